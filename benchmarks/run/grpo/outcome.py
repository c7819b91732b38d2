"""A launch's outcome as its record (``launch_record``): each rank's steps with their peaks from what the ranks said
and what the sampler read, the configuration's steps the maximum over its ranks, the ranks' summaries, how the
launch ended (the first rank that did not finish, or a silent one), and where many ranks ran, how they ran."""

from __future__ import annotations

import re
import signal
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.catalog.profiles import Levers
from benchmarks.results import schema
from benchmarks.run.grpo.channel import RankReports
from benchmarks.run.grpo.sampler import MemorySampler
from benchmarks.run.grpo.worker import engine_refusal
from benchmarks.run.machine import nvml_gpus


def summarise(steps: list[schema.Step], peak_measure: str) -> schema.Summary | None:
    """Medians and peaks over the measured steps (all steps where none is measured); the headline
    peak is each step's ``peaks`` (device memory on CUDA, host RSS on CPU), ``peak_measure`` says which.
    Per phase, each phase's own peak (``Step.phase_peaks``: torch's allocator in the phase on CUDA, with
    the device figure per phase beside it)."""
    measured = [s for s in steps if not s.warmup] or steps
    if not measured:
        return None

    def by_phase(peaks_of: Callable[[schema.Step], dict[str, int]]) -> dict[str, int]:
        peaks: dict[str, int] = {}
        for step in measured:
            for phase, value in peaks_of(step).items():
                peaks[phase] = max(peaks.get(phase, 0), value)
        return peaks

    walls = [s.wall_s for s in measured]
    headline = [max(s.peaks.values(), default=0) for s in measured]
    on_cuda = any(s.cuda_peak_bytes for s in measured)
    last = measured[-1]
    return schema.Summary(
        measured_steps=len(measured),
        step_s_median=statistics.median(walls),
        step_s_min=min(walls),
        step_s_max=max(walls),
        completion_tokens_per_s_median=statistics.median(s.completion_tokens_per_s for s in measured),
        phase_s_median={
            phase: statistics.median(s.phase_s.get(phase, 0.0) for s in measured)
            for phase in sorted({p for s in measured for p in s.phase_s})
        },
        peak_bytes=max(headline),
        peak_bytes_by_phase=by_phase(lambda s: s.phase_peaks),
        peak_measure=peak_measure,
        phase_peak_measure=schema.TORCH_ALLOCATED if on_cuda else "",
        peak_device_bytes_by_phase=by_phase(lambda s: s.peaks) if on_cuda else None,
        peak_rss_bytes=max(max(s.peak_rss_bytes.values(), default=0) for s in measured),
        peak_rss_bytes_by_phase=by_phase(lambda s: s.peak_rss_bytes),
        peak_repeat_spread=(max(headline) - min(headline)) / max(headline) if max(headline) else 0.0,
        optimizer_state_bytes=last.optimizer_state_bytes,
        grad_bytes=last.grad_bytes,
        trainable_params=last.trainable_params,
        reference_model_bytes=last.reference_model_bytes,
        model_states=last.model_states,
    )


def _per_step(peaks: dict[tuple[int | None, str], int], step: int) -> dict[str, int]:
    return {phase: peak for (index, phase), peak in peaks.items() if index == step}


def launch_record(
    heard: RankReports,
    sampler: MemorySampler,
    device: nvml_gpus.DeviceMemory | None,
    levers: Levers,
    log_path: Path,
    exit_status: int | None,
) -> schema.WorkerRecord:
    """The record of a launch from what its ranks said and what the sampler read: per rank its steps'
    peaks and summary; the configuration's steps the maximum over its ranks; how it ended."""
    many = levers.distributed_type != "no"
    ranks, measure = _rank_records(heard, sampler, device, many)
    merged = merged_steps([heard.steps.get(rank, []) for rank in sorted(set(heard.hellos))])
    record = schema.WorkerRecord(status="ok", steps=merged, summary=summarise(merged, measure))
    record.versions, record.device = heard.versions, heard.on_cuda.get(min(heard.on_cuda, default=0))
    if many:
        record.ranks = ranks
    record.setup_peak_rss_bytes = max((v for (_, i, _), v in sampler.peaks.items() if i is None), default=0)
    _ending(record, heard, levers, log_path, exit_status)
    return record


