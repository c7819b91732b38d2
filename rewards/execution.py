"""Unit-test execution reward: model-written code runs only behind a real boundary.

With no sandbox given, the default is :class:`~rewards.sandbox.Bubblewrap`. With no
working boundary, nothing runs: every completion scores 0.0 and one warning says why.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._completions import completion_texts, per_example
from .sandbox import CommandPrefix, Sandbox, Verdict, default_sandbox, run_in_sandbox


class _Slots:
    """Worker slots, process-wide: each running sandbox gets its own uid (and rlimit count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: set[int] = set()

    def acquire(self) -> int:
        with self._lock:
            slot = next(i for i in range(len(self._busy) + 1) if i not in self._busy)
            self._busy.add(slot)
            return slot

    def release(self, slot: int) -> None:
        with self._lock:
            self._busy.discard(slot)


_SLOTS = _Slots()


class TestExecutionReward:
    """Picklable reward: 1.0 if the completion passes every ``test_*`` in its ``test_code``.

    ``test_code`` is a dataset column of pytest-style snippets that import the candidate
    as ``candidate`` (``from candidate import f``) and assert. Completions run in parallel
    up to ``workers`` (default: the machine's cores), each in its own sandbox with a
    wall-clock ``timeout_s``; a per-example ``test_code`` of ``None`` returns ``None``.
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, sandbox: Sandbox | None = None, timeout_s: float = 10.0, workers: int | None = None) -> None:
        self.sandbox = sandbox or default_sandbox()
        self.timeout_s = timeout_s
        self.workers = workers or os.cpu_count() or 1
        self.__name__ = "test_execution_reward"

    def verdicts(self, candidates: Sequence[str], tests: Sequence[str]) -> list[Verdict]:
        """One verdict per candidate, in order; assumes ``sandbox.refusal()`` returned None."""

        def run(pair: tuple[str, str]) -> Verdict:
            slot = _SLOTS.acquire()
            try:
                return run_in_sandbox(self.sandbox, pair[0], pair[1], self.timeout_s, slot)
            finally:
                _SLOTS.release(slot)

        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(candidates)))) as pool:
            return list(pool.map(run, zip(candidates, tests)))

    def __call__(
        self,
        completions: Sequence[Any],
        test_code: Any,
        log_extra: Callable[[str, list], None] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        """Rewards in order. Under TRL, ``log_extra`` adds each verdict's reason and seconds to
        the completions table and ``log_metric`` the batch's slowest sandbox run."""
        texts = completion_texts(completions)
        tests = (
            [test_code] * len(texts) if isinstance(test_code, str) else per_example("test_code", test_code, completions)
        )
        if self.sandbox.refusal():
            return [0.0] * len(texts)
        runnable = [i for i, t in enumerate(tests) if t is not None]
        verdicts = self.verdicts([texts[i] for i in runnable], [tests[i] for i in runnable])
        rewards: list[float | None] = [None] * len(texts)
        reasons: list[str | None] = [None] * len(texts)
        seconds: list[float | None] = [None] * len(texts)
        for i, verdict in zip(runnable, verdicts):
            rewards[i] = 1.0 if verdict.passed else 0.0
            reasons[i], seconds[i] = verdict.reason, verdict.seconds
        if log_extra is not None:
            log_extra("execution_verdict", reasons)
            log_extra("execution_seconds", seconds)
        if log_metric is not None and verdicts:
            log_metric("execution_max_seconds", max(v.seconds for v in verdicts))
        return rewards


class AsyncTestExecutionReward(TestExecutionReward):
    """The same reward as a coroutine, so that TRL runs it concurrently with other async rewards."""

    async def __call__(self, completions: Sequence[Any], test_code: Any, **kwargs: Any) -> list[float | None]:
        call = super().__call__
        return await asyncio.get_running_loop().run_in_executor(None, lambda: call(completions, test_code, **kwargs))


def make_test_execution_reward(
    sandbox: Sandbox | None = None, timeout_s: float = 10.0, workers: int | None = None, asynchronous: bool = False
) -> TestExecutionReward:
    """A configured execution reward; ``asynchronous=True`` returns the coroutine form."""
    cls = AsyncTestExecutionReward if asynchronous else TestExecutionReward
    return cls(sandbox, timeout_s, workers)


def _reward_for(sandbox_cmd: Sequence[str] | None, timeout_s: float, asynchronous: bool) -> TestExecutionReward:
    sandbox = default_sandbox() if sandbox_cmd is None else CommandPrefix(sandbox_cmd)
    return make_test_execution_reward(sandbox, timeout_s, asynchronous=asynchronous)


def test_execution_reward(
    completions: Sequence[Any],
    test_code: Any,
    sandbox_cmd: Sequence[str] | None = None,
    timeout_s: float = 10,
    **kwargs: Any,
) -> list[float | None]:
    """The guide's signature: 1.0 if the completion passes its ``test_code``, else 0.0.

    ``sandbox_cmd``: a command prefix for a boundary of your own (``["docker", "run", "-i",
    "--rm", "--network=none", "python:3.12-slim"]``); ``None`` uses bubblewrap. Without a
    working boundary nothing runs and every completion scores 0.0.

    >>> test_execution_reward(["def add(a, b): return a + b"],
    ...     test_code=["from candidate import add\\ndef test_add():\\n    assert add(1, 2) == 3\\n"])
    [1.0]
    """
    return _reward_for(sandbox_cmd, timeout_s, asynchronous=False)(completions, test_code, **kwargs)


async def async_test_execution_reward(
    completions: Sequence[Any],
    test_code: Any,
    sandbox_cmd: Sequence[str] | None = None,
    timeout_s: float = 10,
    **kwargs: Any,
) -> list[float | None]:
    """:func:`test_execution_reward` as a coroutine function, for TRL's concurrent async rewards."""
    return await _reward_for(sandbox_cmd, timeout_s, asynchronous=True)(completions, test_code, **kwargs)


test_execution_reward.__test__ = False  # type: ignore[attr-defined]
async_test_execution_reward.__test__ = False  # type: ignore[attr-defined]
