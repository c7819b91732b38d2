"""Deterministic reward-benchmark inputs: completions of a given length, half of them right.

Every row of one case (ours, the guide's, TRL's) scores the same inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

GOLD = "42"
ADD_TESTS = (
    "from candidate import add\n\n"
    "def test_small():\n    assert add(1, 2) == 3\n\n"
    "def test_negative():\n    assert add(-2, -3) == -5\n\n"
    "def test_large():\n    assert add(10**12, 1) == 10**12 + 1\n"
)
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer"},
        "steps": {"type": "array", "items": {"type": "string"}},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["answer", "steps"],
    "additionalProperties": False,
}
VOCABULARY = [
    "the",
    "sum",
    "of",
    "two",
    "and",
    "forty",
    "so",
    "we",
    "carry",
    "one",
    "then",
    "add",
    "digits",
    "check",
    "result",
    "again",
]


def _words(count: int, seed: int) -> list[str]:
    return [VOCABULARY[(seed * 7 + i * 13) % len(VOCABULARY)] for i in range(count)]


def reasoning_completion(words: int, index: int) -> str:
    """``<reasoning>`` with ``words`` words, then an answer: right on even indices."""
    answer = GOLD if index % 2 == 0 else str(40 + index % 2)
    return f"<reasoning>{' '.join(_words(words, index))}</reasoning>\n<answer>{answer}</answer>"


def json_completion(words: int, index: int) -> str:
    """A JSON answer whose ``steps`` hold ``words`` words: valid on even indices."""
    answer: Any = int(GOLD) if index % 2 == 0 else GOLD  # a string answer violates the schema
    steps = [" ".join(_words(10, index + k)) for k in range(max(1, words // 10))]
    return json.dumps({"answer": answer, "steps": steps, "confidence": 0.5})


def code_completion(words: int, index: int) -> str:
    """An ``add`` padded with a docstring to about ``words`` words: correct on even indices."""
    body = "a + b" if index % 2 == 0 else "a - b"
    doc = " ".join(_words(max(0, words - 8), index))
    return f'def add(a, b):\n    """{doc}"""\n    return {body}\n'


@dataclass(frozen=True)
class RewardInput:
    completions: list[Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # the plain texts, for the guide's string-only code


def build(kind: str, batch: int, words: int, fmt: str) -> RewardInput:
    """Inputs for a reward ``kind`` ("reasoning", "json" or "code")."""
    make = {"reasoning": reasoning_completion, "json": json_completion, "code": code_completion}[kind]
    texts = [make(words, i) for i in range(batch)]
    completions: list[Any] = texts if fmt == "str" else [[{"role": "assistant", "content": t}] for t in texts]
    kwargs: dict[str, Any] = {
        "reasoning": {"answer": [GOLD] * batch, "solution": [GOLD] * batch, "prompts": ["What is 40 + 2?"] * batch},
        "json": {"output_schema": ANSWER_SCHEMA},
        "code": {"test_code": [ADD_TESTS] * batch},
    }[kind]
    return RewardInput(completions, kwargs, texts)
