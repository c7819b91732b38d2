"""``python -m benchmarks plan``: for one shape, what to rent, how many, with which levers, how long and at what
cost: every GPU card and count up to 64 with the fastest lever set that fits, ranked by wall time, the Pareto
front of wall time against cost marked, and why nothing fits where nothing does."""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks import REPO
from benchmarks.catalog import profiles
from benchmarks.catalog.targets import PLAN_S
from benchmarks.commands.estimate import cost_line, model_command, recipe_levers, recipe_of, why_not_lines
from benchmarks.model import guide, search
from benchmarks.model.memory import placement, predict
from benchmarks.report.markdown import sizing
from benchmarks.report.time_validation import error_line
from benchmarks.results import schema
from benchmarks.results.records import Target, readable

RESULTS = REPO / "results" / "runs"


def plan_cards(parser: argparse.ArgumentParser, wanted: str | None) -> dict[str, profiles.Hardware]:
    """The GPU cards a plan weighs (``--classes``: cards or classes, comma-separated; default every one)."""
    cards = {n: h for n, h in profiles.load_hardware().items() if h.peak_bf16_tflops and h.gpu_class != "cpu"}
    if not wanted:
        return cards
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    known = set(cards) | {h.gpu_class for h in cards.values()}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(
            f"--classes: unknown {', '.join(unknown) or '(none)'}; cards and classes: {', '.join(sorted(known))}"
        )
    return {n: h for n, h in cards.items() if n in names or h.gpu_class in names}


def prices(parser: argparse.ArgumentParser, given: list[str], cards: dict[str, profiles.Hardware]) -> dict[str, float]:
    """``--price CARD_OR_CLASS=PRICE`` as a price per GPU-hour by card."""
    found: dict[str, float] = {}
    for item in given:
        name, _, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            parser.error(f"--price {item!r}: expected CARD_OR_CLASS=PRICE, a number")
        matched = [n for n, h in cards.items() if name in (n, h.gpu_class)]
        if not matched or price < 0:
            parser.error(f"--price {item!r}: {name!r} is not a card or class planned, or the price is negative")
        found |= dict.fromkeys(matched, price)
    return found


def asked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> search.Ask:
    shape_catalog = profiles.load_shapes()
    if args.shape not in shape_catalog:
        parser.error(f"--shape {args.shape!r}: not in profiles/shapes.toml ({', '.join(shape_catalog)})")
    levers, fixed = recipe_levers(parser, [*args.levers, *([f"model={args.method}"] if args.method else [])])
    return search.Ask(shape_catalog[args.shape], levers, fixed, recipe_of(parser, args, levers))


def run_plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    ask = asked(parser, args)
    job = ask.recipe
    cards = plan_cards(parser, args.classes)
    priced = prices(parser, args.price, cards)
    started = time.perf_counter()
    setups = search.plan(ask, cards)
    searched_s = time.perf_counter() - started
    print(f"{args.shape} ({ask.shape.param_count() / 1e9:.4g}B params, {ask.dtype}): {job.line()}")
    unfed = [c for c in placement.GPU_COUNTS if c not in ask.fed_counts()]
    if unfed:
        print(
            f"not offered: {', '.join(map(str, unfed))} trainer GPUs: the global batch of {job.global_batch} does not "
            "split evenly over their ranks (--global-batch to change it)"
        )
    fixed = ", ".join(f"{k}={guide.spelled(getattr(ask.base, k))}" for k in sorted(ask.fixed)) or "none"
    print(
        f"levers held: {fixed}; the rest chosen per row (method, optimizer, checkpointing, vLLM colocated, "
        "asleep or a server, DDP or ZeRO-3, micro-batch)"
    )
    print_rows(setups, job, priced, args.currency, args.all)
    print_measured(args.shape, cards)
    unfit = [card for card in cards if not any(s.card == card for s in setups)]
    for card in unfit:
        hardware = cards[card]
        why = search.why_not(
            dataclasses.replace(ask, base=search.lightest(ask)), hardware, card, placement.GPU_COUNTS[-1]
        )
        print(f"\n{hardware.name}: nothing fits up to {placement.GPU_COUNTS[-1]} GPUs with the lightest levers free")
        print("\n".join(why_not_lines(why, hardware.name, placement.GPU_COUNTS[-1])))
    claim = f"a plan of one shape over {len(cards)} cards and every count in under {PLAN_S:g} s"
    print(Target.at_most(claim, searched_s, PLAN_S).line() + " (seconds, this machine)")
    return 0 if setups else 1


