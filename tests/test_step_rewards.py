"""The reward a GRPO step runs (the ``reward`` lever) and the malloc thresholds every CPU part runs under."""

import os
import subprocess
import sys

import pytest

from benchmarks.catalog import profiles
from benchmarks.commands import bench
from benchmarks.run.grpo import trainer, worker
from benchmarks.run.grpo.job import Job


def job(**levers) -> Job:
    return Job(
        levers=profiles.Levers(**levers),
        model_dir="unused",
        dtype="float32",
        prompt_words=8,
        warmup_steps=0,
        measured_steps=1,
    )


@pytest.mark.parametrize(
    ("reward", "names", "columns"),
    [
        ("synthetic", ["varied_reward"], set()),
        ("format-exact", ["format_reward", "correctness_reward"], {"answer"}),
        ("schema", ["answer_schema_reward"], set()),
        ("execution", ["test_execution_reward"], {"test_code"}),
    ],
)
def test_each_step_reward_brings_its_functions_and_the_columns_they_read(reward, names, columns):
    functions, data = trainer.step_rewards(reward, rows=6)
    assert [f.__name__ for f in functions] == names
    assert set(data) == columns and all(len(values) == 6 for values in data.values())


def test_the_step_rewards_score_real_completions(sandbox):
    functions, data = trainer.step_rewards("execution", rows=2)
    right = "def add(a, b):\n    return a + b\n"
    assert functions[0]([right, "w1 w2 w3"], **data) == [1.0, 0.0]
    functions, data = trainer.step_rewards("format-exact", rows=1)
    text = "<reasoning>r</reasoning>\n<answer>42</answer>"
    assert [f([text], **data) for f in functions] == [[1.0], [2.0]]


def test_an_unknown_step_reward_and_a_misspelt_lever_are_refused():
    with pytest.raises(ValueError, match="no such step reward"):
        trainer.step_rewards("judge", rows=1)
    with pytest.raises(profiles.ProfileError, match="reward: 'exec' is not one of synthetic"):
        profiles.check_lever("reward", "exec", "cpu.toml", "grpo.extra[0].reward")


def test_the_execution_reward_is_skipped_with_the_reason_where_no_sandbox_works(monkeypatch):
    class Refusing:
        def unavailable_reason(self):
            return "bwrap: no user namespaces"

    monkeypatch.setattr(worker, "default_sandbox", Refusing)
    reason = worker.skip_reason(job(reward="execution"), cuda=False)
    assert reason == "the execution reward runs nothing without a sandbox here: bwrap: no user namespaces"
    assert worker.skip_reason(job(), cuda=False) is None


# A child that frees 64 MiB of 1 MiB blocks below a block it keeps: glibc's own thresholds rise after the
# first free, put the blocks in its heap and keep them; fixed ones map each block and return it on free.
HELD_AFTER_FREE = """
import resource
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
first = bytearray(1 << 20)
del first
blocks = [bytearray(1 << 20) for _ in range(64)]
pinned = bytearray(64)
before = rss()
del blocks
print(before - rss())
"""


def freed_bytes(env: dict[str, str]) -> int:
    run = subprocess.run([sys.executable, "-c", HELD_AFTER_FREE], env=env, capture_output=True, text=True, check=True)
    return int(run.stdout)


def test_the_profile_s_thresholds_reach_the_processes_a_run_starts(monkeypatch):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert freed_bytes(environment) < 16 << 20  # glibc's own: the heap keeps them
    monkeypatch.setattr(os, "environ", dict(environment))
    monkeypatch.setattr(worker, "fix_malloc_thresholds", lambda threshold: None)  # not this test process's heap
    bench.fix_malloc_thresholds(profiles.load("cpu"))
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == "131072" == os.environ["MALLOC_TRIM_THRESHOLD_"]
    assert freed_bytes(dict(os.environ)) > 48 << 20  # fixed: every block given back


def test_a_gpu_profile_leaves_glibc_alone(monkeypatch):
    monkeypatch.setattr(os, "environ", {})
    bench.fix_malloc_thresholds(profiles.load("h200"))
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ
