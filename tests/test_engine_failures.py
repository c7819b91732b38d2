"""A first GPU run says what happened: it refuses a GPU other processes fill, its bandwidth probe cannot hang it,
the decode part's vLLM engine starts without a CUDA toolkit, and a failure is filed as out of memory only where
memory ran out; each recorded message below is the library's own words, and the tables over such files call a cell
"does not fit" only from out-of-memory rows."""

import json
import shutil
import sys

import pytest
from test_devices import GIB, FakeNVML, gpu
from test_tables import grpo_file, sizing_row

from benchmarks.catalog.profiles import Levers, load_hardware, load_shapes
from benchmarks.cli import main
from benchmarks.commands import bench
from benchmarks.report.markdown import regenerate
from benchmarks.results import schema
from benchmarks.run import vllm_env
from benchmarks.run.decode import engines, sweep
from benchmarks.run.grpo import configuration
from benchmarks.run.grpo.job import Job
from benchmarks.run.machine import nvml_gpus, pace

SAMPLER = vllm_env.FLASHINFER_SAMPLER


def toolkit(root, name="cuda"):
    """A stand-in CUDA toolkit: ``root/name/bin/nvcc``."""
    nvcc = root / name / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    return nvcc


def test_without_nvcc_the_decode_engine_keeps_vllm_s_sampler_off_flashinfer_s_jit(tmp_path):
    bare = {"PATH": str(tmp_path / "empty")}
    absent = tmp_path / "no-cuda"  # FlashInfer's default /usr/local/cuda, absent on a driver-only image
    assert vllm_env.sampler_env(bare, cuda_default=absent) == {SAMPLER: "0"}
    nvcc = toolkit(tmp_path)
    assert vllm_env.sampler_env({"PATH": str(nvcc.parent)}, cuda_default=absent) == {}  # nvcc on PATH
    assert vllm_env.sampler_env({**bare, "CUDA_HOME": str(nvcc.parent.parent)}, cuda_default=absent) == {}
    assert vllm_env.sampler_env(bare, cuda_default=nvcc.parent.parent) == {}  # the default toolkit is there
    assert vllm_env.sampler_env({**bare, "CUDA_HOME": str(absent)}, cuda_default=nvcc.parent.parent) == {
        SAMPLER: "0"
    }  # FlashInfer takes CUDA_HOME as given, and finds no nvcc under it
    assert vllm_env.sampler_env({**bare, SAMPLER: "1"}, cuda_default=absent) == {}  # the user's own setting stands


@pytest.mark.parametrize(("engine", "seen"), [("vllm", "0"), ("transformers-graphs", "unset")])
def test_the_decode_part_starts_its_vllm_engine_with_that_setting(tmp_path, monkeypatch, engine, seen):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-toolkit"))  # where FlashInfer looks first: no nvcc there
    monkeypatch.delenv(SAMPLER, raising=False)
    said = f"import os, sys; sys.stderr.write('sampler=' + os.environ.get({SAMPLER!r}, 'unset')); sys.exit(3)"
    monkeypatch.setattr(sweep, "WORKER", [sys.executable, "-c", said])
    hardware, shape = load_hardware()["cpu"], load_shapes()["tiny"]
    [row] = sweep._engine_rows({"engine": engine}, None, hardware, shape, 30.0, {})
    assert row.status == "error" and row.reason == f"sampler={seen}"


def test_a_cuda_decode_row_says_its_engine_ran_pytorch_s_sampler(monkeypatch):
    monkeypatch.setenv(SAMPLER, "0")
    assert vllm_env.SAMPLER_OFF in engines.execution("vllm", cuda=True)
    monkeypatch.delenv(SAMPLER)
    assert "sampler" not in engines.execution("vllm", cuda=True) and "sampler" not in engines.execution("vllm", False)


