"""The GPU paths, run on this CPU with stand-ins for pynvml and torch.cuda: detection per device,
device memory per process with a baseline, the NOT_SUPPORTED fallback of unified memory, server
mode's GPUs, the default profile on a CUDA machine, and time limits."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from benchmarks import cli
from benchmarks.catalog import install_plan
from benchmarks.catalog import profiles as profile
from benchmarks.commands import bench
from benchmarks.report.markdown import sizing
from benchmarks.results import schema
from benchmarks.run.grpo import configuration, timed_steps, worker
from benchmarks.run.grpo.job import Job
from benchmarks.run.grpo.sampler import MemorySampler
from benchmarks.run.machine import nvml_gpus

GIB = 2**30


class FakeNVML:
    """pynvml's calls the suite makes, over a list of devices: {name, uuid, total, used, processes}
    (processes: pid -> bytes, or a callable giving that); ``unified`` devices answer NOT_SUPPORTED for their
    memory and, as GB10 does, answer the per-process query."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801  (pynvml's own name)
        pass

    def __init__(self, *gpus: dict) -> None:
        self.gpus = list(gpus)

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "580.159.03"

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:  # noqa: N802
        return self.gpus[handle]["name"].encode()  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return self.gpus[handle]["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        gpu = self.gpus[handle]
        if gpu.get("unified"):
            raise self.NVMLError_NotSupported("Not Supported")
        return SimpleNamespace(total=gpu["total"], used=gpu["used"], free=gpu["total"] - gpu["used"])

    def nvmlDeviceGetMigMode(self, handle: int) -> list:  # noqa: N802
        if "mig" not in self.gpus[handle]:  # a card without MIG
            raise self.NVMLError_NotSupported("Not Supported")
        return [int(self.gpus[handle]["mig"]), int(self.gpus[handle]["mig"])]  # current, pending

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list:  # noqa: N802
        gpu = self.gpus[handle]
        processes = gpu.get("processes", {})
        processes = processes() if callable(processes) else processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in processes.items()]


def gpu(name: str, memory_gib: float, index: int = 0, **more) -> dict:
    return {"name": name, "uuid": f"GPU-{index:08d}-fake", "total": int(memory_gib * GIB), "used": 0, **more}


@pytest.mark.parametrize(
    "name, memory_gib, expected",
    [
        ("NVIDIA H200", 140.4, ("h200", "h200")),
        ("NVIDIA B200", 179.06, ("b200", "b200")),
        ("NVIDIA GB10", 121.7, ("spark", "spark")),
        ("NVIDIA GeForce RTX 4090", 23.99, ("24gb", "rtx4090")),
        ("NVIDIA L4", 22.49, ("24gb", "l4")),
        ("NVIDIA A10G", 22.49, ("24gb", "a10g")),
        ("NVIDIA H100 80GB HBM3", 79.65, ("h100", "h100")),
        ("NVIDIA A100-SXM4-80GB", 80.0, ("h100", "a100-80")),  # the 80 GB question
        ("NVIDIA A100-SXM4-40GB", 40.0, ("gpu", "a100-40")),
        ("NVIDIA RTX A5000", 23.99, ("24gb", "gpu")),  # a 24 GB card by its memory
        ("NVIDIA L40S", 44.99, ("48gb", "l40s")),  # not the L4
        ("NVIDIA RTX A6000", 47.99, ("48gb", "a6000")),
        ("NVIDIA H100 PCIe", 79.65, ("h100", "h100-pcie")),  # the longer name over "H100", same memory
        ("NVIDIA H100 NVL", 93.58, ("h100", "h100-nvl")),
        ("NVIDIA H20", 95.58, ("h100", "h20")),  # not the H200
        ("NVIDIA GH200 480GB", 95.58, ("h100", "gh200")),  # not the H200 either
        ("NVIDIA A40", 44.99, ("gpu", "gpu")),  # unknown: the generic class, sized from its own memory
    ],
)
def test_a_device_gets_its_profile_and_hardware_class(name, memory_gib, expected):
    assert install_plan.classify(name, memory_gib) == expected
    chosen = profile.load(expected[0], hardware=expected[1])
    assert chosen.hardware == expected[1] and chosen.hardware in profile.load_hardware()


