"""TRL-compatible GRPO reward functions: ``fn(completions, **kwargs) -> list[float | None]``.

Every function takes plain-string and conversational completions. Code execution runs
only behind a real sandbox (:mod:`rewards.sandbox`).
"""

from .correctness import correctness_reward, schema_reward
from .execution import (
    AsyncTestExecutionReward,
    TestExecutionReward,
    async_test_execution_reward,
    make_test_execution_reward,
    test_execution_reward,
)
from .format import format_reward
from .judge import (
    AsyncRubricJudgeReward,
    RubricJudgeReward,
    make_async_rubric_judge_reward,
    make_rubric_judge_reward,
)
from .length import AsyncLengthPenalty, LengthPenalty, with_length_penalty
from .sandbox import Bubblewrap, CommandPrefix, Limits, Sandbox, Verdict

__all__ = [
    "AsyncLengthPenalty",
    "AsyncRubricJudgeReward",
    "AsyncTestExecutionReward",
    "Bubblewrap",
    "CommandPrefix",
    "LengthPenalty",
    "Limits",
    "RubricJudgeReward",
    "Sandbox",
    "TestExecutionReward",
    "Verdict",
    "async_test_execution_reward",
    "correctness_reward",
    "format_reward",
    "make_async_rubric_judge_reward",
    "make_rubric_judge_reward",
    "make_test_execution_reward",
    "schema_reward",
    "test_execution_reward",
    "with_length_penalty",
]
