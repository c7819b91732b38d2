"""Structural rewards: did the completion take the required shape at all."""

from __future__ import annotations

import re
from typing import Any, Sequence

from ._completions import completion_texts

REASONING_THEN_ANSWER = re.compile(r"^<reasoning>.*?</reasoning>\s*<answer>.*?</answer>$", re.DOTALL)


def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 if the completion is a ``<reasoning>`` block then an ``<answer>`` block, else 0.0.

    A gate, not the correctness signal: a well-formed wrong answer still scores 0 on
    :func:`correctness_reward`. Surrounding whitespace is ignored.

    >>> format_reward(["<reasoning>2+2</reasoning>\\n<answer>4</answer>", "4"])
    [1.0, 0.0]
    >>> format_reward([[{"role": "assistant", "content": "<reasoning>r</reasoning><answer>4</answer>"}]])
    [1.0]
    """
    return [1.0 if REASONING_THEN_ANSWER.match(text.strip()) else 0.0 for text in completion_texts(completions)]
