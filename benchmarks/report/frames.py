"""Result records as pandas DataFrames, one row per measured thing: the single shape every table,
comparison and figure is made from (``regenerate``, ``side_by_side``, ``figures``), and markdown made by
pandas itself."""

from __future__ import annotations

import pandas as pd

from benchmarks.catalog.levers import differences
from benchmarks.catalog.profiles import Levers, load_hardware, load_shapes
from benchmarks.model.memory.sharding import rank_model_states
from benchmarks.report.validation import PHASE_ORDER, Check
from benchmarks.results.schema import Configuration, ContextFile, DecodeFile, Rank, Result, RewardsFile, Summary


def gpu_class(hardware: str) -> str:
    """The guide's grouping of a hardware class (an unknown class stands for itself)."""
    catalog = load_hardware()
    return catalog[hardware].gpu_class if hardware in catalog else hardware


def configurations(results: list[Result]) -> pd.DataFrame:
    """One row per GRPO configuration on one device (``grpo`` files; many ranks are ``ranks``'): where and
    when it ran, its levers (``levers``, as run; ``change``, those that differ from its file's first
    configuration; ``lever_<name>`` columns, as the file recorded them), its status, step time (median and
    range) and headline peak (device memory on CUDA, host RSS on CPU) with its spread between steps."""
    rows = []
    for result in results:
        if result.kind != "grpo":
            continue
        base = next((c.lever_values for c in result.record.configurations), None)
        for number, configuration in enumerate(result.record.configurations, 1):
            summary = configuration.summary
            rows.append(
                {
                    "file": result.path,
                    "date": result.date,
                    "started": result.record.started,
                    "hardware": result.hardware,
                    "gpu_class": gpu_class(result.hardware),
                    "shape": result.shape,
                    "quick": result.quick,
                    "number": number,
                    "name": configuration.name,
                    "levers": configuration.lever_values,
                    "change": lever_change(configuration.lever_values, base) + held_gpus(configuration),
                    "status": configuration.status,
                    "phase": configuration.phase,
                    "reason": configuration.reason,
                    "step_s": summary.step_s_median if summary else None,
                    "step_s_min": summary.step_s_min if summary else None,
                    "step_s_max": summary.step_s_max if summary else None,
                    "rollout_share": rollout_share(summary) if summary else None,
                    "peak_bytes": summary.peak_bytes if summary else None,
                    "peak_measure": summary.peak_measure if summary else None,
                    "peak_spread": summary.peak_repeat_spread if summary else None,
                    **{f"lever_{k}": v for k, v in configuration.levers.items()},
                }
            )
    return pd.DataFrame(rows)


def held_gpus(configuration: Configuration) -> str:
    """How many GPUs a configuration held, where more than one (a vLLM server's beside the trainer's)."""
    held = len(configuration.harness.gpus) if configuration.harness else 0
    return f" (over {held} GPUs)" if held > 1 else ""


def lever_change(levers: Levers, base: Levers) -> str:
    """The levers that differ from ``base``, as ``name=value``; "baseline" where none does."""
    return ", ".join(f"{name}={value}" for name, value in differences(levers, base)) or "baseline"


def rollout_share(summary: Summary) -> float | None:
    """The rollout's part of the median step (sleep mode's transfers with it)."""
    phases = summary.phase_s_median
    rollout = phases.get("rollout", 0.0) + phases.get("sleep_wake", 0.0)
    return rollout / summary.step_s_median if summary.step_s_median else None


def reward_shares(results: list[Result]) -> pd.DataFrame:
    """One row per GRPO configuration (full runs) that ran a real reward in its steps (the ``reward`` lever),
    and per configuration that differs from one only in running the synthetic reward (its baseline): the
    reward's median seconds a step, the step's, and the share."""
    rows = []
    for result in results:
        if result.kind != "grpo" or result.quick:
            continue
        ran = [c for c in result.record.configurations if c.status == "ok" and c.summary]
        real = [c for c in ran if c.lever_values.reward != "synthetic"]
        bases = {c.lever_values.changed(reward="synthetic") for c in real}
        for configuration in ran:
            if configuration in real or configuration.lever_values in bases:
                summary = configuration.summary
                reward_s = summary.phase_s_median.get("reward", 0.0)
                rows.append(
                    {
                        "file": result.path,
                        "reward": configuration.lever_values.reward,
                        "configuration": configuration.name,
                        "reward_s": reward_s,
                        "step_s": summary.step_s_median,
                        "share": reward_s / summary.step_s_median,
                    }
                )
    return pd.DataFrame(rows, columns=["file", "reward", "configuration", "reward_s", "step_s", "share"])


def provenance(result: Result) -> tuple[str, str]:
    """Where a result file ran (its GPUs by name, else its CPU) and its commit (short, dirty marked)."""
    record = result.record
    if isinstance(record, RewardsFile):
        info, commit = record.machine_info, record.commit_info
        dirty = {True: " (dirty)", False: ""}.get(commit.get("dirty"), " (dirty unknown)")
        return str(info.get("cpu", {}).get("brand_raw", "unknown")), (commit.get("id") or "unknown")[:7] + dirty
    gpus = sorted({gpu.name for gpu in record.machine.gpus})
    machine = " + ".join(gpus) if gpus else record.machine.cpu
    return machine, record.commit.short


