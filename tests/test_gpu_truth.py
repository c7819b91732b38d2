"""What a GPU run records, shown on this CPU with stand-ins: each phase's own peak on CUDA, one allocator
setting for every context contender, a failed CUDA probe's device figure, and a commit that is honest
where the tree travelled without git."""

import io
import json
import subprocess

import pytest

from benchmarks.catalog.profiles import Levers, load, load_hardware, load_shapes
from benchmarks.model.memory.predict import GIB, OUTSIDE_ALLOCATED
from benchmarks.report import validation
from benchmarks.results import schema
from benchmarks.run.grpo import worker
from benchmarks.run.grpo.job import Job
from benchmarks.run.grpo.outcome import summarise
from benchmarks.run.grpo.worker import Phases
from benchmarks.run.machine import provenance
from benchmarks.run.max_context import contender_runs
from benchmarks.run.model_dirs import materialise

torch = pytest.importorskip("torch")


class CachingAllocator:
    """torch.cuda's memory statistics as its caching allocator keeps them: freed blocks stay reserved
    (the pool, and so NVML, never shrinks), peaks last until ``reset_peak_memory_stats``."""

    def __init__(self, total):
        self.total, self.allocated, self.reserved = total, 0, 0
        self.peak_allocated = self.peak_reserved = 0

    def malloc(self, size):
        self.allocated += size
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, size):
        self.allocated -= size

    def reset_peak_memory_stats(self):
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def install(self, monkeypatch):
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "synchronize", lambda: None)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", self.reset_peak_memory_stats)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda: self.peak_allocated)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda: self.peak_reserved)
        monkeypatch.setattr(cuda, "mem_get_info", lambda: (self.total - self.reserved - GIB, self.total))


def a_step(phases, memory, number):
    """A GRPO step's phases as the worker marks them: 8 GiB of weights stay; the rollout holds 1 GiB of
    KV cache, forward and backward 12 GiB of activations, the optimizer 1 GiB of temporaries."""
    for phase, transient in (("rollout", 1), ("forward_backward", 12), ("optimizer", 1)):
        with phases.phase(phase):
            memory.malloc(transient * GIB)
            memory.free(transient * GIB)
    seconds, peaks = phases.take()
    nvml = {phase: memory.reserved + GIB for phase in peaks}  # the pool, and the context
    cuda = {phase: schema.CudaPeaks(**value) for phase, value in peaks.items()}
    return schema.Step(
        step=number, warmup=False, wall_s=1.0, phase_s=seconds, cuda_peak_bytes=cuda, peak_device_bytes=nvml
    )


def test_on_cuda_each_phase_reads_its_own_peak_not_the_pool_s_high_water_mark(monkeypatch):
    memory = CachingAllocator(total=140 * GIB)
    memory.install(monkeypatch)
    phases = Phases(io.StringIO(), cuda=True)
    memory.malloc(8 * GIB)  # the weights
    steps = [a_step(phases, memory, number) for number in range(2)]

    summary = summarise(steps, "device memory held by the worker's processes (NVML usedGpuMemory)")
    assert summary.phase_peak_measure == schema.TORCH_ALLOCATED
    assert summary.peak_bytes_by_phase == {"rollout": 9 * GIB, "forward_backward": 20 * GIB, "optimizer": 9 * GIB}
    # beside it the device's own figure, which keeps the training pool in every later phase
    assert summary.peak_device_bytes_by_phase["rollout"] == 21 * GIB
    assert summary.peak_bytes == 21 * GIB  # the headline stays the device footprint


def test_a_phase_that_runs_out_of_memory_keeps_its_phase_and_its_allocator_peak(monkeypatch):
    memory = CachingAllocator(total=140 * GIB)
    memory.install(monkeypatch)
    phases = Phases(io.StringIO(), cuda=True)
    memory.malloc(8 * GIB)
    with pytest.raises(MemoryError), phases.phase("scoring"), phases.phase("logprob"):
        memory.malloc(30 * GIB)
        raise MemoryError("CUDA out of memory")
    assert phases.failed == ("logprob", {"allocated": 38 * GIB, "reserved": 38 * GIB})
    assert memory.peak_allocated == 38 * GIB and phases.current is None  # left, as the worker finds it