def test_the_default_profile_on_a_cuda_machine_comes_from_its_first_visible_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML(gpu("NVIDIA H200", 140.4), gpu("NVIDIA GeForce RTX 4090", 23.99, index=1))
    assert bench.detect(nvml)[:2] == ("h200", "h200")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert bench.detect(nvml)[:2] == ("24gb", "rtx4090")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000001")  # a UUID's prefix, as CUDA takes it
    assert bench.detect(nvml)[:2] == ("24gb", "rtx4090")
    assert bench.detect(FakeNVML())[:2] == ("cpu", None)


def test_device_memory_counts_this_run_s_processes_on_its_own_devices_above_a_baseline():
    other = {999: 5 * GIB}  # someone else's process on our device
    used = gpu("NVIDIA H200", 140.4, used=6 * GIB, processes={**other, 100: 1 * GIB})
    unused = gpu("NVIDIA H200", 140.4, index=1, used=30 * GIB, processes={101: 30 * GIB})
    nvml = FakeNVML(used, unused)
    memory = nvml_gpus.DeviceMemory(nvml, nvml_gpus.describe(nvml)[:1])  # baseline: 6 GiB used
    used["used"], used["processes"] = 16 * GIB, {**other, 100: 1 * GIB, 200: 9 * GIB}
    assert memory.read({0: {100, 101, 200}}) == ({0: 10 * GIB}, 10 * GIB)  # 101 is on a device we do not use
    # NVML lists none of ours (hidden PIDs): the device figure
    assert memory.read({0: {12345}}) == ({0: None}, 10 * GIB)
    # one sweep for every rank: each its own processes' bytes
    assert memory.read({0: {100}, 1: {200}, 2: {12345}}) == ({0: 1 * GIB, 1: 9 * GIB, 2: None}, 10 * GIB)


