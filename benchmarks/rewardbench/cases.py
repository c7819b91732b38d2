"""The reward benchmark's rows: every reward of ours beside the guide's code and TRL's own, and the
rows that cannot run with the reason; and the profile the pytest options name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import rewards
from benchmarks.catalog import profiles
from benchmarks.rewardbench import reward_inputs, seed_rewards


def load_profile(config: pytest.Config) -> profiles.Profile:
    return profiles.load(config.getoption("--grpo-profile"), quick=config.getoption("--grpo-quick"))


class StubJudge:
    """Passes a response whose tail holds the gold answer; no model behind it."""

    def judge(self, rubric: str, prompt: Any, response: str, output_format: str) -> str:
        return "pass" if reward_inputs.GOLD in response[-40:] else "fail"


def _seed_on_texts(fn: Callable) -> Callable:
    """The guide's functions take strings; on conversational input, extract content first (as the guide says)."""

    def call(completions: list, **kwargs: Any) -> list:
        if completions and not isinstance(completions[0], str):
            completions = [c[0]["content"] for c in completions]
        return fn(completions, **kwargs)

    return call


def _trl(name: str) -> Callable:
    import trl.rewards  # TRL's reference rows only: imported when a row runs

    return getattr(trl.rewards, name)


@dataclass(frozen=True)
class Case:
    reward: str
    implementation: str
    kind: str  # input kind: reasoning, json or code
    make: Callable[[], Callable]
    formats: tuple[str, ...] = ("str", "conversational")

    @property
    def id(self) -> str:
        return f"{self.implementation}:{self.reward}"


CASES = [
    Case("format_reward", "grpo-bench", "reasoning", lambda: rewards.format_reward),
    Case("format_reward", "seed", "reasoning", lambda: _seed_on_texts(seed_rewards.format_reward)),
    Case("correctness_reward", "grpo-bench", "reasoning", lambda: rewards.correctness_reward),
    Case("correctness_reward", "seed", "reasoning", lambda: _seed_on_texts(seed_rewards.correctness_reward)),
    Case("schema_reward", "grpo-bench", "json", lambda: rewards.schema_reward),
    Case("schema_reward", "seed", "json", lambda: _seed_on_texts(seed_rewards.schema_reward)),
    Case(
        "with_length_penalty(correctness_reward)",
        "grpo-bench",
        "reasoning",
        lambda: rewards.with_length_penalty(rewards.correctness_reward),
    ),
    Case(
        "with_length_penalty(correctness_reward)",
        "seed",
        "reasoning",
        lambda: _seed_on_texts(seed_rewards.with_length_penalty(seed_rewards.correctness_reward)),
    ),
    Case("rubric_judge_reward", "grpo-bench", "reasoning", lambda: rewards.make_rubric_judge_reward(StubJudge(), "r")),
    Case(
        "rubric_judge_reward",
        "seed",
        "reasoning",
        lambda: _seed_on_texts(seed_rewards.make_rubric_judge_reward(StubJudge(), "r")),
    ),
    Case("think_format_reward", "trl", "reasoning", lambda: _trl("think_format_reward"), ("conversational",)),
    Case("accuracy_reward", "trl", "reasoning", lambda: _trl("accuracy_reward"), ("conversational",)),
]

SKIPPED = [
    {"row": f"{case.id} on {fmt} completions", "reason": "TRL's rewards take conversational completions only"}
    for case in CASES
    for fmt in ("str",)
    if fmt not in case.formats
]