def ranks(results: list[Result]) -> pd.DataFrame:
    """One row per rank of each configuration of ``distributed`` files (a one-process configuration:
    one row, rank 0): how the configuration really ran, the rank's model states, headline peak and step
    time; with the analytic model's model states for that rank (``predicted_states_bytes``)."""
    rows = []
    for result in results:
        if result.kind != "distributed":
            continue
        shape = load_shapes()[result.shape]
        for configuration in result.record.configurations:
            ran = configuration.distribution
            levers = configuration.lever_values
            entries = configuration.ranks or [Rank(rank=0, summary=configuration.summary)]
            for rank in entries:
                summary = rank.summary
                states = summary.model_states if summary else None
                rows.append(
                    {
                        "file": result.path,
                        "hardware": result.hardware,
                        "configuration": configuration.name,
                        "status": configuration.status,
                        "reason": configuration.reason,
                        "world_size": ran.world_size if ran else 1,
                        "distributed_type": ran.distributed_type if ran else "NO",
                        "zero_stage": ran.zero_stage if ran else None,
                        "held_parameter_fraction": ran.held_parameter_fraction if ran else 1.0,
                        "rank_number": rank.rank,
                        "machine_rank": rank.machine_rank,
                        "states": states,
                        "predicted_states_bytes": rank_model_states(
                            shape, result.record.profile.distributed.dtype, levers
                        ).total,
                        "peak_bytes": summary.peak_bytes if summary else None,
                        "peak_measure": summary.peak_measure if summary else None,
                        "step_s": summary.step_s_median if summary else None,
                        "rollout_share": rollout_share(summary) if summary else None,
                    }
                )
    return pd.DataFrame(rows)


def phases(result: Result) -> pd.DataFrame:
    """Through the last measured step of each configuration that ran: each phase in order, its
    exclusive seconds and its own peak (torch's allocator in the phase on CUDA, host RSS on CPU)."""
    rows = []
    for number, configuration in enumerate(result.record.configurations, 1):
        steps = [s for s in configuration.steps if not s.warmup]
        if configuration.status != "ok" or not steps:
            continue
        step = steps[-1]
        for phase in PHASE_ORDER:
            if phase in step.phase_s and phase in step.phase_peaks:
                peak = step.phase_peaks[phase]
                rows.append({"number": number, "phase": phase, "seconds": step.phase_s[phase], "peak_bytes": peak})
    return pd.DataFrame(rows, columns=["number", "phase", "seconds", "peak_bytes"])


def sweep(run: DecodeFile) -> pd.DataFrame:
    """One row per decode point: engine, batch, context, status (and reason), speed and GB/s."""
    columns = ["engine", "batch", "context", "status", "reason", "ttft_s", "decode_tokens_per_s"]
    columns += ["achieved_gb_s", "efficiency_vs_ceiling"]
    return pd.DataFrame([{c: getattr(point, c) for c in columns} for point in run.sweep], columns=columns)


def projections(run: DecodeFile) -> pd.DataFrame:
    """Predicted rollout seconds per size class (``size``), hardware class and bandwidth basis."""
    rows = [
        {"hardware": r.hardware, "size": r.shape, "basis": r.basis, "gb_per_s": r.gb_per_s, "rollout_s": r.rollout_s}
        for r in run.projections
    ]
    return pd.DataFrame(rows, columns=["hardware", "size", "basis", "gb_per_s", "rollout_s"])


def contenders(run: ContextFile) -> pd.DataFrame:
    """One row per contender of a context search."""
    columns = ["name", "stack", "status", "reason", "max_completion_tokens", "first_failing_tokens", "at_ceiling"]
    columns += ["predicted_max_completion_tokens"]
    return pd.DataFrame([{c: getattr(entry, c) for c in columns} for entry in run.contenders], columns=columns)


def reward_rows(run: RewardsFile) -> pd.DataFrame:
    """One row per reward benchmark row: which reward, whose code, on which inputs, completions/s."""
    columns = ["reward", "implementation", "batch", "words", "format", "completions_per_s"]
    return pd.DataFrame([{c: getattr(row.extra_info, c) for c in columns} for row in run.benchmarks], columns=columns)


def checks(found: list[Check]) -> pd.DataFrame:
    """The analytic model against every measured configuration and phase."""
    columns = ["file", "configuration", "phase", "predicted_bytes", "measured_bytes", "error", "held_out", "measure"]
    columns.append("heap")
    return pd.DataFrame([{c: getattr(check, c) for c in columns} for check in found], columns=columns)


def count(value: float | None, missing: str = "") -> str:
    """A whole number as a table cell (a frame holds it as a float where some rows lack it)."""
    return missing if value is None or pd.isna(value) else f"{value:.0f}"


def markdown(frame: pd.DataFrame, numeric: tuple[str, ...] = ()) -> str:
    """A markdown table by pandas: cells as they stand (already formatted), ``numeric`` columns
    right-aligned."""
    align = tuple("right" if column in numeric else "left" for column in frame.columns)
    return frame.to_markdown(index=False, colalign=align, disable_numparse=True)
