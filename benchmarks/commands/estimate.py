"""``python -m benchmarks estimate``: the memory and time models for one shape, lever set and hardware class:
memory per term and phase, a verdict and its reason, what would fit where nothing does, seconds per phase and
per step, throughput, GPU-hours and their cost. Its defaults are the ones every answer shares (``model.guide``)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import tomllib

from benchmarks import REPO
from benchmarks.catalog import profiles, toml_tables
from benchmarks.model import guide, search
from benchmarks.model.memory import placement, predict
from benchmarks.model.time import calibration, engine_work, work_rates
from benchmarks.report import time_validation
from benchmarks.results import schema
from benchmarks.results.records import readable
from benchmarks.run.machine import pace

RESULTS = REPO / "results" / "runs"
BOOLEANS = {"true": True, "false": False}


def parse_levers(
    texts: list[str], base: profiles.Levers = guide.GUIDE_BASE, together: bool = True
) -> tuple[profiles.Levers, frozenset[str]]:
    """Every ``--levers k=v,k=v`` over ``base``, and the names given; values read as TOML (true, 0.04, "x"), True
    and False too, else as plain strings. A lever given twice with two values is refused; ``together``: what the
    levers require of each other is checked too (not where the recipe places them on ranks first)."""
    table: dict = {}
    for item in (part.strip() for text in texts for part in text.split(",")):
        if not item:
            continue
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep:
            raise profiles.ProfileError(f"--levers: {item!r} is not KEY=VALUE")
        parsed = BOOLEANS.get(value.lower(), _toml_value(value))
        if key in table and table[key] != parsed:
            raise profiles.ProfileError(f"--levers: {key} given twice, as {table[key]!r} and {parsed!r}")
        table[key] = parsed
    levers = toml_tables.build(profiles.Levers, dataclasses.asdict(base) | table, "--levers", partial=True)
    for name, value in table.items():
        profiles.check_lever(name, value, "--levers", f"levers.{name}")
    if together:
        profiles.check_levers(levers, "--levers", "levers")
    return levers, frozenset(table)


def positive(text: str) -> int:
    """An argument that must be a positive whole number."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _toml_value(value: str) -> object:
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def workload_line(levers: profiles.Levers, recipe: guide.Recipe) -> str:
    """The workload the estimate assumes, in TRL's terms, stated once."""
    world = levers.world_size
    line = f"the step: {recipe.line()}"
    line += (
        f"\nper rank: {levers.per_device_train_batch_size * levers.gradient_accumulation_steps} completions a step, "
        f"micro-batches of {levers.per_device_train_batch_size} x gradient_accumulation_steps "
        f"{levers.gradient_accumulation_steps}"
    )
    if world > 1:
        line += f" on each of {world} ranks ({levers.num_machines} machine(s) x {levers.num_processes})"
    return line


def recipe_levers(parser: argparse.ArgumentParser, texts: list[str]) -> tuple[profiles.Levers, frozenset[str]]:
    """``--levers`` over the guide's base, refusing what the recipe decides: each rank's micro-batches follow from
    the global batch."""
    try:
        levers, given = parse_levers(texts, together=False)
    except profiles.ProfileError as error:
        parser.error(str(error))
    if "gradient_accumulation_steps" in given:
        parser.error(
            "--levers gradient_accumulation_steps: it follows from --global-batch over the ranks in micro-batches "
            "of per_device_train_batch_size; give those instead"
        )
    return levers, given


def recipe_of(parser: argparse.ArgumentParser, args: argparse.Namespace, levers: profiles.Levers) -> guide.Recipe:
    """The recipe the arguments ask for: ``--global-batch`` completions in groups of the levers' num_generations,
    of up to their max_completion_length tokens."""
    try:
        return guide.Recipe.of_batch(
            args.global_batch,
            levers.num_generations,
            prompt_tokens=args.prompt_tokens,
            completion_tokens=levers.max_completion_length,
            mean_completion=args.mean_completion,
            steps=args.steps,
        )
    except ValueError as error:
        parser.error(str(error))


