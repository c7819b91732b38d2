"""The time model's tables: its validation (model.md), the seconds a sizing cell's step takes (sizing.md),
DGX Spark's hours against an H200's (decode.md) and the reward's share of a measured step (rewards.md)."""

from __future__ import annotations

import pandas as pd

from benchmarks.catalog.profiles import Hardware, Levers, load_hardware, load_shapes
from benchmarks.model.memory.predict import Workload
from benchmarks.model.time.calibration import fitted, fitted_rates
from benchmarks.model.time.phase_seconds import StepTime, step_time
from benchmarks.model.time.work_rates import Rates
from benchmarks.report import frames
from benchmarks.report import time_validation as tv
from benchmarks.results.schema import Result
from benchmarks.run.machine import pace

SPARK_VERSUS = "h200"  # the class Spark's hours stand beside
SPARK_SHAPES = ("0.5b", "1.5b", "3b", "7b", "8b", "14b", "32b", "70b")


def class_rates(hardware: Hardware, results: list[Result]) -> Rates | None:
    """A class's rates for one device: the CPU's from the fitted run's own calibration, a GPU class's
    assumed; None where neither is known (no fitted run among ``results``, no peaks catalogued)."""
    if hardware.gpu_class == "cpu":
        try:
            return tv.fitted_machine_rates(results)
        except ValueError:
            return None
    try:
        return fitted_rates(hardware)
    except ValueError:
        return None


def cell_time(shape_name: str, dtype: str, levers: Levers, work: Workload, rates: Rates) -> StepTime:
    return step_time(load_shapes()[shape_name], dtype, levers, work, rates)


def seconds_text(seconds: float) -> str:
    return f"{seconds:,.0f}" if seconds >= 10 else f"{seconds:.2g}"


def cell_text(predicted: StepTime) -> str:
    return f"~{seconds_text(predicted.step_s)} s/step, rollout {predicted.rollout_share:.0%}"


def time_table(results: list[Result]) -> str:
    """model.md's time section: the fitted coefficients, each configuration's step and phases against the
    model, the errors per phase fitted and held out, and the targets."""
    measured = [r for r in results if not r.quick and r.complete]
    try:
        coefficients = tv.fitted_coefficients(measured)
        checks = tv.validate_time(measured, coefficients)
    except ValueError as error:
        return f"No time validation: {error}.\n"
    lines = [
        "## Time: seconds per phase and per step",
        "",
        f"Fitted on {', '.join(tv.FITTED_TIME_FILES)}: every phase of their configurations the model prices "
        f"({', '.join(tv.FITTED_PHASES)}). "
        "Every other run with a calibration is held out; each run's machine is its own calibration (its matmul "
        "FLOP/s, Python speed and memory bandwidth, recorded in the file's pace).",
        "",
        "Coefficients (seconds of work per second of the calibration's own): " + tv.describe(coefficients) + ".",
        "",
        frames.markdown(pd.DataFrame(tv.summary_rows(checks)).map(_percent), numeric=("checks",)),
        "",
    ]
    for claim, value, limit, met in tv.targets(checks):
        verdict = "met" if met else "MISSED"
        lines.append(f"- {claim}: {value:.1%} (target at most {limit:.0%}: {verdict})")
        spread = None if met else tv.repeat_spread(checks, claim.split()[0])
        if spread:
            ratio, one, other = spread
            lines.append(
                f"  - the same configuration ({one.configuration}) measured {one.measured_s:.2f} s in {one.file} and "
                f"{other.measured_s:.2f} s in {other.file}, machines whose calibrations agree within "
                f"{tv.REPEAT_CALIBRATION:.0%}: {ratio:.1f}x between repeats, more than any model of the calibration "
                "can follow"
            )
    lines += ["", frames.markdown(_check_frame(checks)), ""]
    lines += [f"Not scored: {why}." for why in tv.unscored(measured)]
    lines += [
        "",
        "GPU classes: no run on a GPU has been scored yet. Their rates are assumptions: "
        f"{fitted().words()}; each class's peaks and links with their sources in profiles/hardware.toml.",
    ]
    return "\n".join(lines) + "\n"


def _percent(value: object) -> object:
    if isinstance(value, float):
        return "" if value != value else f"{value:.0%}"  # NaN: no check of that kind
    return "" if value is None else value


def _check_frame(checks: list[tv.TimeCheck]) -> pd.DataFrame:
    """One row per configuration: its step predicted and measured, and each phase's error."""
    rows: dict[tuple[str, str], dict] = {}
    for check in checks:
        row = rows.setdefault(
            (check.file, check.configuration),
            {
                "set": "held out" if check.held_out else "fitted",
                "file": check.file,
                "configuration": check.configuration,
            },
        )
        if check.phase == "step":
            row |= {"predicted s": f"{check.predicted_s:.2f}", "measured s": f"{check.measured_s:.2f}"}
        row[check.phase] = f"{check.error:+.0%}"
    frame = pd.DataFrame(rows.values())
    order = ["set", "file", "configuration", "predicted s", "measured s", "step", *tv.FITTED_PHASES, "reward"]
    return frame.reindex(columns=[c for c in order if c in frame.columns]).fillna("")


