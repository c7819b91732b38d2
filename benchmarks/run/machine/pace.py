"""How long a profile takes here, said before it starts and checked after it ends.

A few seconds of calibration time fixed work of the three kinds the parts do (pure Python, starting
an interpreter, fp32 tensor work on every core). Each part's estimate is the newest earlier run of
the same profile and part on the same hardware class (a result file with a calibration of its own),
scaled by how much slower this machine did the same calibration work: the reward rows by the Python
and interpreter-start figures, the parts that run models by the tensor and Python figures. Where no
such run exists, a GPU class's part is predicted by the time model, and elsewhere the part has no estimate and the
line says so; nothing is guessed. On a first run a part also builds its models (random weights written once, then
cached): each model not yet built here adds its size on disk at the seconds per GiB of the largest build recorded
(scaled like the part), and the line says so.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.catalog.install_plan import INSTALL
from benchmarks.catalog.profiles import GRPO_PARTS, Profile, configurations, load_shapes
from benchmarks.catalog.targets import ESTIMATE_WITHIN
from benchmarks.model.memory.predict import DTYPE_BYTES, GIB
from benchmarks.model.profile_fit import predicted_basis, predicted_part_s
from benchmarks.results import schema
from benchmarks.run.machine.bandwidth_probe import ceiling, probe
from benchmarks.run.model_dirs import is_built

# Which calibration figures a part's time follows (the geometric mean of their ratios).
FOLLOWS = {
    "rewards": ("python_s", "spawn_s"),  # regex and JSON rows; one sandboxed interpreter per completion
    "decode": ("torch_s", "python_s"),  # matmuls, and generate's per-token Python
    "grpo": ("torch_s", "python_s"),  # steps, and each worker's imports and model load
    "distributed": ("torch_s", "python_s"),
}


def _python_work() -> None:
    words = " ".join(f"w{i}" for i in range(2000))
    pattern = re.compile(r"<answer>(.*?)</answer>", re.S)
    for i in range(2000):  # about 0.1 s: well above the timer's noise
        text = f"<reasoning>{words}</reasoning><answer>{i}</answer>"
        json.loads(json.dumps({"steps": text.split()[:200], "answer": pattern.search(text).group(1)}))


def _torch_work() -> None:
    import torch

    generator = torch.Generator().manual_seed(0)
    blocks = [torch.nn.Linear(576, 1536), torch.nn.Linear(1536, 576)] * 2
    inputs = torch.randn(512, 576, generator=generator)
    for _ in range(8):
        out = inputs
        for block in blocks:
            out = torch.nn.functional.silu(block(out))
        out.sum().backward()


def _timed(work: Callable[[], None], repeats: int = 3) -> float:
    """The fastest of ``repeats`` runs (the first also warms caches)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def calibrate() -> schema.Calibration:
    """About three seconds of fixed work on this machine, and its memory bandwidth (the time model's rates)."""

    def spawn() -> None:
        subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)

    spawns = [_timed(spawn, 1) for _ in range(5)]
    return schema.Calibration(
        python_s=_timed(_python_work),
        spawn_s=statistics.median(spawns),
        torch_s=_timed(_torch_work),
        bandwidth_gb_s=ceiling(probe("cpu", array_bytes=256 << 20, repeats=3))["median_gb_s"],
    )


def scale(now: schema.Calibration, then: schema.Calibration, part: str) -> float:
    """How much longer ``part`` takes here than on the machine calibrated ``then``."""
    ratios = [getattr(now, name) / getattr(then, name) for name in FOLLOWS[part]]
    return math.prod(ratios) ** (1 / len(ratios))


def header(record: object) -> object:
    """Where a result file keeps the suite's own fields: pytest-benchmark's file in its ``grpo_bench`` block."""
    return record.grpo_bench if isinstance(record, schema.RewardsFile) else record


def pace_of(record: object) -> schema.Pace | None:
    return getattr(header(record), "pace", None)


def profile_name(record: object) -> str:
    profile = header(record).profile
    return profile.get("name", "") if isinstance(profile, dict) else profile.name


