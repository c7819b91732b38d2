"""The result files: their schema version, the one writer and the one loader.

Result files are the suite's contract with every other machine and every later version. They
are written here only (atomically, 0644, without the measuring machine's paths) and read here
only (validated: a bad or truncated file is an error naming the file and the key).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks import REPO
from benchmarks.catalog.profiles import Levers, configurations


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


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


@dataclass(frozen=True)
class Result:
    path: str  # relative to the results directory
    data: dict
    kind: str
    hardware: str
    date: str  # YYYY-MM-DD the run started
    complete: bool = True  # False: the run ended early; never cited as a measurement
    whole: bool = True  # False: a subset of its profile (a GRPO run with --only)
    quick: bool = False  # a --quick smoke run
    shape: str | None = None  # the shape a GRPO run or a context search measured

    @property
    def series(self) -> tuple:
        """What a newer result of the same series supersedes: kind, hardware class, shape, quick."""
        return (self.kind, self.hardware, self.shape, self.quick)


def is_complete(data: dict, kind: str) -> bool:
    """Whether a result file holds a whole run. Schema 2 files say so (``complete``); schema 1 files
    were whole when they reached their last field: a GRPO run its targets, a context search its
    verdict, a decode run its projections (the first decode runs measured the ceiling alone);
    rewards files were written whole."""
    header = data.get("grpo_bench", data)
    if "complete" in header:
        return bool(header["complete"])
    last_field = {"grpo": "targets", "context": "verdict", "decode": "projections"}.get(kind)
    return last_field is None or last_field in data


def is_whole(data: dict, kind: str, name: str) -> bool:
    """Whether a GRPO run measured every configuration its profile defines (not an --only subset)."""
    if kind != "grpo":
        return True
    require_keys(data, name, "configurations")
    grpo = data["profile"].get("grpo") or {}
    require_keys(grpo, f"{name}: profile.grpo", "levers", "matrix", "extra")
    base = Levers(**grpo["levers"])
    defined = configurations(SimpleNamespace(levers=base, matrix=grpo["matrix"], extra=tuple(grpo["extra"])))
    return len(data["configurations"]) >= len(defined)


def require_keys(data: dict, path: str, *keys: str) -> None:
    for key in keys:
        if key not in data:
            raise ValueError(f"{path}: missing key {key!r}")


def read_result(path: Path, name: str) -> Result:
    """One result file, ``name`` as it is to be cited; an error naming the file and the key that
    is missing or bad."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{name}: not JSON ({error})") from None
    if "grpo_bench" in data:  # pytest-benchmark's file, our header inside
        header = data["grpo_bench"]
        require_keys(header, name, "kind", "hardware_class")
        kind, hardware, started = header["kind"], header["hardware_class"], data.get("datetime", "")
    else:
        require_keys(data, name, "kind", "profile", "started")
        header, kind, hardware, started = data, data["kind"], data["profile"]["hardware"], data["started"]
    shape = data["shape"]["name"] if kind in ("grpo", "context") else None
    whole, quick = is_whole(data, kind, name), bool(header.get("quick"))
    return Result(name, data, kind, hardware, started[:10], is_complete(data, kind), whole, quick, shape)


def load_results(directory: Path) -> list[Result]:
    """Every result file under ``directory`` (``<hardware>/<time>-<kind>.json``), oldest first; a
    directory that does not exist or holds no result file is an error."""
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such results directory")
    found = [read_result(path, str(path.relative_to(directory))) for path in sorted(directory.glob("*/*.json"))]
    if not found:
        raise ValueError(f"{directory}: no result file (<hardware>/<time>-<kind>.json) under it")
    return sorted(found, key=lambda r: (r.date, r.path))