def test_unified_memory_answering_not_supported_falls_back_to_meminfo_and_says_so(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       {128 * 2**20} kB\nMemFree:  1 kB\nMemAvailable:   {120 * 2**20} kB\n")
    nvml = FakeNVML(gpu("NVIDIA GB10", 0, unified=True))
    (described,) = nvml_gpus.describe(nvml, meminfo)
    assert described.memory_gib == 128.0 and "NOT_SUPPORTED" in described.memory_source
    memory = nvml_gpus.DeviceMemory(nvml, [described], meminfo)  # baseline: 8 GiB used
    meminfo.write_text(f"MemTotal:       {128 * 2**20} kB\nMemAvailable:   {100 * 2**20} kB\n")
    assert memory.read({0: {1}}) == ({0: None}, 20 * GIB)
    assert "/proc/meminfo" in memory.source
    assert bench.detect(nvml)[:2] == ("spark", "spark")


# The stand-in reads the job the harness wrote and takes its test hooks from the environment (STAND_IN_*),
# which the launcher passes on: where to say what it saw, how long to hang, what engine refusal to print.
STAND_IN = """
import json, os, socket, sys, time
job = json.loads(open(sys.argv[-1]).read())
connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
connection.connect(job["channel"])
channel = connection.makefile("w")
def say(**event):
    channel.write(json.dumps(event) + "\\n"); channel.flush()
say(event="hello", pid=os.getpid())
with open(os.environ["STAND_IN_SEEN"], "w") as seen:
    json.dump({"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
               "server_devices": job.get("server_devices")}, seen)
say(event="versions", versions={"stand-in": "1"})
if os.environ.get("CUDA_VISIBLE_DEVICES") and not os.environ.get("STAND_IN_CPU_TORCH"):  # as the worker on CUDA
    say(event="device", name="stand-in", total_bytes=140 * 2**30)
say(event="phase", phase="setup")
if "STAND_IN_MEMINFO" in os.environ:  # the host's unified pool as the worker leaves it: MemAvailable in GiB
    available = int(os.environ["STAND_IN_AVAILABLE_GIB"]) << 20
    with open(os.environ["STAND_IN_MEMINFO"], "w") as meminfo:
        meminfo.write(f"MemTotal: {128 << 20} kB\\nMemAvailable: {available} kB\\n")
time.sleep(float(os.environ.get("STAND_IN_HANG_S", 0)))
if "STAND_IN_ENGINE_LOG" in os.environ:  # vLLM's engine process logs why it refused; the worker sees another error
    print(os.environ["STAND_IN_ENGINE_LOG"], flush=True)
    say(event="error", error="RuntimeError: Engine core initialization failed. See root cause above.")
    sys.exit(1)
say(event="step_begin", step=0)
say(event="phase", phase="rollout")
time.sleep(0.3)
say(event="step", step=0, warmup=False, wall_s=0.3, phase_s={"rollout": 0.3}, completion_tokens=4,
    completion_tokens_per_s=13.0, optimizer_state_bytes=0, grad_bytes=0, trainable_params=1, reference_model_bytes=0)
say(event="phase", phase="idle")
say(event="done")
"""


@pytest.fixture
def stand_in(tmp_path):
    """An interpreter that runs a stand-in worker instead of `python -m benchmarks.run.grpo.worker`."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    interpreter = tmp_path / "interpreter"
    seen = tmp_path / "seen.json"
    interpreter.write_text(f'#!/bin/bash\nSTAND_IN_SEEN={seen} exec {sys.executable} {script} "$@"\n')
    interpreter.chmod(0o755)
    return str(interpreter)


def job(tmp_path, dtype="float32", **levers) -> Job:
    """A job for the stand-in, which reads nothing of it but its channel (the harness places the rest)."""
    return Job(
        levers=profile.Levers(**levers),
        model_dir=str(tmp_path),
        dtype=dtype,
        prompt_words=8,
        warmup_steps=0,
        measured_steps=1,
    )


def test_server_mode_on_one_gpu_is_skipped_with_the_reason(tmp_path, stand_in, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    record = configuration.run_configuration(
        job(tmp_path, use_vllm=True, vllm_mode="server"),
        None,
        tmp_path / "w.log",
        python=stand_in,
        nvml=FakeNVML(gpu("NVIDIA H200", 140.4)),
    )
    assert record.status == "skipped" and "Duplicate GPU detected" in record.reason and "1 visible" in record.reason
    assert not (tmp_path / "seen.json").exists()  # no worker started
    assert timed_steps.targets([schema.Configuration(name="server", levers={}, **vars(record))], 1.0, quick=True)[
        0
    ].met  # the run's targets add up


def test_server_mode_gives_the_server_a_gpu_apart_from_the_trainer_s(tmp_path, stand_in, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML(gpu("NVIDIA H200", 140.4), gpu("NVIDIA H200", 140.4, index=1), gpu("NVIDIA H200", 140.4, index=2))
    record = configuration.run_configuration(
        job(tmp_path, use_vllm=True, vllm_mode="server"), None, tmp_path / "w.log", python=stand_in, nvml=nvml
    )
    assert record.status == "ok", record
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"cuda_visible_devices": "GPU-00000000-fake", "server_devices": ["GPU-00000001-fake"]}
    assert record.harness.gpus == [0, 1]  # device memory read on both, and on the third not at all


def test_on_cuda_the_headline_peak_is_the_device_memory_of_the_worker_s_processes(tmp_path, stand_in, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def ours() -> dict[int, int]:  # every process under this test: the worker tree, 1 GiB each
        return {p.pid: GIB for p in psutil.Process().children(recursive=True)} | {1: 50 * GIB}

    nvml = FakeNVML(gpu("NVIDIA H200", 140.4, processes=ours))
    record = configuration.run_configuration(job(tmp_path), None, tmp_path / "w.log", python=stand_in, nvml=nvml)
    assert record.status == "ok", record
    assert record.steps[0].peak_device_bytes["rollout"] in (GIB, 2 * GIB)  # the bash wrapper may linger
    summary = record.summary
    assert summary.peak_bytes == max(record.steps[0].peak_device_bytes.values()) < 50 * GIB
    assert "NVML" in summary.peak_measure and summary.peak_rss_bytes > 0
    assert json.loads((tmp_path / "seen.json").read_text())["cuda_visible_devices"] == "GPU-00000000-fake"


def test_on_cuda_the_budget_caps_the_worker_s_allocator_and_never_stops_it_by_host_rss(tmp_path, stand_in, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML(gpu("NVIDIA H200", 140.4))
    tiny_budget = 1 << 20  # far under any worker's RSS: on a CPU it would be stopped as oom at once
    record = configuration.run_configuration(job(tmp_path), tiny_budget, tmp_path / "w.log", python=stand_in, nvml=nvml)
    assert record.status == "ok", record
    on_cpu = configuration.run_configuration(
        job(tmp_path), tiny_budget, tmp_path / "w2.log", python=stand_in, nvml=FakeNVML()
    )
    assert on_cpu.status == "oom" and "budget" in on_cpu.reason


def test_a_worker_placed_on_a_gpu_that_trains_without_cuda_is_an_error_never_a_gpu_cell(
    tmp_path, stand_in, monkeypatch, grpo_run
):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML(gpu("NVIDIA H100 80GB HBM3", 79.65, processes={1: 50 * GIB}))
    # a CPU build of torch, or a driver too old for its CUDA: NVML sees the GPU, the worker never touches it
    monkeypatch.setenv("STAND_IN_CPU_TORCH", "1")
    record = configuration.run_configuration(job(tmp_path), None, tmp_path / "w.log", python=stand_in, nvml=nvml)
    assert record.status == "error" and "without CUDA" in record.reason and "H100" in record.reason
    assert record.summary.peak_measure == schema.HOST_RSS and record.steps[0].peak_device_bytes is None
    ran = grpo_run(configurations=[schema.Configuration(name="base", levers={}, **vars(record))], complete=True)
    ran.profile.hardware = "h100"
    path = tmp_path / "runs" / "h100" / "20261202T000000Z-grpo.json"
    path.parent.mkdir(parents=True)
    schema.write(path, ran)
    [(cell, _)] = sizing.measured_cells(schema.load_results(tmp_path / "runs")).values()
    assert cell.startswith("failed: error") and "without CUDA" in cell  # said, and never an H100 fit either way
    assert not cell.startswith(("fits", "does not fit"))
    monkeypatch.delenv("STAND_IN_CPU_TORCH")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CUDA is given no device at all: a CPU run, as asked
    record = configuration.run_configuration(job(tmp_path), None, tmp_path / "w2.log", python=stand_in, nvml=nvml)
    assert record.status == "ok" and record.summary.peak_measure == schema.HOST_RSS and record.harness.gpus == []


def on_unified_memory(tmp_path, monkeypatch, available_gib: int) -> FakeNVML:
    """A GB10 whose host has 120 of 128 GiB available before the worker, and ``available_gib`` once it has set
    up; NVML lists the worker tree's processes at 1 GiB each."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {128 << 20} kB\nMemAvailable: {120 << 20} kB\n")
    monkeypatch.setattr(nvml_gpus, "MEMINFO", meminfo)
    monkeypatch.setenv("STAND_IN_MEMINFO", str(meminfo))
    monkeypatch.setenv("STAND_IN_AVAILABLE_GIB", str(available_gib))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def ours() -> dict[int, int]:
        return {p.pid: GIB for p in psutil.Process().children(recursive=True)}

    return FakeNVML(gpu("NVIDIA GB10", 0, unified=True, processes=ours))


def test_on_unified_memory_the_headline_is_the_pool_s_use_with_nvml_s_per_process_figure_beside(
    tmp_path, stand_in, monkeypatch
):
    nvml = on_unified_memory(tmp_path, monkeypatch, available_gib=100)  # 20 GiB above the baseline
    record = configuration.run_configuration(job(tmp_path), None, tmp_path / "w.log", python=stand_in, nvml=nvml)
    assert record.status == "ok", record
    step = record.steps[0]
    assert step.peak_device_bytes["rollout"] == 20 * GIB == record.summary.peak_bytes
    assert step.peak_device_process_bytes["rollout"] in (GIB, 2 * GIB)  # NVML's per-process figure, beside it
    assert "unified memory" in record.summary.peak_measure and "per-process" in record.summary.peak_measure


def test_on_unified_memory_crossing_the_floor_stops_the_configuration_as_oom(tmp_path, stand_in, monkeypatch):
    nvml = on_unified_memory(tmp_path, monkeypatch, available_gib=4)  # under the Spark's floor
    monkeypatch.setenv("STAND_IN_HANG_S", "30")
    started = time.monotonic()
    record = configuration.run_configuration(job(tmp_path), None, tmp_path / "w.log", python=stand_in, nvml=nvml)
    floor = profile.load_hardware()["spark"].unified_floor_gib
    assert record.status == "oom" and record.phase == "setup" and f"{floor:g} GiB floor" in record.reason
    assert time.monotonic() - started < 20  # stopped at once, not at the end of its hang


def test_on_cpu_the_headline_peak_is_host_rss(tmp_path, stand_in):
    record = configuration.run_configuration(job(tmp_path), None, tmp_path / "w.log", python=stand_in, nvml=FakeNVML())
    assert record.summary.peak_bytes == record.summary.peak_rss_bytes > 0
    assert record.summary.peak_measure == schema.HOST_RSS and record.steps[0].peak_device_bytes is None


def test_a_configuration_past_its_time_limit_is_a_timeout_in_its_phase_and_the_next_one_runs(
    tmp_path, stand_in, monkeypatch
):
    started = time.monotonic()
    monkeypatch.setenv("STAND_IN_HANG_S", "60")
    record = configuration.run_configuration(
        job(tmp_path), None, tmp_path / "w.log", python=stand_in, timeout_s=2, nvml=FakeNVML()
    )
    assert time.monotonic() - started < 15
    assert record.status == "timeout" and record.phase == "setup" and "2 s" in record.reason
    monkeypatch.delenv("STAND_IN_HANG_S")
    following = configuration.run_configuration(
        job(tmp_path), None, tmp_path / "w2.log", python=stand_in, nvml=FakeNVML()
    )
    assert following.status == "ok"


def test_a_run_stopped_early_is_marked_incomplete_and_one_that_ends_is_marked_complete(tmp_path, grpo_run):
    path, result = tmp_path / "x-grpo.json", grpo_run()
    with pytest.raises(KeyboardInterrupt), schema.marked_incomplete(path, result):
        schema.write(path, result)
        raise KeyboardInterrupt
    written = schema.read_result(path, path.name)
    assert not written.complete and written.record.ended_early.startswith("KeyboardInterrupt")
    with schema.marked_incomplete(path, result):
        result.targets = []
    assert schema.read_result(path, path.name).complete


def test_phase_boundaries_synchronize_cuda_before_the_clock_and_read_device_memory(monkeypatch):
    torch = pytest.importorskip("torch")
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (100 * GIB, 140 * GIB))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 7 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 8 * GIB)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: calls.append("reset"))
    real_clock = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: calls.append("clock") or real_clock())
    events = []
    phases = worker.Phases(SimpleNamespace(write=events.append, flush=lambda: None), cuda=True)
    calls.clear()
    with phases.phase("rollout"):
        pass
    assert calls[:2] == ["synchronize", "clock"] and calls.count("synchronize") == 2
    _, peaks = phases.take()
    assert peaks["rollout"] == {"allocated": 7 * GIB, "reserved": 8 * GIB, "device_used_at_end": 40 * GIB}


