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

import ctypes
import fnmatch
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.catalog.profiles import Levers, Profile, configurations, load_shapes
from benchmarks.model.estimate import GIB
from benchmarks.results import schema
from benchmarks.run import devices, machine
from benchmarks.run.models import materialise
from benchmarks.run.worker import ENGINE_CANNOT_START

SAMPLE_INTERVAL_S = 0.02
# vLLM on CPU, in the worker's process: engine in-process (its memory is the worker's RSS,
# counted once), a 1 GiB KV cache, OpenMP on every core.
VLLM_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "all",
}


class MemorySampler(threading.Thread):
    """Peak memory of a process tree per (step, phase), read every 20 ms and at every phase
    boundary: host RSS, and on CUDA the device memory its processes hold (``devices.DeviceMemory``);
    stops the tree when its RSS passes ``budget_bytes``."""

    def __init__(self, pid: int, budget_bytes: int | None, device: devices.DeviceMemory | None = None) -> None:
        super().__init__(daemon=True)
        import psutil  # the worker extra's: `nox -s tables` runs this package without it

        self.root = psutil.Process(pid)
        self.budget_bytes = budget_bytes
        self.where: tuple[int | None, str] = (None, "setup")
        self.peaks: dict[tuple[int | None, str], int] = {}
        self.over_budget: tuple[int | None, str] | None = None
        self.samples = 0
        self.cpu_s = 0.0
        self.members = [self.root]
        self.device = device
        self.device_process_peaks: dict[tuple[int | None, str], int] = {}  # NVML usedGpuMemory of the tree
        self.device_used_peaks: dict[tuple[int | None, str], int] = {}  # the devices' use above the baseline
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def tree_rss(self, members: list) -> int:
        total = 0
        for process in members:
            try:
                total += process.memory_info().rss
            except Exception:  # a child that ended between listing and reading
                continue
        return total

    def sample(self, also: tuple[int | None, str] | None = None) -> None:
        """One reading, charged to the current (step, phase) and to ``also`` if given."""
        members = self.members
        rss = self.tree_rss(members)
        held, used = self.device.read({m.pid for m in members}) if self.device else (None, None)
        with self.lock:
            for where in {self.where, also or self.where}:
                self.peaks[where] = max(self.peaks.get(where, 0), rss)
                if held is not None:
                    self.device_process_peaks[where] = max(self.device_process_peaks.get(where, 0), held)
                if used is not None:
                    self.device_used_peaks[where] = max(self.device_used_peaks.get(where, 0), used)
            self.samples += 1
        if self.budget_bytes and rss > self.budget_bytes and self.over_budget is None:
            self.over_budget = self.where
            os.killpg(self.root.pid, signal.SIGKILL)

    def device_peaks(self) -> tuple[dict[tuple[int | None, str], int], str]:
        """The device peaks that stand for this run, and what they are: NVML's per-process figures
        where it listed the tree's processes, else the devices' use above the baseline."""
        if self.device_process_peaks:
            return self.device_process_peaks, "device memory held by the worker's processes (NVML usedGpuMemory)"
        return self.device_used_peaks, f"device memory used above the baseline ({self.device.source})"

    def move_to(self, where: tuple[int | None, str]) -> None:
        """A phase boundary: the reading there ends the old phase and starts the new one, so
        that a phase shorter than the sampling interval still has its memory read."""
        started = time.process_time()
        previous, self.where = self.where, where
        self.sample(also=previous)
        self.cpu_s += time.process_time() - started

    def run(self) -> None:
        listed = 0.0
        while not self.stopped.is_set():
            started = time.thread_time()
            if time.monotonic() - listed > 0.5:
                try:
                    self.members, listed = [self.root, *self.root.children(recursive=True)], time.monotonic()
                except Exception:  # the worker is gone
                    break
            self.sample()
            self.cpu_s += time.thread_time() - started
            self.stopped.wait(SAMPLE_INTERVAL_S)


def _summary(steps: list[schema.Step], peak_measure: str) -> schema.Summary | None:
    """Medians and peaks over the measured steps (all steps where none is measured); the headline
    peak is each step's ``peaks`` (device memory on CUDA, host RSS on CPU), ``peak_measure`` says which."""
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
        peak_bytes_by_phase=by_phase(lambda s: s.peaks),
        peak_measure=peak_measure,
        peak_rss_bytes=max(max(s.peak_rss_bytes.values(), default=0) for s in measured),
        peak_rss_bytes_by_phase=by_phase(lambda s: s.peak_rss_bytes),
        peak_repeat_spread=(max(headline) - min(headline)) / max(headline) if max(headline) else 0.0,
        optimizer_state_bytes=last.optimizer_state_bytes,
        grad_bytes=last.grad_bytes,
        trainable_params=last.trainable_params,
        reference_model_bytes=last.reference_model_bytes,
    )


