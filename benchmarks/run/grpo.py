"""Timed GRPO steps: every configuration of a profile in its own worker process.

The parent samples the memory of the worker and its children (RSS, every 20 ms and at every
phase boundary; on CUDA also the device memory its processes hold, vLLM's included: see
``benchmarks.run.devices``) and attributes each sample to the step and phase the worker last
reported. A worker tree above the profile's memory budget is stopped and recorded as ``oom``
in its phase, one past its time limit as ``timeout``. The result file is rewritten atomically
after every configuration and says whether the run is complete, so an interrupted run keeps
everything that finished and says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import fnmatch
import functools
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.catalog.profiles import Levers, Profile, configurations, load_shapes
from benchmarks.catalog.shapes import Shape
from benchmarks.model.estimate import GIB, rank_model_states
from benchmarks.results import schema
from benchmarks.run import cluster, devices, launch, machine
from benchmarks.run.models import materialise
from benchmarks.run.worker import ENGINE_CANNOT_START, SERVER_NEEDS_CUDA, server_command

SAMPLE_INTERVAL_S = 0.02
# vLLM on CPU, in the worker's process: engine in-process (its memory is the worker's RSS,
# counted once), a 1 GiB KV cache, OpenMP on every core.
VLLM_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "all",
}


class MemorySampler(threading.Thread):
    """Peak memory per rank and (step, phase), read every 20 ms and at every phase boundary: the host
    RSS of each rank's process and its children, and on CUDA the device memory they hold
    (``devices.DeviceMemory``); what belongs to no rank (the launcher) is rank None. Stops the whole
    tree when its RSS passes ``budget_bytes``."""

    def __init__(self, pid: int, budget_bytes: int | None, device: devices.DeviceMemory | None = None) -> None:
        super().__init__(daemon=True)
        import psutil  # the worker extra's: `nox -s tables` runs this package without it

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self.budget_bytes = budget_bytes
        self.ranks: dict[int, Any] = {}  # rank -> its process, from its hello
        self.where: dict[int | None, tuple[int | None, str]] = {None: (None, "setup")}
        self.peaks: dict[tuple[int | None, int | None, str], int] = {}  # (rank, step, phase) -> host RSS
        self.over_budget: tuple[int | None, str] | None = None
        self.samples = 0
        self.cpu_s = 0.0
        self.members: dict[int | None, list] = {None: [self.root]}  # rank -> its processes
        self.forks: set[int] = set()  # children that are their parent's fork: their own pages only
        self.device = device
        self.device_process_peaks: dict[tuple[int | None, int | None, str], int] = {}  # NVML usedGpuMemory
        self.device_used_peaks: dict[tuple[int | None, str], int] = {}  # the devices' use above the baseline
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def add_rank(self, rank: int, pid: int) -> None:
        with self.lock:
            self.ranks[rank] = self.psutil.Process(pid)
            self.where[rank] = self.where.get(rank, (None, "setup"))
        self.list_members()

    def list_members(self) -> None:
        """Which processes are whose: each rank's process and its children; the rest the launcher's.
        A child that runs its parent's command line is a fork not (yet) replaced by another program:
        its pages are its parent's, shared copy-on-write, and only its own (USS) are counted."""
        everyone = [self.root, *self.root.children(recursive=True)]
        owned: dict[int | None, list] = {}
        taken: set[int] = set()
        for rank, process in list(self.ranks.items()):
            try:
                owned[rank] = [process, *process.children(recursive=True)]
            except self.psutil.Error:  # the rank has ended
                owned[rank] = []
            taken |= {member.pid for member in owned[rank]}
        owned[None] = [member for member in everyone if member.pid not in taken]
        forks = set()
        for member in everyone[1:]:
            try:
                if member.cmdline() == member.parent().cmdline():
                    forks.add(member.pid)
            except (self.psutil.Error, AttributeError):  # ended, or its parent has
                continue
        self.members, self.forks = owned, forks

    def rss(self, members: list) -> int:
        total = 0
        for process in members:
            try:
                total += process.memory_full_info().uss if process.pid in self.forks else process.memory_info().rss
            except Exception:  # a child that ended between listing and reading
                continue
        return total

    def sample(self, also: dict[int | None, tuple[int | None, str]] | None = None) -> None:
        """One reading per rank, charged to its current (step, phase) and to ``also``'s if given."""
        members = self.members
        total = 0
        ranks = {rank: {m.pid for m in processes} for rank, processes in members.items() if rank is not None}
        held_by_rank, used = self.device.read(ranks) if self.device else ({}, 0)  # one NVML sweep for every rank
        with self.lock:
            for rank, processes in members.items():
                rss = self.rss(processes)
                total += rss
                held = held_by_rank.get(rank)
                now = self.where.get(rank, (None, "setup"))
                for step, phase in {now, (also or {}).get(rank, now)}:
                    key = (rank, step, phase)
                    self.peaks[key] = max(self.peaks.get(key, 0), rss)
                    if held is not None:
                        self.device_process_peaks[key] = max(self.device_process_peaks.get(key, 0), held)
            if self.device:
                first = self.where.get(min(self.ranks, default=None), (None, "setup"))
                self.device_used_peaks[first] = max(self.device_used_peaks.get(first, 0), used)
            self.samples += 1
        if self.budget_bytes and total > self.budget_bytes and self.over_budget is None:
            self.over_budget = self.where.get(min(self.ranks, default=None), (None, "setup"))
            os.killpg(self.root.pid, signal.SIGKILL)

    def move_to(self, rank: int, where: tuple[int | None, str]) -> None:
        """A phase boundary of ``rank``: the reading there ends its old phase and starts the new one,
        so that a phase shorter than the sampling interval still has its memory read."""
        started = time.process_time()
        previous = self.where.get(rank, (None, "setup"))
        self.where[rank] = where
        self.sample(also={rank: previous})
        self.cpu_s += time.process_time() - started

    def rank_peaks(self, rank: int) -> tuple[dict[tuple[int | None, str], int], dict[tuple[int | None, str], int]]:
        """(host RSS peaks, device peaks) of one rank by (step, phase)."""

        def of(peaks: dict) -> dict[tuple[int | None, str], int]:
            return {(step, phase): value for (r, step, phase), value in peaks.items() if r == rank}

        return of(self.peaks), of(self.device_process_peaks)

    def run(self) -> None:
        listed = 0.0
        while not self.stopped.is_set():
            started = time.thread_time()
            if time.monotonic() - listed > 0.5:
                try:
                    self.list_members()
                    listed = time.monotonic()
                except Exception:  # the launcher is gone
                    break
            self.sample()
            self.cpu_s += time.thread_time() - started
            self.stopped.wait(SAMPLE_INTERVAL_S)


