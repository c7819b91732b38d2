"""``python -m benchmarks tables``: every table under ``results/tables/``, the claims ledger and the docs'
excerpts, regenerated from the result files (``report.markdown.regenerate``), and the memory model's error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import REPO
from benchmarks.commands import summaries
from benchmarks.commands.output import RESULTS, shown
from benchmarks.report.markdown import regenerate
from benchmarks.results import schema


def add_options(commands: argparse._SubParsersAction) -> None:
    """The tables command and its options."""
    tabulate = commands.add_parser("tables", help="regenerate results/tables/*.md from every result file")
    tabulate.add_argument("--results", type=Path, default=RESULTS, help="result files (default: results/runs)")
    tabulate.add_argument("--out", type=Path, default=REPO / "results" / "tables", help="default: results/tables")
    tabulate.add_argument("--doc", type=Path, action="append", default=[], help="a markdown file with table markers")
    tabulate.add_argument(
        "--claims", type=Path, default=REPO / "results" / "claims.md", help="the ledger (default: results/claims.md)"
    )
    tabulate.add_argument(
        "--all", action="store_true", help="every complete run, superseded and --only subsets too (default: the newest)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        written = regenerate.write_tables(args.results, args.out, args.all, args.claims)
        results = schema.load_results(args.results)
        cited = regenerate.headline(results, args.all)
        built = regenerate.build(cited, results)
        for doc in args.doc:
            replaced = regenerate.rewrite_document(doc, built, regenerate.last_verified(cited))
            print(f"rewrote {doc}: {', '.join(replaced) or 'no table markers'}; Last verified lines set")
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {shown(path)}")
    summaries.model_error(args.results, args.all)
    return 0
