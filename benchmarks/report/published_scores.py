"""Both models scored against published GPU figures (``catalog.published``): each mapped entry's stated figure
beside the prediction and their ratio, grouped by kind and role with the median and worst ratio, the targets,
and, where a group misses its target, which term is off and by how much (``published.md``)."""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter
from dataclasses import dataclass

from benchmarks.catalog import published
from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.catalog.targets import PUBLISHED_WITHIN
from benchmarks.model import guide, search
from benchmarks.model.time import calibration
from benchmarks.model.time.calibration import fitted_rates
from benchmarks.model.time.rates import ASSUMED
from benchmarks.results.records import Target, readable


@dataclass(frozen=True)
class Score:
    """One entry: the prediction in the stated unit and its ratio to the stated figure (None where unscored, with
    the reason); for a time, each phase group's share of the prediction."""

    entry: published.Entry
    predicted: float | None = None
    reason: str = ""
    rollout_s: float = 0.0  # the prediction's rollout (and sleep/wake) seconds, for time

    @property
    def ratio(self) -> float | None:
        if self.predicted is None:
            return None
        return self.predicted / self.entry.stated.value


def ask_of(mapping: published.Mapping) -> search.Ask:
    """The mapped setup as a plan's question: its levers, and the recipe its ranks' batches add up to."""
    base = guide.GUIDE_BASE.changed(**mapping.levers)
    per_rank = base.per_device_train_batch_size * base.gradient_accumulation_steps
    recipe = guide.Recipe.of_batch(
        per_rank * mapping.gpus,
        base.num_generations,
        prompt_tokens=mapping.prompt_tokens,
        completion_tokens=base.max_completion_length,
        mean_completion=mapping.mean_completion,
        packed=mapping.packed,
    )
    return search.Ask(load_shapes()[mapping.shape], base, frozenset(mapping.levers), recipe, mapping.dtype)


def score(entry: published.Entry) -> Score:
    """The models' figure for a mapped entry, in its stated unit."""
    mapping = entry.mapping
    if mapping is None:
        return Score(entry, reason=entry.unmapped)
    hardware = load_hardware()[mapping.card]
    if entry.kind in ("decode", "training"):
        seconds = calibration.entry_seconds(entry, fitted_rates(hardware))
        return Score(entry, calibration.as_stated(entry, seconds), rollout_s=seconds if entry.kind == "decode" else 0)
    ask = ask_of(mapping)
    if entry.kind == "min_gpus":
        found = search.smallest(ask, hardware, mapping.card)
        if found is None:
            return Score(entry, reason="no count up to 64 fits, predicted")
        return Score(entry, float(found.gpus))
    placed = ask.on(ask.base, mapping.gpus, hardware)
    if entry.kind == "memory":
        return Score(entry, ask.predict(placed, hardware).peak / published.UNIT_BYTES[entry.stated.unit])
    step = ask.step(placed, fitted_rates(hardware))
    rollout = step.phases.get("rollout", 0.0) + step.phases.get("sleep_wake", 0.0)
    if entry.kind == "time":
        return Score(entry, step.step_s, rollout_s=rollout)
    tokens = step.completion_tokens
    if mapping.counts_prompts:
        tokens += ask.recipe.workload(placed).step_sequences * mapping.prompt_tokens
    return Score(entry, tokens / step.step_s, rollout_s=rollout)


def scores(entries: list[published.Entry] | None = None) -> list[Score]:
    """Every entry scored (default: the committed ones, scored once a process: the tables, the site's pages and
    each estimate's error line all ask)."""
    return committed_scores() if entries is None else [score(e) for e in entries]


@functools.cache
def committed_scores() -> list[Score]:
    return [score(e) for e in published.entries()]


def worst(ratios: list[float]) -> float:
    """The ratio furthest from 1, either way."""
    return max(ratios, key=lambda r: abs(math.log(r)))


def within(ratio: float) -> float:
    """A ratio as "within N x" reads it: over or under alike."""
    return max(ratio, 1 / ratio)


def targets(found: list[Score]) -> list[Target]:
    """The held-out targets: memory and time within their median and worst, minimum GPUs matched."""
    held = [s for s in found if s.entry.role == "held-out" and s.ratio is not None]
    out = []
    for kind in ("memory", "time"):
        ratios = [within(s.ratio) for s in held if s.entry.kind == kind]
        median, most = PUBLISHED_WITHIN[kind]
        out.append(Target.at_most(f"held-out {kind}: median within {median:g}x", _median(ratios), median))
        out.append(Target.at_most(f"held-out {kind}: worst within {most:g}x", max(ratios, default=None), most))
    counts = [s for s in found if s.entry.role == "held-out" and s.entry.kind == "min_gpus" and s.entry.mapping]
    share = PUBLISHED_WITHIN["min_gpus"]
    matched = sum(s.predicted == s.entry.stated.value for s in counts) / len(counts) if counts else None
    claim = f"held-out minimum GPUs: matched exactly on at least {share:.0%}"
    out.append(Target(claim=claim, measured=matched, limit=share, met=None if matched is None else matched >= share))
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def binding_term(entry: published.Entry) -> str:
    """What keeps the mapped setup off the published count of GPUs, in the memory model: the engine's start or the
    largest term of the peak phase."""
    mapping = entry.mapping
    hardware = load_hardware()[mapping.card]
    bound = search.binding(ask_of(mapping), hardware, int(entry.stated.value))
    if bound.engine:
        return "the vLLM engine's start (weights, one sequence's KV, vLLM's own memory as its profiling reports it)"
    return bound.term