@pytest.mark.parametrize(
    "message",
    [
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing ...",
        "To serve at least one request with the models's max seq len (131072), (16.0 GiB KV cache is needed, which is "
        "larger than the available KV cache memory (4.2 GiB).",
    ],
)
def test_vllm_refusing_to_start_is_engine_cannot_start(message):
    assert worker.engine_refusal(repr(ValueError(message))).startswith("engine cannot start: the engine's share holds")
    assert worker.engine_refusal(repr(ValueError("shape mismatch"))) is None


def test_an_engine_process_refusing_to_start_is_recorded_as_engine_cannot_start(tmp_path, stand_in, monkeypatch):
    refusal = "(EngineCore pid=7) ValueError: No available memory for the cache blocks. Try increasing ..."
    monkeypatch.setenv("STAND_IN_ENGINE_LOG", refusal)
    record = configuration.run_configuration(job(tmp_path), None, tmp_path / "w.log", python=stand_in, nvml=FakeNVML())
    assert record.status == "oom" and record.phase == "engine_start"
    assert record.reason.startswith("engine cannot start: the engine's share holds its weights and overheads but no KV")
    assert "(EngineCore pid=7) ValueError: No available memory for the cache blocks" in record.reason


def test_the_worker_s_skip_reasons_name_what_is_missing():
    assert worker.skip_reason(job(Path("unused"), model="qlora"), cuda=False).startswith("QLoRA")
    assert worker.skip_reason(job(Path("unused")), cuda=False) is None


