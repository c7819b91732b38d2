"""Every target the suite measures itself against, with its limit, in one place. A run records each as met or
missed in its result file (``results.records.Target``) and the tables print the models' against their
measurements; no test asserts one (a timing target would flake on a noisy machine)."""

from __future__ import annotations

# A part's wall time, in seconds: (a full run, a --quick one). The whole profile's limit is its own
# `time_limit_min` (profiles/*.toml).
GRPO_PART_S = (900, 120)
DISTRIBUTED_PART_S = (300, 120)
CONTEXT_SEARCH_S = 1200
ESTIMATE_WITHIN = 0.25  # the whole-run estimate printed at the start, against the real time
PLAN_S = 2.0  # `plan` of one shape over every card and count, on this project's 2-core machines: each run prints it

# What a measurement must hold to, run by run.
HARNESS_OVERHEAD = 0.02  # the parent's sampler CPU time over wall time, per configuration or rank
PEAK_REPEAT_SPREAD = 0.02  # the peak of repeated measured steps, largest over smallest less one
ZERO3_STATES_WITHIN = 0.10  # a ZeRO-3 rank's model states at 2 ranks against the memory model's
CONTEXT_AGREEMENT_STEPS = 1.0  # a contender's maximum against the earlier search's, in the search's steps
MAX_CONTEXT_PROBES = 4  # probes per contender in one guided search

# A measured figure within this of what the guide claims holds the claim (Unsloth's ~7x, Spark's 180–192 GB/s).
CLAIM_HOLDS_WITHIN = 0.10

# The models against every measurement, held-out runs (median and worst relative error).
MEMORY_WITHIN = (0.10, 0.25)  # the training-phase peak
STEP_TIME_WITHIN = (0.15, 0.35)  # the whole step
PHASE_TIME_WITHIN = 0.25  # each phase over PHASE_SHARE of its step: the median
PHASE_SHARE = 0.10
# The models against published GPU figures held out of every fit (results/published): memory and time as (median,
# worst) ratios either way, minimum GPUs as the share of entries matched exactly.
PUBLISHED_WITHIN = {"memory": (1.25, 1.5), "time": (1.5, 2.0), "min_gpus": 0.8}

# Reward throughput against the guide's code (rows named ``seed``) on the same inputs: (name, claim as every
# rewards file records it, rewards compared, minimum ratio of completions/s, within the rows' noise).
STRING_REWARDS = ("format_reward", "correctness_reward", "with_length_penalty(correctness_reward)")
REWARD_TARGETS = (
    ("schema_reward", "schema_reward at least 5x the seed's completions/s", ("schema_reward",), 5.0, False),
    (
        "execution",
        "execution at least 20x the seed design's completions/s on 2 cores with the same isolation",
        ("test_execution_reward",),
        20.0,
        False,
    ),
    # Where ours and the guide's code do the same core work (one regex per completion), "no slower" can only
    # mean not slower beyond the rows' own spread: a ratio under 1 by less than the larger relative IQR of
    # the two rows counts as met, and each comparison shows that noise. (The judge is I/O-bound, like
    # execution: its rows time our wrapper around an in-process stub, and are not held to this.)
    ("string_rewards", "string rewards no slower than the seed's", STRING_REWARDS, 1.0, True),
)


def part_limit_s(limits: tuple[int, int], quick: bool) -> int:
    return limits[1] if quick else limits[0]
