"""``python -m benchmarks bench``: run a profile's parts and write one result file per part.

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
from pathlib import Path

from benchmarks import REPO, estimating, planning, summaries
from benchmarks.catalog import gpus, install_plan, profiles
from benchmarks.catalog.contenders import CONTENDERS
from benchmarks.model import profile_fit
from benchmarks.report.markdown import figures, regenerate, side_by_side
from benchmarks.report.web import builder
from benchmarks.results import schema
from benchmarks.run.decode import sweep
from benchmarks.run.grpo import timed_steps, worker
from benchmarks.run.machine import nvml_gpus, pace, provenance
from benchmarks.run.max_context import contender_runs

RESULTS = REPO / "results" / "runs"


def detect(nvml: object = None) -> tuple[str, str | None, str]:
    """(profile, hardware class or None for the profile's own, what was seen) for this machine: from the GPUs
    the run uses (``nvml_gpus.choice``: the same decision as the install's, NVML, no CUDA context), else ``cpu``."""
    gpus = nvml_gpus.visible_gpus(nvml)
    if not gpus:
        listed = os.environ.get("CUDA_VISIBLE_DEVICES")
        why = f"CUDA_VISIBLE_DEVICES={listed} hides every GPU" if listed is not None else "NVML sees none"
        return "cpu", None, f"no CUDA device ({why})"
    first = gpus[0]
    profile, hardware = install_plan.classify(first.name, first.memory_gib, len(gpus))
    many = f"{len(gpus)} x" if len(gpus) > 1 else "CUDA device"
    return profile, hardware, f"{many} {first.name} ({first.memory_gib:g} GiB, {first.memory_source})"


def pin_devices(nvml: object = None) -> None:
    """Before any part: CUDA numbers devices as NVML does (PCI order), and where models are mixed the run is
    pinned to the chosen ones (``CUDA_VISIBLE_DEVICES``) with a word saying so; a refused list (MIG) stops here."""
    chosen = nvml_gpus.choice(nvml)
    if isinstance(chosen, str):
        raise SystemExit(chosen)
    if chosen.devices:
        os.environ.update(gpus.DEVICE_ORDER)
    if chosen.placed:
        print(chosen.note)
        os.environ["CUDA_VISIBLE_DEVICES"] = chosen.placed


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
    gpus = nvml_gpus.describe(nvml_gpus.load_nvml())
    print("GPUs: " + (", ".join(f"{g.index}: {g.name} {g.memory_gib:g} GiB" for g in gpus) or "none"))


def run_rewards(profile: profiles.Profile, quick: bool, out: Path) -> Path:
    """The reward benchmarks under pytest-benchmark; returns the result file written."""
    settings = profile.rewards
    target = out / profile.hardware / f"{provenance.stamp()}-rewards.json"
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


def run_tables(args: argparse.Namespace) -> int:
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


def run_compare(args: argparse.Namespace) -> int:
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


def run_site(args: argparse.Namespace) -> int:
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


def run_context_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    print_environment()
    pin_devices()
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
    path = contender_runs.run_context(profile, pythons, args.out, overrides, args.quick)
    summaries.context(path)
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
    remake = commands.add_parser("decode-report", help="(re)make the table and figure of decode result files")
    remake.add_argument("files", nargs="+", type=Path, metavar="FILE")
    _context_options(commands)
    estimating.add_options(commands)
    planning.add_options(commands)
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
    versus = commands.add_parser("compare", help="result files or hardware classes side by side, with figures")
    versus.add_argument("sides", nargs="*", metavar="FILE_OR_CLASS")
    versus.add_argument("--results", type=Path, default=RESULTS, help="result files (default: results/runs)")
    versus.add_argument("--out", type=Path, help="default: results/compare/<A>-vs-<B>")
    web = commands.add_parser("site", help="build the static site of the results (claims, sizing, classes, series)")
    web.add_argument("--results", type=Path, default=RESULTS, help="result files (default: results/runs)")
    web.add_argument("--out", type=Path, default=REPO / "build" / "site", help="default: build/site")
    web.add_argument(
        "--screenshot",
        type=Path,
        help="also PNGs of the front page by headless Chromium: FILE (1366 px) and FILE-phone",
    )
    commands.add_parser(
        "provenance", help=f"record this checkout's commit in {provenance.PROVENANCE.name}, for a tree that travels"
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
    bench.add_argument(
        "--deadline",
        type=float,
        metavar="EPOCH_S",
        help="a caller's own time limit (seconds since the epoch): each GRPO configuration ends by it, as a timeout "
        "record with the phase it reached",
    )


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
        return estimating.run_estimate(commands_parser(parser, "estimate"), args)
    if args.command == "plan":
        return planning.run_plan(commands_parser(parser, "plan"), args)
    if args.command == "tables":
        return run_tables(args)
    if args.command == "compare":
        return run_compare(args)
    if args.command == "site":
        return run_site(args)
    if args.command == "context":
        return run_context_command(parser, args)
    if args.command == "decode-report":
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
    part: str,
    profile: profiles.Profile,
    quick: bool,
    out: Path,
    configuration_filter: list[str] | None,
    deadline: float | None = None,
) -> Path:
    """One part of a profile, its summary printed; returns its result file."""
    if part == "rewards":
        path = run_rewards(profile, quick, out)
        summaries.rewards(path)
    elif part == "decode":
        path = sweep.run_decode(profile, quick, out)
        try:  # tabulate and matplotlib: a GPU box may lack them, and the result file stands alone
            summaries.decode(path)
            for made in figures.write_decode_report(path):
                print(f"made {shown(made)}")
        except ImportError as error:
            remake = f"python -m benchmarks decode-report {shown(path)}"
            print(f"no decode table or figure here ({error}): `{remake}` makes them")
    else:
        path = timed_steps.run_grpo(profile, quick, out, configuration_filter, part, deadline)
        summaries.grpo(path)
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


def calibrated(profile: profiles.Profile) -> schema.Calibration | None:
    """This CPU's calibration, where the profile runs on it; a GPU profile's parts are timed on the device, and
    its estimates come from the class's own earlier runs (unscaled) or the time model."""
    if profile.hardware != "cpu":
        print("no CPU calibration: a GPU profile's parts run on the device")
        return None
    started = time.monotonic()
    found = pace.calibrate()
    print(
        f"calibration ({time.monotonic() - started:.1f} s): Python {found.python_s * 1e3:.0f} ms, "
        f"interpreter start {found.spawn_s * 1e3:.0f} ms, fp32 tensor work {found.torch_s * 1e3:.0f} ms"
    )
    return found


def print_predicted_fits(profile: profiles.Profile) -> None:
    """The memory model's verdict on each GRPO configuration, before it runs; the generic class on this device's
    own memory."""
    device = nvml_gpus.visible_gpus()
    for predicted in profile_fit.predicted_fits(profile, device[0].memory_gib if device else 0.0):
        print(f"  the memory model: {predicted.line()}")


def run_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The profile's parts (or those ``--only`` names), each writing its result file, then the run's pace."""
    print_environment()
    pin_devices()
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
    print_predicted_fits(profile)
    fix_malloc_thresholds(profile)
    started = time.monotonic()
    calibration = calibrated(profile)
    install = pace.install_from(os.environ)
    if install:
        print(pace.install_line(install))
    estimates = pace.estimate_run([args.out, RESULTS], profile, parts, args.quick, calibration, configuration_filter)
    print(pace.estimate_line(estimates), flush=True)
    whole_profile = len(parts) == len(profile.parts) and configuration_filter is None
    for number, (part, estimated) in enumerate(zip(parts, estimates, strict=True), 1):
        print(f"\n== {part} == ({pace.clock(time.monotonic() - started)} elapsed)", flush=True)
        part_started = time.monotonic()
        path = run_part(part, profile, args.quick, args.out, configuration_filter, args.deadline)
        ended = time.monotonic()
        record = schema.Pace(
            calibration=calibration,
            part_s=ended - part_started,
            estimated_s=estimated.seconds,
            reference=estimated.reference,
            scale=estimated.scale,
            predicted=estimated.predicted,
            install=install if number == 1 else None,
            first_run_s=estimated.first_run_s or None,
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
