"""The result files: their typed records, their schema version, the one writer and the one loader.

Result files are the suite's contract with every other machine and every later version. Every
harness builds a record (``FILES``: GrpoFile, DecodeFile, ContextFile, RewardsFile, and the records
inside them) and writes it here only (``write``: atomically, 0644, without the measuring machine's
paths); every report reads it here only (``read_result``, ``load_results``: validated, a bad or
truncated file is an error naming the file and the key; an older schema upgraded as it is read).
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
from benchmarks.results.codec import decode, encode
from benchmarks.results.part_records import (
    BenchmarkRow,
    BestKernel,
    Ceiling,
    Comparison,
    ContenderRun,
    ContextFile,
    DecodeFile,
    DecodePoint,
    EarlierSearch,
    KernelRate,
    LogitsShare,
    Probe,
    Projection,
    RewardsBlock,
    RewardsFile,
    RewardTarget,
    RolloutShape,
    RowInfo,
    RowStats,
    Search,
    Verdict,
)
from benchmarks.results.records import (
    HOST_RSS,
    TORCH_ALLOCATED,
    TORCH_RESERVED,
    BuiltModel,
    Calibration,
    Commit,
    Configuration,
    CudaPeaks,
    DecodeSettings,
    Distribution,
    Gpu,
    GrpoFile,
    GrpoSettings,
    Harness,
    Install,
    Machine,
    ModelStates,
    Pace,
    ProfileRecord,
    Rank,
    RunFile,
    SchemaError,
    ShapeRecord,
    Step,
    Summary,
    Target,
    WorkerRecord,
)

# The records are read as ``schema.<Record>``: this module is the one entry to the contract.
__all__ = [
    "BenchmarkRow",
    "BestKernel",
    "Calibration",
    "Ceiling",
    "Commit",
    "Comparison",
    "Configuration",
    "ContenderRun",
    "ContextFile",
    "CudaPeaks",
    "DecodeFile",
    "DecodePoint",
    "DecodeSettings",
    "Distribution",
    "EarlierSearch",
    "Gpu",
    "GrpoFile",
    "GrpoSettings",
    "HOST_RSS",
    "Harness",
    "KernelRate",
    "LogitsShare",
    "Machine",
    "ModelStates",
    "Pace",
    "Install",
    "BuiltModel",
    "Probe",
    "ProfileRecord",
    "Projection",
    "Rank",
    "RewardTarget",
    "RewardsBlock",
    "RewardsFile",
    "RolloutShape",
    "RowInfo",
    "RowStats",
    "RunFile",
    "SchemaError",
    "Search",
    "ShapeRecord",
    "Step",
    "Summary",
    "TORCH_ALLOCATED",
    "TORCH_RESERVED",
    "Target",
    "Verdict",
    "WorkerRecord",
    "decode",
    "encode",
]


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


def write(path: Path, record: Any) -> None:
    """The one way a result file is written: a record (one of FILES), whole or not at all, 0644,
    without the measuring machine's paths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".partial", delete=False) as f:
        json.dump(scrub_paths(encode(record)), f, indent=1)
    os.chmod(f.name, 0o644)
    os.replace(f.name, path)


# 2: `complete` (and `ended_early`), device peaks per phase on CUDA, `peak_bytes` with its `peak_measure`.
# 3: a commit's `dirty` may be unknown (null) and says its `source`; on CUDA each phase's peak is torch's
#    allocator in that phase (`peak_bytes_by_phase`, `phase_peak_measure`), NVML's beside it; a context
#    search records its allocator settings.
SCHEMA_VERSION = 3


class Stopped(Exception):
    """SIGTERM (a scheduler's or a timeout's) turned into an exception, so that the result file is
    marked before the process ends."""


