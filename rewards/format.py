"""Structural rewards: did the completion take the required shape at all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._completions import completion_texts

REASONING, REASONING_END, ANSWER, ANSWER_END = "<reasoning>", "</reasoning>", "<answer>", "</answer>"


def reasoning_then_answer(text: str) -> bool:
    """Whether ``text.strip()`` matches ``^<reasoning>.*?</reasoning>\\s*<answer>.*?</answer>$``
    (DOTALL), the guide's pattern, decided with ``str.find`` instead of a regex scan: the same
    answers (a test checks them against the regex), several times faster on long completions.
    """
    text = text.strip()
    if not (text.startswith(REASONING) and text.endswith(ANSWER_END)):
        return False
    last_answer_start = len(text) - len(ANSWER_END) - len(ANSWER)
    end = text.find(REASONING_END, len(REASONING))
    while end != -1:  # the lazy .*? tries every closing tag, leftmost first
        start = end + len(REASONING_END)
        while start < len(text) and text[start].isspace():
            start += 1
        if start <= last_answer_start and text.startswith(ANSWER, start):
            return True
        end = text.find(REASONING_END, end + 1)
    return False


def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 if the completion is a ``<reasoning>`` block then an ``<answer>`` block, else 0.0.

    A gate, not the correctness signal: a well-formed wrong answer still scores 0 on
    :func:`correctness_reward`. Surrounding whitespace is ignored.

    >>> format_reward(["<reasoning>2+2</reasoning>\\n<answer>4</answer>", "4"])
    [1.0, 0.0]
    >>> format_reward([[{"role": "assistant", "content": "<reasoning>r</reasoning><answer>4</answer>"}]])
    [1.0]
    """
    return [1.0 if reasoning_then_answer(text) else 0.0 for text in completion_texts(completions)]
