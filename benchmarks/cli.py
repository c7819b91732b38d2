"""``python -m benchmarks bench``: run a profile's parts and write one result file per part.

    python -m benchmarks bench [--profile NAME] [--hardware CLASS] [--quick] [--only PATTERN] [--out DIR]
    python -m benchmarks report FILE...   # a decode result's table and figure, made again
    python -m benchmarks estimate --shape 32b --hardware h200 [--levers optim=adamw_8bit,model=lora] [...]
    python -m benchmarks tables [--results DIR] [--out DIR] [--doc FILE ...]
    python -m benchmarks compare [A B ...] [--results DIR] [--out DIR]
    python -m benchmarks provenance   # the commit, for a copy of the tree that travels without .git
    python -m benchmarks context [--profile NAME] [--quick] [--budget-gib G] [--shape S] [--contenders A,B]
                                 [--python NAME=INTERPRETER ...] [--out DIR]

With no ``--profile``, the machine picks it: ``cpu`` with no CUDA device, else by the first GPU's
name and memory (H200 ``h200``, B200 ``b200``, GB10 ``spark``, a 24 GB card ``24gb``, any other
``gpu``); ``--hardware`` names the class the results are filed under.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks import REPO
from benchmarks.catalog import profiles, shapes
from benchmarks.catalog.contenders import CONTENDERS
from benchmarks.model import estimate, timing
from benchmarks.report import compare, figures, sizing, tables, time_validation, validation
from benchmarks.results import schema
from benchmarks.run import context, context_verdict, decode, devices, grpo, machine, pace, worker

RESULTS = REPO / "results" / "runs"


def detect(nvml: object = None) -> tuple[str, str | None, str]:
    """(profile, hardware class or None for the profile's own, what was seen) for this machine: from
    the first visible CUDA device's name and memory (NVML, no CUDA context), else ``cpu``."""
    gpus = devices.visible_gpus(nvml)
    if not gpus:
        return "cpu", None, "no CUDA device (NVML sees none)"
    first = gpus[0]
    profile, hardware = devices.classify(first.name, first.memory_gib)
    return profile, hardware, f"CUDA device {first.name} ({first.memory_gib:g} GiB, {first.memory_source})"


def chosen_profile(name: str | None, hardware: str | None, quick: bool = False) -> profiles.Profile:
    """``--profile`` and ``--hardware`` as given, else this machine's (``detect``)."""
    if name is None:
        name, detected, seen = detect()
        hardware = hardware or detected
        print(f"{seen}: profile {name}" + (f" on hardware class {hardware}" if hardware else ""))
    return profiles.load(name, quick=quick, hardware=hardware)


def print_environment() -> None:
    print(
        f"python {platform.python_version()} on {platform.machine()} "
        f"({platform.processor() or 'processor unknown'}), {os.cpu_count()} cores"
    )
    for module in ("torch", "trl", "transformers"):
        try:
            print(f"{module} {__import__(module).__version__}")
        except ImportError:
            print(f"{module}: not installed")
    gpus = devices.describe(devices.load_nvml())
    print("GPUs: " + (", ".join(f"{g.index}: {g.name} {g.memory_gib:g} GiB" for g in gpus) or "none"))


def run_rewards(profile: profiles.Profile, quick: bool, out: Path) -> Path:
    """The reward benchmarks under pytest-benchmark; returns the result file written."""
    settings = profile.rewards
    target = out / profile.hardware / f"{machine.stamp()}-rewards.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        partial = Path(scratch) / "rewards.json"
        command = [sys.executable, "-m", "pytest", str(REPO / "benchmarks" / "rewardbench" / "bench_rewards.py"), "-q"]
        command += ["-p", "no:cacheprovider", "--grpo-profile", profile.name, f"--benchmark-json={partial}"]
        command += [f"--benchmark-max-time={settings.max_time_s}", f"--benchmark-min-rounds={settings.min_rounds}"]
        command += ["--benchmark-columns=median,iqr,rounds", "--benchmark-sort=name"]
        command += ["--grpo-quick"] if quick else []
        done = subprocess.run(command, cwd=REPO)
        if not partial.exists():
            raise SystemExit(f"reward benchmarks wrote no result (pytest exit {done.returncode})")
        result = schema.read_result(partial, str(target)).record
        result.grpo_bench.complete = done.returncode == 0  # a failed row: the file keeps those that ran
        schema.write(target, result)
    if done.returncode != 0:
        print(f"warning: pytest exited {done.returncode}; the result file keeps the rows that ran")
    return target


def shown(path: Path) -> Path:
    """A path as printed: relative to the checkout where it lies in it."""
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def print_rewards_summary(path: Path) -> None:
    run = schema.read_result(path, str(path)).record
    print(f"\n{'reward':42} {'impl':10} {'batch':>5} {'words':>5} {'format':14} {'completions/s':>13}  p50/p99 s")
    for info in sorted((row.extra_info for row in run.benchmarks), key=lambda i: (i.reward, i.batch)):
        latency = f"{info.p50_latency_s:.3f}/{info.p99_latency_s:.3f}" if info.p50_latency_s is not None else ""
        print(
            f"{info.reward:42} {info.implementation:10} {info.batch:>5} {info.words:>5} "
            f"{info.format:14} {info.completions_per_s:>13,.0f}  {latency}"
        )
    for target in run.grpo_bench.targets:
        lowest = target.lowest_ratio
        verdict = (
            "not measured" if lowest is None else f"lowest ratio {lowest:.2f}x: {'met' if target.met else 'MISSED'}"
        )
        if target.within_noise and lowest is not None:
            verdict += " (within the rows' spread)"
        print(f"target: {target.claim} (>= {target.minimum_ratio:g}x): {verdict}")


# What `estimate` assumes where --levers leaves it: the guide's workload (one prompt's 8 generations of
# 1024 tokens a rank), not the harness's small defaults.
ESTIMATE_BASE = {"num_generations": 8, "per_device_train_batch_size": 8, "max_completion_length": 1024}


def parse_levers(text: str, base: dict | None = None) -> profiles.Levers:
    """``k=v,k=v`` as Levers over ``base``; values read as TOML (true, 0.04, "x") or else as plain strings."""
    table = dict(base or {})
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise profiles.ProfileError(f"--levers: {item!r} is not KEY=VALUE")
        try:
            table[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            table[key.strip()] = value.strip()
    levers = profiles._build(profiles.Levers, table, "--levers", partial=True)
    profiles.check_levers(levers, "--levers", "levers")
    return levers


def workload_line(levers: profiles.Levers, prompt_tokens: int) -> str:
    """The workload the estimate assumes, in TRL's terms, stated once."""
    prompts = levers.per_device_train_batch_size // levers.num_generations
    world = levers.world_size
    line = (
        f"per rank: {levers.per_device_train_batch_size} completions a step ({prompts} prompt(s) x "
        f"num_generations={levers.num_generations}) of {prompt_tokens} prompt + {levers.max_completion_length} "
        "completion tokens"
    )
    if world > 1:
        line += (
            f"; {world} ranks ({levers.num_machines} machine(s) x {levers.num_processes}, {levers.distributed_type}): "
            f"{world * levers.per_device_train_batch_size} completions a step in all"
        )
    return line


@dataclass(frozen=True)
class Sizer:
    """The memory model for one shape, dtype and hardware class, as ``estimate`` asks it."""

    shape: shapes.Shape
    hardware: profiles.Hardware
    dtype: str
    prompt_tokens: int
    logits: str

    @property
    def capacity(self) -> float:
        return self.hardware.memory_gib * estimate.GIB

    def predict(self, levers: profiles.Levers) -> estimate.Estimate:
        work = estimate.Workload.of(levers, self.prompt_tokens)
        return estimate.estimate(self.shape, self.dtype, levers, work, self.hardware, self.logits, malloc_fixed=True)

    def fits(self, levers: profiles.Levers) -> bool:
        return profiles.combination_problem(levers) is None and self.predict(levers).fits(self.capacity)

    def smallest(self, levers: profiles.Levers, counts: tuple[int, ...]) -> profiles.Levers | None:
        """``levers`` on the first of ``counts`` GPUs that fits, or None."""
        return next((c for c in (estimate.on_gpus(levers, n) for n in counts) if self.fits(c)), None)


def estimate_sizer(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Sizer:
    """The sizer ``estimate``'s arguments ask for; a parser error naming a bad one."""
    shape_catalog, catalog = profiles.load_shapes(), profiles.load_hardware()
    if args.shape not in shape_catalog:
        parser.error(f"--shape {args.shape!r}: not in profiles/shapes.toml ({', '.join(shape_catalog)})")
    if args.hardware not in catalog:
        parser.error(f"--hardware {args.hardware!r}: not in profiles/hardware.toml ({', '.join(catalog)})")
    if args.prompt_tokens <= 0:
        parser.error(f"--prompt-tokens must be positive, got {args.prompt_tokens}")
    if args.price_per_gpu_hour is not None and args.price_per_gpu_hour < 0:
        parser.error(f"--price-per-gpu-hour must be at least 0, got {args.price_per_gpu_hour}")
    return Sizer(shape_catalog[args.shape], catalog[args.hardware], args.dtype, args.prompt_tokens, args.logits)


def run_estimate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    sizer = estimate_sizer(parser, args)
    hardware = sizer.hardware
    try:
        levers = parse_levers(args.levers, ESTIMATE_BASE)
        if args.min_gpus:
            found = sizer.smallest(levers, estimate.GPU_COUNTS)
            if found is None:
                most = estimate.GPU_COUNTS[-1]
                print(f"{args.shape} does not fit {most} x {hardware.name} with these levers (predicted)")
                return 0
            levers = found
        est = sizer.predict(levers)
    except (profiles.ProfileError, ValueError) as error:
        parser.error(str(error))
    print(
        f"{args.shape} ({sizer.shape.param_count() / 1e9:.2f}B) {args.dtype} on {levers.world_size} x "
        f"{hardware.name} ({hardware.memory_gib:g} GiB each)"
    )
    print(workload_line(levers, args.prompt_tokens))
    print(f"levers: {levers}")
    print_memory(sizer, levers, est, args.min_gpus)
    print_step_time(args, sizer.shape, levers, hardware)
    if not est.fits(sizer.capacity):
        print_what_would_fit(sizer, levers)
    return 0


def print_memory(sizer: Sizer, levers: profiles.Levers, est: estimate.Estimate, min_gpus: bool) -> None:
    """Every term per phase, the peak and whether it fits, and why an engine could not start."""
    for phase, terms in est.phases.items():
        print(f"\n{phase}, per GPU: {est.total(phase) / estimate.GIB:.2f} GiB")
        for term, value in sorted(terms.items(), key=lambda item: -item[1]):
            print(f"  {term:24} {value / estimate.GIB:9.2f} GiB  {est.notes.get(term, '')}")
    for term, note in est.notes.items():
        if not any(term in terms for terms in est.phases.values()):
            print(f"  ({note})")
    fits = "fits" if est.fits(sizer.capacity) else "does NOT fit"
    print(
        f"\npeak {est.peak / estimate.GIB:.2f} GiB per GPU in {est.peak_phase}: {fits} "
        f"{sizer.hardware.memory_gib:g} GiB (predicted)"
        + (f"; the smallest GPU count of {estimate.GPU_COUNTS} that fits" if min_gpus else "")
    )
    if est.engine_cannot_start:
        work = estimate.Workload.of(levers, sizer.prompt_tokens)
        share = estimate.engine_need(sizer.shape, sizer.dtype, levers, work).total / sizer.capacity
        hold = f"; vllm_gpu_memory_utilization >= {share:.2f} would hold it" if share <= 1 else ""
        print(f"{est.engine_cannot_start}{hold}")


def print_what_would_fit(sizer: Sizer, levers: profiles.Levers) -> None:
    """The lightest lever set over these levers on as many GPUs, and the fewest GPUs, that would hold it."""
    gpus, name = levers.world_size, sizer.hardware.name
    lighter = [
        (label, change) for label, change in sizing.ladder(sizer.hardware) if sizer.fits(replace(levers, **change))
    ]
    if lighter:
        label, change = lighter[0]
        print(f"on {gpus} x {name}, {label} would hold it ({change})")
    more = sizer.smallest(levers, tuple(count for count in estimate.GPU_COUNTS if count > gpus))
    if more is not None:
        print(f"{more.world_size} x {name} would hold it ({more.distributed_type}; see --min-gpus)")
    elif not lighter:
        print(
            f"no lighter lever set here and no count up to {estimate.GPU_COUNTS[-1]} GPUs holds it: what one GPU "
            "processes has to shrink (per_device_train_batch_size, max_completion_length)"
        )


def step_rates(args: argparse.Namespace, levers: profiles.Levers, hardware: profiles.Hardware) -> timing.Rates:
    """This machine's rates (its calibration, the committed fit) for the cpu class, else the class's assumed ones;
    the reward's seconds a completion from the newest rewards part."""
    results = schema.load_results(RESULTS)
    reward_s = time_validation.reward_seconds(results, levers.reward, None)
    if hardware.size_class != "cpu":
        return timing.assumed_rates(hardware, reward_s=reward_s)
    print("\ncalibrating this machine for the time model ...", flush=True)
    calibration = pace.calibrate()
    coefficients = time_validation.fitted_coefficients(results)
    return time_validation.machine_rates(coefficients, calibration, levers.num_processes, reward_s)


def print_step_time(
    args: argparse.Namespace, shape: shapes.Shape, levers: profiles.Levers, hardware: profiles.Hardware
) -> None:
    """Seconds per phase and per step, throughput and GPU-hours, from the time model (and a cost, if priced)."""
    try:
        rates = step_rates(args, levers, hardware)
    except ValueError as error:
        print(f"\nno time estimate: {error}")
        return
    work = estimate.Workload.of(levers, args.prompt_tokens)
    predicted = timing.step_time(shape, args.dtype, levers, work, rates)
    print(f"\ntime per step, per GPU (predicted; {rates.source}):")
    for phase, seconds in predicted.phases.items():
        print(f"  {phase:24} {seconds:9.2f} s")
    gpus = predicted.gpus
    print(f"  {'step':24} {predicted.step_s:9.2f} s; the rollout {predicted.rollout_share:.0%} of it")
    hours = predicted.gpu_hours(1000)
    line = f"{predicted.tokens_per_s_per_gpu:,.0f} completion tokens/s per GPU; {hours:,.1f} GPU-hours per 1,000 steps"
    if args.price_per_gpu_hour is not None:
        line += f" on {gpus} GPU(s): {hours * args.price_per_gpu_hour:,.2f} at {args.price_per_gpu_hour:g} a GPU-hour"
    print(line)
    print(time_validation.error_line(hardware.size_class))


def run_tables(args: argparse.Namespace) -> int:
    try:
        written = tables.write_tables(args.results, args.out, args.all)
        results = schema.load_results(args.results)
        cited = tables.headline(results, args.all)
        built = tables.build(cited, results)
        for doc in args.doc:
            replaced = tables.rewrite_document(doc, built, tables.last_verified(cited))
            print(f"rewrote {doc}: {', '.join(replaced) or 'no table markers'}; Last verified lines set")
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {shown(path)}")
    tables.print_model_error(args.results, args.all)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    try:
        sides = compare.resolve_sides(args.sides, args.results)
        out = args.out or REPO / "results" / "compare" / "-vs-".join(s.label for s in sides)
        written = compare.write_comparison(sides, out)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {shown(path)}")
    return 0


def run_context_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    print_environment()
    try:
        profile = chosen_profile(args.profile, args.hardware, args.quick)
    except profiles.ProfileError as error:
        parser.error(str(error))
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
    path = context.run_context(profile, pythons, args.out, overrides, args.quick)
    context_verdict.print_context_summary(path)
    print(f"\nwrote {shown(path)}")
    return 0


HARDWARE_HELP = "a class of profiles/hardware.toml: the results go under it (default: detected, else the profile's)"


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
    _bench_options(commands)
    remake = commands.add_parser("report", help="(re)make the table and figure of decode result files")
    remake.add_argument("files", nargs="+", type=Path, metavar="FILE")
    _context_options(commands)
    _estimate_options(commands)
    tabulate = commands.add_parser("tables", help="regenerate results/tables/*.md from every result file")
    tabulate.add_argument("--results", type=Path, default=RESULTS, help="result files (default: results/runs)")
    tabulate.add_argument("--out", type=Path, default=REPO / "results" / "tables", help="default: results/tables")
    tabulate.add_argument("--doc", type=Path, action="append", default=[], help="a markdown file with table markers")
    tabulate.add_argument(
        "--all", action="store_true", help="every complete run, superseded and --only subsets too (default: the newest)"
    )
    versus = commands.add_parser("compare", help="result files or hardware classes side by side, with figures")
    versus.add_argument("sides", nargs="*", metavar="FILE_OR_CLASS")
    versus.add_argument("--results", type=Path, default=RESULTS, help="result files (default: results/runs)")
    versus.add_argument("--out", type=Path, help="default: results/compare/<A>-vs-<B>")
    commands.add_parser(
        "provenance", help=f"record this checkout's commit in {machine.PROVENANCE.name}, for a tree that travels"
    )
    return parser


def _bench_options(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="run a profile and write result files")
    bench.add_argument("--profile", help=f"one of: {', '.join(profiles.available())} (default: this hardware's)")
    bench.add_argument("--quick", action="store_true", help="the profile's [quick] overlay: tiny shapes, a smoke run")
    bench.add_argument("--hardware", help=HARDWARE_HELP)
    bench.add_argument(
        "--only",
        metavar="PATTERN",
        help=f"only the parts ({', '.join(profiles.PARTS)}) or GRPO configurations whose name matches PATTERN "
        "(several: PATTERN,PATTERN)",
    )
    bench.add_argument("--out", type=Path, default=RESULTS, help="results directory (default: results/runs)")


def _context_options(commands: argparse._SubParsersAction) -> None:
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


def _estimate_options(commands: argparse._SubParsersAction) -> None:
    guess = commands.add_parser("estimate", help="the analytic model's memory per term for one GRPO step")
    guess.add_argument("--shape", required=True, help="a shape of profiles/shapes.toml")
    guess.add_argument("--hardware", required=True, help="a hardware class of profiles/hardware.toml")
    guess.add_argument("--dtype", default="bfloat16", help="float32, bfloat16 or float16 (default bfloat16)")
    guess.add_argument("--levers", default="", help="GRPOConfig fields and model/lora_r: k=v,k=v (TOML values)")
    guess.add_argument("--prompt-tokens", type=int, default=256, help="prompt length (completions: the levers')")
    guess.add_argument(
        "--min-gpus",
        action="store_true",
        help=f"the smallest GPU count of {estimate.GPU_COUNTS} that fits these levers",
    )
    guess.add_argument("--logits", default="trl-tiled", choices=estimate.LOGITS_PATHS, help="the loss's logits path")
    guess.add_argument(
        "--price-per-gpu-hour",
        type=float,
        help="a GPU-hour's price: the cost of 1,000 steps is printed beside their hours",
    )


def dispatch(argv: list[str] | None = None) -> int:
    parser = command_line()
    args = parser.parse_args(argv)
    if args.command == "provenance":
        print(f"{machine.PROVENANCE.name}: {machine.write_provenance().short}")
        return 0
    if args.command == "estimate":
        return run_estimate(parser, args)
    if args.command == "tables":
        return run_tables(args)
    if args.command == "compare":
        return run_compare(args)
    if args.command == "context":
        return run_context_command(parser, args)
    if args.command == "report":
        failed = 0
        for path in args.files:
            try:
                for made in figures.write_decode_report(path):
                    print(f"made {made}")
            except (OSError, ValueError) as error:  # say which file, and go on with the others
                print(f"error: {error}", file=sys.stderr)
                failed += 1
        return 1 if failed else 0

    return run_bench(parser, args)


def run_part(
    part: str, profile: profiles.Profile, quick: bool, out: Path, configuration_filter: list[str] | None
) -> Path:
    """One part of a profile, its summary printed; returns its result file."""
    if part == "rewards":
        path = run_rewards(profile, quick, out)
        print_rewards_summary(path)
    elif part == "decode":
        path = decode.run_decode(profile, quick, out)
        try:  # tabulate and matplotlib: a GPU box may lack them, and the result file stands alone
            figures.print_decode_summary(path)
            for made in figures.write_decode_report(path):
                print(f"made {shown(made)}")
        except ImportError as error:
            print(f"no decode table or figure here ({error}): `python -m benchmarks report {shown(path)}` makes them")
    else:
        path = grpo.run_grpo(profile, quick, out, configuration_filter, part)
        grpo.print_summary(path)
        lines = validation.phase_lines(schema.read_result(path, str(path)))
        print("\nthe model beside each measured phase (on CUDA: the tensors torch held in it)", *lines, sep="\n")
    return path


def fix_malloc_thresholds(profile: profiles.Profile) -> None:
    """CPU: glibc's thresholds fixed in this process (mallopt) and in every process it starts (glibc reads
    ``MALLOC_*_THRESHOLD_`` at start), as the profile asks."""
    threshold = profile.malloc_mmap_threshold
    if profile.hardware != "cpu" or not threshold:
        return
    worker.fix_malloc_thresholds(threshold)
    os.environ.update(MALLOC_MMAP_THRESHOLD_=str(threshold), MALLOC_TRIM_THRESHOLD_=str(threshold))
    print(f"glibc's mmap and trim thresholds fixed at {threshold} bytes in every process of this run")


def run_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The profile's parts (or those ``--only`` names), each writing its result file, then the run's pace."""
    print_environment()
    try:
        profile = chosen_profile(args.profile, args.hardware, args.quick)
    except profiles.ProfileError as error:
        parser.error(str(error))
    patterns = args.only.split(",") if args.only else []
    parts = [p for p in profile.parts if not patterns or any(fnmatch.fnmatch(p, x) for x in patterns)]
    configuration_filter = None
    if not parts:  # configurations of the parts that run GRPO steps, by name
        for part in profiles.GRPO_PARTS:
            bench = getattr(profile, part)
            names = [name for name, _ in profiles.configurations(bench)] if part in profile.parts and bench else []
            if any(fnmatch.fnmatch(name, x) for name in names for x in patterns):
                parts.append(part)
        configuration_filter = patterns
    if not parts:
        parser.error(
            f"--only {args.only!r} matches no part of profile {profile.name!r} ({', '.join(profile.parts)}) "
            "and no GRPO configuration"
        )
    print(f"profile {profile.name}{' (quick)' if args.quick else ''}: {profile.question}")
    fix_malloc_thresholds(profile)
    started = time.monotonic()
    calibration = pace.calibrate()
    print(
        f"calibration ({time.monotonic() - started:.1f} s): Python {calibration.python_s * 1e3:.0f} ms, "
        f"interpreter start {calibration.spawn_s * 1e3:.0f} ms, fp32 tensor work {calibration.torch_s * 1e3:.0f} ms"
    )
    estimates = pace.estimate_run([args.out, RESULTS], profile, parts, args.quick, calibration, configuration_filter)
    print(pace.estimate_line(estimates), flush=True)
    whole_profile = len(parts) == len(profile.parts) and configuration_filter is None
    for number, (part, estimated) in enumerate(zip(parts, estimates, strict=True), 1):
        print(f"\n== {part} == ({pace.clock(time.monotonic() - started)} elapsed)", flush=True)
        part_started = time.monotonic()
        path = run_part(part, profile, args.quick, args.out, configuration_filter)
        ended = time.monotonic()
        record = schema.Pace(
            calibration=calibration,
            part_s=ended - part_started,
            estimated_s=estimated.seconds,
            reference=estimated.reference,
            scale=estimated.scale,
        )
        if number == len(parts):  # the last part's file holds the whole run's time and targets
            record.run_s, record.run_estimated_s = ended - started, pace.whole_estimate(estimates)
            limit_min = profile.time_limit_min if whole_profile else None
            record.run_targets = pace.run_targets(profile.name, limit_min, record.run_s, record.run_estimated_s)
        pace.record(path, record)
        print(f"\nwrote {shown(path)}")
    print(f"profile {profile.name} took {pace.clock(time.monotonic() - started)}")
    for target in record.run_targets:
        print(target.line())
    return 0