def off_by(found: list[Score]) -> list[str]:
    """Which term is off and by how much, per kind: for time, the factor the rollout alone, or the training
    phases alone, would need to match each stated step (medians); for memory, the median ratio."""
    lines = []
    times = [s for s in found if s.entry.kind == "time" and s.ratio is not None]
    if times:
        rollout = [(s.entry.stated.value - (s.predicted - s.rollout_s)) / s.rollout_s for s in times if s.rollout_s]
        training = [(s.entry.stated.value - s.rollout_s) / (s.predicted - s.rollout_s) for s in times]
        lines.append(
            f"time: the step is predicted at {readable(_median([s.ratio for s in times]))}x of the stated (median); "
            f"to match it alone the rollout would need {readable(_median(rollout))}x its predicted seconds, or the "
            f"training phases (log-probs, forward and backward, optimizer) {readable(_median(training))}x"
        )
    counted = [s for s in found if s.entry.kind == "min_gpus" and s.entry.mapping]
    missed = [s for s in counted if s.predicted != s.entry.stated.value]
    if missed:
        terms = Counter(binding_term(s.entry) for s in missed)
        counted = ", ".join(f"{term} on {n}" for term, n in terms.most_common())
        lines.append(
            f"fewest GPUs: {len(missed)} entries not matched; what the memory model holds binding at the published "
            f"count: {counted}"
        )
    memory = [s.ratio for s in found if s.entry.kind == "memory" and s.ratio is not None]
    if memory:
        lines.append(f"memory: predicted at {readable(_median(memory))}x of the stated peak (median)")
    return lines


KIND_TITLES = {
    "memory": "Peak memory per GPU",
    "min_gpus": "Fewest GPUs",
    "time": "Seconds a step",
    "throughput": "Tokens a second per GPU",
    "decode": "An inference engine's batch (decode)",
    "training": "A training run's tokens a second per GPU",
}


def published_table(found: list[Score] | None = None) -> str:
    """published.md: the targets, each mapped entry's figure beside the prediction by kind and role with the
    median and worst ratio, the entries the suite cannot map with the reason, and the sources."""
    found = scores() if found is None else found
    sources = published.load()
    classes = sorted({s.entry.setup.gpu for s in found} - {"(not stated)"})
    lines = [
        "## Published GPU figures against the models",
        "",
        f"{len(found)} entries from {len(sources)} sources (results/published/), on {len(classes)} GPU classes as "
        f"stated ({', '.join(classes)}); {sum(s.entry.mapping is not None for s in found)} mapped to the suite's "
        "shapes, cards and levers and scored, the rest listed with the reason. Ratios are predicted / stated. "
        "Held-out entries never tune a constant (NVIDIA NeMo RL's are all held out).",
        "",
        "### Targets (held-out entries)",
        "",
        *[f"- {t.line()}" for t in targets(found)],
        "",
        "Where the models are off (every scored entry): ",
        "",
        *[f"- {line}" for line in off_by(found)],
        "",
        *calibration_lines(found),
    ]
    for kind in published.KINDS:
        for role in published.ROLES:
            group = [s for s in found if s.entry.kind == kind and s.entry.role == role and s.entry.mapping]
            if group:
                lines += ["", f"### {KIND_TITLES[kind]}, {role}", "", *group_lines(group)]
    unmapped = [s for s in found if s.entry.mapping is None]
    if unmapped:
        rows = [(s.entry.id, s.entry.source, _setup(s.entry), s.reason) for s in unmapped]
        lines += ["", "### Not mapped, so not scored", "", _markdown(("entry", "source", "setup", "why"), rows)]
    rows = [(s.locator, s.project, s.document, str(s.read), str(len(s.entries))) for s in sources]
    lines += ["", "### Sources", "", _markdown(("locator", "project", "document", "read", "entries"), rows)]
    return "\n".join(lines) + "\n"


