"""The reward benchmark's targets are computed from its own rows, per matching case."""

import pytest

from benchmarks.catalog import profiles
from benchmarks.results import schema
from benchmarks.rewardbench.reward_targets import summarize


def row(reward, implementation, median_s, batch=8, words=100, fmt="str", iqr_s=0.0):
    """A row as pytest-benchmark writes it, typed by the schema (which adds completions/s)."""
    info = {"reward": reward, "implementation": implementation, "batch": batch, "words": words, "format": fmt}
    output = {"benchmarks": [{"name": reward, "extra_info": info, "stats": {"median": median_s, "iqr": iqr_s}}]}
    return schema.benchmark_rows(output)[0]


def test_targets_compare_ours_with_the_seed_on_the_same_case_only():
    rows = [
        row("schema_reward", "grpo-bench", 0.001),
        row("schema_reward", "seed", 0.010),  # 10x: met
        row("schema_reward", "grpo-bench", 0.001, batch=64),  # no seed row for this case: not compared
        row("test_execution_reward", "grpo-bench", 1.0, batch=64),
        row("test_execution_reward", "seed", 10.0, batch=64),  # 10x: under 20x
        row("format_reward", "grpo-bench", 0.002),
        row("format_reward", "seed", 0.001),  # half as fast: missed
        row("think_format_reward", "trl", 0.001),  # a reference row, in no target
    ]
    block = summarize(profiles.load("cpu"), rows)
    assert rows[0].extra_info.completions_per_s == pytest.approx(8000)
    targets = {t.name: t for t in block.targets}
    assert targets["schema_reward"].lowest_ratio == pytest.approx(10) and targets["schema_reward"].met is True
    assert len(targets["schema_reward"].comparisons) == 1
    assert targets["execution"].lowest_ratio == pytest.approx(10) and targets["execution"].met is False
    assert targets["string_rewards"].lowest_ratio == pytest.approx(0.5) and targets["string_rewards"].met is False
    assert block.schema_version == schema.SCHEMA_VERSION and block.profile["name"] == "cpu"


def test_no_slower_means_not_slower_beyond_the_rows_spread():
    def block(ours_s, seed_s, iqr_fraction):
        rows = [
            row("format_reward", "grpo-bench", ours_s, iqr_s=ours_s * iqr_fraction),
            row("format_reward", "seed", seed_s),
        ]
        return {t.name: t for t in summarize(profiles.load("cpu"), rows).targets}["string_rewards"]

    assert block(0.00105, 0.001, 0.10).met is True  # 5% slower, 10% spread: within noise
    assert block(0.00120, 0.001, 0.10).met is False  # 17% slower, 10% spread: slower
    assert block(0.00105, 0.001, 0.0).met is False  # 5% slower, no spread: slower


def test_a_target_with_no_rows_says_not_measured():
    block = summarize(profiles.load("cpu", quick=True), [row("format_reward", "grpo-bench", 0.001)])
    assert all(t.met is None and t.lowest_ratio is None for t in block.targets)