def _summary(steps: list[schema.Step], peak_measure: str) -> schema.Summary | None:
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


def _die_with_parent() -> None:
    """In the worker before exec: SIGKILL when the parent ends, so that a harness stopped by a
    timeout or ^C leaves no worker behind (its own session keeps it from the terminal's signals)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _per_step(peaks: dict[tuple[int | None, str], int], step: int) -> dict[str, int]:
    return {phase: peak for (index, phase), peak in peaks.items() if index == step}


def with_every_lever(job: dict) -> dict:
    """``job`` with every lever the worker reads: those it leaves out at their defaults."""
    return {**job, "levers": {**asdict(Levers()), **job["levers"]}}


def server_mode(levers: dict) -> bool:
    return levers["use_vllm"] and levers["vllm_mode"] == "server"


class Channel:
    """The Unix socket every rank of a configuration reports on: one JSON event per line, each
    carrying its rank (a socket, not a pipe: launchers close the file descriptors they do not know)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(64)

    def events(self, launcher: subprocess.Popen) -> Iterator[dict]:
        """Every event of every rank until the launcher has ended and every rank has hung up."""
        selector = selectors.DefaultSelector()
        selector.register(self.server, selectors.EVENT_READ)
        pending: dict[socket.socket, bytes] = {}
        try:
            while True:
                ready = selector.select(timeout=0.2)
                for key, _ in ready:
                    if key.fileobj is self.server:
                        connection, _ = self.server.accept()
                        selector.register(connection, selectors.EVENT_READ)
                        pending[connection] = b""
                        continue
                    connection = key.fileobj
                    data = connection.recv(1 << 16)
                    if not data:
                        selector.unregister(connection)
                        connection.close()
                        del pending[connection]
                        continue
                    *lines, pending[connection] = (pending[connection] + data).split(b"\n")
                    for line in lines:
                        yield json.loads(line)
                if not ready and not pending and launcher.poll() is not None:
                    return
        finally:
            for connection in pending:
                connection.close()
            selector.close()
            self.server.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_configuration(
    job: dict,
    budget_bytes: int | None,
    log_path: Path,
    prefix: Sequence[str] = (),
    python: str = sys.executable,
    timeout_s: float | None = None,
    nvml: Any = None,
    place: launch.Place | None = None,
) -> schema.WorkerRecord:
    """One configuration's ranks on this machine (one worker process, or ``num_processes`` under
    ``accelerate launch``; run by ``python``, another stack's venv for instance; started under
    ``prefix``, e.g. ``unshare --net``); returns their record: status ok, oom, timeout (past
    ``timeout_s``), skipped or error, per rank where there are many.

    On CUDA (GPUs seen through ``nvml``, default: pynvml) the ranks get the first ``num_processes``
    visible GPUs and in server mode the next ones go to ``trl vllm-serve``; with too few the
    configuration is skipped. Device memory is read on exactly the GPUs the run uses."""
    nvml = devices.load_nvml() if nvml is None else nvml
    place = place or launch.Place(
        machine_rank=0, main_process_ip="127.0.0.1", main_process_port=free_port()
    )  # one machine: its own rendezvous port
    job = with_every_lever(job)
    levers = job["levers"]
    gpus = devices.visible_gpus(nvml)
    placed = _place(job, gpus, place)
    if isinstance(placed, schema.WorkerRecord):
        return placed
    job, env, used = placed
    device = devices.DeviceMemory(nvml, used) if used else None  # its baseline: before the worker starts
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as scratch:
        channel = Channel(Path(scratch) / "channel")
        job_path = Path(scratch) / "job.json"
        job_path.write_text(json.dumps({**job, "channel": channel.path}))
        argv, config = launch.command(levers, job.get("dtype", "float32"), bool(gpus), place, job_path, python)
        # the budget bounds the host's RSS on a CPU; on CUDA each rank caps its allocator at it instead
        run = _run_launcher([*prefix, *argv], env, log_path, channel, None if used else budget_bytes, device, timeout_s)
    record = _record(run.heard, run.sampler, device, levers, log_path, run.returncode)
    _verdict(record, run, timeout_s, budget_bytes)
    if config is not None or levers["num_machines"] > 1:
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
    job: dict, gpus: list[schema.Gpu], place: launch.Place
) -> tuple[dict, dict[str, str], list[schema.Gpu]] | schema.WorkerRecord:
    """The job, the launcher's environment and the GPUs it uses: the ranks get the first visible GPUs, a
    server started here the next ones, its address in the job; or the record of a configuration skipped."""
    levers = job["levers"]
    env = {**os.environ, **VLLM_CPU_ENV, "PYTHONUNBUFFERED": "1"}
    used: list[schema.Gpu] = []
    # The server beside the first machine's ranks, unless a machine of its own runs it (run_machines).
    server_here = server_mode(levers) and place.machine_rank == 0 and "server_host" not in job
    if gpus:
        server_count = levers["vllm_server_tensor_parallel_size"] * levers["vllm_server_data_parallel_size"]
        split = devices.split(gpus, levers["num_processes"], server_count if server_here else 0)
        if isinstance(split, str):
            return _skipped(split)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(split.trainer)
        job = {**job, "server_devices": split.server}
        used = [g for g in gpus if g.uuid in split.trainer + split.server]
    elif launch.cpu_skip_reason(levers):
        return _skipped(launch.cpu_skip_reason(levers))
    if server_mode(levers):
        address = {"server_host": place.main_process_ip, "server_port": free_port()}
        job = {**address, **job, "server_starts_here": server_here}
    return job, env, used