def group_lines(group: list[Score]) -> list[str]:
    rows = []
    for s in group:
        figure = s.entry.stated
        predicted = "none fits" if s.predicted is None else readable(s.predicted)
        ratio = "-" if s.ratio is None else f"{readable(s.ratio)}x"
        rows.append((s.entry.id, _setup(s.entry), f"{readable(figure.value)} {figure.unit}", predicted, ratio,
                     s.entry.mapping.approximations))  # fmt: skip
    table = _markdown(("entry", "setup as stated", "stated", "predicted", "ratio", "mapped with"), rows)
    ratios = [s.ratio for s in group if s.ratio is not None]
    summary = "no entry scored"
    if ratios:
        summary = f"median {readable(statistics.median(ratios))}x, worst {readable(worst(ratios))}x over {len(ratios)}"
    unscored = [f"{s.entry.id}: {s.reason}" for s in group if s.ratio is None]
    return [table, "", summary + (f"; not scored: {'; '.join(unscored)}" if unscored else "")]


def _setup(entry: published.Entry) -> str:
    s = entry.setup
    gpus = f"{s.gpus} x {s.gpu}" if s.gpus else s.gpu
    method = f", {s.method}" if s.method else ""
    return f"{s.framework}: {s.model}{method} on {gpus}"


def _markdown(header: tuple[str, ...], rows: list[tuple]) -> str:
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def calibration_lines(found: list[Score]) -> list[str]:
    """Each constant fitted on the calibration entries, the entries behind it, and how far those entries were off
    before and after the fit."""
    fitted = calibration.fitted()
    lines = ["### Constants fitted on calibration entries", ""]
    if not fitted.fitted_on:
        names = ", ".join(s.entry.id for s in found if s.entry.role == "calibration") or "none"
        return [*lines, f"None: no mapped calibration figure of a fitted kind; the rates stay {ASSUMED.words()}. "
                        f"Calibration entries: {names}."]  # fmt: skip
    chosen = [s.entry for s in found if s.entry.id in fitted.fitted_on]
    catalog = load_hardware()
    before = [p.seconds(ASSUMED) / p.stated_s for p in (calibration.parts(e, catalog[e.mapping.card], ASSUMED)
                                                        for e in chosen)]  # fmt: skip
    after = [p.seconds(fitted) / p.stated_s for p in (calibration.parts(e, catalog[e.mapping.card], fitted)
                                                      for e in chosen)]  # fmt: skip
    shapes = load_shapes()
    decode = [e.id for e in chosen if e.kind == "decode"]
    dense = [e.id for e in chosen if e.kind == "training" and not shapes[e.mapping.shape].moe]
    moe = [e.id for e in chosen if e.kind == "training" and shapes[e.mapping.shape].moe]
    lines += [
        f"- decode at {fitted.decode_mbu:.0%} of spec bandwidth (assumed {ASSUMED.decode_mbu:.0%}) and "
        f"{readable(fitted.engine_step_s * 1e3)} ms a vLLM decode step (assumed "
        f"{readable(ASSUMED.engine_step_s * 1e3)}), fitted on {len(decode)} decode figures: {', '.join(decode)}",
        f"- training at {fitted.training_mfu:.0%} of peak bf16 FLOP/s (assumed {ASSUMED.training_mfu:.0%}), fitted on "
        f"{len(dense)} dense training figures (and the MoE ones' attention and shared layers): {', '.join(dense)}",
        f"- a mixture of experts' routed experts in training at {fitted.expert_mfu:.0%} of peak bf16 FLOP/s (assumed "
        f"{ASSUMED.expert_mfu:.0%}), fitted on {len(moe)} MoE training figures: {', '.join(moe)}",
        f"- the calibration figures' seconds, predicted / stated: median {readable(_median(before))}x, worst "
        f"{readable(worst(before))}x at the assumptions; median {readable(_median(after))}x, worst "
        f"{readable(worst(after))}x fitted",
    ]
    return lines


def class_error(gpu_class: str, found: list[Score] | None = None) -> list[str]:
    """How far the models were off on the published figures of ``gpu_class``, per kind scored there."""
    catalog = load_hardware()
    mine = [
        s
        for s in (scores() if found is None else found)
        if s.entry.mapping is not None and catalog[s.entry.mapping.card].gpu_class == gpu_class
    ]
    lines = []
    for kind in published.KINDS:
        group = [s for s in mine if s.entry.kind == kind]
        ratios = [s.ratio for s in group if s.ratio is not None]
        roles = "/".join(sorted({s.entry.role for s in group}))
        if kind == "min_gpus" and group:
            matched = sum(s.predicted == s.entry.stated.value for s in group)
            lines.append(f"fewest GPUs matched on {matched} of {len(group)} published entries ({roles})")
        elif ratios:
            lines.append(
                f"{KIND_TITLES[kind].lower()} predicted at {readable(statistics.median(ratios))}x of the published "
                f"figure (median of {len(ratios)}, worst {readable(worst(ratios))}x; {roles})"
            )
    return lines