def spark_rows(work: Workload, levers: Levers, dtype: str) -> list[str]:
    """Hours per 1,000 steps per size class on DGX Spark at its sustained budget against an H200: the same
    step with the rollout at each end of its budget (every other rate assumed as on any class)."""
    catalog = load_hardware()
    spark, versus = catalog["spark"], catalog[SPARK_VERSUS]
    bases = [
        (f"DGX Spark at {gb_s:g} GB/s", fitted_rates(spark, decode_gb_s=gb_s))
        for gb_s in spark.sustained_bandwidth_gb_s
    ]
    bases.append((versus.name, fitted_rates(versus)))
    budget = " and ".join(f"{gb_s:g}" for gb_s in spark.sustained_bandwidth_gb_s)
    rows = []
    for name in SPARK_SHAPES:
        row = {"size class": name}
        for label, rates in bases:
            predicted = cell_time(name, dtype, levers, work, rates)
            row[f"{label}: h / 1,000 steps"] = f"{predicted.gpu_hours(1000):,.1f}"
            row[f"{label}: rollout"] = f"{predicted.rollout_share:.0%}"
        rows.append(row)
    return [
        "Worth doing on a DGX Spark? Hours per 1,000 GRPO steps (one device, predicted by the time model), LoRA "
        f"with checkpointing, {work.completions} completions x {work.completion_tokens} tokens after "
        f"{work.prompt_tokens}-token prompts, the rollout by a colocated vLLM engine, {dtype}: Spark's rollout at its "
        f"sustained {budget} GB/s (the guide's budget), every other rate assumed ({fitted().words()}), "
        f"beside an {versus.name} at its assumed rates. Memory is not checked here: sizing.md says what fits.",
        "",
        frames.markdown(pd.DataFrame(rows)),
    ]


def reward_share_rows(results: list[Result]) -> list[str]:
    """Each real reward's measured share of a step, beside the configuration that differs from it only in
    running the synthetic reward (its baseline)."""
    shares = frames.reward_shares(results)
    if shares.empty:
        return ["No GRPO step has run a real reward yet."]
    table = pd.DataFrame(
        {
            "file": shares.file,
            "reward in the step": shares.reward,
            "configuration": shares.configuration,
            "reward s/step": shares.reward_s.map(lambda s: f"{s:.3f}"),
            "step s": shares.step_s.map(lambda s: f"{s:.2f}"),
            "reward share": shares.share.map(lambda s: f"{s:.1%}"),
        }
    )
    return [
        "The reward inside measured GRPO steps (the `reward` lever): its median seconds a step and its share of "
        "the step, the synthetic reward beside it as the baseline.",
        "",
        frames.markdown(table, numeric=("reward s/step", "step s", "reward share")),
    ]


def steps_table(results: list[Result]) -> str:
    """The newest full GRPO run of each hardware class and shape: a row per configuration that ran (named by
    the levers it changes from the run's first), its median step, the rollout's share of it, its peak."""
    configurations = frames.configurations([r for r in results if not r.quick])
    if configurations.empty:
        return "No GRPO result yet.\n"
    newest = configurations.groupby(["hardware", "shape"]).file.transform("max")
    ran = configurations[(configurations.file == newest) & (configurations.status == "ok")]
    rows = [
        {
            "file": row.file,
            "size": row.shape,
            "levers": row.change,
            "s/step": f"{row.step_s:.2f}",
            "rollout": f"{row.rollout_share:.0%}",
            "peak GiB": f"{row.peak_bytes / 2**30:.2f}",
        }
        for row in ran.itertuples()
    ]
    return frames.markdown(pd.DataFrame(rows), numeric=("s/step", "rollout", "peak GiB")) + "\n"


def runs_table(results: list[Result]) -> str:
    """Every run that recorded its pace, a row each (its files share one calibration): the profile, the
    machine and its calibration, each part's seconds, the whole run's time, the estimate's error and the
    profile's time target."""
    runs: dict[tuple, list[Result]] = {}
    for result in results:
        found = pace.pace_of(result.record)
        if found is not None:
            # a run's files share its calibration; a GPU run's (none) share the part files' run stamp
            shared = found.calibration.python_s if found.calibration else result.path.split("/")[-1][:16]
            key = (pace.profile_name(result.record), result.quick, shared)
            runs.setdefault(key, []).append(result)
    rows = [_run_row(files) for files in runs.values()]
    if not rows:
        return "No run recorded its pace yet.\n"
    return frames.markdown(pd.DataFrame(rows)) + "\n"


def _run_row(files: list[Result]) -> dict[str, str]:
    paces = [pace.pace_of(r.record) for r in files]
    last = paces[-1]
    calibration = last.calibration
    bandwidth = f", {calibration.bandwidth_gb_s:.0f} GB/s" if calibration and calibration.bandwidth_gb_s else ""
    calibrated = f"{calibration.python_s * 1e3:.0f} ms, {calibration.torch_s * 1e3:.0f} ms" if calibration else "none"
    limit = [t for t in last.run_targets if "finishes within" in t.claim]
    estimate = last.run_estimated_s / last.run_s - 1 if last.run_s and last.run_estimated_s else None
    return {
        "run": files[0].path.split("/")[-1][:16],
        "profile": pace.profile_name(files[-1].record) + (" --quick" if files[-1].quick else ""),
        "machine": getattr(getattr(files[-1].record, "machine", None), "cpu", ""),
        "calibration (Python, tensor)": calibrated + bandwidth,
        "parts": ", ".join(f"{r.kind} {p.part_s:.0f} s" for r, p in zip(files, paces)),
        "whole run": pace.clock(last.run_s) if last.run_s else "(a part alone)",
        "estimate": f"{estimate:+.0%}" if estimate is not None else "",
        "time target": (f"{limit[0].limit / 60:g} min: " + ("met" if limit[0].met else "MISSED")) if limit else "",
    }
