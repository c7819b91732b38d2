"""Length-penalty wrapper: discourage padding without overriding the correctness signal."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._completions import callable_name, completion_texts, is_async, per_example


class LengthPenalty:
    """``reward_fn`` minus ``penalty_per_token`` for each token past ``target_len``.

    The penalty only eats into the positive part of a reward: a positive reward falls at
    most to 0.0, and a reward at or below 0.0 (or ``None``) is returned unchanged, so the
    penalty never raises a negative reward (the guide's ``min(reward, overflow * p)`` did).
    Tokens are counted with ``tokenizer`` (a Hugging Face tokenizer, special tokens
    excluded) when given, else as whitespace-separated words.
    """

    def __init__(
        self,
        reward_fn: Callable[..., list],
        target_len: int = 512,
        penalty_per_token: float = 0.001,
        tokenizer: Any = None,
    ) -> None:
        if target_len < 0 or penalty_per_token < 0:
            raise ValueError(f"target_len ({target_len}) and penalty_per_token ({penalty_per_token}) must be >= 0")
        self.reward_fn = reward_fn
        self.target_len = target_len
        self.penalty_per_token = penalty_per_token
        self.tokenizer = tokenizer
        self.__name__ = f"{callable_name(reward_fn)}_length_penalized"

    def lengths(self, texts: Sequence[str]) -> list[int]:
        """Token (or word) counts; a text too short to exceed ``target_len`` words counts as 0."""
        if self.tokenizer is not None:
            return [len(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
        # A text of n characters holds at most (n + 1) // 2 words: skip splitting short ones.
        return [len(text.split()) if (len(text) + 1) // 2 > self.target_len else 0 for text in texts]

    def penalize(self, rewards: Sequence[float | None], completions: Sequence[Any]) -> list[float | None]:
        rewards = per_example("rewards returned", rewards, completions)
        texts = completion_texts(completions)
        positive = [i for i, reward in enumerate(rewards) if reward is not None and reward > 0]
        adjusted = list(rewards)  # only positive rewards can be penalized: count only their lengths
        for i, length in zip(positive, self.lengths([texts[i] for i in positive])):
            overflow = max(0, length - self.target_len)
            adjusted[i] = rewards[i] - min(rewards[i], overflow * self.penalty_per_token)
        return adjusted

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return self.penalize(self.reward_fn(completions, **kwargs), completions)


class AsyncLengthPenalty(LengthPenalty):
    """:class:`LengthPenalty` around an async reward function; itself async."""

    async def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return self.penalize(await self.reward_fn(completions, **kwargs), completions)


def with_length_penalty(
    reward_fn: Callable[..., list], target_len: int = 512, penalty_per_token: float = 0.001, tokenizer: Any = None
) -> LengthPenalty:
    """Wrap ``reward_fn`` with a length penalty (async if ``reward_fn`` is); see :class:`LengthPenalty`.

    >>> from rewards import correctness_reward
    >>> penalized = with_length_penalty(correctness_reward, target_len=2, penalty_per_token=0.5)
    >>> penalized(["<answer>4</answer>", "padding padding <answer>4</answer>"], answer=["4", "4"])
    [2.0, 1.5]
    """
    cls = AsyncLengthPenalty if is_async(reward_fn) else LengthPenalty
    return cls(reward_fn, target_len, penalty_per_token, tokenizer)
