"""The claims ledger (``results/claims.md``, the site's front page): every claim of the guide the suite checks
(docs/claims.md), its status, the measured figure beside the model's, and the result files behind it.

A status is one of ``STATUSES``: a claim is *measured* only by a result file of the hardware class it is
about; until one exists it rests on the model (*predicted only*) or on nothing yet (*not yet measured*)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from itertools import combinations

import pandas as pd

from benchmarks.catalog.contenders import BASELINE
from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.catalog.targets import CLAIM_HOLDS_WITHIN
from benchmarks.model.estimate import GIB, estimate
from benchmarks.model.guide import GUIDE_BASE, GUIDE_DTYPE, GUIDE_WORKLOAD
from benchmarks.report import frames
from benchmarks.report.sizing import (
    CLASS_NAMES,
    hardware_for,
    measured_cells,
    predicted_cell,
    vllm_share,
)
from benchmarks.results.schema import ContextFile, DecodeFile, Result, RewardsFile
from benchmarks.run.context_verdict import claim_holds

GUIDE = "A GRPO sizing guide (last verified 2026-07-13)"  # the document the claims come from (docs/claims.md)
HOLDS, FAILS = "measured: holds", "measured: does not hold"
PREDICTED, UNMEASURED = "predicted only", "not yet measured"
NO_FIGURE = "measured: the guide states no figure"
STATUSES = (HOLDS, FAILS, PREDICTED, UNMEASURED, NO_FIGURE)

# The guide's "Memory Anchors by Size Class": the row, the size class that stands for it (the largest it
# names) and the hardware class it names.
ANCHOR_ROWS = (
    (
        "small",
        "Small (≤~3B) | 24GB-class GPU — vLLM sleep mode + 8-bit AdamW + gradient checkpointing",
        "3b",
        "24gb",
    ),
    ("32b", "~32B-class | H200-class GPU", "32b", "h200"),
    ("70b", "~70B-class | B200-class GPU", "70b", "b200"),
)
THREE_LEVERS = {"vLLM sleep": {"vllm_enable_sleep_mode": True}, "8-bit AdamW": {"optim": "adamw_8bit"}}
THREE_LEVERS |= {"checkpointing": {"gradient_checkpointing": True}}
SMALL_SIZES = ("0.5b", "1.5b", "3b")
SPARK_SIZE = "3b"  # the size whose Spark rollout the ledger quotes


@dataclass(frozen=True)
class Evidence:
    """A result file behind a claim: where it ran, from which commit, when."""

    file: str
    hardware: str
    machine: str
    commit: str
    date: str


@dataclass(frozen=True)
class Claim:
    key: str  # a stable anchor: the site links to it
    title: str
    guide: str  # the guide's words
    status: str  # one of STATUSES
    measured: str
    model: str
    evidence: tuple[Evidence, ...] = ()
    detail: str = ""  # the table that holds the rest, under results/tables/


def evidence(result: Result) -> Evidence:
    machine, commit = frames.provenance(result)
    return Evidence(file=result.path, hardware=result.hardware, machine=machine, commit=commit, date=result.date)


def ledger(results: list[Result]) -> list[Claim]:
    """Every claim, from the results the tables cite (``tables.headline``)."""
    return [
        *(_anchor_claim(key, guide, size, gpu_class, results) for key, guide, size, gpu_class in ANCHOR_ROWS),
        _three_lever_claim(),
        _spark_claim(results),
        _context_claim(results),
        _reward_claim(results),
    ]


def _anchor_claim(key: str, guide: str, size: str, gpu_class: str, results: list[Result]) -> Claim:
    """A row of the guide's table: measured where a GRPO file of that size ran on that class."""
    _, hardware = hardware_for(gpu_class, load_hardware())
    name = CLASS_NAMES.get(gpu_class, gpu_class)
    cell = predicted_cell(size, hardware)
    if cell is None:
        model = f"{size} does not fit any number of {name} GPUs at the guide's workload (predicted)"
    else:
        count, label, peak = cell.count, cell.label, cell.peak
        verdict = "holds" if count == 1 else "does not hold: needs more than one GPU"
        model = f"{size}: {count} x {name}, {label}, {peak / GIB:.0f} GiB per GPU: {verdict}"
    measured, file = measured_cells(results).get((size, gpu_class), (None, None))
    if measured is None:
        return Claim(
            key,
            f"{size} on one {name} GPU",
            guide,
            PREDICTED,
            "no GRPO run on this class yet",
            model,
            detail="sizing.md",
        )
    status = HOLDS if measured.startswith("fits") else FAILS
    cited = tuple(evidence(r) for r in results if r.path == file)
    return Claim(key, f"{size} on one {name} GPU", guide, status, measured, model, cited, "sizing.md")