def _die_with_parent() -> None:
    """In the worker before exec: SIGKILL when the parent ends, so that a harness stopped by a
    timeout or ^C leaves no worker behind (its own session keeps it from the terminal's signals)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _per_step(peaks: dict[tuple[int | None, str], int], step: int) -> dict[str, int]:
    return {phase: peak for (index, phase), peak in peaks.items() if index == step}


def server_mode(job: dict) -> bool:
    return job["levers"]["use_vllm"] and job["levers"]["vllm_mode"] == "server"


def run_configuration(
    job: dict,
    budget_bytes: int | None,
    log_path: Path,
    prefix: Sequence[str] = (),
    python: str = sys.executable,
    timeout_s: float | None = None,
    nvml: Any = None,
) -> schema.WorkerRecord:
    """One worker process (run by ``python``, another stack's venv for instance; started under
    ``prefix``, e.g. ``unshare --net``, ``numactl``); returns its record: status ok, oom,
    timeout (past ``timeout_s``), skipped or error.

    On CUDA (GPUs seen through ``nvml``, default: pynvml) the worker gets the first visible GPU;
    in server mode the second goes to ``trl vllm-serve``, and with fewer than two the
    configuration is skipped. Device memory is read on exactly the GPUs the run uses."""
    nvml = devices.load_nvml() if nvml is None else nvml
    gpus = devices.visible_gpus(nvml)
    env = {**os.environ, **VLLM_CPU_ENV, "PYTHONUNBUFFERED": "1"}
    used = gpus[:1]
    if gpus and server_mode(job):
        split = devices.split_for_server(gpus)
        if split is None:
            return _skipped(
                "vLLM server mode needs a GPU of its own for `trl vllm-serve` beside the trainer's (TRL's weight "
                f"sync is an NCCL group: two ranks on one device fail with 'Duplicate GPU detected'); {len(gpus)} "
                "visible here"
            )
        env["CUDA_VISIBLE_DEVICES"] = ",".join(split.trainer)
        job = {**job, "server_devices": split.server}
        used = [g for g in gpus if g.uuid in split.trainer + split.server]
    elif gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[0].uuid
    device = devices.DeviceMemory(nvml, used) if used else None  # its baseline: before the worker starts
    read_end, write_end = os.pipe()
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [*prefix, python, "-m", "benchmarks.run.worker"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=[write_end],
            env=env,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            text=True,
        )
    os.close(write_end)
    sampler = MemorySampler(worker.pid, budget_bytes, device)
    sampler.start()
    started = time.monotonic()
    worker.stdin.write(json.dumps({**job, "channel_fd": write_end}))
    worker.stdin.close()
    steps: list[schema.Step] = []
    versions: dict[str, str] = {}
    on_cuda: dict[str, Any] = {}  # the worker's word that it runs on the device, and its budget there
    ending: dict[str, Any] = {"event": "error", "error": "the worker ended without a word"}
    timed_out = threading.Event()

    def stop_on_time() -> None:
        timed_out.set()
        os.killpg(worker.pid, signal.SIGKILL)

    timer = threading.Timer(timeout_s, stop_on_time) if timeout_s else None
    if timer:
        timer.start()
    with os.fdopen(read_end) as channel:
        for line in channel:
            event = json.loads(line)
            kind = event["event"]
            if kind == "phase":
                sampler.move_to((sampler.where[0], event["phase"]))
            elif kind == "step_begin":
                sampler.move_to((event["step"], sampler.where[1]))
            elif kind == "step":
                step = {k: v for k, v in event.items() if k != "event"}
                steps.append(schema.decode(schema.Step, step, f"{log_path.name}: step event"))
            elif kind == "versions":
                versions = event["versions"]
            elif kind == "device":
                on_cuda = {k: v for k, v in event.items() if k != "event"}
            else:
                ending = event
    worker.wait()
    if timer:
        timer.cancel()
    sampler.stopped.set()
    sampler.join()
    wall = time.monotonic() - started
    on_device = device is not None and bool(on_cuda)
    device_peaks, measure = sampler.device_peaks() if on_device else ({}, schema.HOST_RSS)
    for step in steps:
        step.peak_rss_bytes = _per_step(sampler.peaks, step.step)
        if on_device:
            step.peak_device_bytes = _per_step(device_peaks, step.step)
            step.peak_device_used_bytes = _per_step(sampler.device_used_peaks, step.step)
    record = schema.WorkerRecord(status="ok" if ending["event"] == "done" else ending["event"], steps=steps)
    record.versions, record.device = versions, on_cuda or None
    if timed_out.is_set():
        record.status, record.phase = "timeout", sampler.where[1]
        record.reason = f"still running after the configuration's limit of {timeout_s:g} s; the worker tree was stopped"
    elif sampler.over_budget is not None:
        record.status, record.phase = "oom", sampler.over_budget[1]
        record.reason = f"worker tree RSS passed the {budget_bytes / GIB:.1f} GiB budget"
    elif ending["event"] in ("oom", "skipped"):
        record.phase, record.reason, record.error = ending.get("phase"), ending.get("reason"), ending.get("error")
    elif ending["event"] != "done":
        tail = log_path.read_text(errors="replace")[-3000:]
        record.reason, record.log_tail = ending.get("error", f"worker exit {worker.returncode}"), tail
        refused = [line for line in tail.splitlines() if any(m in line for m in ENGINE_CANNOT_START)]
        if refused:  # vLLM's engine process refused to start; the worker saw only "initialization failed"
            record.status, record.phase = "oom", "engine_start"
            record.reason = f"engine cannot start: {refused[-1][:400]}"
    if record.status != "ok":  # where the memory stood when the worker ended (e.g. stopped at the budget)
        finished = {step.step for step in steps}

        def unfinished(peaks: dict[tuple[int | None, str], int]) -> dict[str, int] | None:
            return {p: v for (i, p), v in peaks.items() if i is not None and i not in finished} if peaks else None

        record.unfinished_peak_rss_bytes = unfinished(sampler.peaks)
        record.unfinished_peak_device_bytes = unfinished(device_peaks)
    record.setup_peak_rss_bytes = max((p for (i, _), p in sampler.peaks.items() if i is None), default=0)
    record.summary = _summary(steps, measure)
    record.harness = schema.Harness(
        wall_s=wall,
        sampler_cpu_s=sampler.cpu_s,
        samples=sampler.samples,
        overhead_fraction=sampler.cpu_s / wall if wall else 0.0,
        gpus=[g.index for g in used],  # NVML indices
    )
    return record


def _skipped(reason: str) -> schema.WorkerRecord:
    return schema.WorkerRecord(status="skipped", reason=reason)


def resolved_levers(levers: Levers, prompt_words: int) -> Levers:
    """The levers as the trainer gets them: an unset ``vllm_max_model_length`` becomes the workload's
    prompt + completion (+ 8 for special tokens), so that vLLM reserves KV for this run's sequences
    and not for the shape's whole context."""
    if levers.vllm_max_model_length is not None:
        return levers
    return replace(levers, vllm_max_model_length=prompt_words + levers.max_completion_length + 8)