# A worker whose trainer fails as the named library fails: the real worker (its main, its channel), fed the
# recorded message, with the engine process's log where vLLM's engine runs in a process of its own.
FAILING = """
import os, sys
from benchmarks.run.grpo import worker
def failing(*args, **kwargs):
    import torch
    print(os.environ.get("ENGINE_LOG", ""), flush=True)
    kinds = {"OutOfMemoryError": torch.cuda.OutOfMemoryError, "ValueError": ValueError, "RuntimeError": RuntimeError}
    raise kinds[os.environ["FAIL_AS"]](os.environ["FAIL_WITH"])
worker.build_trainer = failing
sys.argv = [sys.argv[0], sys.argv[-1]]
worker.main()
"""
TORCH_OOM = (  # c10/cuda/CUDACachingAllocator.cpp, as torch 2.x prints it
    "CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 14.57 GiB of which 1.58 GiB is "
    "free. Including non-PyTorch memory, this process has 12.94 GiB memory in use."
)
NO_CACHE_BLOCKS = (  # vllm/v1/core/kv_cache_utils.py: _check_enough_kv_cache_memory
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine "
    "(this flag also controls CPU memory reservation on the CPU backend, despite its name)."
)
NOT_FREE = (  # vllm/v1/worker/utils.py: the free memory at the engine's start
    "Free memory on device cuda:0 (20.1/79.19 GiB) on startup is less than desired GPU memory utilization (0.3, "
    "23.76 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)
NO_NVCC = "Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist"  # flashinfer/jit/cpp_ext.py
ENGINE_DIED = "Engine core initialization failed. See root cause above. Failed core proc(s): {}"  # v1/engine/utils.py


@pytest.mark.parametrize(
    ("raised", "message", "engine_log", "status", "said"),
    [
        ("OutOfMemoryError", TORCH_OOM, "", "oom", None),
        ("ValueError", NO_CACHE_BLOCKS, "", "oom", "the engine's share holds its weights and overheads but no KV"),
        ("ValueError", NOT_FREE, "", "oom", "the device's free memory at the engine's start is below its share"),
        ("RuntimeError", ENGINE_DIED, f"(EngineCore_DP0 pid=7) ValueError: {NO_CACHE_BLOCKS}", "oom", "no KV cache"),
        ("RuntimeError", NO_NVCC, "", "error", NO_NVCC),
        ("RuntimeError", ENGINE_DIED, f"(EngineCore_DP0 pid=7) RuntimeError: {NO_NVCC}", "error", NO_NVCC),
        ("ValueError", "shape mismatch", "", "error", "shape mismatch"),
    ],
    ids=[
        "torch",
        "vllm-no-cache",
        "vllm-not-free",
        "vllm-process-no-cache",
        "flashinfer",
        "flashinfer-process",
        "other",
    ],
)
def test_a_worker_fed_each_recorded_failure_writes_its_status(
    tmp_path, monkeypatch, raised, message, engine_log, status, said
):
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/bash\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    for name, value in {"FAIL_AS": raised, "FAIL_WITH": message, "ENGINE_LOG": engine_log}.items():
        monkeypatch.setenv(name, value)
    job = Job(
        levers=Levers(), model_dir=str(tmp_path), dtype="float32", prompt_words=8, warmup_steps=0, measured_steps=1
    )
    record = configuration.run_configuration(job, None, tmp_path / "w.log", python=str(python), nvml=FakeNVML())
    assert record.status == status, record.reason
    assert said is None or said in record.reason
    if message in (NO_CACHE_BLOCKS, NOT_FREE) or engine_log:
        assert record.phase == "engine_start" and record.reason.startswith("engine cannot start: ")


def failed_file(directory, statuses):
    """A GPU GRPO file whose configurations ended as ``statuses`` (status, phase, reason), the first file's shape."""
    path = grpo_file(directory, "h200", "32b", status=statuses[0][0])
    data = json.loads(path.read_text())
    first = data["configurations"][0]
    data["configurations"] = [
        {**first, "name": f"c{i}", "status": s, "phase": phase, "reason": reason, "summary": None, "steps": []}
        for i, (s, phase, reason) in enumerate(statuses)
    ]
    path.write_text(json.dumps(data))
    return path


def test_the_tables_call_a_cell_does_not_fit_only_from_out_of_memory_rows(tmp_path):
    failed_file(
        tmp_path, [("oom", "engine_start", f"engine cannot start: x: {NO_CACHE_BLOCKS}"), ("error", None, NO_NVCC)]
    )
    _, row = sizing_row(tmp_path, "32b")
    cell = row["H200-class (140.4 GiB)"]
    assert cell.startswith(f"failed: error: {NO_NVCC}") and "1 of 2 configurations failed, 1 ran out of memory" in cell
    written = regenerate.write_tables(tmp_path, tmp_path / "tables", ledger=tmp_path / "claims.md")
    text = "".join(p.read_text() for p in written)
    assert "ran out of memory (measured" not in text and "failed: error" in text
    [claim] = [line for line in (tmp_path / "claims.md").read_text().splitlines() if "| 32b on one" in line]
    assert "failed: error" in claim and "measured and does not hold" not in claim  # a broken run decides nothing


def test_every_configuration_out_of_memory_is_a_measured_does_not_fit_naming_the_engine_s_share(tmp_path):
    reason = f"engine cannot start: the engine's share holds no KV cache: {NO_CACHE_BLOCKS}"
    failed_file(tmp_path, [("oom", "engine_start", reason), ("oom", "optimizer", TORCH_OOM)])
    _, row = sizing_row(tmp_path, "32b")
    cell = row["H200-class (140.4 GiB)"]
    assert cell.startswith("does not fit: every configuration ran out of memory (measured")
    assert "1 of them at the engine's start, its share too small" in cell


def test_a_gpu_other_processes_fill_is_refused_before_any_part_and_a_little_is_said(monkeypatch, capsys):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml_gpus.held_by_others(FakeNVML(gpu("NVIDIA H100 80GB HBM3", 79.65))) is None
    desktop = FakeNVML(gpu("NVIDIA GeForce RTX 4090", 23.99, processes={1042: int(0.6 * GIB)}))  # a display server
    line, refused = nvml_gpus.held_by_others(desktop)
    assert not refused and "GPU 0 (NVIDIA GeForce RTX 4090): 0.60 GiB held by process(es) 1042" in line
    bench.refuse_shared_gpus(desktop)
    assert "inside the 10% a device tolerates" in capsys.readouterr().out
    shared = FakeNVML(gpu("NVIDIA H100 80GB HBM3", 79.65, processes={7: 50 * GIB}))  # another job's model
    with pytest.raises(SystemExit, match=r"refused: GPU 0 \(NVIDIA H100 80GB HBM3\): 50.00 GiB held by process"):
        bench.refuse_shared_gpus(shared)


def test_a_bandwidth_probe_that_hangs_ends_at_the_engine_limit(monkeypatch):
    monkeypatch.setattr(sweep, "WORKER", [sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(RuntimeError, match=r"the bandwidth probe gave no answer within 1 s \(engine_limit_s\)"):
        sweep._decode_process({"probe": {}}, {}, 1.0)


def test_a_part_that_breaks_is_said_and_the_parts_after_it_still_run(tmp_path, monkeypatch, committed_results, capsys):
    decode = max((committed_results / "cpu").glob("*-decode.json"))
    written = tmp_path / "cpu" / decode.name
    written.parent.mkdir()
    shutil.copy(decode, written)

    def part(name, *args):
        if name == "rewards":
            raise RuntimeError("the reward benchmarks wrote no result")
        return written

    monkeypatch.setattr(bench, "run_part", part)
    monkeypatch.setattr(bench, "calibrated", lambda profile: None)
    monkeypatch.setattr(bench, "fix_malloc_thresholds", lambda profile: None)
    assert main(["bench", "--profile", "cpu", "--only", "rewards,decode", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "error: rewards failed: RuntimeError: the reward benchmarks wrote no result" in err
    assert "error: rewards failed (above); the other parts' files are whole" in err
    assert pace.header(schema.read_result(written, written.name).record).pace.part_s >= 0  # decode ran, was timed