@dataclass(frozen=True)
class PartEstimate:
    part: str
    seconds: float | None
    reference: str | None  # the result file scaled
    scale: float | None
    why_none: str = ""
    predicted: bool = False  # from the time model (a first run on a GPU class), not scaled from a run
    first_run_s: float = 0.0  # building the part's models, not yet built here
    first_run: str = ""  # what that is, or why it is not estimated


def to_build(profile: Profile, part: str) -> tuple[str, float] | None:
    """The model ``part`` builds before it measures, where it is not built here yet: (shape, GiB written)."""
    settings = None if part == "rewards" else getattr(profile, part, None)
    if settings is None:
        return None
    shape = load_shapes()[settings.shape]
    if is_built(shape, settings.dtype, settings.weights):
        return None
    saved = settings.weights == "saved"  # on-device weights: a config and a tokenizer only
    return settings.shape, shape.param_count() * DTYPE_BYTES[settings.dtype] / GIB if saved else 0.0


def build_rate(results: list[schema.Result]) -> tuple[float, schema.Result, schema.Calibration | None] | None:
    """Seconds per GiB of the largest model build recorded (a first run's), its file and that run's calibration."""
    builds = [(b, r) for r in results for b in getattr(r.record, "built_models", []) if b.gib > 0]
    if not builds:
        return None
    built, found = max(builds, key=lambda item: item[0].gib)
    then = pace_of(found.record)
    return built.seconds / built.gib, found, then.calibration if then else None


def with_first_run(
    estimate: PartEstimate, profile: Profile, results: list[schema.Result], calibration: schema.Calibration | None
) -> PartEstimate:
    """``estimate`` with the building of its models that are not built here yet."""
    building = to_build(profile, estimate.part)
    if building is None:
        return estimate
    names, gib = building
    rate = build_rate(results)
    if rate is None:
        return replace(estimate, first_run=f"first run here: building {names} ({gib:.2f} GiB) not estimated yet")
    per_gib, found, then = rate
    factor = scale(calibration, then, estimate.part) if calibration and then else 1.0
    seconds = gib * per_gib * factor
    said = f"first run here: building {names} ~{clock(seconds)} ({gib:.2f} GiB at {per_gib:.1f} s/GiB, {found.path})"
    return replace(estimate, first_run_s=seconds, first_run=said)


def reference(results: list[schema.Result], profile: Profile, part: str, quick: bool) -> schema.Result | None:
    """The newest complete run of ``part`` with ``profile`` (same name, hardware class and --quick)
    that recorded its pace."""
    found = [
        r
        for r in results
        if r.kind == part
        and r.hardware == profile.hardware
        and r.quick == quick
        and r.complete
        and profile_name(r.record) == profile.name
        and pace_of(r.record) is not None
    ]
    return max(found, key=lambda r: r.record.started if part != "rewards" else r.record.datetime, default=None)


def share(record: object, names: Sequence[str] | None) -> float:
    """The part of a GRPO run's time that ``names`` (the configurations to run now) took then: the same
    configurations, 1; fewer, less; a name the reference lacks counts as its mean configuration."""
    configurations = getattr(record, "configurations", None)
    if names is None or not configurations:
        return 1.0
    walls = {c.name: c.harness.wall_s for c in configurations if c.harness}
    mean = statistics.fmean(walls.values()) if walls else 0.0
    total = sum(walls.values())
    return sum(walls.get(name, mean) for name in names) / total if total else 1.0


def estimate_part(
    results: list[schema.Result],
    profile: Profile,
    part: str,
    quick: bool,
    calibration: schema.Calibration | None,
    names: Sequence[str] | None = None,
) -> PartEstimate:
    """``part``'s time here: its reference run's, scaled by the calibrations (and, for a GRPO part, by the
    share its configurations to run now took then)."""
    found = reference(results, profile, part, quick)
    if found is None:
        predicted = predicted_part_s(profile, part, names)
        if predicted is not None:
            return PartEstimate(part, predicted, None, None, predicted=True)
        return PartEstimate(part, None, None, None, f"no earlier {part} run of profile {profile.name} with a pace here")
    then = pace_of(found.record)
    # a GPU profile's own earlier run on the same class stands as it is: its parts ran on the device
    factor = scale(calibration, then.calibration, part) if calibration and then.calibration else 1.0
    return PartEstimate(part, then.part_s * factor * share(found.record, names), found.path, factor)


