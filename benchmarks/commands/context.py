"""``python -m benchmarks context``: the max-context search across stacks (``run.max_context``), on the
profile this machine runs (``bench``) or the one named, with the overrides its options give."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.catalog import profiles
from benchmarks.catalog.contenders import CONTENDERS
from benchmarks.commands import summaries
from benchmarks.commands.bench import HARDWARE_HELP, started_profile
from benchmarks.commands.output import RESULTS, shown
from benchmarks.run.max_context import contender_runs


def add_options(commands: argparse._SubParsersAction) -> None:
    """The context command and its options."""
    search = commands.add_parser("context", help="the max-context search across stacks (nox -s context)")
    search.add_argument("--profile", help="a profile with a [context] table (default: this hardware's)")
    search.add_argument("--hardware", help=HARDWARE_HELP)
    search.add_argument("--quick", action="store_true", help="the profile's [quick] overlay: a smoke run")
    search.add_argument(
        "--budget-gib", type=float, help="the memory budget in GiB of the device (default: the profile's)"
    )
    search.add_argument("--shape", help="a shape of profiles/shapes.toml (default: the profile's)")
    search.add_argument("--contenders", help=f"a comma-separated subset of {', '.join(CONTENDERS)}")
    search.add_argument(
        "--search", choices=profiles.SEARCHES, help="guided (the default) or doubling, then bisection (the reference)"
    )
    search.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="NAME=INTERPRETER",
        help="the interpreter of a contender's venv (nox -s context passes every one it built)",
    )
    search.add_argument("--out", type=Path, default=RESULTS, help="results directory (default: results/runs)")


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    profile = started_profile(parser, args)
    if profile.context is None:
        parser.error(f"profile {profile.name!r} has no [context] table")
    overrides: dict = {}
    if args.budget_gib is not None:
        if args.budget_gib <= 0:
            parser.error(f"--budget-gib must be positive, got {args.budget_gib}")
        overrides["budget_gib"] = args.budget_gib
    if args.shape is not None:
        if args.shape not in profiles.load_shapes():
            parser.error(f"--shape {args.shape!r}: not in profiles/shapes.toml ({', '.join(profiles.load_shapes())})")
        overrides["shape"] = args.shape
    if args.contenders is not None:
        names = tuple(n.strip() for n in args.contenders.split(",") if n.strip())
        unknown = [n for n in names if n not in CONTENDERS]
        if unknown or not names:
            parser.error(f"--contenders: unknown {', '.join(unknown) or '(none given)'}; have {', '.join(CONTENDERS)}")
        overrides["contenders"] = names
    if args.search is not None:
        overrides["search"] = args.search
    pythons = {}
    for item in args.python:
        name, _, interpreter = item.partition("=")
        if name not in CONTENDERS or not interpreter:
            parser.error(f"--python {item!r}: expected NAME=INTERPRETER with NAME one of {', '.join(CONTENDERS)}")
        pythons[name] = interpreter
    path = contender_runs.run_context(profile, pythons, args.out, overrides, args.quick)
    summaries.context(path)
    print(f"\nwrote {shown(path)}")
    return 0