@dataclass
class LauncherRun:
    """What a launcher's run left: what its ranks said, the memory sampler, its time and exit status."""

    heard: Heard
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
    device: devices.DeviceMemory | None,
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
            preexec_fn=_die_with_parent,
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
        heard = _listen(channel, launcher, sampler, log_path)
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


def _listen(channel: Channel, launcher: subprocess.Popen, sampler: MemorySampler, log_path: Path) -> Heard:
    """What the ranks say on the channel until they have all hung up, each phase boundary passed on to
    the sampler as it comes."""
    heard = Heard()
    for event in channel.events(launcher):
        rank, kind = event.pop("rank", 0), event.pop("event")
        now = sampler.where.get(rank, (None, "setup"))
        if kind == "hello":
            heard.hellos.append(rank)
            sampler.add_rank(rank, event["pid"])
        elif kind == "phase":
            sampler.move_to(rank, (now[0], event["phase"]))
        elif kind == "step_begin":
            sampler.move_to(rank, (event["step"], now[1]))
        elif kind == "step":
            heard.steps.setdefault(rank, []).append(schema.decode(schema.Step, event, f"{log_path.name}: step"))
        elif kind == "versions":
            heard.versions = event["versions"]
        elif kind == "device":
            heard.on_cuda[rank] = event
        elif kind == "distribution":
            heard.distribution[rank] = event
        else:
            heard.endings.append((rank, {"event": kind, **event}))
    return heard


