"""The claims ledger as the page it is read on (``results/claims.md``): a row per claim with its status, the
measured figure beside the model's and the evidence, then the guide's own words for each."""

from __future__ import annotations

import pandas as pd

from benchmarks.report import frames
from benchmarks.report.markdown.claims import Claim


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
            "published elsewhere": claim.published,
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
                "claim is measured here only by a result file of the hardware class it is about that runs the path "
                "it is about; published elsewhere where a cited figure of its size and class decides it "
                "(results/published, scored in tables/published.md); until then it rests on the model (predicted "
                "only).",
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