def three_lever_fits(size: str) -> dict[tuple[str, ...], float]:
    """The predicted peak per GPU of ``size`` on one 24GB-class GPU (full fine-tuning, the guide's residency)
    under every subset of the three levers, by the levers engaged."""
    _, hardware = hardware_for("24gb", load_hardware())
    shape, peaks = load_shapes()[size], {}
    for count in range(len(THREE_LEVERS) + 1):
        for engaged in combinations(THREE_LEVERS, count):
            change = {k: v for name in engaged for k, v in THREE_LEVERS[name].items()}
            levers = vllm_share(replace(GUIDE_BASE, **change), size, hardware)
            peaks[engaged] = estimate(shape, GUIDE_DTYPE, levers, GUIDE_WORKLOAD, hardware, malloc_fixed=True).peak
    return peaks


def _three_lever_claim() -> Claim:
    _, hardware = hardware_for("24gb", load_hardware())
    budget, found = hardware.memory_gib * GIB, []
    holds = True
    for size in SMALL_SIZES:
        peaks = three_lever_fits(size)
        fitting = [engaged for engaged, peak in peaks.items() if peak <= budget]
        only_all = fitting == [tuple(THREE_LEVERS)]
        holds &= only_all
        least = min(fitting, key=len) if fitting else None
        if least is None:
            found.append(f"{size}: no subset fits (all three: {peaks[tuple(THREE_LEVERS)] / GIB:.0f} GiB)")
        else:
            found.append(f"{size}: fits with {' + '.join(least) or 'none of them'} ({peaks[least] / GIB:.0f} GiB)")
    verdict = "holds" if holds else "does not hold"
    return Claim(
        "three-levers",
        "all three levers, not any one alone, on the 24GB class",
        "feasible for small models only with all three levers engaged together, not any one alone (vLLM sleep "
        "mode, 8-bit AdamW, gradient checkpointing)",
        PREDICTED,
        "no GRPO run on a 24GB-class GPU yet (each lever's effect per phase is measured on the CPU: steps.md)",
        f"fewest levers that fit {hardware.memory_gib:g} GiB, full fine-tuning: " + "; ".join(found) + f": {verdict}",
        detail="sizing.md",
    )


def _spark_claim(results: list[Result]) -> Claim:
    """Measured on a Spark: its sustained decode bandwidth against the budget. Elsewhere the projection at the
    budget and at the spec, beside what the machines here reached of their own ceiling."""
    decodes = [r for r in results if isinstance(r.record, DecodeFile) and r.record.sweep]
    guide = (
        "Measured sustained bandwidth runs well below the 273 GB/s spec figure ... 180–192 GB/s sustained, not "
        "the spec ceiling"
    )
    model = _spark_projection(results)
    spark = [r for r in decodes if frames.gpu_class(r.hardware) == "spark"]
    judged = [(r, rows) for r in spark if (rows := sustained_rows(r.record))]
    if judged:
        newest, rows = judged[-1]
        median = statistics.median(p.achieved_gb_s for p in rows)
        low, high = load_hardware()["spark"].sustained_bandwidth_gb_s
        within = CLAIM_HOLDS_WITHIN
        status = HOLDS if low * (1 - within) <= median <= high * (1 + within) else FAILS
        return Claim(
            "spark-bandwidth",
            "Spark rollouts at 180–192 GB/s",
            guide,
            status,
            f"decode {median:.0f} GB/s: the median of {len(rows)} bandwidth-bound rows at the GRPO batch "
            f"({rows[0].batch} sequences)",
            model,
            (evidence(newest),),
            "decode.md",
        )
    newest = {r.hardware: r for r in decodes}.values()
    reached = [f"{r.hardware}: decode reached {_best_efficiency(r):.0%} of its own measured ceiling" for r in newest]
    measured = "no decode run on a DGX Spark yet" + (f" ({'; '.join(reached)})" if reached else "")
    return Claim(
        "spark-bandwidth",
        "Spark rollouts at 180–192 GB/s",
        guide,
        UNMEASURED,
        measured,
        model,
        tuple(map(evidence, newest)),
        "decode.md",
    )


def sustained_rows(run: DecodeFile) -> list:
    """The decode rows a sustained-rollout budget is judged on: measured, not bound by kernel launches, at the GRPO
    batch of the run's profile (its ``[grpo]`` completions a step; none where the profile trains none)."""
    grpo = run.profile.grpo
    batch = grpo.levers.get("per_device_train_batch_size") if grpo else None
    return [p for p in run.sweep if p.status == "ok" and p.batch == batch and not p.launch_bound and p.achieved_gb_s]


def _best_efficiency(result: Result) -> float:
    return frames.sweep(result.record).query("status == 'ok'").efficiency_vs_ceiling.max()