@dataclass
class Heard:
    """What the ranks of one launch said on the channel."""

    hellos: list[int] = field(default_factory=list)
    steps: dict[int, list[schema.Step]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    on_cuda: dict[int, dict] = field(default_factory=dict)
    distribution: dict[int, dict] = field(default_factory=dict)
    endings: list[tuple[int, dict]] = field(default_factory=list)


def _record(
    heard: Heard,
    sampler: MemorySampler,
    device: devices.DeviceMemory | None,
    levers: dict,
    log_path: Path,
    exit_status: int | None,
) -> schema.WorkerRecord:
    """The record of a launch from what its ranks said and what the sampler read: per rank its steps'
    peaks and summary; the configuration's steps the maximum over its ranks; how it ended."""
    many = levers["distributed_type"] != "no"
    ranks, measure = _rank_records(heard, sampler, device, many)
    merged = _merged_steps([heard.steps.get(rank, []) for rank in sorted(set(heard.hellos))])
    record = schema.WorkerRecord(status="ok", steps=merged, summary=_summary(merged, measure))
    record.versions, record.device = heard.versions, heard.on_cuda.get(min(heard.on_cuda, default=0))
    if many:
        record.ranks = ranks
    record.setup_peak_rss_bytes = max((v for (_, i, _), v in sampler.peaks.items() if i is None), default=0)
    _ending(record, heard, levers, log_path, exit_status)
    return record


def _rank_records(
    heard: Heard, sampler: MemorySampler, device: devices.DeviceMemory | None, many: bool
) -> tuple[list[schema.Rank], str]:
    """Each rank's steps with their peaks (host RSS; on CUDA its processes' device memory, or the devices'
    use above the baseline where NVML lists none of them), its summary, and what the peaks measure."""
    on_device = device is not None and bool(heard.on_cuda)
    ranks: list[schema.Rank] = []
    measure = schema.HOST_RSS
    for rank in sorted(set(heard.hellos)):
        steps = heard.steps.get(rank, [])
        rss, held = sampler.rank_peaks(rank)
        device_peaks = held
        if on_device and not held and not many:
            device_peaks = sampler.device_used_peaks
        if on_device:
            measure = (
                "device memory held by the worker's processes (NVML usedGpuMemory)"
                if held
                else f"device memory used above the baseline ({device.source})"
            )
        for step in steps:
            step.peak_rss_bytes = _per_step(rss, step.step)
            if on_device:
                step.peak_device_bytes = _per_step(device_peaks, step.step)
                step.peak_device_used_bytes = _per_step(sampler.device_used_peaks, step.step)
        ranks.append(schema.Rank(rank=rank, summary=_summary(steps, measure)))
    return ranks, measure


def _ending(record: schema.WorkerRecord, heard: Heard, levers: dict, log_path: Path, exit_status: int | None) -> None:
    """How the ranks ended: the first that did not finish (oom, skipped, an error; an engine that could not
    start), independent runs where one of many ranks was asked for, or ranks that ended without a word."""
    expected = levers["num_processes"]
    bad = [(rank, e) for rank, e in heard.endings if e["event"] != "done"]
    if bad:
        rank, ending = bad[0]
        _bad_ending(record, ending, log_path, exit_status)
        if levers["distributed_type"] != "no":
            record.reason = f"rank {rank}: {record.reason}"
    elif len(heard.hellos) != len(set(heard.hellos)):
        record.status = "error"
        record.reason = (
            f"{len(heard.hellos)} processes reported ranks {sorted(heard.hellos)}: the launcher started independent "
            "runs, not one run of many ranks"
        )
    elif len(heard.endings) < expected:
        record.status = "error"
        record.reason = f"{len(heard.endings)} of {expected} ranks ended with a word (launcher exit {exit_status})"
        record.log_tail = log_path.read_text(errors="replace")[-3000:]


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


def _merged_steps(per_rank: list[list[schema.Step]]) -> list[schema.Step]:
    """Each step as the configuration's figure: the slowest rank's time, every phase's maximum over
    ranks, memory the maximum over ranks, completions summed over ranks."""
    if len(per_rank) <= 1:
        return per_rank[0] if per_rank else []
    merged = []
    for steps in zip(*per_rank, strict=False):
        slowest = max(steps, key=lambda s: s.wall_s)
        tokens = sum(s.completion_tokens for s in steps)

        def most(of: Callable[[schema.Step], dict[str, Any] | None], steps: tuple = steps) -> dict[str, Any] | None:
            found = [of(s) for s in steps if of(s) is not None]
            return {k: max(d.get(k, 0) for d in found) for d in found for k in d} if found else None

        merged.append(
            replace(
                slowest,
                phase_s=most(lambda s: s.phase_s),
                completion_tokens=tokens,
                completion_tokens_per_s=tokens / slowest.wall_s if slowest.wall_s else 0.0,
                optimizer_state_bytes=max(s.optimizer_state_bytes for s in steps),
                grad_bytes=max(s.grad_bytes for s in steps),
                reference_model_bytes=max(s.reference_model_bytes for s in steps),
                model_states=max(
                    (s.model_states for s in steps if s.model_states), key=lambda m: m.total, default=None
                ),
                peak_rss_bytes=most(lambda s: s.peak_rss_bytes),
                peak_device_bytes=most(lambda s: s.peak_device_bytes),
                peak_device_used_bytes=most(lambda s: s.peak_device_used_bytes),
            )
        )
    return merged


def _distribution(heard: Heard, levers: dict, config: dict | None) -> schema.Distribution:
    """How the ranks ran, from their own reports (rank 0's, the partition share the largest over ranks)."""
    seen = heard.distribution
    first = seen[min(seen)] if seen else {}
    return schema.Distribution(
        world_size=first.get("world_size"),
        num_machines=levers["num_machines"],
        distributed_type=first.get("distributed_type", "unknown: no rank reported it"),
        backend=first.get("backend"),
        zero_stage=first.get("zero_stage"),
        fsdp_version=first.get("fsdp_version"),
        held_parameter_fraction=max((d["held_parameter_fraction"] for d in seen.values()), default=None),
        launcher="accelerate launch" if config is not None else "python",
        config=config,
        notes=first.get("notes", []),
    )


def run_machines(
    job: dict, budget_bytes: int | None, log_path: Path, timeout_s: float, gpus: bool
) -> schema.WorkerRecord:
    """A configuration over ``num_machines`` machines: one launcher per machine through submitit, as one
    job (``cluster.run_tasks``), rendezvous on the first machine; in server mode one more machine runs
    ``trl vllm-serve`` alone, as TRL's multi-node recipe does. The trainer machines' records merged."""
    job = with_every_lever(job)
    if server_mode(job["levers"]) and not gpus:
        return _skipped(SERVER_NEEDS_CUDA)
    task, machines, per_machine, where = machines_job(job, budget_bytes, log_path, timeout_s, gpus)
    return merge_machines([r for r in cluster.run_tasks(task, machines, per_machine, timeout_s, where) if r])


def machines_job(
    job: dict, budget_bytes: int | None, log_path: Path, timeout_s: float, gpus: bool
) -> tuple[Callable[[], Any], int, int, Path]:
    """What submitit runs for one configuration: the task every machine runs, how many machines (the
    vLLM server's one included), the GPUs each asks for (a GPU per rank, or per server GPU), and the
    folder its machines share."""
    levers = job["levers"]
    server = levers["vllm_server_tensor_parallel_size"] * levers["vllm_server_data_parallel_size"]
    where = cluster.folder(log_path.with_suffix(".submitit"))
    where.mkdir(parents=True, exist_ok=True)  # the machines' logs go here, whichever job array runs them
    log = where / log_path.name
    task = functools.partial(machine_task, job, budget_bytes, str(log), timeout_s, free_port())
    machines = levers["num_machines"] + (1 if server_mode(levers) else 0)
    per_machine = max(levers["num_processes"], server if server_mode(levers) else 0) if gpus else 0
    return task, machines, per_machine, where


def submit_to_slurm(
    jobs: dict[int, dict], budget_bytes: int | None, logs: Path, timeout_s: float, gpus: bool
) -> dict[int, Any]:
    """Every configuration (number -> job, every lever given, as ``run_grpo`` makes them) as a Slurm job,
    those needing the same machines and GPUs as one job array; their submitit jobs by number."""
    groups: dict[tuple[int, int], list[tuple[int, Callable[[], Any], Path]]] = {}
    for number, job in jobs.items():
        task, machines, per_machine, where = machines_job(job, budget_bytes, logs / f"{number}.log", timeout_s, gpus)
        groups.setdefault((machines, per_machine), []).append((number, task, where))
    submitted = {}
    for (machines, per_machine), members in groups.items():
        array = cluster.submit_array([task for _, task, _ in members], machines, per_machine, timeout_s, members[0][2])
        submitted |= {number: job for (number, _, _), job in zip(members, array, strict=True)}
    return submitted


def slurm_record(job: Any) -> schema.WorkerRecord:
    """A submitted configuration's record once its Slurm job ends; a job that failed is an error with
    what Slurm and the task said, never a hole in the result file."""
    try:
        return merge_machines([record for record in job.results() if record is not None])
    except Exception as error:  # submitit's FailedJobError / UncompletedJobError: the job's own words
        return schema.WorkerRecord(status="error", reason=f"Slurm job {job.job_id}: {str(error)[-1500:]}")


def machine_task(
    job: dict, budget_bytes: int | None, log_path: str, timeout_s: float, port: int
) -> schema.WorkerRecord | None:
    """One machine's part of a configuration, run by submitit on that machine: its ranks' launcher,
    or, on the machine after the trainers' in server mode, the vLLM server until the trainers are done."""
    machine_rank, hosts = cluster.place_here()
    levers = job["levers"]
    done = Path(f"{log_path}.trainers-done")  # submitit's folder is shared by the job's machines
    if server_mode(levers):
        job = {**job, "server_host": hosts[levers["num_machines"]], "server_port": port + 1}
        if machine_rank == levers["num_machines"]:
            serve_until(job, done, Path(f"{log_path}.server"), timeout_s)
            return None
    place = launch.Place(machine_rank=machine_rank, main_process_ip=hosts[0], main_process_port=port)
    record = run_configuration(
        job, budget_bytes, Path(f"{log_path}.machine{machine_rank}"), timeout_s=timeout_s, place=place
    )
    if machine_rank == 0:
        done.touch()
    return record


def serve_until(job: dict, done: Path, log_path: Path, timeout_s: float) -> None:
    """``trl vllm-serve`` on every GPU of this machine until ``done`` appears (or the time limit)."""
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            server_command(job, sys.executable, host="0.0.0.0"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    deadline = time.monotonic() + timeout_s
    while not done.exists() and server.poll() is None and time.monotonic() < deadline:
        time.sleep(2)
    os.killpg(server.pid, signal.SIGTERM)
    server.wait()


def merge_machines(records: list[schema.WorkerRecord]) -> schema.WorkerRecord:
    """The machines' records as one configuration's: its status the first that is not ok (naming the
    machine), its steps the maximum over every rank, its ranks every machine's."""
    first = records[0]
    for machine_rank, record in enumerate(records):
        for rank in record.ranks:
            rank.machine_rank = machine_rank
    steps = _merged_steps([r.steps for r in records])
    merged = replace(first, steps=steps, ranks=[rank for r in records for rank in r.ranks])
    measure = first.summary.peak_measure if first.summary else schema.HOST_RSS
    merged.summary = _summary(steps, measure)
    bad = [(i, r) for i, r in enumerate(records) if r.status != "ok"]
    if bad:
        machine_rank, record = bad[0]
        merged.status, merged.phase, merged.error, merged.log_tail = (
            record.status,
            record.phase,
            record.error,
            record.log_tail,
        )
        merged.reason = f"machine {machine_rank}: {record.reason}"
    if first.distribution is not None:
        fractions = [r.distribution.held_parameter_fraction for r in records if r.distribution]
        held = max((f for f in fractions if f is not None), default=None)
        merged.distribution = replace(first.distribution, held_parameter_fraction=held)
    harnesses = [r.harness for r in records if r.harness]
    if harnesses:
        merged.harness = replace(
            harnesses[0],
            wall_s=max(h.wall_s for h in harnesses),
            overhead_fraction=max(h.overhead_fraction for h in harnesses),
            launcher_peak_rss_bytes=max(h.launcher_peak_rss_bytes for h in harnesses),
        )
    return merged


def _skipped(reason: str) -> schema.WorkerRecord:
    return schema.WorkerRecord(status="skipped", reason=reason)


def resolved_levers(levers: Levers, prompt_words: int) -> Levers:
    """The levers as the trainer gets them: an unset ``vllm_max_model_length`` becomes the workload's
    prompt + completion (+ 8 for special tokens), so that vLLM reserves KV for this run's sequences
    and not for the shape's whole context."""
    if levers.vllm_max_model_length is not None:
        return levers
    return replace(levers, vllm_max_model_length=prompt_words + levers.max_completion_length + 8)


def run_grpo(profile: Profile, quick: bool, out: Path, only: Sequence[str] = (), part: str = "grpo") -> Path:
    """The configurations of the profile's ``grpo`` or ``distributed`` part (those whose name matches
    a pattern of ``only``, if given); returns the result file written. The file says ``complete:
    false`` until the last configuration has been recorded, and why it ended early where it did."""
    bench = getattr(profile, part)
    assert bench is not None
    shape = load_shapes()[bench.shape]
    print(f"shape {bench.shape}: {shape.param_count() / 1e6:,.1f}M parameters ({shape.source}); building or reusing it")
    model_dir = materialise(shape, bench.dtype, weights=bench.weights)
    budget = int(bench.memory_budget_gib * GIB)
    path = out / profile.hardware / f"{machine.stamp()}-{part}.json"
    result = schema.GrpoFile(**machine.header(part, profile, quick), shape=machine.shape_record(bench.shape))
    todo = [
        (name, levers)
        for name, levers in configurations(bench)
        if not only or any(fnmatch.fnmatch(name, x) for x in only)
    ]
    started = time.monotonic()
    resolved = {number: resolved_levers(levers, bench.prompt_words) for number, (_, levers) in enumerate(todo, 1)}
    jobs = {
        number: {
            "levers": asdict(levers),
            "model_dir": str(model_dir),
            "dtype": bench.dtype,
            "warmup_steps": bench.warmup_steps,
            "measured_steps": bench.measured_steps,
            "prompt_words": bench.prompt_words,
            "weights": bench.weights,
            "memory_budget_bytes": budget,  # CUDA: each rank caps torch's allocator at it
        }
        for number, levers in resolved.items()
    }
    gpus, timeout_s = profile.hardware != "cpu", bench.configuration_timeout_s
    with tempfile.TemporaryDirectory() as logs, schema.marked_incomplete(path, result):
        on_slurm = cluster.kind() == "slurm"
        submitted = submit_to_slurm(jobs, budget, Path(logs), timeout_s, gpus) if on_slurm else {}
        for number, (name, _) in enumerate(todo, 1):
            print(
                f"[{number}/{len(todo)}] {progress(time.monotonic() - started, number - 1, len(todo))} {name} ...",
                end=" ",
                flush=True,
            )
            levers, job, log = resolved[number], jobs[number], Path(logs) / f"{number}.log"
            if on_slurm:
                ran = slurm_record(submitted[number])
            elif levers.num_machines > 1:
                ran = run_machines(job, budget, log, timeout_s=timeout_s, gpus=gpus)
            else:
                ran = run_configuration(job, budget, log, timeout_s=timeout_s)
            configuration = schema.Configuration(name=name, levers=asdict(levers), **vars(ran))
            result.configurations.append(configuration)
            result.finished = schema.now()
            schema.write(path, result)
            print(_one_line(configuration), flush=True)
        wall = time.monotonic() - started
        if part == "distributed":
            result.targets = distributed_targets(result.configurations, wall, quick, shape, bench.dtype)
        else:
            result.targets = targets(result.configurations, wall, quick)
    return path


def progress(elapsed_s: float, done: int, total: int) -> str:
    """Elapsed time, and the time left at the pace so far (the mean of the configurations done)."""

    def clock(seconds: float) -> str:
        return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"

    left = f", ~{clock(elapsed_s / done * (total - done))} left" if done else ""
    return f"({clock(elapsed_s)} elapsed{left})"


def targets(records: list[schema.Configuration], wall_s: float, quick: bool) -> list[schema.Target]:
    """This part's targets, as measured in this run (not asserted anywhere)."""
    summaries = [r.summary for r in records if r.status == "ok" and r.summary]
    spread = max((s.peak_repeat_spread for s in summaries if s.measured_steps > 1), default=None)
    limit_s = 120 if quick else 900
    return [
        schema.Target.at_most(
            f"the {'--quick ' if quick else ''}GRPO part finishes within {limit_s // 60} minutes", wall_s, limit_s
        ),
        schema.Target.at_most(
            "harness overhead (the parent's memory sampler, CPU time over wall time) at most 2% of step time",
            harness_overhead(records),
            0.02,
        ),
        schema.Target.at_most("peak memory of repeated measured steps within 2% of each other", spread, 0.02),
    ]


def harness_overhead(records: list[schema.Configuration]) -> float | None:
    """The parent's sampler CPU time over wall time, the largest over the configurations."""
    return max((r.harness.overhead_fraction for r in records if r.harness), default=None)


def distributed_targets(
    records: list[schema.Configuration], wall_s: float, quick: bool, shape: Shape, dtype: str
) -> list[schema.Target]:
    """The many-ranks part's targets, as measured in this run: ZeRO-3's per-rank model states against
    the analytic model's (``estimate.rank_model_states``), the harness's overhead, the part's time."""
    errors = []
    for record in records:
        levers = record.lever_values
        if record.status == "ok" and levers.distributed_type == "zero3" and levers.world_size == 2 and record.ranks:
            predicted = rank_model_states(shape, dtype, levers).total
            for rank in record.ranks:
                if rank.summary and rank.summary.model_states:
                    errors.append(abs(rank.summary.model_states.total / predicted - 1))
    limit_s = 120 if quick else 300
    return [
        schema.Target.at_most(
            "per-rank model-state memory at 2 ranks with ZeRO-3 within 10% of what the analytic model "
            "predicts for that rank (largest relative error over the ranks)",
            max(errors, default=None),
            0.10,
        ),
        schema.Target.at_most(
            "the harness's overhead per rank (the parent's sampler CPU time over wall time) at most 2% of step time",
            harness_overhead(records),
            0.02,
        ),
        schema.Target.at_most(
            f"the {'--quick ' if quick else ''}distributed part finishes within {limit_s // 60} minutes",
            wall_s,
            limit_s,
        ),
    ]


def _one_line(record: schema.Configuration) -> str:
    summary = record.summary
    if record.status != "ok" or summary is None:
        return f"{record.status}: {record.reason or record.phase or ''}".strip()
    return (
        f"ok: {summary.step_s_median:.2f} s/step, {summary.completion_tokens_per_s_median:.1f} tok/s, "
        f"peak {summary.peak_bytes / GIB:.2f} GiB ({summary.peak_measure})"
    )


def print_summary(path: Path) -> None:
    run = schema.read_result(path, str(path)).record
    for target in run.targets:
        print(target.line())
    if not run.complete:
        print(f"INCOMPLETE: {run.ended_early or 'the run ended before its last configuration'}")
    phases = ("rollout", "logprob", "forward_backward", "optimizer")
    measures = {r.summary.peak_measure for r in run.configurations if r.summary}
    header = f"peak GiB by phase ({'; '.join(sorted(measures)) or 'none measured'}): " + " / ".join(phases)
    print(f"\n{'configuration':80} {'status':8} {'s/step':>7} {'tok/s':>7}  {header}")
    for record in run.configurations:
        summary = record.summary
        if record.status != "ok" or summary is None:
            print(f"{record.name:80} {record.status:8} {record.reason or record.phase or ''}")
            continue
        by_phase = " / ".join(f"{summary.peak_bytes_by_phase.get(p, 0) / GIB:5.2f}" for p in phases)
        speed = f"{summary.step_s_median:7.2f} {summary.completion_tokens_per_s_median:7.1f}"
        print(f"{record.name:80} {'ok':8} {speed}  {by_phase}")
        for rank in record.ranks:
            states = rank.summary.model_states if rank.summary else None
            if states is not None:
                parts = ", ".join(
                    f"{name} {getattr(states, name) / GIB:.3f}"
                    for name in ("parameters", "master", "optimizer", "gradients")
                )
                peak = rank.summary.peak_bytes / GIB
                print(f"    rank {rank.rank}: model states {states.total / GIB:.3f} GiB ({parts}); peak {peak:.2f} GiB")
