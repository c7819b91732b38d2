"""The time model (``benchmarks.model.timing``) against the seconds GRPO result files measured, per phase and
for the whole step: its coefficients fitted on the runs named in ``FITTED_TIME_FILES``, every other run held
out; each run's machine described by its own calibration (``pace``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import numpy as np

from benchmarks.catalog.profiles import load_shapes
from benchmarks.model.estimate import Workload
from benchmarks.model.timing import Coefficients, calibration_units, fit, measured_rates, phase_work, step_time
from benchmarks.results.schema import Calibration, Configuration, Result

# The runs the time model's coefficients are fitted on: one cpu profile run's GRPO and ZeRO parts.
FITTED_TIME_FILES = ("cpu/20261201T001546Z-grpo.json", "cpu/20261201T001849Z-distributed.json")
FITTED_PHASES = ("rollout", "sleep_wake", "logprob", "forward_backward", "optimizer")
# The reward each step lever runs, as the rewards part names its rows (ours): their seconds add up.
REWARD_ROWS = {
    "synthetic": (),  # a hash per completion: not benchmarked, taken as free
    "format-exact": ("format_reward", "correctness_reward"),
    "schema": ("schema_reward",),
    "execution": ("test_execution_reward",),
}
STEP_WITHIN = (0.15, 0.35)  # the whole step, held out: median and worst relative error
PHASE_WITHIN = 0.25  # each phase over PHASE_SHARE of its step, held out: median relative error
PHASE_SHARE = 0.10


@dataclass(frozen=True)
class TimeCheck:
    """The model against one measured configuration in one phase (``step``: the whole step)."""

    file: str
    configuration: str
    phase: str
    predicted_s: float
    measured_s: float
    share: float  # the phase's part of the measured step
    held_out: bool

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def calibration_of(result: Result, results: list[Result]) -> Calibration | None:
    """The calibration the run recorded, with its bandwidth (from the same run's decode part where the
    calibration predates the bandwidth probe), or None: its machine is not described."""
    found = getattr(result.record, "pace", None)
    if found is None:
        return None
    calibration = found.calibration
    if calibration.bandwidth_gb_s:
        return calibration
    for other in results:
        pace = getattr(other.record, "pace", None)
        if other.kind == "decode" and pace is not None and pace.calibration == calibration:
            probed = other.record.ceiling  # its ceiling as the calibration takes it: the fastest kernel
            gb_s = max(kernel.median_gb_s for kernel in (probed.copy, probed.read, probed.triad))
            return replace(calibration, bandwidth_gb_s=gb_s)
    return None


def reward_seconds(results: list[Result], reward: str, calibration: Calibration) -> float:
    """Seconds a completion of ``reward``: our rows at the smallest batch and shortest text in the same run's
    rewards file, else the newest one; 0 for the synthetic reward."""
    names = REWARD_ROWS[reward]
    if not names:
        return 0.0
    files = [r for r in results if r.kind == "rewards" and r.complete]
    same_run = [r for r in files if r.record.grpo_bench.pace and r.record.grpo_bench.pace.calibration == calibration]
    chosen = (same_run or files)[-1:]
    if not chosen:
        raise ValueError(f"no rewards result file measured {', '.join(names)}")
    rows = [b.extra_info for b in chosen[0].record.benchmarks if b.extra_info.implementation == "grpo-bench"]
    seconds = 0.0
    for name in names:
        mine = [row for row in rows if row.reward == name and row.format == "str"]
        if not mine:
            raise ValueError(f"{chosen[0].path}: no row of {name}")
        row = min(mine, key=lambda r: (r.batch, r.words))
        seconds += 1 / row.completions_per_s
    return seconds


def _workload(result: Result, configuration: Configuration) -> tuple:
    grpo = getattr(result.record.profile, result.kind)
    levers = configuration.lever_values
    return load_shapes()[result.record.shape.name], grpo.dtype, levers, Workload.of(levers, grpo.prompt_words)


def _measured(results: list[Result]) -> list[tuple[Result, Configuration, Calibration]]:
    """Every configuration that ran in a GRPO result file whose machine is described."""
    found = []
    for result in results:
        if result.kind not in ("grpo", "distributed"):
            continue
        calibration = calibration_of(result, results)
        if calibration is None:
            continue
        found += [(result, c, calibration) for c in result.record.configurations if c.status == "ok" and c.summary]
    return found


def fitted_coefficients(results: list[Result]) -> Coefficients:
    """The coefficients fitted on ``FITTED_TIME_FILES``'s phases."""
    rows = []
    for result, configuration, calibration in _measured(results):
        if result.path not in FITTED_TIME_FILES:
            continue
        shape, dtype, levers, work = _workload(result, configuration)
        measured = configuration.summary.phase_s_median
        for phase, w in phase_work(shape, dtype, levers, work).items():
            if phase in FITTED_PHASES and measured.get(phase):
                c = calibration
                units = calibration_units(w, c.torch_s, c.python_s, c.bandwidth_gb_s, levers.num_processes)
                rows.append((units, measured[phase]))
    if not rows:
        raise ValueError(f"none of {', '.join(FITTED_TIME_FILES)} is among the results: nothing to fit on")
    return fit(rows, " and ".join(FITTED_TIME_FILES))


