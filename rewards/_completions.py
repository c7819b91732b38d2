"""The two completion formats TRL passes, and the checks every reward shares."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Sequence


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
    texts = [c if type(c) is str else _message_content(c) for c in completions]
    if None in texts:  # something that is neither format: find it and say which
        for index, completion in enumerate(completions):
            completion_text(completion, index)
    return texts  # type: ignore[return-value]


def _message_content(completion: Any) -> str | None:
    """The fast path of :func:`completion_text`: None where that one would raise."""
    try:
        content = completion[-1]["content"]
    except (TypeError, KeyError, IndexError, AttributeError):
        return None
    return content if type(content) is str and isinstance(completion, (list, tuple)) else None


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
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def callable_name(fn: Any) -> str:
    """The name TRL logs a reward under: ``__name__``, else the class name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)
