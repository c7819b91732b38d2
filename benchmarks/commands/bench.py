"""``python -m benchmarks bench``: run a profile's parts and write one result file per part, each part's
summary printed as it ends, the run's pace before and after.

With no ``--profile``, the machine picks it: ``cpu`` with no CUDA device, else by the first GPU's
name and memory (H200 ``h200``, B200 ``b200``, GB10 ``spark``, a 24 GB card ``24gb``, any other
``gpu``); ``--hardware`` names the class the results are filed under.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import REPO
from benchmarks.catalog import gpus, install_plan, profiles
from benchmarks.commands import summaries
from benchmarks.commands.output import RESULTS, shown
from benchmarks.model import profile_fit
from benchmarks.report.markdown import figures
from benchmarks.results import schema
from benchmarks.run.decode import sweep
from benchmarks.run.grpo import timed_steps, worker
from benchmarks.run.machine import nvml_gpus, pace, provenance


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


def refuse_shared_gpus(nvml: object = None) -> None:
    """Another process's memory on the run's GPUs said before any part, and past the share a device tolerates, the
    run stopped: what it holds no configuration can have (``nvml_gpus.held_by_others``)."""
    others = nvml_gpus.held_by_others(nvml)
    if others and others[1]:
        raise SystemExit(others[0])
    if others:
        print(others[0])


def chosen_profile(name: str | None, hardware: str | None, quick: bool = False) -> profiles.Profile:
    """``--profile`` and ``--hardware`` as given, else this machine's (``detect``)."""
    if name is None:
        name, detected, seen = detect()
        hardware = hardware or detected
        print(f"{seen}: profile {name}" + (f" on hardware class {hardware}" if hardware else ""))
    return profiles.load(name, quick=quick, hardware=hardware)


def started_profile(parser: argparse.ArgumentParser, args: argparse.Namespace) -> profiles.Profile:
    """What a command that runs a profile does first: the environment printed, the devices pinned, and the
    profile its options name (``--profile``, ``--hardware``, ``--quick``) or this machine's; a bad one is a
    parser error."""
    print_environment()
    pin_devices()
    refuse_shared_gpus()
    try:
        return chosen_profile(args.profile, args.hardware, args.quick)
    except profiles.ProfileError as error:
        parser.error(str(error))


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


HARDWARE_HELP = "a class of profiles/hardware.toml: the results go under it (default: detected, else the profile's)"


def add_options(commands: argparse._SubParsersAction) -> None:
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


def chosen_parts(
    parser: argparse.ArgumentParser, args: argparse.Namespace, profile: profiles.Profile
) -> tuple[list[str], list[str] | None]:
    """The parts ``--only`` names (all by default), or the GRPO parts whose configurations it names, with those
    names as the configurations' filter; a pattern that matches nothing is a parser error."""
    patterns = args.only.split(",") if args.only else []
    parts = [p for p in profile.parts if not patterns or any(fnmatch.fnmatch(p, x) for x in patterns)]
    if parts:
        return parts, None
    for part in profiles.GRPO_PARTS:  # configurations of the parts that run GRPO steps, by name
        bench = getattr(profile, part)
        names = [name for name, _ in profiles.configurations(bench)] if part in profile.parts and bench else []
        if any(fnmatch.fnmatch(name, x) for name in names for x in patterns):
            parts.append(part)
    if not parts:
        parser.error(
            f"--only {args.only!r} matches no part of profile {profile.name!r} ({', '.join(profile.parts)}) "
            "and no GRPO configuration"
        )
    return parts, patterns


def run_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The profile's parts (or those ``--only`` names), each writing its result file, then the run's pace; a part
    that breaks is said, and the parts after it still run (exit status 1)."""
    profile = started_profile(parser, args)
    parts, configuration_filter = chosen_parts(parser, args, profile)
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
    record, failed = None, []
    for number, (part, estimated) in enumerate(zip(parts, estimates, strict=True), 1):
        print(f"\n== {part} == ({pace.clock(time.monotonic() - started)} elapsed)", flush=True)
        part_started = time.monotonic()
        try:
            path = run_part(part, profile, args.quick, args.out, configuration_filter, args.deadline)
        except schema.Stopped:
            raise
        except Exception as error:  # its file keeps what it measured before it broke; the next parts still run
            failed.append(part)
            print(f"error: {part} failed: {type(error).__name__}: {str(error)[:2000]}", file=sys.stderr)
            continue
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
            limit_min = profile.time_limit_min if whole_profile and not failed else None
            record.run_targets = pace.run_targets(profile.name, limit_min, record.run_s, record.run_estimated_s)
        pace.record(path, record)
        print(f"\nwrote {shown(path)}")
    print(f"profile {profile.name} took {pace.clock(time.monotonic() - started)}")
    for target in record.run_targets if record else []:
        print(target.line())
    if failed:
        print(f"error: {', '.join(failed)} failed (above); the other parts' files are whole", file=sys.stderr)
    return 1 if failed else 0