def _spark_projection(results: list[Result]) -> str:
    decodes = [r for r in results if isinstance(r.record, DecodeFile) and r.record.projections]
    if not decodes:
        return "no projection yet (no decode result)"
    spark = frames.projections(decodes[-1].record).query("hardware == 'spark' and size == @SPARK_SIZE")
    seconds = {row.basis: row.rollout_s for row in spark.itertuples()}
    parts = [f"{basis} {s:,.0f} s" for basis, s in seconds.items()]
    return f"{SPARK_SIZE} rollout of one GRPO step on a Spark (predicted): " + ", ".join(parts)


def _context_claim(results: list[Result]) -> Claim:
    guide = (
        "Unsloth's chunked-loss RL path extends usable RL context to roughly 7x longer than an unchunked GRPO "
        "setup at the same memory budget"
    )
    searches = [r for r in results if isinstance(r.record, ContextFile) and r.record.verdict]
    measured, model, ratios = [], [], []
    for result in searches:
        verdict, search = result.record.verdict, result.record.search
        where = f"{result.hardware}, {result.shape} {search.dtype}, {search.budget_gib:g} GiB"
        ratio = verdict.measured_ratio_vs_unchunked
        if ratio and _at_ceiling(result.record):  # a lower bound, or a baseline the search never bounded
            measured.append(f"{ratio:.1f}x, inconclusive: a side fitted the search's ceiling ({where})")
        elif ratio:
            ratios.append(ratio)
            measured.append(f"{ratio:.1f}x ({where})")
        if verdict.predicted_ratio_vs_unchunked:
            model.append(f"{verdict.predicted_ratio_vs_unchunked:.1f}x ({where})")
    if not ratios:
        status = UNMEASURED
    else:
        status = HOLDS if all(map(claim_holds, ratios)) else FAILS
    cuda = any("cuda" in r.record.search.budget_enforced_by for r in searches)
    note = "" if cuda or not ratios else "; on CPU only, where Unsloth's efficient GRPO loss does not run"
    return Claim(
        "context-7x",
        "Unsloth's ~7x context",
        guide,
        status,
        ("; ".join(measured) or "no context search yet") + note,
        "; ".join(model) or "no prediction yet",
        tuple(map(evidence, searches)),
        "context.md",
    )


def _at_ceiling(search: ContextFile) -> bool:
    """Whether Unsloth or the unchunked baseline fitted the search's longest length: no ratio to judge by."""
    return any(c.at_ceiling for c in search.contenders if c.stack == "unsloth" or c.name == BASELINE)


def _reward_claim(results: list[Result]) -> Claim:
    newest = [r for r in results if isinstance(r.record, RewardsFile)][-1:]
    guide = (
        "(no sentence to quote: the guide ships reward functions for TRL's GRPOTrainer, format, exact match, "
        "JSON Schema, sandboxed unit tests, a length penalty and a rubric judge, with no figure on their cost)"
    )
    if not newest:
        return Claim("rewards", "what the reward functions cost", guide, UNMEASURED, "no reward run yet", "(none)")
    frame = frames.reward_rows(newest[0].record)
    seed = frame[(frame.implementation == "seed") & (frame.format == "str")]
    largest = seed.sort_values(["batch", "words"], ascending=[True, False], kind="stable").groupby("reward").last()
    rates = [f"{reward} {row.completions_per_s:,.0f}/s" for reward, row in largest.iterrows()]
    real = frames.reward_shares(results).query("reward != 'synthetic'")
    shares = [f"{row.reward} reward {row.share:.1%} of a step" for row in real.itertuples()]
    measured = f"the guide's code on {newest[0].hardware}: " + ", ".join(rates)
    measured += ("; the suite's " + "; ".join(shares)) if shares else ""
    return Claim(
        "rewards",
        "what the reward functions cost",
        guide,
        NO_FIGURE,
        measured,
        "(no model: measured only)",
        (evidence(newest[0]),),
        "rewards.md",
    )


def quote(words: str) -> str:
    """The guide's words in quotes; a note of ours (in parentheses) as it stands."""
    return words if words.startswith("(") else f'"{words}"'


def claims_markdown(claims: list[Claim]) -> str:
    rows = [
        {
            "claim": claim.title,
            "status": claim.status,
            "measured": claim.measured,
            "model": claim.model,
            "evidence": "; ".join(f"{e.file} ({e.machine}, {e.commit}, {e.date})" for e in claim.evidence) or "none",
            "detail": f"results/tables/{claim.detail}" if claim.detail else "",
        }
        for claim in claims
    ]
    quoted = [f"- **{claim.title}**: {quote(claim.guide)}" for claim in claims]
    return (
        "\n".join(
            [
                "Every claim of the guide the suite checks (docs/claims.md), its status and the evidence behind it. A "
                "claim is measured only by a result file of the hardware class it is about; until then it rests on "
                "the model (predicted only).",
                "",
                frames.markdown(pd.DataFrame(rows)),
                "",
                "What the guide says, in its own words (docs/claims.md gives each claim with its context):",
                "",
                *quoted,
            ]
        )
        + "\n"
    )
