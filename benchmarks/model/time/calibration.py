"""The GPU time model's constants fitted on published figures: the efficiencies and the per-step overhead that
turn a card's catalogued peaks into rates (``fitted_rates``), fitted only on the ``calibration`` entries
of results/published/ (held-out entries never reach this module's fit) and used by every answer.

Each calibration entry's stated figure is read as seconds (a decode batch's tokens over its tokens a second, a
trained sequence's tokens over its tokens a second a GPU) and the model's seconds split into what each constant
scales: FLOPs at the card's peak (1 / MFU), a MoE's routed experts' FLOPs likewise (1 / their own MFU), bytes at its
spec bandwidth (1 / MBU), vLLM engine steps (seconds each), and the rest at the assumed rates. The
constants minimise the relative error by least squares, none negative; a decode step's binding side (FLOPs or
bytes) is decided at the constants of the previous round, from the assumptions on."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from benchmarks.catalog import published
from benchmarks.catalog.profiles import Hardware, Levers, load_hardware, load_shapes
from benchmarks.model.memory.terms import DTYPE_BYTES, GIB, Workload
from benchmarks.model.time.engine_work import generation_work, kv_held
from benchmarks.model.time.rates import ASSUMED, GpuConstants, gpu_rates
from benchmarks.model.time.schedule import Engine
from benchmarks.model.time.work_rates import Rates, Work, forward_work, training_passes

# The kinds a constant is fitted on, and the constants they fit (columns of FLOPs, bytes, engine steps, routed
# experts' FLOPs): decode figures fit decode's bandwidth share and the engine step, training figures training's
# FLOP share, dense and through a MoE's experts.
FITTED_KINDS = ("decode", "training")
FITTED_COLUMNS = (0, 1, 2, 3)
ROUNDS = 5


@dataclass(frozen=True)
class Parts:
    """An entry's predicted seconds split by what each constant scales, at the constants that split them."""

    flops_s: float  # at the card's peak FLOP/s
    bytes_s: float  # at the card's spec bandwidth
    engine_steps: float
    expert_flops_s: float  # a MoE's routed experts' FLOPs at the card's peak
    rest_s: float
    stated_s: float

    def seconds(self, constants: GpuConstants) -> float:
        return (
            self.flops_s / constants.training_mfu
            + self.bytes_s / constants.decode_mbu
            + self.engine_steps * constants.engine_step_s
            + self.expert_flops_s / constants.expert_mfu
            + self.rest_s
        )


def decode_engine(mapping: published.Mapping) -> tuple[Engine, Workload]:
    """A decode figure's engine: its batch over its tensor-parallel GPUs, each prompt its own, at most
    ``max_num_seqs`` of them running at once, and where its levers give a vLLM engine's share, no more than its
    KV cache holds (``engine_work.kv_held``); the rest queued (``schedule.decode_schedule``)."""
    work = Workload(mapping.sequences, mapping.prompt_tokens, mapping.completion_tokens)
    held = mapping.max_num_seqs or math.inf
    if mapping.levers.get("use_vllm"):
        levers, memory = Levers().changed(**mapping.levers), load_hardware()[mapping.card].memory_gib * GIB
        held = min(held, kv_held(load_shapes()[mapping.shape], "bfloat16", levers, work, memory))
    return Engine(mapping.sequences, mapping.gpus, held=held), work


def decode_work(entry: published.Entry) -> dict[str, Work]:
    shape = load_shapes()[entry.mapping.shape]
    engine, work = decode_engine(entry.mapping)
    return {"generation": generation_work(shape, DTYPE_BYTES["bfloat16"], engine, work)}


def trained_work(entry: published.Entry) -> dict[str, Work]:
    """A training figure's work on one of its GPUs for one sequence: its forward and backward (and recompute) through
    every matmul and attention (``work_rates.forward_work``). Its sharding's collectives, its optimizer (spread over a
    step of many sequences) and a framework's other kernels sit inside the share of peak it reaches."""
    mapping = entry.mapping
    levers = Levers().changed(**mapping.levers)
    forward = forward_work(load_shapes()[mapping.shape], 1, mapping.sequence_tokens)
    return {"training": forward * training_passes(levers)}


def entry_work(entry: published.Entry) -> dict[str, Work]:
    return trained_work(entry) if entry.kind == "training" else decode_work(entry)


def entry_seconds(entry: published.Entry, rates: Rates) -> float:
    """The model's seconds for a decode figure's whole batch, or a training figure's sequence on one GPU."""
    return sum(rates.seconds(w) for w in entry_work(entry).values())