@contextlib.contextmanager
def marked_incomplete(path: Path, result: RunFile) -> Iterator[None]:
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
        result.complete, result.ended_early, result.finished = False, f"{reason} at {now()}", now()
        write(path, result)
        print(f"\n{reason}: kept {path.name}, marked complete: false ({kept(result)})", flush=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    result.complete, result.finished = True, now()
    write(path, result)


def kept(result: RunFile) -> str:
    """What an interrupted run's file holds, in a few words."""
    for name in ("configurations", "contenders", "sweep"):
        if hasattr(result, name):
            return f"{len(getattr(result, name))} {name} recorded"
    return "its header"


def benchmark_rows(output_json: dict) -> list[BenchmarkRow]:
    """pytest-benchmark's rows as it is about to write them, typed: each gains ``completions_per_s``
    (its batch over the median call) and loses its raw per-round timings (``stats.data``, up to tens
    of thousands a row), so that the file stays small and ``pytest-benchmark compare`` reads it still."""
    for row in output_json["benchmarks"]:
        row["stats"].pop("data", None)
        row["extra_info"]["completions_per_s"] = row["extra_info"]["batch"] / row["stats"]["median"]
    return [
        decode(BenchmarkRow, row, f"pytest-benchmark: benchmarks[{i}]")
        for i, row in enumerate(output_json["benchmarks"])
    ]


def attach_rewards_block(output_json: dict, block: RewardsBlock) -> None:
    """The suite's block in pytest-benchmark's file."""
    output_json["grpo_bench"] = encode(block)


# A ``distributed`` run is a GRPO run whose configurations spread over ranks: the same records.
FILES: dict[str, type] = {
    "grpo": GrpoFile,
    "distributed": GrpoFile,
    "decode": DecodeFile,
    "context": ContextFile,
    "rewards": RewardsFile,
}


@dataclass(frozen=True)
class Result:
    """A result file as loaded: its record (one of FILES), and what the tables need to choose it."""

    path: str  # relative to the results directory, or as named
    record: Any  # GrpoFile, DecodeFile, ContextFile or RewardsFile
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
    last_field = {"grpo": "targets", "context": "verdict", "decode": "projections"}.get(kind)  # before schema 2
    return last_field is None or last_field in data


def is_whole(record: Any) -> bool:
    """Whether a GRPO run measured every configuration its profile defines (not an --only subset)."""
    if not isinstance(record, GrpoFile):
        return True
    grpo = getattr(record.profile, record.kind)
    if grpo is None:
        return True
    defined = configurations(SimpleNamespace(levers=Levers.recorded(grpo.levers), matrix=grpo.matrix, extra=grpo.extra))
    return len(record.configurations) >= len(defined)


def upgrade(data: dict, kind: str) -> dict:
    """A file of an older schema as the current records read it (the file itself is never edited):
    schema 1 had no ``complete`` flag, and its GRPO summaries headlined host RSS only."""
    header = data.get("grpo_bench", data)
    if "complete" not in header:
        header = {**header, "complete": is_complete(data, kind)}
        data = {**data, "grpo_bench": header} if "grpo_bench" in data else header
    if kind == "grpo":
        data = {**data, "configurations": [_upgraded_configuration(c) for c in data.get("configurations", [])]}
    return data


def _upgraded_configuration(record: dict) -> dict:
    summary = record.get("summary") or None
    if summary and "peak_bytes" not in summary:
        by_phase = summary.get("peak_rss_bytes_by_phase", {})
        summary = {**summary, "peak_bytes": summary.get("peak_rss_bytes", 0), "peak_bytes_by_phase": by_phase}
        summary["peak_measure"] = HOST_RSS
    return {**record, "summary": summary}


def read_result(path: Path, name: str) -> Result:
    """One result file, ``name`` as it is to be cited; an error naming the file and the key that
    is missing or bad."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SchemaError(f"{name}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise SchemaError(f"{name}: expected an object, got {type(data).__name__}")
    header = data.get("grpo_bench", data)  # pytest-benchmark's file holds the suite's header inside
    kind = header.get("kind") if isinstance(header, dict) else None
    if kind not in FILES:
        raise SchemaError(f"{name}: kind {kind!r} is not one of {', '.join(FILES)}")
    version = header.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise SchemaError(
            f"{name}: schema_version {version} is newer than this suite reads ({SCHEMA_VERSION}): "
            "update grpo-bench to read it"
        )
    record = decode(FILES[kind], upgrade(data, kind), name)
    if isinstance(record, RewardsFile):
        block, shape = record.grpo_bench, None
        hardware, started, complete, quick = block.hardware_class, record.datetime, block.complete, block.quick
    else:
        hardware, started, complete, quick = record.profile.hardware, record.started, record.complete, record.quick
        shape = record.shape.name if isinstance(record, GrpoFile | ContextFile) else None
    return Result(name, record, kind, hardware, started[:10], complete, is_whole(record), quick, shape)


def load_results(directory: Path) -> list[Result]:
    """Every result file under ``directory`` (``<hardware>/<time>-<kind>.json``), oldest first; a
    directory that does not exist or holds no result file is an error."""
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such results directory")
    found = [read_result(path, str(path.relative_to(directory))) for path in sorted(directory.glob("*/*.json"))]
    if not found:
        raise ValueError(f"{directory}: no result file (<hardware>/<time>-<kind>.json) under it")
    return sorted(found, key=lambda r: (r.date, r.path))