def asked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[search.Ask, str, profiles.Hardware]:
    """The shape, levers and card ``estimate``'s arguments ask for; a parser error naming a bad one."""
    shape_catalog, catalog = profiles.load_shapes(), profiles.load_hardware()
    if args.shape not in shape_catalog:
        parser.error(f"--shape {args.shape!r}: not in profiles/shapes.toml ({', '.join(shape_catalog)})")
    if args.hardware not in catalog:
        parser.error(f"--hardware {args.hardware!r}: not in profiles/hardware.toml ({', '.join(catalog)})")
    if args.price_per_gpu_hour is not None and args.price_per_gpu_hour < 0:
        parser.error(f"--price-per-gpu-hour must be at least 0, got {args.price_per_gpu_hour}")
    levers, given = recipe_levers(parser, args.levers)
    if args.dtype not in predict.DTYPE_BYTES:
        parser.error(f"--dtype {args.dtype!r}: one of {', '.join(predict.DTYPE_BYTES)}")
    gpus = args.gpus or levers.world_size
    if (args.min_gpus or gpus > 1) and not catalog[args.hardware].peak_bf16_tflops:
        parser.error(f"--gpus/--min-gpus: {args.hardware!r} is one machine, with no GPU count to choose")
    ask = search.Ask(shape_catalog[args.shape], levers, given, recipe_of(parser, args, levers), args.dtype)
    placed = None if args.min_gpus else ask.on(levers, gpus, catalog[args.hardware])
    if not args.min_gpus and placed is None:
        parser.error(
            f"{gpus} GPUs: the global batch of {ask.recipe.global_batch} completions does not split evenly over their "
            f"ranks; counts it feeds: {', '.join(map(str, ask.fed_counts()))}"
        )
    problem = placed and profiles.combination_problem(placed)
    if problem:
        parser.error(f"--levers on {gpus} GPU(s): {problem}")
    return ask, args.hardware, catalog[args.hardware]


def run_estimate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    ask, card, hardware = asked(parser, args)
    if args.min_gpus:
        found = search.smallest(ask, hardware, card)
        if found is None:
            fed = ask.fed_counts()
            print(f"{args.shape} does not fit any count up to {fed[-1]} x {hardware.name} (predicted){fed_bound(ask)}")
            why = search.why_not(ask, hardware, card, fed[-1])
            print("\n".join(why_not_lines(why, hardware.name, fed[-1])))
            return 1
        levers, server = found.levers, found.server_gpus
    else:
        levers, server = ask.on(ask.base, args.gpus or ask.base.world_size, hardware), 0
    est = ask.predict(levers, hardware)
    capacity = hardware.memory_gib * predict.GIB
    print(
        f"{args.shape} ({ask.shape.param_count() / 1e9:.4g}B params, {ask.dtype}) on "
        f"{levers.world_size + server} x {hardware.name} ({readable(hardware.memory_gib)} GiB each)"
    )
    print(workload_line(levers, ask.recipe))
    print(f"levers beside the defaults: {guide.differing(ask.base, guide.GUIDE_BASE)}")
    print(f"  which is: {guide.in_words(levers, server)}{engine_line(ask, levers)}")
    print_memory(est)
    fits = est.fits(capacity) and profiles.combination_problem(levers) is None
    print("\n" + verdict(est, capacity, hardware.name, args.min_gpus))
    if est.engine_cannot_start and levers.vllm_mode == "colocate":
        work = ask.recipe.workload(levers)
        need = predict.engine_need(ask.shape, ask.dtype, levers, work, unified=bool(hardware.unified_floor_gib))
        share = math.ceil(100 * need.to_start / capacity) / 100
        print(f"  vllm_gpu_memory_utilization >= {share:.2f} would start it" if share <= 1 else "")
    if fits:
        rates = step_rates(levers, hardware)
        setup = search.Setup(card, hardware, levers, server, est.peak, ask.step(levers, rates))
        print_step_time(args, setup, rates, ask)
        return 0
    print("no time or cost: it does not fit")
    if hardware.peak_bf16_tflops:  # a GPU class: what would fit on more of it, or with other levers
        why = search.why_not(ask, hardware, card, levers.world_size)
        print("\n".join(why_not_lines(why, hardware.name, levers.world_size)))
    return 1


def engine_line(ask: search.Ask, levers: profiles.Levers) -> str:
    if not (levers.use_vllm and levers.vllm_mode == "colocate"):
        return ""
    how = "as given" if "vllm_gpu_memory_utilization" in ask.fixed else "sized to the rollout"
    return f"; the engine's share {levers.vllm_gpu_memory_utilization:.2f} of the device, {how}"


def verdict(est: predict.Estimate, capacity: float, name: str, min_gpus: bool) -> str:
    """One line: fits or not, and why."""
    peak, of = f"{readable(est.peak / predict.GIB)} GiB", f"{readable(capacity / predict.GIB)} GiB"
    if est.engine_cannot_start:
        return f"does NOT fit (predicted): {est.engine_cannot_start}"
    if est.peak > capacity:
        phase = est.phases[est.peak_phase]
        term, value = max(phase.items(), key=lambda item: item[1])
        return (
            f"does NOT fit (predicted): peak {peak} is over the {of} of one {name} by "
            f"{readable((est.peak - capacity) / predict.GIB)} GiB in {est.peak_phase}; its largest term is {term}, "
            f"{readable(value / predict.GIB)} GiB"
        )
    fewest = "; the fewest GPUs that fit" if min_gpus else ""
    return (
        f"fits (predicted): peak {peak} of {of} per GPU in {est.peak_phase}, "
        f"{readable((capacity - est.peak) / predict.GIB)} GiB ({1 - est.peak / capacity:.0%}) to spare{fewest}"
    )


