"""The claims ledger (``results/claims.md``, the site's front page): every claim of the guide the suite checks
(docs/claims.md), its status, the measured figure beside the model's, and the result files behind it.

A status is one of ``STATUSES``: a claim is *measured here* only by a result file of the hardware class it is
about that exercises the path the claim is about; *published elsewhere* where a cited published figure of that
class and size decides it (results/published); until then it rests on the model (*predicted only*) or on nothing
yet (*not yet measured*)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import combinations

from benchmarks.catalog import published
from benchmarks.catalog.contenders import BASELINE
from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.catalog.targets import CLAIM_HOLDS_WITHIN
from benchmarks.model.guide import GUIDE_BASE, GUIDE_DTYPE, GUIDE_WORKLOAD
from benchmarks.model.memory.predict import GIB, estimate
from benchmarks.report import frames
from benchmarks.report.markdown.sizing import (
    CLASS_NAMES,
    hardware_for,
    measured_cells,
    predicted_cell,
    vllm_share,
)
from benchmarks.results.records import readable
from benchmarks.results.schema import ContextFile, DecodeFile, Result, RewardsFile
from benchmarks.run.max_context.verdict import claim_holds

GUIDE = "A GRPO sizing guide (last verified 2026-07-13)"  # the document the claims come from (docs/claims.md)
HOLDS, FAILS = "measured here: holds", "measured here: does not hold"
PUBLISHED_HOLDS, PUBLISHED_FAILS = "published elsewhere: holds", "published elsewhere: does not hold"
PREDICTED, UNMEASURED = "predicted only", "not yet measured"
NO_FIGURE = "measured here: the guide states no figure"
STATUSES = (HOLDS, FAILS, PUBLISHED_HOLDS, PUBLISHED_FAILS, PREDICTED, UNMEASURED, NO_FIGURE)

# The guide's "Memory Anchors by Size Class": the row, the size class that stands for it (the largest it
# names) and the hardware class it names.
# The row, the size class that stands for it (the largest it names), the hardware class and the levers it names
# (full fine-tuning with them; None: any lever set).
THREE = {"gradient_checkpointing": True, "optim": "adamw_8bit", "vllm_enable_sleep_mode": True}
ANCHOR_ROWS = (
    (
        "small",
        "Small (≤~3B) | 24GB-class GPU — vLLM sleep mode + 8-bit AdamW + gradient checkpointing",
        "3b",
        "24gb",
        THREE,
    ),
    ("32b", "~32B-class | H200-class GPU", "32b", "h200", None),
    ("70b", "~70B-class | B200-class GPU", "70b", "b200", None),
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
    published: str = "none"  # published figures beside it (results/published), cited


def evidence(result: Result) -> Evidence:
    machine, commit = frames.provenance(result)
    return Evidence(file=result.path, hardware=result.hardware, machine=machine, commit=commit, date=result.date)


def ledger(results: list[Result], entries: list[published.Entry] | None = None) -> list[Claim]:
    """Every claim, from the results the tables cite (``regenerate.headline``) and the published figures (default:
    every entry under results/published)."""
    entries = published.entries() if entries is None else entries
    return [
        *(_anchor_claim(row, results, entries) for row in ANCHOR_ROWS),
        _three_lever_claim(),
        _spark_claim(results),
        _context_claim(results, entries),
        _reward_claim(results),
    ]


def _anchor_claim(row: tuple, results: list[Result], entries: list[published.Entry]) -> Claim:
    """A row of the guide's table: measured here where a GRPO file of that size ran on that class, else published
    where a cited figure of that size and class decides it, else predicted; judged on the levers the row names."""
    key, guide, size, gpu_class, named = row
    name = CLASS_NAMES.get(gpu_class, gpu_class)
    title = f"{size} on one {name} GPU" + (" with the levers it names" if named else "")
    model = _anchor_model(size, gpu_class, named)
    found = _published_for(size, gpu_class, entries)
    measured, file = measured_cells(results).get((size, gpu_class), (None, None))
    cited = tuple(evidence(r) for r in results if r.path == file)
    if measured is not None and not measured.startswith("failed"):  # a run that broke decides nothing
        status = HOLDS if measured.startswith("fits") else FAILS
        return Claim(key, title, guide, status, measured, model, cited, "sizing.md", found.text)
    status = PREDICTED if found.holds is None else PUBLISHED_HOLDS if found.holds else PUBLISHED_FAILS
    measured = measured or "no GRPO run on this class yet"
    return Claim(key, title, guide, status, measured, model, cited, "sizing.md", found.text)


def _anchor_model(size: str, gpu_class: str, named: dict | None) -> str:
    """The model's verdict on one GPU of the class: with the levers the row names (full fine-tuning), the
    lightest lever set that fits beside it; else the lightest lever set that fits."""
    _, hardware = hardware_for(gpu_class, load_hardware())
    name = CLASS_NAMES.get(gpu_class, gpu_class)
    cell = predicted_cell(size, hardware)
    lightest = (
        f"{size} does not fit any number of {name} GPUs at the guide's workload"
        if cell is None
        else f"{cell.count} x {name}, {cell.label}, {cell.peak / GIB:.0f} GiB per GPU"
    )
    if named is None:
        verdict = "holds" if cell is not None and cell.count == 1 else "does not hold: needs more than one GPU"
        return f"{size}: {lightest}: {verdict}"
    levers = vllm_share(GUIDE_BASE.changed(**named), size, hardware)
    peak = estimate(load_shapes()[size], GUIDE_DTYPE, levers, GUIDE_WORKLOAD, hardware, malloc_fixed=True).peak
    verdict = "holds" if peak <= hardware.memory_gib * GIB else "does not hold"
    return (
        f"{size}, full fine-tuning with the levers it names: {peak / GIB:.0f} GiB on one {hardware.memory_gib:g} GiB "
        f"{name} GPU: {verdict}; the lightest that fits: {lightest}"
    )


@dataclass(frozen=True)
class Published:
    text: str
    holds: bool | None  # None: no published figure of this size and class decides it


def _published_for(size: str, gpu_class: str, entries: list[published.Entry]) -> Published:
    """The published entries of this size class: cited beside the claim; those of its hardware class decide it
    (fewest GPUs 1, or a peak within the class's memory)."""
    catalog = load_hardware()
    _, hardware = hardware_for(gpu_class, catalog)
    mine = [e for e in entries if e.mapping is not None and e.mapping.shape == size]
    deciding = [e for e in mine if catalog[e.mapping.card].gpu_class == gpu_class and e.kind in ("min_gpus", "memory")]
    holds = None
    if deciding:
        holds = all(_one_gpu_holds(e, hardware.memory_gib) for e in deciding)
    text = "; ".join(f"{_stated(e)} ({e.source}: {e.id})" for e in mine) or "none of this size class"
    return Published(text, holds)


def _one_gpu_holds(entry: published.Entry, memory_gib: float) -> bool:
    figure = entry.stated
    if entry.kind == "min_gpus":
        return figure.value == 1
    return figure.value * published.UNIT_BYTES[figure.unit] <= memory_gib * GIB


def _stated(entry: published.Entry) -> str:
    """An entry as the ledger cites it: who, what, on which GPUs, and its figure in the source's words."""
    s, figure = entry.setup, entry.stated
    method = f" {s.method}" if s.method else ""
    where = f"{s.gpus} x {s.gpu}" if s.gpus else s.gpu
    said = figure.words or f"{entry.figure} {figure.value:g} {figure.unit}"
    return f"{s.framework}: {s.model}{method} on {where}: {said}"


def three_lever_fits(size: str) -> dict[tuple[str, ...], float]:
    """The predicted peak per GPU of ``size`` on one 24GB-class GPU (full fine-tuning, the guide's residency)
    under every subset of the three levers, by the levers engaged."""
    _, hardware = hardware_for("24gb", load_hardware())
    shape, peaks = load_shapes()[size], {}
    for count in range(len(THREE_LEVERS) + 1):
        for engaged in combinations(THREE_LEVERS, count):
            change = {k: v for name in engaged for k, v in THREE_LEVERS[name].items()}
            levers = vllm_share(GUIDE_BASE.changed(**change), size, hardware)
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


def _context_claim(results: list[Result], entries: list[published.Entry]) -> Claim:
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
    cuda = any("cuda" in r.record.search.budget_enforced_by for r in searches)
    if not ratios or not cuda:  # a CPU search never runs Unsloth's efficient GRPO loss: it does not test the claim
        status = UNMEASURED
    else:
        status = HOLDS if all(map(claim_holds, ratios)) else FAILS
    note = (
        ""
        if cuda or not ratios
        else "; CPU searches only, where Unsloth's efficient GRPO loss does not run: they do not test the claim"
    )
    cited = [e for e in entries if e.kind == "context" or "context" in e.figure]
    return Claim(
        "context-7x",
        "Unsloth's ~7x context",
        guide,
        status,
        ("; ".join(measured) or "no context search yet") + note,
        "; ".join(model) or "no prediction yet",
        tuple(map(evidence, searches)),
        "context.md",
        "; ".join(f"{_stated(e)} ({e.source}: {e.id})" for e in cited) or "none",
    )


def _at_ceiling(search: ContextFile) -> bool:
    """Whether Unsloth or the unchunked baseline fitted the search's longest length: no ratio to judge by."""
    return any(c.at_ceiling for c in search.contenders if c.stack == "unsloth" or c.name == BASELINE)


# Rewards whose benchmark rows run a stand-in for what they call (benchmarks/rewardbench/bench_rewards.py).
STUBBED = {"rubric_judge_reward": " (a stub judge that runs no model: the wrapper's own cost, not a judge's)"}


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
    rates = [
        f"{reward} {readable(row.completions_per_s)}/s{STUBBED.get(reward, '')}" for reward, row in largest.iterrows()
    ]
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