def test_ranks_get_a_gpu_each_and_the_server_the_next_ones_or_the_configuration_is_skipped():
    gpus = nvml_gpus.describe(FakeNVML(*(gpu("NVIDIA H100", 79.65, index=i) for i in range(4))))
    split = nvml_gpus.split(gpus, trainer=2, server=2)
    assert split.trainer == ["GPU-00000000-fake", "GPU-00000001-fake"]
    assert split.server == ["GPU-00000002-fake", "GPU-00000003-fake"]
    assert nvml_gpus.split(gpus, trainer=4, server=1).startswith("vLLM server mode needs 1 GPU(s) of its own")
    assert nvml_gpus.split(gpus, trainer=8, server=0) == "8 ranks need a GPU each; 4 visible here"


def test_a_launch_where_fewer_ranks_report_than_asked_for_is_an_error(tmp_path, stand_in, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML(*(gpu("NVIDIA H100", 79.65, index=i) for i in range(3)))
    two_ranks = job(tmp_path, dtype="bfloat16", num_processes=2, distributed_type="ddp")
    # the stand-in takes the launcher's place: one process, one rank's word, where two were asked for
    record = configuration.run_configuration(two_ranks, None, tmp_path / "w.log", python=stand_in, nvml=nvml)
    assert record.status == "error" and record.reason.startswith("1 of 2 ranks ended with a word")
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["cuda_visible_devices"] == "GPU-00000000-fake,GPU-00000001-fake"  # a GPU per rank
    assert record.distribution.launcher == "accelerate launch" and record.distribution.world_size is None


def test_a_fork_of_a_worker_counts_only_its_own_pages_not_its_parent_s_again(tmp_path):
    # a worker holding ~400 MB forks a child that writes nothing: the child's RSS shows the parent's
    # pages (shared copy-on-write), which the tree's memory must not count twice
    script = (
        "import os, time\n"
        "held = bytearray(400 * 2**20)\n"
        "for i in range(0, len(held), 4096): held[i] = 1\n"
        "if os.fork() == 0:\n"
        "    time.sleep(30); os._exit(0)\n"
        "time.sleep(30)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        waited = 0.0
        while not psutil.Process(worker.pid).children() and waited < 25:  # its 400 MB touched, then the fork
            time.sleep(0.2)
            waited += 0.2
        sampler = MemorySampler(worker.pid, None)
        sampler.list_members()
        (child,) = psutil.Process(worker.pid).children()
        assert child.memory_info().rss > 400 * 2**20  # what counting its RSS would add
        sampler.sample()
        tree = sampler.peaks[(None, None, "setup")]
        assert 400 * 2**20 < tree < psutil.Process(worker.pid).memory_info().rss + 100 * 2**20
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


NEW_CLASS = """
["rtx-pro-6000"]
name = "NVIDIA RTX PRO 6000 Blackwell"
gpu_class = "rtx-pro"
memory_gib = 94.97
memory_source = "a class made up for this test"
spec_bandwidth_gb_s = 1792.0
bandwidth_source = "a class made up for this test"
peak_bf16_tflops = 500.0
flops_source = "a class made up for this test"
host_link_gb_s = 50.0
link_source = "a class made up for this test"
device_names = ["RTX PRO 6000"]
profile = "gpu"
"""


@pytest.fixture
def catalog_with_a_new_class(tmp_path, monkeypatch):
    """profiles/ copied, with one hardware class more in hardware.toml: nothing else changed."""
    for path in profile.PROFILES_DIR.glob("*.toml"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "hardware.toml").write_text((tmp_path / "hardware.toml").read_text() + NEW_CLASS)
    monkeypatch.setattr(profile, "PROFILES_DIR", tmp_path)
    profile.load_hardware.cache_clear()
    yield
    monkeypatch.undo()
    profile.load_hardware.cache_clear()


def test_a_new_hardware_class_is_one_catalog_entry(catalog_with_a_new_class, capsys):
    assert install_plan.classify("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 94.97) == ("gpu", "rtx-pro-6000")
    assert profile.load("gpu", hardware="rtx-pro-6000").hardware == "rtx-pro-6000"
    cli.main(
        [
            "estimate",
            "--shape",
            "8b",
            "--hardware",
            "rtx-pro-6000",
            "--levers",
            "model=lora,gradient_checkpointing=true",
        ]
    )
    out = capsys.readouterr().out
    assert "NVIDIA RTX PRO 6000 Blackwell (94.97 GiB each)" in out and "time per step, per GPU" in out


def test_every_catalogued_class_names_a_profile_that_runs_on_it():
    for name, hardware in profile.load_hardware().items():
        for each in filter(None, (hardware.profile, hardware.node_profile)):
            assert profile.load(each, hardware=name).hardware == name
        for each in hardware.cluster_profiles:
            assert profile.load(each).parts == ("distributed",)


def test_several_gpus_of_a_class_with_a_node_profile_run_it(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML(*(gpu("NVIDIA H100 80GB HBM3", 79.65, index=i) for i in range(8)))
    assert bench.detect(nvml)[:2] == ("h100-node", "h100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # one of them: one GPU's profile
    assert bench.detect(nvml)[:2] == ("h100", "h100")
    assert install_plan.classify("NVIDIA H200", 140.4, gpus=8) == ("h200", "h200")  # a class without a node profile


def test_the_cpu_profile_sees_no_gpu_where_the_bench_session_hid_them(monkeypatch):
    # `--profile cpu` on a GPU machine: the session sets CUDA_VISIBLE_DEVICES=-1; NVML still lists the GPUs
    nvml = FakeNVML({"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1", "total": 80 * GIB, "used": 0})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    profile, hardware, seen = bench.detect(nvml)
    assert (profile, hardware) == ("cpu", None) and "CUDA_VISIBLE_DEVICES=-1 hides every GPU" in seen
    assert nvml_gpus.visible_gpus(nvml) == [] and len(nvml_gpus.describe(nvml)) == 1