COLUMNS = ("", "GPUs", "card", "levers", "peak/GPU", "spare", "s/step", "tok/s/GPU", "wall", "GPU-h", "cost")


def print_rows(
    setups: list[search.Setup], job: guide.Recipe, priced: dict[str, float], currency: str, every: bool
) -> None:
    """The rows ranked by wall time, the Pareto front marked *; without ``every`` the front and each card's fewest
    GPUs and fastest."""
    if not setups:
        print("\nnothing fits any card or count (predicted)")
        return
    front = search.pareto(setups, job, priced)
    shown = setups if every else [s for s in setups if s in front or s in _ends(setups, job)]
    rows = [_row(s, job, priced, currency, s in front) for s in sorted(shown, key=lambda s: s.wall_s(job))]
    widths = [max(len(str(r[i])) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    print()
    for row in [COLUMNS, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    against = "cost, among the priced cards" if priced else "GPU-hours (no --price given)"
    print(f"\n* the Pareto front: no other row is both faster and cheaper in {against}; every row predicted")
    for gpu_class in dict.fromkeys(s.hardware.gpu_class for s in setups):
        print(f"  {gpu_class}: {error_line(gpu_class)}")
    if not every:
        print(f"  {len(shown)} of {len(setups)} rows shown (--all: every card and count that fits)")
    fastest = min(setups, key=lambda s: s.wall_s(job))
    print(f"the fastest: {fastest.gpus} x {fastest.card}, {fastest.words()}")
    print(f"  {cost_line(fastest, job, priced.get(fastest.card), currency)}")


def _ends(setups: list[search.Setup], job: guide.Recipe) -> list[search.Setup]:
    """Each card's fewest-GPU row and its fastest."""
    ends = []
    for card in dict.fromkeys(s.card for s in setups):
        mine = [s for s in setups if s.card == card]
        ends += [min(mine, key=lambda s: s.gpus), min(mine, key=lambda s: s.wall_s(job))]
    return ends


def _row(setup: search.Setup, job: guide.Recipe, priced: dict[str, float], currency: str, front: bool) -> tuple:
    hours, price = setup.gpu_hours(job), priced.get(setup.card)
    count = f"{setup.levers.world_size}+{setup.server_gpus}" if setup.server_gpus else str(setup.gpus)
    return (
        "*" if front else "",
        count,
        setup.card,
        setup.words(),
        f"{readable(setup.peak / predict.GIB)} GiB",
        f"{setup.headroom:.0%}",
        f"{readable(setup.step.step_s)} s",
        readable(setup.tokens_per_s / setup.gpus),
        clock(setup.wall_s(job)),
        readable(hours),
        f"{readable(hours * price)} {currency}" if price is not None else "-",
    )


def clock(seconds: float) -> str:
    """A duration as a person reads it: minutes, hours or days, four significant digits at most."""
    if seconds < 3600:
        return f"{readable(seconds / 60)} min"
    if seconds < 3 * 86400:
        return f"{readable(seconds / 3600)} h"
    return f"{readable(seconds / 86400)} days"


def print_measured(shape: str, cards: dict[str, profiles.Hardware]) -> None:
    """A measured GRPO run of this shape on a planned class, where one is committed."""
    cells = sizing.measured_cells([r for r in schema.load_results(RESULTS) if r.kind == "grpo"])
    for gpu_class in dict.fromkeys(h.gpu_class for h in cards.values()):
        if (shape, gpu_class) in cells:
            print(f"measured on {gpu_class}: {cells[(shape, gpu_class)][0]}")


PLAN_EXAMPLES = """examples:
  python -m benchmarks plan --shape 32b --price h100=2.5 --price h200=3.5
  python -m benchmarks plan --shape 70b --method full --classes h100,h200,b200
"""


def add_options(commands: argparse._SubParsersAction) -> None:
    ask = model_command(
        commands, "plan", "what to rent, how many, with which levers, how long, at what cost", PLAN_EXAMPLES
    )
    ask.add_argument("--method", choices=("full", "lora", "qlora"), help="hold the method (default: the fastest)")
    ask.add_argument("--classes", help="cards or classes to weigh, comma-separated (default every GPU card)")
    ask.add_argument("--price", action="append", default=[], metavar="CARD_OR_CLASS=PRICE", help="a GPU-hour's price")
    ask.add_argument("--currency", default="USD", help="the prices' currency (default USD)")
    ask.add_argument("--all", action="store_true", help="every card and count that fits, not only the front")
