"""Timed GRPO steps on tiny shapes: the harness records what it should, and the physics shows.

Each test runs real TRL GRPOTrainer steps in a worker process (a few seconds each on CPU).
"""

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

from benchmarks.catalog.profiles import Levers, load_shapes  # noqa: E402
from benchmarks.run.grpo.configuration import run_configuration  # noqa: E402
from benchmarks.run.grpo.job import Job  # noqa: E402
from benchmarks.run.model_dirs import materialise  # noqa: E402

BASE = Levers(num_generations=4, per_device_train_batch_size=4, max_completion_length=16)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: materialise(load_shapes()[name], "float32", root=root) for name in ("tiny", "tiny-wide")}


def job(model_dir, steps=1, **levers):
    """A job of ``BASE`` with ``levers`` changed on a tiny shape: ``steps`` measured steps, no warm-up."""
    levers = dataclasses.replace(BASE, **levers)
    return Job(
        levers=levers, model_dir=str(model_dir), dtype="float32", warmup_steps=0, measured_steps=steps, prompt_words=8
    )


def run(model_dirs, tmp_path, shape="tiny", prefix=(), steps=1, **levers):
    record = run_configuration(
        job(model_dirs[shape], steps, **levers), budget_bytes=None, log_path=tmp_path / "worker.log", prefix=prefix
    )
    assert record.status == "ok", record.reason or record.log_tail
    return record


def no_network_prefix():
    unshare = shutil.which("unshare")
    if not unshare or subprocess.run([unshare, "--net", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a network namespace here (unshare --net)")
    return [unshare, "--net"]


def test_a_step_records_time_memory_and_state_per_phase_with_no_network(model_dirs, tmp_path):
    record = run(model_dirs, tmp_path, prefix=no_network_prefix(), steps=2)
    assert len(record.steps) == 2
    step = record.steps[-1]
    assert {"rollout", "reward", "scoring", "forward_backward", "optimizer"} <= set(step.phase_s)
    assert 0.8 * step.wall_s < sum(step.phase_s.values()) <= step.wall_s  # exclusive, nearly all of it
    assert {"rollout", "forward_backward", "optimizer"} <= set(step.peak_rss_bytes)
    assert step.completion_tokens == 4 * 16 and step.completion_tokens_per_s > 0
    assert step.optimizer_state_bytes > 0 and step.grad_bytes > 0
    assert record.summary.measured_steps == 2 and record.harness.samples > 0


def test_eight_bit_adamw_keeps_about_a_quarter_of_the_state(model_dirs, tmp_path):
    full = run(model_dirs, tmp_path, shape="tiny-wide", optim="adamw_torch").summary.optimizer_state_bytes
    eight_bit = run(model_dirs, tmp_path, shape="tiny-wide", optim="adamw_8bit").summary.optimizer_state_bytes
    assert 0.2 < eight_bit / full < 0.35  # 2 B/param of uint8 states (+ block scales) against 8 B/param


def test_lora_gradients_and_states_are_a_small_fraction_of_full_fine_tuning(model_dirs, tmp_path):
    full = run(model_dirs, tmp_path, shape="tiny-wide").summary
    lora = run(model_dirs, tmp_path, shape="tiny-wide", model="lora", lora_r=8).summary
    assert lora.trainable_params < 0.2 * full.trainable_params
    assert lora.grad_bytes < 0.2 * full.grad_bytes
    assert lora.optimizer_state_bytes < 0.2 * full.optimizer_state_bytes


def test_gradient_checkpointing_lowers_the_training_peak_at_long_sequences(model_dirs, tmp_path):
    # 8 x 384 positions: the model predicts checkpointing keeps ~150 MiB less, three times the margin asserted
    long = {"shape": "tiny-wide", "max_completion_length": 384, "per_device_train_batch_size": 8, "num_generations": 8}
    plain = run(model_dirs, tmp_path, **long).summary.peak_rss_bytes_by_phase["forward_backward"]
    checkpointed = run(model_dirs, tmp_path, gradient_checkpointing=True, **long)
    assert checkpointed.summary.peak_rss_bytes_by_phase["forward_backward"] < plain - 50 * 2**20


def test_beta_without_peft_adds_a_reference_copy_of_the_weights(model_dirs, tmp_path):
    policy_bytes = load_shapes()["tiny"].param_count() * 4
    assert run(model_dirs, tmp_path).summary.reference_model_bytes == 0  # beta = 0: TRL loads none
    assert run(model_dirs, tmp_path, beta=0.04).summary.reference_model_bytes == policy_bytes
    assert run(model_dirs, tmp_path, beta=0.04, model="lora").summary.reference_model_bytes == 0


def test_a_configuration_this_machine_cannot_run_is_skipped_with_its_reason(model_dirs, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("QLoRA runs where CUDA is")
    record = run_configuration(
        job(model_dirs["tiny"], model="qlora"), budget_bytes=None, log_path=tmp_path / "worker.log"
    )
    assert record.status == "skipped" and "CUDA" in record.reason


def test_a_worker_over_its_memory_budget_is_recorded_as_oom_in_its_phase(model_dirs, tmp_path):
    record = run_configuration(job(model_dirs["tiny"]), budget_bytes=200 * 2**20, log_path=tmp_path / "worker.log")
    assert record.status == "oom" and record.phase and "budget" in record.reason


def test_a_worker_does_not_outlive_its_harness(tmp_path):
    marker = f"grpo-bench-orphan-{tmp_path.name}"
    interpreter = tmp_path / "interpreter"
    interpreter.write_text(f"#!/bin/bash\ntouch {tmp_path / 'started'}\nexec -a {marker} sleep 60\n")
    interpreter.chmod(0o755)
    harness = (
        "import os, threading, pathlib\n"
        "from benchmarks.catalog.levers import Levers\n"
        "from benchmarks.run.grpo.configuration import run_configuration\n"
        "from benchmarks.run.grpo.job import Job\n"
        "threading.Timer(1.0, lambda: os._exit(0)).start()\n"
        "job = Job(levers=Levers(), model_dir='-', dtype='float32', prompt_words=8, warmup_steps=0, measured_steps=1)\n"
        f"run_configuration(job, None, pathlib.Path({str(tmp_path / 'w.log')!r}), python={str(interpreter)!r})\n"
    )
    subprocess.run([sys.executable, "-c", harness], timeout=30, check=False)
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    assert (tmp_path / "started").exists(), "the worker never started"
    assert not left, "the worker kept running after its harness ended"


def test_gradient_accumulation_runs_its_micro_batches_in_one_step(model_dirs, tmp_path):
    record = run(model_dirs, tmp_path, gradient_accumulation_steps=2)
    step = record.steps[-1]
    assert step.completion_tokens == 2 * 4 * 16  # two micro-batches of 4 completions in one optimizer step
    assert step.phase_s["forward_backward"] > 0 and step.phase_s["rollout"] > 0


def test_the_progress_line_says_the_time_elapsed_and_left_at_the_pace_so_far():
    from benchmarks.run.grpo.timed_steps import progress

    assert progress(0.0, 0, 5) == "(0:00 elapsed)"
    assert progress(150.0, 2, 5) == "(2:30 elapsed, ~3:45 left)"  # 75 s each, three to go
