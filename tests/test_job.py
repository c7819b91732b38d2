"""The job crosses the process boundary typed: what the harness writes is what the worker reads, every lever
included, and a key either side does not know is named, never dropped."""

import json

import pytest
from test_levers import AWAY

from benchmarks.catalog.profiles import Levers
from benchmarks.run.grpo.job import Job


def a_job(**fields) -> Job:
    return Job(levers=AWAY, model_dir="m", dtype="bfloat16", prompt_words=8, warmup_steps=1, measured_steps=2, **fields)


def test_a_job_with_every_lever_away_from_its_default_reads_back_as_written(tmp_path):
    placed = a_job(
        stack="unsloth",
        extra_config={"unsloth_grpo_mini_batch": 2},
        memory_budget_bytes=3 << 30,
        malloc_mmap_threshold=131072,
        allocator_conf="expandable_segments:True",
        server_host="10.0.0.2",
        server_port=8001,
        server_starts_here=True,
        server_devices=("GPU-1", "GPU-2"),
        channel="/tmp/channel",
    )
    placed.write(tmp_path / "job.json")
    read = Job.read(tmp_path / "job.json")
    assert read == placed and isinstance(read.levers, Levers) and read.levers != Levers()
    assert read.with_levers(max_completion_length=64).levers.max_completion_length == 64
    assert read.server_mode == (AWAY.use_vllm and AWAY.vllm_mode == "server")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda data: data.update(seen="x"), "seen"),
        (lambda data: data["levers"].update(vllm_enable_sleep="yes"), "levers.vllm_enable_sleep"),
        (lambda data: data.pop("model_dir"), "model_dir"),
    ],
)
def test_a_key_the_job_lacks_or_does_not_know_is_named_with_its_file(tmp_path, change, named):
    path = tmp_path / "job.json"
    a_job().write(path)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"job.json: (unknown|missing) key\(s\) {named} "):
        Job.read(path)


def test_a_stack_the_worker_cannot_build_is_refused():
    with pytest.raises(ValueError, match="stack 'liger'"):
        a_job(stack="liger")