def test_a_cuda_configuration_is_compared_with_the_model_s_allocated_terms(grpo_run):
    steps = [
        schema.Step(
            step=0,
            warmup=False,
            wall_s=1.0,
            phase_s={"rollout": 0.5, "forward_backward": 0.5},
            cuda_peak_bytes={
                "rollout": schema.CudaPeaks(allocated=3 * GIB, reserved=5 * GIB),
                "forward_backward": schema.CudaPeaks(allocated=4 * GIB, reserved=5 * GIB),
            },
            peak_device_bytes={"rollout": 6 * GIB, "forward_backward": 6 * GIB},
        )
    ]
    configuration = schema.Configuration(
        name="base", levers={}, status="ok", steps=steps, summary=summarise(steps, "device memory")
    )
    run = grpo_run(configurations=[configuration])
    run.profile = schema.ProfileRecord(
        hardware="h200", grpo=schema.GrpoSettings(dtype="bfloat16", prompt_words=8, levers={})
    )
    result = schema.Result("h200/x-grpo.json", run, "grpo", "h200", "2026-12-01", shape="tiny")
    checks = validation.validate([result], load_shapes(), load_hardware())
    assert {c.phase: c.measured_bytes for c in checks} == {"rollout": 3 * GIB, "training": 4 * GIB}
    for check in checks:
        assert not set(check.terms) & set(OUTSIDE_ALLOCATED)  # no context, cached frees or vLLM
        assert check.predicted_bytes == sum(check.terms.values())


def stand_in_probe(jobs, fits_up_to):
    """run_configuration for a CUDA search: fits up to a length, out of memory in forward_backward past it."""

    def run(job, budget, log, python, timeout_s):
        jobs.append(job)
        length = job.levers.max_completion_length
        device = {"name": "stand-in", "allocator_conf": job.allocator_conf}
        if length > fits_up_to:
            peaks = schema.CudaPeaks(allocated=int(2.9 * GIB), reserved=int(2.99 * GIB))
            return schema.WorkerRecord(
                status="oom", phase="forward_backward", device=device, unfinished_cuda_peak_bytes=peaks
            )
        peaks = schema.CudaPeaks(allocated=2 * GIB, reserved=int(2.5 * GIB))
        step = schema.Step(step=0, warmup=False, wall_s=1.0, phase_s={}, cuda_peak_bytes={"forward_backward": peaks})
        return schema.WorkerRecord(status="ok", steps=[step], device=device)

    return run


def test_every_cuda_contender_runs_under_the_same_allocator_settings(monkeypatch, tmp_path):
    jobs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(contender_runs, "materialise", lambda shape, dtype: tmp_path)
    monkeypatch.setattr(contender_runs, "run_configuration", stand_in_probe(jobs, fits_up_to=1024))
    profile = load("h200")
    pythons = {name: "python3" for name in profile.context.contenders}
    path = contender_runs.run_context(profile, pythons, tmp_path, {"warmup_probe": False})

    run = schema.read_result(path, path.name).record
    assert {job.stack for job in jobs} == {"trl", "unsloth"} and len(run.contenders) == 4
    assert {job.allocator_conf for job in jobs} == {contender_runs.CUDA_ALLOC_CONF}
    assert contender_runs.CUDA_ALLOC_CONF in run.search.allocator_conf
    assert "CUDA context lies outside" in run.search.budget_enforced_by
    failed = [p for c in run.contenders for p in c.probes if not p.fits]
    assert failed and all(p.peak_bytes == int(2.99 * GIB) for p in failed)  # the device figure, not RSS
    assert {p.peak_measure for c in run.contenders for p in c.probes} == {schema.TORCH_RESERVED}


