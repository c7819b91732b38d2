"""One GRPO configuration on this machine: its ranks placed on GPUs, launched (one worker process, or many
ranks under ``accelerate launch``), sampled and listened to, stopped at a time limit or memory budget; its
record built from what the ranks said and what the sampler read."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.catalog.profiles import Levers
from benchmarks.model.memory.predict import GIB
from benchmarks.results import schema
from benchmarks.run.grpo import launch
from benchmarks.run.grpo.channel import Channel, RankReports, free_port, listen
from benchmarks.run.grpo.job import Job
from benchmarks.run.grpo.sampler import MemorySampler
from benchmarks.run.grpo.worker import ENGINE_CANNOT_START
from benchmarks.run.machine import nvml_gpus

# vLLM on CPU, in the worker's process: engine in-process (its memory is the worker's RSS,
# counted once), a 1 GiB KV cache, OpenMP on every core.
VLLM_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "all",
}


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


def die_with_parent() -> None:
    """In the worker before exec: SIGKILL when the parent ends, so that a harness stopped by a
    timeout or ^C leaves no worker behind (its own session keeps it from the terminal's signals)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _per_step(peaks: dict[tuple[int | None, str], int], step: int) -> dict[str, int]:
    return {phase: peak for (index, phase), peak in peaks.items() if index == step}


def run_configuration(
    job: Job,
    budget_bytes: int | None,
    log_path: Path,
    prefix: Sequence[str] = (),
    python: str = sys.executable,
    timeout_s: float | None = None,
    nvml: Any = None,
    place: launch.Rendezvous | None = None,
) -> schema.WorkerRecord:
    """One configuration's ranks on this machine (one worker process, or ``num_processes`` under
    ``accelerate launch``; run by ``python``, another stack's venv for instance; started under
    ``prefix``, e.g. ``unshare --net``); returns their record: status ok, oom, timeout (past
    ``timeout_s``), skipped or error, per rank where there are many.

    On CUDA (GPUs seen through ``nvml``, default: pynvml) the ranks get the first ``num_processes``
    visible GPUs and in server mode the next ones go to ``trl vllm-serve``; with too few the
    configuration is skipped. Device memory is read on exactly the GPUs the run uses."""
    nvml = nvml_gpus.load_nvml() if nvml is None else nvml
    place = place or launch.Rendezvous(
        machine_rank=0, main_process_ip="127.0.0.1", main_process_port=free_port()
    )  # one machine: its own rendezvous port
    levers = job.levers
    gpus = nvml_gpus.visible_gpus(nvml)
    placed = _place(job, gpus, place)
    if isinstance(placed, schema.WorkerRecord):
        return placed
    job, env, used = placed
    # its baseline: before the worker starts
    device = nvml_gpus.DeviceMemory(nvml, used, floor_gib=nvml_gpus.unified_floor_gib(used)) if used else None
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as scratch:
        channel = Channel(Path(scratch) / "channel")
        job_path = Path(scratch) / "job.json"
        replace(job, channel=channel.path).write(job_path)
        argv, config = launch.command(levers, job.dtype, bool(gpus), place, job_path, python)
        # the budget bounds the host's RSS on a CPU; on CUDA each rank caps its allocator at it instead
        run = _run_launcher([*prefix, *argv], env, log_path, channel, None if used else budget_bytes, device, timeout_s)
    record = _record(run.heard, run.sampler, device, levers, log_path, run.returncode)
    _verdict(record, run, timeout_s, budget_bytes)
    if used and record.status == "ok" and not run.heard.on_cuda:
        record.status = "error"
        record.reason = (
            f"placed on {len(used)} GPU(s) ({used[0].name}), the worker trained without CUDA: torch in the worker "
            "found no usable device (a CPU build of torch, or a driver older than its CUDA); not a GPU measurement"
        )
    if config is not None or levers.num_machines > 1:
        record.distribution = _distribution(run.heard, levers, config)
    sampler = run.sampler
    record.harness = schema.Harness(
        wall_s=run.wall_s,
        sampler_cpu_s=sampler.cpu_s,
        samples=sampler.samples,
        overhead_fraction=sampler.cpu_s / run.wall_s if run.wall_s else 0.0,
        gpus=[g.index for g in used],  # NVML indices
        launcher_peak_rss_bytes=max((v for (r, _, _), v in sampler.peaks.items() if r is None), default=0),
    )
    return record


def _place(
    job: Job, gpus: list[schema.Gpu], place: launch.Rendezvous
) -> tuple[Job, dict[str, str], list[schema.Gpu]] | schema.WorkerRecord:
    """The job, the launcher's environment and the GPUs it uses: the ranks get the first visible GPUs, a
    server started here the next ones, its address in the job; or the record of a configuration skipped."""
    levers = job.levers
    env = {**os.environ, **VLLM_CPU_ENV, "PYTHONUNBUFFERED": "1"}
    used: list[schema.Gpu] = []
    # The server beside the first machine's ranks, unless a machine of its own runs it (run_machines).
    server_here = job.server_mode and place.machine_rank == 0 and job.server_host is None
    if gpus:
        server_count = levers.vllm_server_tensor_parallel_size * levers.vllm_server_data_parallel_size
        split = nvml_gpus.split(gpus, levers.num_processes, server_count if server_here else 0)
        if isinstance(split, str):
            return skipped(split)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(split.trainer)
        job = replace(job, server_devices=tuple(split.server))
        used = [g for g in gpus if g.uuid in split.trainer + split.server]
    elif launch.cpu_skip_reason(levers):
        return skipped(launch.cpu_skip_reason(levers))
    if job.server_mode:
        if job.server_host is None:
            job = replace(job, server_host=place.main_process_ip, server_port=free_port())
        job = replace(job, server_starts_here=server_here)
    return job, env, used


@dataclass
class LauncherRun:
    """What a launcher's run left: what its ranks said, the memory sampler, its time and exit status."""

    heard: RankReports
    sampler: MemorySampler
    wall_s: float
    returncode: int | None
    timed_out: bool


def _run_launcher(
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    channel: Channel,
    budget_bytes: int | None,
    device: nvml_gpus.DeviceMemory | None,
    timeout_s: float | None,
) -> LauncherRun:
    """The launcher in a session of its own, sampled and listened to until it ends, stopped at
    ``timeout_s``; nothing of it outlives the call, an interrupt included."""
    with open(log_path, "w") as log:
        launcher = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    sampler = MemorySampler(launcher.pid, budget_bytes, device)
    sampler.start()
    started = time.monotonic()
    timed_out = threading.Event()

    def stop_on_time() -> None:
        timed_out.set()
        os.killpg(launcher.pid, signal.SIGKILL)

    # a daemon: a run stopped meanwhile (SIGTERM, ^C) must not wait for it to fire
    timer = threading.Timer(timeout_s, stop_on_time) if timeout_s else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        heard = listen(channel, launcher, sampler, log_path)
        launcher.wait()
    finally:  # on an interrupt too: no timer, sampler or worker outlives the configuration
        if timer:
            timer.cancel()
        _stop_group(launcher)
        sampler.stopped.set()
        sampler.join()
    return LauncherRun(heard, sampler, time.monotonic() - started, launcher.returncode, timed_out.is_set())


def _verdict(record: schema.WorkerRecord, run: LauncherRun, timeout_s: float | None, budget_bytes: int | None) -> None:
    """A run stopped at its time limit or memory budget says so, with the phase it was in and where the
    memory stood in the steps that did not finish."""
    sampler = run.sampler
    if run.timed_out:
        record.status, record.phase = (
            "timeout",
            sampler.where.get(min(run.heard.hellos, default=None), (None, "setup"))[1],
        )
        record.reason = f"still running after the configuration's limit of {timeout_s:g} s; the worker tree was stopped"
    elif sampler.over_budget is not None and sampler.below_floor:
        record.status, record.phase = "oom", sampler.over_budget[1]
        floor = sampler.device.floor_bytes / GIB
        record.reason = (
            f"unified memory: the host's available memory fell under the {floor:g} GiB floor; the worker tree was "
            "stopped before the machine ran out"
        )
    elif sampler.over_budget is not None:
        record.status, record.phase = "oom", sampler.over_budget[1]
        record.reason = f"worker tree RSS passed the {budget_bytes / GIB:.1f} GiB budget"
    if record.status == "ok":
        return
    finished = {step.step for step in record.steps}

    def unfinished(peaks: dict[tuple[int | None, int | None, str], int]) -> dict[str, int] | None:
        found: dict[str, int] = {}
        for (_, index, phase), value in peaks.items():
            if index is not None and index not in finished:
                found[phase] = max(found.get(phase, 0), value)
        return found if peaks else None

    record.unfinished_peak_rss_bytes = unfinished(sampler.peaks)
    record.unfinished_peak_device_bytes = unfinished(sampler.device_process_peaks) if record.device else None


def _stop_group(launcher: subprocess.Popen) -> None:
    """The launcher's whole process group killed, if it still runs (its workers with it)."""
    if launcher.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


def _record(
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
    refused = [line for line in tail.splitlines() if any(m in line for m in ENGINE_CANNOT_START)]
    if refused:  # vLLM's engine process refused to start; the worker saw only "initialization failed"
        record.status, record.phase = "oom", "engine_start"
        record.reason = f"engine cannot start: {refused[-1][:400]}"


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


def _distribution(heard: RankReports, levers: Levers, config: dict | None) -> schema.Distribution:
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


def skipped(reason: str) -> schema.WorkerRecord:
    return schema.WorkerRecord(status="skipped", reason=reason)