def stated_seconds(entry: published.Entry) -> float:
    """A decode figure as the seconds its batch took: tokens over tokens a second, requests over requests a second,
    or its milliseconds; a training figure as the seconds a GPU takes for one sequence."""
    figure, mapping = entry.stated, entry.mapping
    if entry.kind == "training":
        return mapping.sequence_tokens / figure.value
    if figure.unit == "ms":
        return figure.value / 1000
    if figure.unit == "requests/s":
        return mapping.sequences / figure.value
    return mapping.sequences * mapping.completion_tokens / figure.value


def as_stated(entry: published.Entry, seconds: float) -> float:
    """Seconds of a decode figure's batch, or of a training figure's sequence, in the figure's own unit."""
    if entry.kind == "training":
        return entry.mapping.sequence_tokens / seconds
    if entry.stated.unit == "ms":
        return seconds * 1000
    if entry.stated.unit == "requests/s":
        return entry.mapping.sequences / seconds
    return entry.mapping.sequences * entry.mapping.completion_tokens / seconds


def parts(entry: published.Entry, hardware: Hardware, constants: GpuConstants) -> Parts:
    rates = gpu_rates(hardware, constants)
    flops = nbytes = steps = experts = rest = 0.0
    for w in entry_work(entry).values():
        bound_flops, bound_bytes = w.bound(rates.flop_s, rates.bytes_s)
        flops += w.flops + bound_flops
        nbytes += w.bytes + bound_bytes
        steps += w.engine_steps
        experts += w.expert_flops
        rest += rates.seconds(replace(w, flops=0.0, expert_flops=0.0, bytes=0.0, roofline=(), engine_steps=0.0))
    peak = hardware.peak_bf16_tflops * 1e12
    return Parts(
        flops / peak, nbytes / (hardware.spec_bandwidth_gb_s * 1e9), steps, experts / peak, rest, stated_seconds(entry)
    )


def calibration_entries(entries: list[published.Entry]) -> list[published.Entry]:
    """The mapped calibration entries a constant is fitted on; held-out ones are dropped here, first."""
    return [e for e in entries if e.role == "calibration" and e.kind in FITTED_KINDS and e.mapping is not None]


def fit(entries: list[published.Entry]) -> GpuConstants:
    """The constants that best match ``entries``' calibration figures (``ASSUMED`` where none is mapped); a
    constant no entry moves keeps its assumption."""
    chosen = calibration_entries(entries)
    if not chosen:
        return ASSUMED
    catalog = load_hardware()
    constants = ASSUMED
    for _ in range(ROUNDS):
        rows = [parts(e, catalog[e.mapping.card], constants) for e in chosen]
        constants = _least_squares(rows, constants)
    return replace(constants, fitted_on=tuple(e.id for e in chosen))


def _least_squares(rows: list[Parts], start: GpuConstants) -> GpuConstants:
    """1 / MFU, 1 / MBU, the engine step's seconds and 1 / the experts' MFU minimising the relative error, none
    negative: every subset of them solved, the best non-negative one; the others keep ``start``'s."""
    columns = np.array([[r.flops_s, r.bytes_s, r.engine_steps, r.expert_flops_s] for r in rows])
    columns /= np.array([[r.stated_s] for r in rows])
    target = np.array([1 - r.rest_s / r.stated_s for r in rows])
    current = np.array([1 / start.training_mfu, 1 / start.decode_mbu, start.engine_step_s, 1 / start.expert_mfu])
    moved = [i for i in FITTED_COLUMNS if columns[:, i].any()]
    best, best_residual = current, float("inf")
    for size in range(1, len(moved) + 1):
        for subset in itertools.combinations(moved, size):
            fixed = [i for i in range(len(current)) if i not in subset]
            aim = target - columns[:, fixed] @ current[fixed]
            solution, *_ = np.linalg.lstsq(columns[:, subset], aim, rcond=None)
            if (solution <= 0).any():
                continue
            full = current.copy()
            full[list(subset)] = solution
            residual = float(np.sum((columns @ full - target) ** 2))
            if residual < best_residual:
                best, best_residual = full, residual
    mfu, mbu, experts = (min(1.0, 1 / float(best[i])) for i in (0, 1, 3))
    return GpuConstants(mfu, mbu, float(best[2]), experts)  # plain floats: their figures go into JSON result files


@functools.cache
def fitted() -> GpuConstants:
    """The constants fitted on the committed calibration entries, fitted once a process."""
    return fit(published.entries())


def fitted_rates(hardware: Hardware, decode_gb_s: float | None = None, reward_s: float = 0.0) -> Rates:
    """A GPU class's rates at the fitted constants: what every GPU answer uses."""
    return gpu_rates(hardware, fitted(), decode_gb_s, reward_s)
