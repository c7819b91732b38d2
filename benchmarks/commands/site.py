"""``python -m benchmarks site``: the static site of the results (``report.web.builder``), and its front page
drawn by headless Chromium where ``--screenshot`` asks."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks import REPO
from benchmarks.commands.output import RESULTS, shown
from benchmarks.report.web import builder


def add_options(commands: argparse._SubParsersAction) -> None:
    """The site command and its options."""
    web = commands.add_parser("site", help="build the static site of the results (claims, sizing, classes, series)")
    web.add_argument("--results", type=Path, default=RESULTS, help="result files (default: results/runs)")
    web.add_argument("--out", type=Path, default=REPO / "build" / "site", help="default: build/site")
    web.add_argument(
        "--screenshot",
        type=Path,
        help="also PNGs of the front page by headless Chromium: FILE (1366 px) and FILE-phone",
    )


def run(args: argparse.Namespace) -> int:
    try:
        written = builder.build_site(args.results, args.out)
        shots = builder.screenshot(args.out / "index.html", args.screenshot) if args.screenshot else []
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {len(written)} pages under {shown(args.out)}; open {shown(args.out / 'index.html')}")
    print(f"or serve it: python -m http.server --directory {shown(args.out)}")
    for shot in shots:
        print(f"wrote {shown(shot)}")
    return 0