def test_a_cut_context_search_keeps_every_probe_that_ended(monkeypatch, tmp_path):
    jobs = []
    probe = stand_in_probe(jobs, fits_up_to=1024)

    def cut_in_the_third_contender(job, *args, **kwargs):
        if job.extra_config.get("use_liger_kernel"):
            raise schema.Stopped("signal SIGTERM")
        return probe(job, *args, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(contender_runs, "materialise", lambda shape, dtype: tmp_path)
    monkeypatch.setattr(contender_runs, "run_configuration", cut_in_the_third_contender)
    profile = load("h200")
    order = ("trl-1.14.2", "unsloth-2026.10.9", "trl-1.16-liger", "trl-1.16")
    with pytest.raises(schema.Stopped):
        contender_runs.run_context(profile, dict.fromkeys(order, "python3"), tmp_path, {"contenders": order})

    [path] = (tmp_path / "h200").glob("*-context.json")
    run = schema.read_result(path, path.name).record
    assert not run.complete and "SIGTERM" in run.ended_early
    assert [c.status for c in run.contenders] == ["measured", "measured", "searching"]
    assert run.verdict.measured_ratio_vs_unchunked == 1.0  # the claim's pair, written before the cut


def git_checkout(root):
    (root / "a.txt").write_text("one\n")
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "a.txt"], [*identity, "commit", "-qm", "a"]):
        subprocess.run(["git", *command], cwd=root, check=True)


def test_without_git_the_commit_comes_from_the_provenance_or_is_unknown(monkeypatch, tmp_path):
    git_checkout(tmp_path)
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    monkeypatch.setattr(provenance, "PROVENANCE", tmp_path / ".grpo-bench-commit.json")
    written = provenance.write_provenance()
    assert written.id and written.dirty is False

    monkeypatch.setenv("PATH", "")  # a machine with no git
    travelled = provenance.commit()
    assert (travelled.id, travelled.dirty) == (written.id, False) and "no git" in travelled.source
    (tmp_path / "a.txt").write_text("two\n")
    assert provenance.commit().dirty is True

    provenance.PROVENANCE.unlink()
    unknown = provenance.commit()
    assert (unknown.id, unknown.dirty) == (None, None) and unknown.short == "unknown (dirty unknown)"
    header = provenance.header("grpo", load("cpu"), False)  # no crash where the run starts
    assert json.loads(json.dumps(schema.encode(header["commit"])))["dirty"] is None


def test_the_70b_row_s_on_device_qlora_policy_trains_a_real_grpo_step_here(tmp_path):
    """The H200 script's QLoRA path (NF4 layers made where the worker runs, LoRA over them, TRL's trainer),
    run on this CPU where bitsandbytes has 4-bit kernels too; the harness itself skips QLoRA off CUDA."""
    pytest.importorskip("trl")
    pytest.importorskip("bitsandbytes")
    levers = Levers(model="qlora", gradient_checkpointing=True, per_device_train_batch_size=4, max_completion_length=8)
    job = Job(
        levers=levers,
        model_dir=str(materialise(load_shapes()["tiny"], "float32", root=tmp_path, weights="on-device")),
        dtype="float32",
        warmup_steps=0,
        measured_steps=1,
        prompt_words=8,
        weights="on-device",
    )
    assert not list(tmp_path.rglob("*.safetensors"))  # nothing but the config and tokenizer on disk
    channel = io.StringIO()
    trainer = worker.build_trainer(job, Phases(channel, cuda=False), False, str(tmp_path / "out"), None)
    base = trainer.model.base_model.model.model.layers[-1].mlp.down_proj.base_layer
    assert type(base).__name__ == "Linear4bit" and base.weight.dtype == torch.uint8
    trainer.train()
    steps = [json.loads(line) for line in channel.getvalue().splitlines() if '"event": "step"' in line]
    assert len(steps) == 1 and {"rollout", "forward_backward", "optimizer"} <= set(steps[0]["phase_s"])
