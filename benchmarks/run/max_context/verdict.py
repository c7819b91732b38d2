"""What a context search found, against the claim it checks: each contender's max context over the
unchunked baseline's and TRL's, the verdict on Unsloth's ~7x, the search's targets, and its summary."""

from __future__ import annotations

from benchmarks.catalog.contenders import BASELINE, OPTIMIZED
from benchmarks.catalog.profiles import ContextBench
from benchmarks.catalog.targets import (
    CLAIM_HOLDS_WITHIN,
    CONTEXT_AGREEMENT_STEPS,
    CONTEXT_SEARCH_S,
    MAX_CONTEXT_PROBES,
)
from benchmarks.results import schema

SEED_CLAIM = (
    "Unsloth's chunked-loss RL path extends usable RL context to roughly 7x longer than an unchunked "
    "GRPO setup at the same memory budget"
)
UNSLOTH_CLAIM = (
    '"~7x longer context (can be more than 12x) vs. other optimized setups that use FA3, kernels & chunked losses"'
)
CLAIMED_RATIO = 7.0

RATIO_KINDS = {
    "measured": lambda c: c.max_completion_tokens,
    "predicted": lambda c: c.predicted_max_completion_tokens,
    "anchored": lambda c: c.anchored_max_completion_tokens,
}


def ratios(contenders: list[schema.ContenderRun]) -> dict[str, dict[str, float | None]]:
    """Max context of each contender over the unchunked baseline's and over TRL 1.16's, measured
    and predicted (``measured_vs_trl-1.14.2``, ...)."""
    by_name = {c.name: c for c in contenders if c.status == "measured"}
    out: dict[str, dict[str, float | None]] = {}
    for name, entry in by_name.items():
        row: dict[str, float | None] = {}
        for reference in (BASELINE, OPTIMIZED):
            other = by_name.get(reference)
            for kind, tokens in RATIO_KINDS.items():
                mine, theirs = tokens(entry), tokens(other) if other else None
                row[f"{kind}_vs_{reference}"] = mine / theirs if mine and theirs else None
        out[name] = row
    return out


def claim_holds(measured_ratio: float) -> bool:
    """Whether a measured ratio over the unchunked baseline reaches the ~7x claim (within its tolerance)."""
    return measured_ratio >= CLAIMED_RATIO * (1 - CLAIM_HOLDS_WITHIN)


def verdict(contenders: list[schema.ContenderRun], table: dict[str, dict], cuda: bool) -> schema.Verdict:
    """The claim, quoted, against the measured and the predicted ratio of Unsloth to the unchunked
    baseline; inconclusive where a side of either search was not bounded."""
    by_name = {c.name: c for c in contenders}
    unsloth = next((c for c in contenders if c.stack == "unsloth"), None)
    row = table.get(unsloth.name, {}) if unsloth else {}
    measured, predicted = row.get(f"measured_vs_{BASELINE}"), row.get(f"predicted_vs_{BASELINE}")
    backend = "Unsloth's GPU path" if cuda else "Unsloth's CPU backend (its efficient GRPO loss needs CUDA)"
    if unsloth is None or BASELINE not in by_name:
        text = f"not measured: the search needs both {BASELINE} and Unsloth among the contenders"
    elif measured is None:
        reasons = [
            f"{c.name}: {c.reason or 'no length fits'}"
            for c in (unsloth, by_name[BASELINE])
            if c.status != "measured" or not c.max_completion_tokens
        ]
        text = "not measured: " + "; ".join(reasons)
    else:
        text = f"{backend} reached {measured:.1f}x the context of unchunked TRL 1.14.2 at this budget"
        anchored = row.get(f"anchored_vs_{BASELINE}")
        text += f" (the analytic model predicts {predicted:.1f}x" if predicted else " ("
        text += f"; anchored on the first probes, {anchored:.1f}x)" if anchored else ")"
        if unsloth.at_ceiling:
            text += f"; Unsloth fitted the search's ceiling, so {measured:.1f}x is a lower bound: inconclusive"
        elif by_name[BASELINE].at_ceiling:
            text += "; the baseline fitted the search's ceiling: inconclusive, lower the budget"
        else:
            text += ": the ~7x claim " + ("holds here." if claim_holds(measured) else "is not reproduced here.")
        versus = row.get(f"measured_vs_{OPTIMIZED}")
        if versus is not None:
            text += f" Against TRL 1.16's fused LM head (the 'other optimized setups'): {versus:.2f}x."
    return schema.Verdict(
        seed_claim=SEED_CLAIM,
        unsloth_claim=UNSLOTH_CLAIM,
        claimed_ratio=CLAIMED_RATIO,
        measured_ratio_vs_unchunked=measured,
        predicted_ratio_vs_unchunked=predicted,
        anchored_ratio_vs_unchunked=row.get(f"anchored_vs_{BASELINE}"),
        text=text,
    )


def search_targets(
    contenders: list[schema.ContenderRun], earlier: schema.EarlierSearch | None, settings: ContextBench, wall_s: float
) -> list[schema.Target]:
    """The search's own targets, as measured: its time, its probes per contender, and its maxima against
    the earlier search of the same settings, in the searches' own steps (``resolution`` of the earlier
    maximum, at least a ``granule``)."""
    measured = [c for c in contenders if c.status == "measured"]
    agreement = []
    for entry in measured:
        theirs = (earlier.contenders.get(entry.name) or {}).get("max_completion_tokens") if earlier else None
        if entry.max_completion_tokens and theirs:
            step = max(settings.granule, theirs * settings.resolution)
            agreement.append(abs(entry.max_completion_tokens - theirs) / step)
    against = f" ({earlier.file})" if earlier else " (none here with these settings)"
    return [
        schema.Target.at_most(f"the search finishes within {CONTEXT_SEARCH_S // 60} minutes", wall_s, CONTEXT_SEARCH_S),
        schema.Target.at_most(
            f"at most {MAX_CONTEXT_PROBES} probes per contender",
            max((len(c.probes) for c in measured), default=None),
            MAX_CONTEXT_PROBES,
        ),
        schema.Target.at_most(
            f"each contender's maximum within one step (its resolution, at least a granule) of the earlier "
            f"search's{against}: the largest difference in steps",
            max(agreement, default=None),
            CONTEXT_AGREEMENT_STEPS,
        ),
    ]
