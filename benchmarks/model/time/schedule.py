"""An engine's decode schedule: how long completions run and how many sequences it decodes at each step.

Completion lengths are taken as an exponential cut at the longest (most RL completions end early, a few run to
the cap), so a batch thins as they end and lasts until its longest ends; an engine whose KV cache holds fewer
sequences than it is given runs those it holds and admits a waiting one as each ends."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np


def exponential_scale(mean: float, longest: int) -> float:
    """The scale of completion lengths drawn from an exponential cut at ``longest`` (a completion that reaches it
    stops there) whose mean is ``mean``: mu (1 - exp(-longest / mu)) = mean; inf where every completion runs to
    the longest. RL completions are skewed this way: most end early, a few run to the cap."""
    if mean >= longest:
        return math.inf
    cut_mean = lambda mu: mu * -math.expm1(-longest / mu)  # noqa: E731
    low, high = mean, 2.0 * mean
    while cut_mean(high) < mean and high < 1e12 * longest:
        low, high = high, 2 * high
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if cut_mean(middle) < mean else (low, middle)
    return high


@functools.lru_cache(maxsize=4096)
def expected_longest(count: int, longest: int, mean: float) -> float:
    """The longest of ``count`` completions on average, lengths as ``exponential_scale`` draws them: the integral
    over x up to ``longest`` of the chance that one of them runs past x, 1 - (1 - exp(-x / mu))^count (``mean``
    itself for one completion)."""
    scale = exponential_scale(mean, longest)
    if math.isinf(scale):
        return float(longest)
    x = np.arange(longest) + 0.5
    return float(np.sum(1 - (-np.expm1(-x / scale)) ** count))


@functools.lru_cache(maxsize=4096)
def live_sequences(sequences: int, longest: int, mean: float) -> np.ndarray:
    """Sequences an engine still decodes at each of its decode steps: all of them until the longest ends where
    every completion runs to ``longest``; else the batch thins as completions end (lengths exponential with the
    given mean, ``exponential_scale``), the rollout lasting until its longest completion ends
    (``expected_longest``), the last one decoding alone."""
    scale = exponential_scale(mean, longest)
    if math.isinf(scale):
        live = np.full(longest, float(sequences))
    else:
        steps = max(1, math.ceil(expected_longest(sequences, longest, mean)))
        live = np.maximum(1.0, sequences * np.exp(-np.arange(steps) / scale))
    live.setflags(write=False)  # cached: shared by every caller
    return live


@dataclass(frozen=True)
class Engine:
    """One inference engine's rollout: the sequences it decodes together, over ``tensor_parallel`` GPUs, each
    prompt's ``generations`` sharing its prefill (vLLM's prefix cache) or not (``shared_prefill``)."""

    sequences: int
    tensor_parallel: int = 1
    generations: int = 1
    shared_prefill: bool = False
    held: float = math.inf  # sequences it runs at once (its KV cache's, ``kv_held``; max_num_seqs): the rest queue


@functools.lru_cache(maxsize=4096)
def running_age(longest: int, mean: float) -> float:
    """The mean age (tokens generated so far) of a running sequence while an engine admits a waiting one whenever
    one ends: E[len^2] / 2 E[len] over the completion lengths (renewal theory's inspection paradox: half the
    longest where every completion reaches it, the scale of an exponential's draws)."""
    x = np.arange(longest, dtype=float)
    running = np.exp(-x / exponential_scale(mean, longest))  # the chance a completion runs past x
    return float(np.sum((2 * x + 1) * running) / (2 * np.sum(running)))


@functools.lru_cache(maxsize=4096)
def decode_schedule(engine: Engine, longest: int, mean: float) -> tuple[np.ndarray, np.ndarray]:
    """Sequences an engine decodes at each of its decode steps, and their mean age. Where its KV cache holds them
    all, ``live_sequences`` from the first step. Else vLLM runs as many as it holds, admitting a waiting one as
    each ends, until the queue drains (its sequences beyond those held, their mean length each, at the held
    count a step), then the last held ones thin as ``live_sequences`` does."""
    held = max(1, math.floor(min(engine.sequences, engine.held)))
    live = live_sequences(held, longest, mean)
    ages = np.arange(len(live), dtype=float)
    if held < engine.sequences:
        queued = math.ceil((engine.sequences - held) * mean / held)
        live = np.concatenate([np.full(queued, float(held)), live])
        ages = np.concatenate([np.full(queued, running_age(longest, mean)), ages])
    live.setflags(write=False)  # cached: shared by every caller
    ages.setflags(write=False)
    return live, ages
