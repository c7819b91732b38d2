"""Reward-function throughput at GRPO burst sizes: ours against the guide's code and TRL's.

Rows: every reward x batch size x completion length x completion format, from the
profile's ``[rewards]`` table. Reference rows run the same inputs: the guide's library
(``benchmarks/rewardbench/seed_rewards.py``; on conversational completions it is given
``completion[0]["content"]``, as the guide says to do) and TRL's ``think_format_reward`` and
``accuracy_reward`` (which take conversational completions only). The rubric judge's
client is an in-process stub, so its rows measure the reward's own overhead, not a model.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

import pytest

import rewards
from benchmarks.rewardbench import reward_inputs, seed_rewards
from benchmarks.rewardbench.cases import CASES, Case, load_profile
from rewards.sandbox import Bubblewrap, default_sandbox


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Rows that are compared run back to back (ours, then the guide's, on the same inputs), so
    that the machine's drift over the session does not fall between them."""
    settings = load_profile(metafunc.config).rewards
    inputs = [(b, w, f) for b in settings.batch_sizes for w in settings.words for f in settings.formats]
    if "case" in metafunc.fixturenames:
        params = [
            pytest.param(case, batch, words, fmt, id=f"{case.id}-b{batch}-w{words}-{fmt}")
            for batch, words, fmt in inputs
            for case in CASES
            if fmt in case.formats
        ]
        metafunc.parametrize("case, batch, words, fmt", params)
    elif "exec_batch" in metafunc.fixturenames:
        # A completion's execution costs one sandboxed interpreter whatever its length or format (the
        # code is padded with a docstring; the format only changes how it is extracted): one row per
        # batch, at the shortest completions as plain strings, and the guide's at its one batch.
        words, fmt = min(settings.words), "str"
        batches = dict.fromkeys([*settings.batch_sizes, settings.seed_execution_batch])
        params = [
            pytest.param(implementation, batch, words, fmt, id=f"{implementation}-b{batch}-w{words}-{fmt}")
            for batch in batches
            for implementation in ("grpo-bench", "seed")
            if implementation == "grpo-bench" or batch == settings.seed_execution_batch
        ]
        metafunc.parametrize("implementation, exec_batch, words, fmt", params)


def _describe(benchmark: Any, reward: str, implementation: str, batch: int, words: int, fmt: str) -> None:
    benchmark.group = f"{reward} batch={batch} words={words} {fmt}"
    benchmark.extra_info.update(reward=reward, implementation=implementation, batch=batch, words=words, format=fmt)


def test_reward_throughput(benchmark: Any, case: Case, batch: int, words: int, fmt: str) -> None:
    inputs = reward_inputs.build(case.kind, batch, words, fmt)
    fn = case.make()
    _describe(benchmark, case.reward, case.implementation, batch, words, fmt)
    result = benchmark(fn, inputs.completions, **inputs.kwargs)
    assert len(result) == batch
    benchmark.extra_info["mean_reward"] = statistics.fmean(r for r in result if r is not None)


def _latencies(seconds_each: list[float]) -> dict[str, float]:
    seconds = sorted(seconds_each)
    return {
        "p50_latency_s": statistics.median(seconds),
        "p99_latency_s": seconds[min(len(seconds) - 1, round(0.99 * (len(seconds) - 1)))],
    }


@pytest.fixture(scope="module")
def sandbox() -> Bubblewrap:
    reason = default_sandbox().unavailable_reason()
    if reason:
        pytest.skip(f"execution rows need the default sandbox: {reason}")
    return default_sandbox()


def test_execution_throughput(
    benchmark: Any, bench_profile: Any, sandbox: Bubblewrap, implementation: str, exec_batch: int, words: int, fmt: str
) -> None:
    """Completions/s and per-completion latency of the execution reward, ours or the guide's design."""
    settings = bench_profile.rewards
    inputs = reward_inputs.build("code", exec_batch, words, fmt)
    _describe(benchmark, "test_execution_reward", implementation, exec_batch, words, fmt)
    if implementation == "seed":
        result, latencies, described = _seed_execution(benchmark, settings, inputs)
    else:
        result, latencies, described = _our_execution(benchmark, settings, inputs, sandbox)
    assert result == [1.0 if i % 2 == 0 else 0.0 for i in range(exec_batch)], "a verdict differs from the inputs' truth"
    benchmark.extra_info.update(_latencies(latencies), **described)


def _our_execution(benchmark: Any, settings: Any, inputs: Any, sandbox: Bubblewrap) -> tuple[list, list, dict]:
    """One bubblewrap sandbox per completion, a small runner inside, workers = cores."""
    reward = rewards.make_test_execution_reward(sandbox, timeout_s=settings.execution_timeout_s)
    latencies: list[float] = []

    def log_extra(column: str, values: list) -> None:
        if column == "execution_seconds":
            latencies.extend(values)

    result = benchmark.pedantic(
        reward,
        args=(inputs.completions,),
        kwargs={**inputs.kwargs, "log_extra": log_extra},
        rounds=settings.execution_rounds,
        warmup_rounds=1 if settings.execution_rounds > 1 else 0,
    )
    return result, latencies, {"workers": reward.workers, "sandbox": "bubblewrap + runner"}


class HostUidBubblewrap(Bubblewrap):
    """The default boundary, but the process inside keeps the host uid (no drop)."""

    def uid(self, slot: int) -> None:
        return None


def _seed_execution(benchmark: Any, settings: Any, inputs: Any) -> tuple[list, list, dict]:
    """The guide's design: serial, one ``python -m pytest`` per completion, in the same bubblewrap
    (same namespaces, mounts and rlimits; the guide's files are written by the host into a 0700
    temporary directory, so pytest runs as the host uid inside instead of a dropped one)."""
    work_root = tempfile.mkdtemp(prefix="grpo-bench-seed-", dir="/var/tmp")
    seed_rewards.SEED_WORK_ROOT = work_root
    seed_sandbox = HostUidBubblewrap(
        ro_paths=[sys.prefix, work_root], python_flags=("-I",), env={"PATH": f"{sys.prefix}/bin:/usr/bin:/bin"}
    )
    sandbox_cmd = seed_sandbox.runner_argv(0, settings.execution_timeout_s)
    latencies: list[float] = []

    def serial_round() -> list[float]:
        results = []
        for completion, tests in zip(inputs.completions, inputs.kwargs["test_code"]):
            start = time.perf_counter()
            results += seed_rewards.test_execution_reward(
                [completion], [tests], sandbox_cmd, settings.execution_timeout_s
            )
            latencies.append(time.perf_counter() - start)
        return results

    result = benchmark.pedantic(serial_round, rounds=settings.seed_execution_rounds, warmup_rounds=0)
    os.rmdir(work_root)
    return result, latencies, {"workers": 1, "sandbox": "bubblewrap + python -m pytest"}
