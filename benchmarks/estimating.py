"""``python -m benchmarks estimate``: the memory and time models for one shape, lever set and hardware class:
memory per term and phase, whether it fits and what would, seconds per phase and per step, throughput,
GPU-hours and their cost."""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass, replace

from benchmarks import REPO
from benchmarks.catalog import profiles, shapes
from benchmarks.catalog.levers import GUIDE_LEVERS
from benchmarks.model import estimate, timing
from benchmarks.report import sizing, time_validation
from benchmarks.results import schema
from benchmarks.run import pace

RESULTS = REPO / "results" / "runs"


WORKLOAD_LEVERS = ("num_generations", "per_device_train_batch_size", "max_completion_length")
ESTIMATE_BASE = {name: getattr(GUIDE_LEVERS, name) for name in WORKLOAD_LEVERS}  # the guide's workload


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
        work = estimate.Workload.from_levers(levers, self.prompt_tokens)
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
        work = estimate.Workload.from_levers(levers, sizer.prompt_tokens)
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


def step_rates(levers: profiles.Levers, hardware: profiles.Hardware) -> timing.Rates:
    """This machine's rates (its calibration, the committed fit) for the cpu class, else the class's assumed ones;
    the reward's seconds a completion from the newest rewards part."""
    results = schema.load_results(RESULTS)
    reward_s = time_validation.reward_seconds(results, levers.reward, None)
    if hardware.gpu_class != "cpu":
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
        rates = step_rates(levers, hardware)
    except ValueError as error:
        print(f"\nno time estimate: {error}")
        return
    work = estimate.Workload.from_levers(levers, args.prompt_tokens)
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
    print(time_validation.error_line(hardware.gpu_class))
