"""pytest options and result-file additions for the benchmark modules.

``pytest benchmarks/rewardbench/bench_rewards.py --grpo-profile cpu [--grpo-quick] --benchmark-json F``
is what ``python -m benchmarks bench`` runs. The JSON gains a ``grpo_bench`` block: schema
version, resolved profile, library versions, sandbox, skipped rows with their reasons, and
the targets measured against the guide's baselines.
"""

from __future__ import annotations

import pytest

from benchmarks.catalog import profiles
from benchmarks.results import schema
from benchmarks.rewardbench.cases import load_profile
from benchmarks.rewardbench.reward_targets import summarize


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("grpo-bench")
    group.addoption("--grpo-profile", default="cpu", help="profile under profiles/ (default: cpu)")
    group.addoption("--grpo-quick", action="store_true", help="apply the profile's [quick] overlay")


@pytest.fixture(scope="session")
def bench_profile(request: pytest.FixtureRequest) -> profiles.Profile:
    return load_profile(request.config)


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: list, output_json: dict) -> None:
    rows = schema.benchmark_rows(output_json)
    schema.attach_rewards_block(output_json, summarize(load_profile(config), rows, config.getoption("--grpo-quick")))
