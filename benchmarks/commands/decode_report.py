"""``python -m benchmarks decode-report FILE...``: a decode result's table and figure made again
(``report.markdown.figures``), where the run that wrote the file could not make them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.report.markdown import figures


def add_options(commands: argparse._SubParsersAction) -> None:
    """The decode-report command and its options."""
    remake = commands.add_parser("decode-report", help="(re)make the table and figure of decode result files")
    remake.add_argument("files", nargs="+", type=Path, metavar="FILE")


def run(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            for made in figures.write_decode_report(path):
                print(f"made {made}")
        except (OSError, ValueError) as error:  # say which file, and go on with the others
            print(f"error: {error}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0
