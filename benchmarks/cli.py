"""The command line: every command's parser assembled, and each dispatched to its module in ``commands/``
(its options and its printing there).

    python -m benchmarks bench [--profile NAME] [--hardware CLASS] [--quick] [--only PATTERN] [--out DIR]
    python -m benchmarks decode-report FILE...   # a decode result's table and figure, made again
    python -m benchmarks estimate --shape 32b --hardware h200 [--levers optim=adamw_8bit,model=lora] [...]
    python -m benchmarks plan --shape 32b [--method lora] [--levers K=V,...] [--price h100=2.5 ...] [--all]
    python -m benchmarks tables [--results DIR] [--out DIR] [--doc FILE ...]
    python -m benchmarks compare [A B ...] [--results DIR] [--out DIR]
    python -m benchmarks site [--results DIR] [--out DIR] [--screenshot FILE]
    python -m benchmarks provenance   # the commit, for a copy of the tree that travels without .git
    python -m benchmarks context [--profile NAME] [--quick] [--budget-gib G] [--shape S] [--contenders A,B]
                                 [--python NAME=INTERPRETER ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import signal

from benchmarks.commands import bench, compare, context, decode_report, estimate, plan, site, tables
from benchmarks.results import schema
from benchmarks.run.machine import provenance


def main(argv: list[str] | None = None) -> int:
    """The command line; a run stopped by SIGTERM or ^C ends at once with its file marked (its one line
    printed by ``schema.marked_incomplete``) and the shell's status for that signal."""

    def stop(signum: int, frame: object) -> None:
        raise schema.Stopped(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, stop)  # so that a child the run waits for is stopped with it
    try:
        return dispatch(argv)
    except schema.Stopped:
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


def command_line() -> argparse.ArgumentParser:
    """Every subcommand and its options."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    commands = parser.add_subparsers(dest="command", required=True)
    bench.add_options(commands)
    decode_report.add_options(commands)
    context.add_options(commands)
    estimate.add_options(commands)
    plan.add_options(commands)
    tables.add_options(commands)
    compare.add_options(commands)
    site.add_options(commands)
    commands.add_parser(
        "provenance", help=f"record this checkout's commit in {provenance.PROVENANCE.name}, for a tree that travels"
    )
    return parser


def commands_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """A subcommand's own parser, so that its errors print its own usage."""
    action = next(a for a in parser._subparsers._group_actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def dispatch(argv: list[str] | None = None) -> int:
    parser = command_line()
    args = parser.parse_args(argv)
    if args.command == "provenance":
        print(f"{provenance.PROVENANCE.name}: {provenance.write_provenance().short}")
        return 0
    if args.command == "estimate":
        return estimate.run_estimate(commands_parser(parser, "estimate"), args)
    if args.command == "plan":
        return plan.run_plan(commands_parser(parser, "plan"), args)
    if args.command == "tables":
        return tables.run(args)
    if args.command == "compare":
        return compare.run(args)
    if args.command == "site":
        return site.run(args)
    if args.command == "context":
        return context.run(parser, args)
    if args.command == "decode-report":
        return decode_report.run(args)
    return bench.run_bench(parser, args)
