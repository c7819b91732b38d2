"""``python -m benchmarks compare``: result files or hardware classes side by side, with figures
(``report.markdown.side_by_side``), under ``results/compare/<A>-vs-<B>/`` unless ``--out`` says where."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import REPO
from benchmarks.commands.output import RESULTS, shown
from benchmarks.report.markdown import side_by_side


def add_options(commands: argparse._SubParsersAction) -> None:
    """The compare command and its options."""
    versus = commands.add_parser("compare", help="result files or hardware classes side by side, with figures")
    versus.add_argument("sides", nargs="*", metavar="FILE_OR_CLASS")
    versus.add_argument("--results", type=Path, default=RESULTS, help="result files (default: results/runs)")
    versus.add_argument("--out", type=Path, help="default: results/compare/<A>-vs-<B>")


def run(args: argparse.Namespace) -> int:
    try:
        predicted = side_by_side.predicted_classes(args.sides, args.results)
        if predicted:
            out = args.out or REPO / "results" / "compare" / ("-vs-".join(predicted) + "-predicted")
            written = side_by_side.write_predicted(predicted, args.results, out)
        else:
            sides = side_by_side.resolve_sides(args.sides, args.results)
            out = args.out or REPO / "results" / "compare" / "-vs-".join(s.label for s in sides)
            written = side_by_side.write_comparison(sides, out)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {shown(path)}")
    return 0
