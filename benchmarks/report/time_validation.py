"""The time model (``benchmarks.model.time.phase_seconds``) against the seconds GRPO result files measured, per
phase and for the whole step: its coefficients fitted on the runs named in ``FITTED_TIME_FILES``, every other run
held out; each run's machine described by its own calibration (``pace``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import numpy as np

from benchmarks.catalog.profiles import load_shapes
from benchmarks.catalog.targets import PHASE_SHARE, PHASE_TIME_WITHIN, STEP_TIME_WITHIN
from benchmarks.model.memory.predict import Workload
from benchmarks.model.time.phase_seconds import phase_work, step_time
from benchmarks.model.time.rates import Coefficients, calibration_units, fit, measured_rates
from benchmarks.model.time.work_rates import CALIBRATION_FLOPS, Rates
from benchmarks.report.published_scores import class_error
from benchmarks.results.schema import Calibration, Configuration, Result

# The runs the time model's coefficients are fitted on: one cpu profile run's GRPO and ZeRO parts.
FITTED_TIME_FILES = (
    "cpu/20261201T001546Z-grpo.json",
    "cpu/20261201T001849Z-distributed.json",
    "cpu/20261201T175857Z-grpo.json",
    "cpu/20261201T180808Z-distributed.json",
)
FITTED_PHASES = ("rollout", "sleep_wake", "logprob", "forward_backward", "optimizer")
# The reward each step lever runs, as the rewards part names its rows (ours): their seconds add up.
REWARD_ROWS = {
    "synthetic": (),  # a hash per completion: not benchmarked, taken as free
    "format-exact": ("format_reward", "correctness_reward"),
    "schema": ("schema_reward",),
    "execution": ("test_execution_reward",),
}


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
    machine: tuple[float, float, float] = (0.0, 0.0, 0.0)  # its run's calibration: matmul s, Python s, GB/s
    levers: object = None  # the configuration's Levers: what makes two checks repeats of one configuration

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def calibration_of(result: Result, results: list[Result]) -> Calibration | None:
    """The calibration the run recorded, with its bandwidth (from the same run's decode part where the
    calibration predates the bandwidth probe), or None: its machine is not described."""
    found = getattr(result.record, "pace", None)
    if found is None or found.calibration is None:  # no pace, or a GPU run's (no CPU calibration)
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


def reward_seconds(results: list[Result], reward: str, calibration: Calibration | None) -> float:
    """Seconds a completion of ``reward``: our rows at the smallest batch and shortest text in the rewards file
    of the run with this ``calibration``, else the newest one; 0 for the synthetic reward."""
    names = REWARD_ROWS[reward]
    if not names:
        return 0.0
    files = [r for r in results if r.kind == "rewards" and r.complete]
    pace = [r.record.grpo_bench.pace for r in files]
    same_run = [r for r, p in zip(files, pace) if calibration and p and p.calibration == calibration]
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


def machine_rates(coefficients: Coefficients, calibration: Calibration, sharing: int, reward_s: float) -> Rates:
    """The rates of one of ``sharing`` ranks on the machine ``calibration`` describes."""
    c = calibration
    return measured_rates(coefficients, c.torch_s, c.python_s, c.bandwidth_gb_s, sharing, reward_s)


def fitted_machine_rates(results: list[Result], sharing: int = 1, reward_s: float = 0.0) -> Rates:
    """The rates of the machine the fit ran on (its first fitted file's calibration)."""
    fitted = [r for r in results if r.path == FITTED_TIME_FILES[0]]
    calibration = calibration_of(fitted[0], results) if fitted else None
    if calibration is None:
        raise ValueError(f"{FITTED_TIME_FILES[0]} (the fitted run) is not among the results, or has no calibration")
    return machine_rates(fitted_coefficients(results), calibration, sharing, reward_s)


def describe(c: Coefficients) -> str:
    """The fitted coefficients in words."""
    return (
        f"matmuls at {1 / c.flops:.0%} of the calibration's FLOP/s ({CALIBRATION_FLOPS / 1e9:.0f} GFLOP of linears), "
        f"streamed bytes at {1 / c.bytes:.0%} of the probe's bandwidth, a layer pass {c.layer_passes:.4f} and an "
        f"adapter pass {c.adapter_passes:.4f} of the calibration's Python workload, a vLLM step {c.engine_steps:.4f} "
        f"of it, ranks' collectives at {1 / c.link_bytes if c.link_bytes else 0:.1%} of the probe's bandwidth, "
        f"8-bit AdamW's (de)quantisation the time of {c.quantised_params:,.0f} matmul FLOPs a parameter, fresh "
        f"pages (fixed thresholds) at {1 / c.faulted_bytes if c.faulted_bytes else 0:.0%} of the probe's bandwidth"
    )


def fixed_heap(result: Result) -> bool:
    """Whether a CPU run fixed glibc's malloc thresholds."""
    return result.hardware == "cpu" and result.record.profile.malloc_mmap_threshold > 0


def _workload(result: Result, configuration: Configuration) -> tuple:
    grpo = getattr(result.record.profile, result.kind)
    levers = configuration.lever_values
    return load_shapes()[result.record.shape.name], grpo.dtype, levers, Workload.from_levers(levers, grpo.prompt_words)


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
        for phase, w in phase_work(shape, dtype, levers, work, fixed_heap(result)).items():
            if phase in FITTED_PHASES and measured.get(phase):
                c = calibration
                units = calibration_units(w, c.torch_s, c.python_s, c.bandwidth_gb_s, levers.num_processes)
                rows.append((units, measured[phase]))
    if not rows:
        raise ValueError(f"none of {', '.join(FITTED_TIME_FILES)} is among the results: nothing to fit on")
    return fit(rows, " and ".join(FITTED_TIME_FILES))


def validate_time(results: list[Result], coefficients: Coefficients | None = None) -> list[TimeCheck]:
    """Predicted against measured seconds, per phase and for the whole step, for every configuration of
    a GRPO result file whose run recorded a calibration (``coefficients``: the fit, if already made)."""
    coefficients = coefficients or fitted_coefficients(results)
    checks = []
    for result, configuration, calibration in _measured(results):
        shape, dtype, levers, work = _workload(result, configuration)
        reward_s = reward_seconds(results, levers.reward, calibration)
        rates = machine_rates(coefficients, calibration, levers.num_processes, reward_s)
        predicted = step_time(shape, dtype, levers, work, rates, fixed_heap(result))
        summary = configuration.summary
        held_out = result.path not in FITTED_TIME_FILES
        measured = {**summary.phase_s_median, "step": summary.step_s_median}
        for phase, seconds in {**predicted.phases, "step": predicted.step_s}.items():
            if measured.get(phase) and seconds:  # a phase the model prices at 0 (the synthetic reward) is not scored
                share = measured[phase] / summary.step_s_median
                machine = (calibration.torch_s, calibration.python_s, calibration.bandwidth_gb_s)
                row = (result.path, configuration.name, phase, seconds, measured[phase], share, held_out)
                checks.append(TimeCheck(*row, machine=machine, levers=levers))
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
            big = [
                abs(c.error) for c in checks if c.phase == phase and c.held_out == held_out and c.share > PHASE_SHARE
            ]
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
        out.append(("whole step, median error held out", median, STEP_TIME_WITHIN[0], median <= STEP_TIME_WITHIN[0]))
        out.append(("whole step, worst error held out", worst, STEP_TIME_WITHIN[1], worst <= STEP_TIME_WITHIN[1]))
    for phase in FITTED_PHASES:
        big = [abs(c.error) for c in held if c.phase == phase and c.share > PHASE_SHARE]
        if big:
            median = float(np.median(big))
            claim = f"{phase} (where over {PHASE_SHARE:.0%} of its step), median error held out"
            out.append((claim, median, PHASE_TIME_WITHIN, median <= PHASE_TIME_WITHIN))
    return out


def error_line(gpu_class: str) -> str:
    """Where an estimate's error is known from: model.md's held-out time checks on a CPU; on a GPU class the
    published figures of that class the models were scored against (published.md), where any were."""
    if gpu_class == "cpu":
        return (
            "error: as model.md's held-out time checks on this CPU (fitted on " + " and ".join(FITTED_TIME_FILES) + ")"
        )
    published = class_error(gpu_class)
    if published:
        return "error on published figures of this class (results/tables/published.md): " + "; ".join(published)
    return (
        "error: not known on this class: no run on it and no published figure of it is scored yet (its rates are "
        "peaks x assumed efficiencies, hardware.toml; results/tables/published.md scores the classes that have some)"
    )


REPEAT_CALIBRATION = 0.15  # two runs' machines count as alike when each calibration figure is within this


def repeat_spread(checks: list[TimeCheck], phase: str) -> tuple[float, TimeCheck, TimeCheck] | None:
    """The largest ratio between two measurements of one configuration's ``phase`` on alike machines (every
    calibration figure within ``REPEAT_CALIBRATION``): the noise no model of the calibration can follow."""
    found = [c for c in checks if c.phase == phase and c.levers is not None]
    best = None
    for i, one in enumerate(found):
        for other in found[i + 1 :]:
            alike = all(abs(a / b - 1) <= REPEAT_CALIBRATION for a, b in zip(one.machine, other.machine))
            if one.file == other.file or one.levers != other.levers or not alike:
                continue
            ratio = max(one.measured_s, other.measured_s) / min(one.measured_s, other.measured_s)
            if best is None or ratio > best[0]:
                best = (ratio, one, other)
    return best
