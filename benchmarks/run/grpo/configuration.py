"""One GRPO configuration on this machine: its ranks placed on GPUs, launched (one worker process, or many
ranks under ``accelerate launch``), sampled and listened to, stopped at a time limit or memory budget; its
record built from what the ranks said and what the sampler read (``outcome``)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.model.memory.predict import GIB
from benchmarks.results import schema
from benchmarks.run.grpo import launch
from benchmarks.run.grpo.channel import Channel, RankReports, free_port, listen
from benchmarks.run.grpo.job import Job
from benchmarks.run.grpo.outcome import distribution_of, launch_record
from benchmarks.run.grpo.sampler import MemorySampler
from benchmarks.run.machine import nvml_gpus
from benchmarks.run.vllm_env import VLLM_CPU_ENV


def die_with_parent() -> None:
    """In the worker before exec: SIGKILL when the parent ends, so that a harness stopped by a
    timeout or ^C leaves no worker behind (its own session keeps it from the terminal's signals)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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
    record = launch_record(run.heard, run.sampler, device, levers, log_path, run.returncode)
    _verdict(record, run, timeout_s, budget_bytes)
    if used and record.status == "ok" and not run.heard.on_cuda:
        record.status = "error"
        record.reason = (
            f"placed on {len(used)} GPU(s) ({used[0].name}), the worker trained without CUDA: torch in the worker "
            "found no usable device (a CPU build of torch, or a driver older than its CUDA); not a GPU measurement"
        )
    if config is not None or levers.num_machines > 1:
        record.distribution = distribution_of(run.heard, levers, config)
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


def skipped(reason: str) -> schema.WorkerRecord:
    return schema.WorkerRecord(status="skipped", reason=reason)