def run_grpo(profile: Profile, quick: bool, out: Path, only: Sequence[str] = ()) -> Path:
    """The configurations of ``profile.grpo`` (those whose name matches a pattern of ``only``,
    if given); returns the result file written. The file says ``complete: false`` until the last
    configuration has been recorded, and why it ended early where it did."""
    grpo = profile.grpo
    assert grpo is not None
    shape = load_shapes()[grpo.shape]
    print(f"shape {grpo.shape}: {shape.param_count() / 1e6:,.1f}M parameters ({shape.source}); building or reusing it")
    model_dir = materialise(shape, grpo.dtype)
    budget = int(grpo.memory_budget_gib * GIB)
    path = out / profile.hardware / f"{machine.stamp()}-grpo.json"
    result = schema.GrpoFile(**machine.header("grpo", profile, quick), shape=machine.shape_record(grpo.shape))
    todo = [
        (name, levers)
        for name, levers in configurations(grpo)
        if not only or any(fnmatch.fnmatch(name, x) for x in only)
    ]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as logs, schema.marked_incomplete(path, result):
        for number, (name, levers) in enumerate(todo, 1):
            print(f"[{number}/{len(todo)}] {name} ...", end=" ", flush=True)
            levers = resolved_levers(levers, grpo.prompt_words)
            job = {
                "levers": asdict(levers),
                "model_dir": str(model_dir),
                "dtype": grpo.dtype,
                "warmup_steps": grpo.warmup_steps,
                "measured_steps": grpo.measured_steps,
                "prompt_words": grpo.prompt_words,
                "memory_budget_bytes": budget,  # CUDA: the worker caps torch's allocator at it
            }
            ran = run_configuration(job, budget, Path(logs) / f"{number}.log", timeout_s=grpo.configuration_timeout_s)
            configuration = schema.Configuration(name=name, levers=asdict(levers), **vars(ran))
            result.configurations.append(configuration)
            result.finished = schema.now()
            schema.write(path, result)
            print(_one_line(configuration), flush=True)
        result.targets = targets(result.configurations, time.monotonic() - started, quick)
    return path


def targets(records: list[schema.Configuration], wall_s: float, quick: bool) -> list[schema.Target]:
    """The issue's targets for this part, as measured in this run (not asserted anywhere)."""
    summaries = [r.summary for r in records if r.status == "ok" and r.summary]
    overhead = max((r.harness.overhead_fraction for r in records if r.harness), default=None)
    spread = max((s.peak_repeat_spread for s in summaries if s.measured_steps > 1), default=None)
    limit_s = 120 if quick else 900
    return [
        schema.Target(
            claim=f"the {'--quick ' if quick else ''}GRPO part finishes within {limit_s // 60} minutes",
            measured=wall_s,
            limit=limit_s,
            met=wall_s <= limit_s,
        ),
        schema.Target(
            claim="harness overhead (the parent's memory sampler, CPU time over wall time) at most 2% of step time",
            measured=overhead,
            limit=0.02,
            met=None if overhead is None else overhead <= 0.02,
        ),
        schema.Target(
            claim="peak memory of repeated measured steps within 2% of each other",
            measured=spread,
            limit=0.02,
            met=None if spread is None else spread <= 0.02,
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
        met = {True: "met", False: "MISSED", None: "not measured"}[target.met]
        print(f"target: {target.claim}: {met} (measured {target.measured}, limit {target.limit})")
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