def print_memory(est: predict.Estimate) -> None:
    """Every term per phase, largest first."""
    for phase, terms in est.phases.items():
        print(f"\n{phase}, per GPU: {readable(est.total(phase) / predict.GIB)} GiB")
        for term, value in sorted(terms.items(), key=lambda item: -item[1]):
            print(f"  {term:24} {readable(value / predict.GIB):>9} GiB  {est.notes.get(term, '')}")
    for term, note in est.notes.items():
        if not any(term in terms for terms in est.phases.values()):
            print(f"  ({note})")


def fed_bound(ask: search.Ask) -> str:
    """Where the global batch, not memory, ends a search over GPU counts: in words, and the batch that goes on."""
    fed, most = ask.fed_counts(), placement.GPU_COUNTS[-1]
    if fed[-1] == most:
        return ""
    recipe = ask.recipe
    wider = recipe.generations * math.lcm(recipe.prompts, most // math.gcd(most, recipe.generations))
    return (
        f": the global batch of {recipe.prompts * recipe.generations} completions, not memory, bounds the search at "
        f"{fed[-1]} GPUs (it splits evenly over {', '.join(map(str, fed))}); --global-batch {wider} lets it go on to "
        f"{most}"
    )


def why_not_lines(why: search.WhyNot, name: str, count: int) -> list[str]:
    """The binding term, whether it shrinks with GPUs, and the smallest change that fits, in words."""
    gib, bound = predict.GIB, why.bound
    most = bound.most_gpus
    if bound.engine:
        lines = [f"why not, on {count} GPU(s): {bound.engine}"]
    else:
        lines = [
            f"why not, on {count} GPU(s): peak {readable(bound.peak / gib)} GiB against "
            f"{readable(why.capacity / gib)} GiB per {name}; the binding term is {bound.term}, "
            f"{readable(bound.term_bytes / gib)} GiB per GPU"
        ]
    if why.shrinks:
        lines.append(
            f"  {bound.term} shrinks with more GPUs: {readable(bound.most_gpus_bytes / gib)} GiB per GPU on {most}"
            + (f", but this global batch feeds at most {bound.fed_most}" if bound.fed_most < most else "")
        )
    else:
        lines.append(f"  {bound.term} does not shrink with more GPUs: each rank holds its own, on 1 GPU or {most}")
    if why.setup is None:
        lines.append("  no change of up to three levers fits any count up to 64 either")
    else:
        s = why.setup
        lines.append(
            f"  the smallest change that fits: {why.changed()}: {s.gpus} x {name}, {s.words()} "
            f"(peak {readable(s.peak / gib)} GiB per GPU, predicted)"
        )
    return lines


def step_rates(levers: profiles.Levers, hardware: profiles.Hardware) -> work_rates.Rates:
    """This machine's rates (its calibration, the committed fit) for the cpu class, else the class's at the constants
    fitted on published figures; the reward's seconds a completion from the newest rewards part."""
    results = schema.load_results(RESULTS)
    reward_s = time_validation.reward_seconds(results, levers.reward, None)
    if hardware.gpu_class != "cpu":
        return calibration.fitted_rates(hardware, reward_s=reward_s)
    print("\ncalibrating this machine for the time model ...", flush=True)
    measured = pace.calibrate()
    coefficients = time_validation.fitted_coefficients(results)
    return time_validation.machine_rates(coefficients, measured, levers.num_processes, reward_s)


def print_step_time(args: argparse.Namespace, setup: search.Setup, rates: work_rates.Rates, ask: search.Ask) -> None:
    """Seconds per phase and per step, throughput, and GPU-hours and cost of the guide's 1,000 steps; where the
    engine runs fewer sequences at once than it is given (its KV cache, a server's max_num_seqs), how many."""
    step = setup.step
    print(f"\ntime per step, per GPU (predicted; {rates.source})")
    print(time_validation.error_line(setup.hardware.gpu_class))
    for phase, seconds in step.phases.items():
        print(f"  {phase:24} {readable(seconds):>9} s")
    print(f"  {'step':24} {readable(step.step_s):>9} s; the rollout {step.rollout_share:.0%} of it")
    work = ask.recipe.workload(setup.levers)
    held = engine_work.kv_held(ask.shape, ask.dtype, setup.levers, work, rates.device_bytes)
    engine = engine_work.engine_of(setup.levers, work, held)
    if held <= engine.held and held < math.inf:
        print(f"  the engine's KV cache holds {int(held)} of its {engine.sequences} sequences at once: the rest wait "
              "their turn")  # fmt: skip
    elif engine.held < engine.sequences:
        print(f"  the server runs at most vLLM's default max_num_seqs, {int(engine.held)}, of its {engine.sequences} "
              "sequences at once: the rest wait their turn")  # fmt: skip
    print(cost_line(setup, ask.recipe, args.price_per_gpu_hour, args.currency))


def cost_line(setup: search.Setup, job: guide.Recipe, price: float | None, currency: str) -> str:
    """Throughput per GPU and the GPU-hours of ``job`` on every GPU the setup holds; the cost where priced."""
    hours = setup.gpu_hours(job)
    line = (
        f"{readable(setup.tokens_per_s / setup.gpus)} completion tokens/s per GPU; {readable(hours)} GPU-hours "
        f"for {job.line()} on {setup.gpus} GPU(s)"
    )
    if price is not None:
        per_million = price * hours / (job.tokens / 1e6)
        line += (
            f"\ncost: {readable(hours * price)} {currency} at {readable(price)} {currency} a GPU-hour; "
            f"{readable(per_million)} {currency} per million completion tokens"
        )
    return line


def shapes_and_classes() -> str:
    """The shapes and hardware classes, for ``--help``."""
    catalog = profiles.load_hardware()
    return (
        f"shapes: {', '.join(n for n in profiles.load_shapes() if not n.startswith('tiny'))}\n"
        f"hardware: {', '.join(n for n, h in catalog.items() if h.memory_gib)}"
    )


ESTIMATE_EXAMPLES = """examples:
  python -m benchmarks estimate --shape 32b --hardware h200 --levers model=lora
      --levers gradient_checkpointing=true,vllm_enable_sleep_mode=true
  python -m benchmarks estimate --shape 7b --hardware rtx4090 --levers model=lora --min-gpus
"""
DEFAULTS = (
    "Defaults, shared with sizing.md and the claims ledger: the guide's step (one prompt's 8 completions of 1024 "
    "tokens after a 256-token prompt, over every GPU together), bfloat16, a reference model (beta 0.04) and a "
    "colocated vLLM engine whose share is sized to the rollout unless vllm_gpu_memory_utilization is given."
)


def add_options(commands: argparse._SubParsersAction) -> None:
    guess = model_command(
        commands, "estimate", "the models' memory per term, verdict, time and cost for one setup", ESTIMATE_EXAMPLES
    )
    guess.add_argument("--hardware", required=True, help="a hardware class of profiles/hardware.toml (below)")
    guess.add_argument("--dtype", default="bfloat16", help="float32, bfloat16 or float16 (default bfloat16)")
    guess.add_argument(
        "--gpus", type=int, help="trainer GPUs (default the levers' num_processes x num_machines, else 1)"
    )
    guess.add_argument(
        "--min-gpus",
        action="store_true",
        help=f"the smallest GPU count of {placement.GPU_COUNTS} that fits these levers",
    )
    guess.add_argument(
        "--price-per-gpu-hour", type=float, help="a GPU-hour's price: the cost is printed beside the hours"
    )
    guess.add_argument("--currency", default="USD", help="the price's currency (default USD)")


def model_command(commands: argparse._SubParsersAction, name: str, help: str, examples: str) -> argparse.ArgumentParser:
    """A command that asks the two models (estimate, plan): its help with the shared defaults, the shapes and
    classes and ``examples``; its shape and levers."""
    command = commands.add_parser(
        name,
        help=help,
        epilog=f"{DEFAULTS}\n\n{shapes_and_classes()}\n\n{examples}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("--shape", required=True, help="a shape of profiles/shapes.toml (below)")
    recipe = guide.GUIDE_RECIPE
    command.add_argument(
        "--global-batch",
        type=positive,
        default=recipe.global_batch,
        help=f"completions an optimizer step, every rank together, whole groups of num_generations (default "
        f"{recipe.global_batch}: the guide's one prompt)",
    )
    command.add_argument(
        "--prompt-tokens", type=positive, default=recipe.prompt_tokens, help=f"default {recipe.prompt_tokens}"
    )
    command.add_argument(
        "--mean-completion",
        type=float,
        default=0.0,
        help="the completions' mean length, the levers' max_completion_length their longest (default: every one "
        "runs to the longest)",
    )
    command.add_argument(
        "--steps", type=positive, default=recipe.steps, help=f"optimizer steps (default {recipe.steps})"
    )
    command.add_argument(
        "--levers",
        action="append",
        default=[],
        metavar="K=V,...",
        help="GRPOConfig fields and model/lora_r (TOML values; True and False too); may repeat, a lever given "
        "twice with two values is refused",
    )
    return command