def estimate_run(
    results_dirs: Sequence[Path],
    profile: Profile,
    parts: Sequence[str],
    quick: bool,
    calibration: schema.Calibration | None,
    patterns: Sequence[str] | None = None,
) -> list[PartEstimate]:
    """Every part's estimate from the result files under ``results_dirs`` (those that exist); ``patterns``:
    --only's configuration names, where it chose configurations rather than parts."""
    results = []
    for directory in dict.fromkeys(results_dirs):
        try:
            results += schema.load_results(directory)
        except (OSError, ValueError) as error:  # no results yet, or one that does not read: none from it
            print(f"no earlier runs to scale from {directory}: {error}")
    return [
        with_first_run(
            estimate_part(results, profile, part, quick, calibration, configuration_names(profile, part, patterns)),
            profile,
            results,
            calibration,
        )
        for part in parts
    ]


def configuration_names(profile: Profile, part: str, patterns: Sequence[str] | None) -> list[str] | None:
    """The GRPO configurations of ``part`` to run (those ``patterns`` choose; None: all), or None where
    ``part`` runs none."""
    bench = getattr(profile, part, None) if part in GRPO_PARTS else None
    if bench is None:
        return None
    names = [name for name, _ in configurations(bench)]
    return names if patterns is None else [n for n in names if any(fnmatch.fnmatch(n, x) for x in patterns)]


def clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def estimate_line(estimates: list[PartEstimate]) -> str:
    """What is printed before the run starts: the whole estimate, each part's, and what it scaled."""
    parts = [_part_line(e) + (f" + {e.first_run}" if e.first_run else "") for e in estimates]
    whole = whole_estimate(estimates)
    head = f"estimate: ~{clock(whole)} in all" if whole is not None else "estimate: none for the whole run"
    first = " (a first run here: building models included)" if any(e.first_run_s for e in estimates) else ""
    basis = f" ({predicted_basis()})" if any(e.predicted for e in estimates) else ""
    return f"{head}{first}; " + "; ".join(parts) + basis


def install_from(environ: Mapping[str, str]) -> schema.Install | None:
    """The bench session's install, where the session handed it to this run."""
    given = environ.get(INSTALL)
    return schema.decode(schema.Install, json.loads(given), INSTALL) if given else None


def install_line(install: schema.Install) -> str:
    kind = "a new environment: a first run" if install.fresh else "a reused environment"
    return f"install: {clock(install.seconds)} (stack {install.stack}, {kind}; before this run, not in its time)"


def _part_line(e: PartEstimate) -> str:
    if e.seconds is None:
        return e.why_none
    return f"{e.part} ~{clock(e.seconds)} " + ("(predicted)" if e.predicted else f"({e.reference} x{e.scale:.2f})")


def whole_estimate(estimates: list[PartEstimate]) -> float | None:
    if any(e.seconds is None for e in estimates):
        return None
    return sum(e.seconds + e.first_run_s for e in estimates)


def run_targets(profile: str, limit_min: float | None, run_s: float, estimated_s: float | None) -> list[schema.Target]:
    """The whole run's targets: the profile's time limit (where it sets one and the whole profile ran)
    and the estimate's error."""
    targets = []
    if limit_min:
        claim = f"the whole {profile} profile finishes within {limit_min:g} minutes"
        targets.append(schema.Target.at_most(claim, run_s, limit_min * 60))
    error = abs(estimated_s / run_s - 1) if estimated_s is not None and run_s > 0 else None
    claim = f"the whole-run estimate printed at the start within {ESTIMATE_WITHIN:.0%} of the real time"
    targets.append(schema.Target.at_most(claim, error, ESTIMATE_WITHIN))
    return targets


def record(path: Path, pace: schema.Pace) -> None:
    """``pace`` into the part's result file, once the part has ended."""
    run = schema.read_result(path, str(path)).record
    header(run).pace = pace
    schema.write(path, run)