def _rank_records(
    heard: RankReports, sampler: MemorySampler, device: nvml_gpus.DeviceMemory | None, many: bool
) -> tuple[list[schema.Rank], str]:
    """Each rank's steps with their peaks (host RSS; on CUDA its processes' device memory, or the devices'
    use above the baseline where NVML lists none of them), its summary, and what the peaks measure."""
    on_device = device is not None and bool(heard.on_cuda)
    ranks: list[schema.Rank] = []
    measure = schema.HOST_RSS
    for rank in sorted(set(heard.hellos)):
        steps = heard.steps.get(rank, [])
        rss, held = sampler.rank_peaks(rank)
        device_peaks, measure = _device_headline(device, sampler, held, many) if on_device else (held, measure)
        for step in steps:
            step.peak_rss_bytes = _per_step(rss, step.step)
            if on_device:
                step.peak_device_bytes = _per_step(device_peaks, step.step)
                step.peak_device_used_bytes = _per_step(sampler.device_used_peaks, step.step)
                step.peak_device_process_bytes = _per_step(held, step.step) if device.unified and held else None
        ranks.append(schema.Rank(rank=rank, summary=summarise(steps, measure)))
    return ranks, measure


def _device_headline(
    device: nvml_gpus.DeviceMemory, sampler: MemorySampler, held: dict, many: bool
) -> tuple[dict[tuple[int | None, str], int], str]:
    """A rank's headline device peaks and what they measure: on unified memory the pool's use above the baseline
    (the worker's CPU-side memory is in the same pool; NVML's per-process figure is kept beside it); else its
    processes' NVML usedGpuMemory, or where NVML lists none of them the devices' use above the baseline."""
    if device.unified and not many:
        return sampler.device_used_peaks, (
            f"unified memory used above the baseline ({device.source}); NVML's per-process usedGpuMemory beside it"
        )
    if held:
        return held, "device memory held by the worker's processes (NVML usedGpuMemory)"
    # many ranks share the devices: their use above the baseline is no one rank's
    return held if many else sampler.device_used_peaks, f"device memory used above the baseline ({device.source})"


def _ending(
    record: schema.WorkerRecord, heard: RankReports, levers: Levers, log_path: Path, exit_status: int | None
) -> None:
    """How the ranks ended: the first that did not finish (oom, skipped, an error; an engine that could not
    start), independent runs where one of many ranks was asked for, or ranks that ended without a word."""
    expected = levers.num_processes
    bad = [(rank, e) for rank, e in heard.endings if e["event"] != "done"]
    if bad:
        rank, ending = bad[0]
        _bad_ending(record, ending, log_path, exit_status)
        if levers.distributed_type != "no":
            record.reason = f"rank {rank}: {record.reason}"
    elif len(heard.hellos) != len(set(heard.hellos)):
        record.status = "error"
        record.reason = (
            f"{len(heard.hellos)} processes reported ranks {sorted(heard.hellos)}: the launcher started independent "
            "runs, not one run of many ranks"
        )
    elif len(heard.endings) < expected:
        record.status = "error"
        record.phase, record.reason = silent_ending(heard, expected, exit_status)
        record.log_tail = log_path.read_text(errors="replace")[-3000:]


def silent_ending(heard: RankReports, expected: int, exit_status: int | None) -> tuple[str | None, str]:
    """(the phase, the reason) where ranks ended without a word: how the launcher ended (a signal by name, and
    SIGKILL's likely sender), and where each silent rank last said it was."""
    ended = {rank for rank, _ in heard.endings}
    silent = [(rank, heard.where.get(rank, (None, "setup"))) for rank in range(expected) if rank not in ended]
    where = "; ".join(
        f"rank {rank} was in {phase}" + (f" of step {step}" if step is not None else "")
        for rank, (step, phase) in silent
    )
    how = f"the launcher exited {exit_status}"
    if exit_status is not None and exit_status < 0:
        how = f"killed by {signal.Signals(-exit_status).name}"
        if -exit_status == signal.SIGKILL:
            how += " (under memory pressure the kernel's out-of-memory killer sends it: see dmesg)"
    reason = f"{len(ended)} of {expected} ranks ended with a word; {how}; {where}"
    return (silent[0][1][1] if silent else None), reason


