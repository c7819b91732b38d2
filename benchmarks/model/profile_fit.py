"""A profile against both models before it runs: each GRPO configuration as the run hands it to the trainer
(``placement.as_run``), its predicted peak per rank and whether it fits the profile's budget on its class; and on a
GPU class a first run's time, part by part, where no earlier run of the profile gives it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from benchmarks.catalog.profiles import (
    GRPO_PARTS,
    DecodeBench,
    GrpoBench,
    Levers,
    Profile,
    combination_problem,
    configurations,
    load_hardware,
    load_shapes,
)
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.decode_bytes import decode_step_bytes
from benchmarks.model.memory.placement import as_run
from benchmarks.model.memory.predict import DTYPE_BYTES, GIB, MODELLED_OPTIMIZERS, Workload, estimate
from benchmarks.model.time.calibration import fitted, fitted_rates
from benchmarks.model.time.phase_seconds import step_time
from benchmarks.model.time.work_rates import Rates


@dataclass(frozen=True)
class PredictedFit:
    """One configuration's predicted peak (bytes per rank) against its capacity: the profile's budget, at most
    the device's memory. ``peak_bytes`` None: the model cannot price it (``why``)."""

    part: str
    name: str
    capacity_bytes: float
    peak_bytes: int | None = None
    engine_cannot_start: str | None = None
    why: str = ""

    @property
    def fits(self) -> bool | None:
        if self.peak_bytes is None:
            return None
        return self.engine_cannot_start is None and self.peak_bytes <= self.capacity_bytes

    def line(self) -> str:
        capacity = f"{self.capacity_bytes / GIB:.1f} GiB"
        if self.peak_bytes is None:
            return f"{self.part} {self.name}: not predicted ({self.why})"
        verdict = "fits" if self.fits else "does NOT fit"
        line = f"{self.part} {self.name}: predicted peak {self.peak_bytes / GIB:.1f} GiB a rank, {verdict} {capacity}"
        return line + (f": {self.engine_cannot_start}" if self.engine_cannot_start else "")


def as_run_configurations(profile: Profile, part: str) -> Iterator[tuple[str, GrpoBench, Levers, Shape]]:
    """``part``'s configurations of ``profile`` in the order they run, each as the run hands it to the trainer."""
    hardware, bench = load_hardware()[profile.hardware], getattr(profile, part)
    shape = load_shapes()[bench.shape]
    for name, levers in configurations(bench):
        yield name, bench, as_run(bench, levers, shape, hardware), shape


def predicted_fits(profile: Profile, device_memory_gib: float = 0.0) -> list[PredictedFit]:
    """Every GRPO configuration of ``profile``'s parts, in the order they run, against the model on its class; a
    class of no memory of its own (the generic ``gpu``) on ``device_memory_gib``, the device's, read at run time
    (none known: no prediction)."""
    hardware = load_hardware()[profile.hardware]
    if not hardware.memory_gib:
        if not device_memory_gib:
            return []
        hardware = dataclasses.replace(hardware, memory_gib=device_memory_gib)
    found = []
    for part in (p for p in profile.parts if p in GRPO_PARTS):
        for name, bench, levers, shape in as_run_configurations(profile, part):
            capacity = min(bench.memory_budget_gib, hardware.memory_gib or bench.memory_budget_gib) * GIB
            why = combination_problem(levers) or (
                ""
                if levers.optim in MODELLED_OPTIMIZERS
                else f"the model counts AdamW's states only, not {levers.optim}"
            )
            if why:
                found.append(PredictedFit(part, name, capacity, why=why))
                continue
            work = Workload.from_levers(levers, bench.prompt_words)
            est = estimate(shape, bench.dtype, levers, work, hardware, malloc_fixed=True)
            found.append(PredictedFit(part, name, capacity, est.peak, est.engine_cannot_start))
    return found


# Assumed, not yet measured on a GPU: a configuration's worker start (imports, the model loaded onto the device, a
# colocated engine started and its CUDA graphs captured) and an engine's start in the decode part; a GPU run's
# pace replaces the whole prediction with its own time (benchmarks.run.machine.pace).
SETUP_S = 120.0


def predicted_basis() -> str:
    """What a GPU class's predicted run time rests on."""
    return f"predicted: the time model ({fitted().words()}), {SETUP_S:g} s to start each worker"


def predicted_part_s(profile: Profile, part: str, names: Sequence[str] | None = None) -> float | None:
    """``part``'s seconds on ``profile``'s GPU class as the time model predicts them (only the configurations
    ``names`` of a GRPO part, where given); None on a CPU or a class without catalogued peaks."""
    hardware = load_hardware()[profile.hardware]
    try:
        rates = fitted_rates(hardware)
    except ValueError:  # the cpu and generic gpu classes: no peaks to predict from
        return None
    if part == "decode":
        return _decode_s(profile.decode, rates)
    if part not in GRPO_PARTS or getattr(profile, part, None) is None:
        return None
    seconds = 0.0
    for name, bench, levers, shape in as_run_configurations(profile, part):
        if names is None or name in names:
            work = Workload.from_levers(levers, bench.prompt_words)
            step = step_time(shape, bench.dtype, levers, work, rates).step_s
            seconds += SETUP_S + (bench.warmup_steps + bench.measured_steps) * step
    return seconds


def _decode_s(decode: DecodeBench, rates: Rates) -> float:
    """Each engine's start, then every point's repeats (and one warm-up call) at the assumed bandwidth."""
    shape, dtype_bytes = load_shapes()[decode.shape], DTYPE_BYTES[decode.dtype]
    points = 0.0
    for batch in decode.batches:
        for context in decode.contexts:
            step_bytes = decode_step_bytes(shape, dtype_bytes, batch, context).total
            points += (decode.repeats + 1) * decode.new_tokens * (step_bytes / rates.bytes_s + rates.engine_step_s)
    return len(decode.engines) * (SETUP_S + points)
