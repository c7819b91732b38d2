"""The two completion formats TRL passes, and the checks every reward shares."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any


def completion_text(completion: Any, index: int) -> str:
    """The text of one completion: a ``str``, or conversational ``[{"role": ..., "content": str}, ...]``.

    A conversational completion's text is the content of its last message (the final answer
    when the model called tools on the way).
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
        raise TypeError(f"completions[{index}]: message content is {type(content).__name__}, not str")
    raise TypeError(
        f"completions[{index}] is {type(completion).__name__}: expected str or a list of "
        '{"role": ..., "content": str} messages'
    )


def completion_texts(completions: Sequence[Any]) -> list[str]:
    """The texts of a batch, checked. One pass at near C speed for well-formed batches of
    either format; anything else goes item by item through :func:`completion_text`, which
    raises naming the index."""
    try:
        return [t if type(t := c if type(c) is str else c[-1]["content"]) is str else _not_text() for c in completions]
    except (TypeError, KeyError, IndexError, AttributeError):
        return [completion_text(completion, index) for index, completion in enumerate(completions)]


def _not_text() -> str:
    raise TypeError  # caught by completion_texts, which then finds and names the culprit


def per_example(name: str, values: Any, completions: Sequence[Any]) -> list[Any]:
    """A dataset column aligned with ``completions``; raises naming both lengths if it is not."""
    if not isinstance(values, list):
        values = list(values)
    if len(values) != len(completions):
        raise ValueError(f"{len(values)} {name} for {len(completions)} completions: they must align one to one")
    return values


def is_async(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine: functions, partials and callable instances (as TRL 1.16 asks)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


def callable_name(fn: Any) -> str:
    """The name TRL logs a reward under: ``__name__``, else the class name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)