def _bad_ending(record: schema.WorkerRecord, ending: dict, log_path: Path, exit_status: int | None) -> None:
    record.status = ending["event"]
    record.phase, record.reason, record.error = ending.get("phase"), ending.get("reason"), ending.get("error")
    if ending.get("cuda_peak_bytes"):
        record.unfinished_cuda_peak_bytes = schema.decode(schema.CudaPeaks, ending["cuda_peak_bytes"], "oom")
    if record.status != "error":
        return
    tail = log_path.read_text(errors="replace")[-3000:]
    record.reason, record.log_tail = ending.get("error", f"worker exit {exit_status}"), tail
    refused = [line for line in tail.splitlines() if engine_refusal(line)]
    if refused:  # vLLM's engine process refused to start; the worker saw only "initialization failed"
        record.status, record.phase, record.reason = "oom", "engine_start", engine_refusal(refused[-1])
    elif ENGINE_FAILED in record.reason:  # any other cause is the engine process's own last error, an error still
        causes = [m.group(0) for m in map(RAISED.search, tail.splitlines()) if m and ENGINE_FAILED not in m.group(0)]
        record.phase = "engine_start"
        record.reason = f"engine cannot start: {causes[-1][:400]}" if causes else record.reason


# What vLLM's engine client raises when its engine process died starting (v1/engine/utils.py); the cause is in
# the log the engine process wrote, as the last exception it printed.
ENGINE_FAILED = "Engine core initialization failed"
RAISED = re.compile(r"\b[A-Z]\w*(?:Error|Exception): .+")


def merged_steps(per_rank: list[list[schema.Step]]) -> list[schema.Step]:
    """Each step as the configuration's figure: the slowest rank's time, every phase's maximum over
    ranks, memory the maximum over ranks, completions summed over ranks."""
    if len(per_rank) <= 1:
        return per_rank[0] if per_rank else []
    merged = []
    for steps in zip(*per_rank, strict=False):
        slowest = max(steps, key=lambda s: s.wall_s)
        tokens = sum(s.completion_tokens for s in steps)

        def largest(figures: Callable[[schema.Step], dict[str, Any] | None], steps: tuple = steps) -> dict | None:
            """Each key's largest value over the ranks' figures of this step (None where no rank has them)."""
            found = [figures(s) for s in steps if figures(s) is not None]
            return {k: max(d.get(k, 0) for d in found) for d in found for k in d} if found else None

        merged.append(
            replace(
                slowest,
                phase_s=largest(lambda s: s.phase_s),
                completion_tokens=tokens,
                completion_tokens_per_s=tokens / slowest.wall_s if slowest.wall_s else 0.0,
                optimizer_state_bytes=max(s.optimizer_state_bytes for s in steps),
                grad_bytes=max(s.grad_bytes for s in steps),
                reference_model_bytes=max(s.reference_model_bytes for s in steps),
                model_states=max(
                    (s.model_states for s in steps if s.model_states), key=lambda m: m.total, default=None
                ),
                peak_rss_bytes=largest(lambda s: s.peak_rss_bytes),
                peak_device_bytes=largest(lambda s: s.peak_device_bytes),
                peak_device_used_bytes=largest(lambda s: s.peak_device_used_bytes),
                peak_device_process_bytes=largest(lambda s: s.peak_device_process_bytes),
            )
        )
    return merged


def distribution_of(heard: RankReports, levers: Levers, config: dict | None) -> schema.Distribution:
    """How the ranks ran, from their own reports (rank 0's, the partition share the largest over ranks)."""
    seen = heard.distribution
    first = seen[min(seen)] if seen else {}
    return schema.Distribution(
        world_size=first.get("world_size"),
        num_machines=levers.num_machines,
        distributed_type=first.get("distributed_type", "unknown: no rank reported it"),
        backend=first.get("backend"),
        zero_stage=first.get("zero_stage"),
        fsdp_version=first.get("fsdp_version"),
        held_parameter_fraction=max((d["held_parameter_fraction"] for d in seen.values()), default=None),
        launcher="accelerate launch" if config is not None else "python",
        config=config,
        notes=first.get("notes", []),
    )
