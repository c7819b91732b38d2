"""Rubric-as-reward: a binary pass/fail verdict from an injected judge client."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ._completions import completion_texts, per_example


def _passed(verdict: Any) -> float:
    return 1.0 if verdict == "pass" else 0.0


class RubricJudgeReward:
    """1.0 when ``judge_client.judge(rubric=, prompt=, response=, output_format="pass_fail")``
    answers exactly ``"pass"``, else 0.0; never an intermediate score.

    ``judge_client`` and the fixed ``rubric`` are bound here because TRL passes only
    dataset columns; ``prompts`` (which TRL passes) go to the judge as given, the response
    as text. Picklable when the client is. Calibrate the judge against human labels first.
    """

    def __init__(self, judge_client: Any, rubric: str) -> None:
        if not hasattr(judge_client, "judge"):
            raise TypeError(
                f"judge_client {type(judge_client).__name__} has no judge(rubric=, prompt=, response=, ...)"
            )
        self.judge_client = judge_client
        self.rubric = rubric
        self.__name__ = "rubric_judge_reward"

    def _texts(self, completions: Sequence[Any], prompts: Sequence[Any] | None) -> list[str]:
        if prompts is None:
            raise ValueError("rubric_judge_reward needs prompts= (GRPOTrainer passes them)")
        per_example("prompts", prompts, completions)
        return completion_texts(completions)

    def __call__(self, completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
        texts = self._texts(completions, prompts)
        judge, rubric = self.judge_client.judge, self.rubric
        return [
            1.0 if judge(rubric=rubric, prompt=prompt, response=text, output_format="pass_fail") == "pass" else 0.0
            for prompt, text in zip(prompts, texts)  # type: ignore[arg-type]
        ]


class AsyncRubricJudgeReward(RubricJudgeReward):
    """The judge reward as a coroutine: up to ``max_concurrency`` verdicts in flight.

    Uses ``judge_client.ajudge(...)`` when the client has it (an async client), else runs
    ``judge`` in worker threads.
    """

    def __init__(self, judge_client: Any, rubric: str, max_concurrency: int = 16) -> None:
        super().__init__(judge_client, rubric)
        self.max_concurrency = max_concurrency

    async def __call__(
        self, completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float]:
        gate = asyncio.Semaphore(self.max_concurrency)
        ajudge = getattr(self.judge_client, "ajudge", None)

        async def one(prompt: Any, response: str) -> float:
            request = dict(rubric=self.rubric, prompt=prompt, response=response, output_format="pass_fail")
            async with gate:
                if ajudge is not None:
                    return _passed(await ajudge(**request))
                return _passed(await asyncio.to_thread(self.judge_client.judge, **request))

        texts = self._texts(completions, prompts)
        return list(await asyncio.gather(*(one(p, t) for p, t in zip(prompts, texts))))  # type: ignore[arg-type]


def make_rubric_judge_reward(judge_client: Any, rubric: str) -> RubricJudgeReward:
    """The guide's factory: a TRL reward function bound to ``judge_client`` and ``rubric``.

    >>> class AlwaysPass:
    ...     def judge(self, rubric, prompt, response, output_format):
    ...         return "pass"
    >>> make_rubric_judge_reward(AlwaysPass(), "stays on topic")(["ok"], prompts=["q"])
    [1.0]
    """
    return RubricJudgeReward(judge_client, rubric)


def make_async_rubric_judge_reward(judge_client: Any, rubric: str, max_concurrency: int = 16) -> AsyncRubricJudgeReward:
    """:func:`make_rubric_judge_reward` as an async reward, judged concurrently."""
    return AsyncRubricJudgeReward(judge_client, rubric, max_concurrency)