def validate_time(results: list[Result]) -> list[TimeCheck]:
    """Predicted against measured seconds, per phase and for the whole step, for every configuration of
    a GRPO result file whose run recorded a calibration."""
    coefficients = fitted_coefficients(results)
    checks = []
    for result, configuration, calibration in _measured(results):
        shape, dtype, levers, work = _workload(result, configuration)
        reward_s = reward_seconds(results, levers.reward, calibration)
        c = calibration
        rates = measured_rates(coefficients, c.torch_s, c.python_s, c.bandwidth_gb_s, levers.num_processes, reward_s)
        predicted = step_time(shape, dtype, levers, work, rates)
        summary = configuration.summary
        held_out = result.path not in FITTED_TIME_FILES
        measured = {**summary.phase_s_median, "step": summary.step_s_median}
        for phase, seconds in {**predicted.phases, "step": predicted.step_s}.items():
            if measured.get(phase) and seconds:  # a phase the model prices at 0 (the synthetic reward) is not scored
                share = measured[phase] / summary.step_s_median
                check = TimeCheck(result.path, configuration.name, phase, seconds, measured[phase], share, held_out)
                checks.append(check)
    return checks


def unscored(results: list[Result]) -> list[str]:
    """GRPO result files the time model cannot score, each with why."""
    return [
        f"{r.path}: no calibration recorded (runs before the pace was)"
        for r in results
        if r.kind in ("grpo", "distributed") and calibration_of(r, results) is None
    ]


def summary_rows(checks: list[TimeCheck]) -> list[dict]:
    """Median and worst absolute error per phase, fitted and held out apart."""
    rows = []
    for held_out in (False, True):
        for phase in ("step", *FITTED_PHASES, "reward"):
            chosen = [abs(c.error) for c in checks if c.phase == phase and c.held_out == held_out]
            big = [abs(c.error) for c in checks if c.phase == phase and c.held_out == held_out and c.share > PHASE_SHARE]
            if chosen:
                rows.append(
                    {
                        "runs": "held out" if held_out else "fitted",
                        "phase": phase,
                        "checks": len(chosen),
                        "median error": statistics.median(chosen),
                        "worst error": max(chosen),
                        f"median where > {PHASE_SHARE:.0%} of the step": statistics.median(big) if big else None,
                    }
                )
    return rows


def targets(checks: list[TimeCheck]) -> list[tuple[str, float | None, float, bool | None]]:
    """The time model's targets on held-out runs: (claim, measured, limit, met)."""
    held = [c for c in checks if c.held_out]
    steps = [abs(c.error) for c in held if c.phase == "step"]
    out = []
    if steps:
        median, worst = float(np.median(steps)), max(steps)
        out.append(("whole step, median error held out", median, STEP_WITHIN[0], median <= STEP_WITHIN[0]))
        out.append(("whole step, worst error held out", worst, STEP_WITHIN[1], worst <= STEP_WITHIN[1]))
    for phase in FITTED_PHASES:
        big = [abs(c.error) for c in held if c.phase == phase and c.share > PHASE_SHARE]
        if big:
            median = float(np.median(big))
            claim = f"{phase} (where over {PHASE_SHARE:.0%} of its step), median error held out"
            out.append((claim, median, PHASE_WITHIN, median <= PHASE_WITHIN))
    return out
