"""What to rent, how many, with which levers, how long and at what cost: for one shape, every GPU card and count
up to 64, the fastest lever set the memory model fits and its price for a job (the time model); the Pareto front
of wall time against cost; and, where nothing fits, why not and the smallest change that would."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from benchmarks.catalog.levers import MODELS, Levers, combination_problem
from benchmarks.catalog.profiles import Hardware
from benchmarks.catalog.shapes import Shape
from benchmarks.model import guide
from benchmarks.model.memory.placement import GPU_COUNTS, on_gpus
from benchmarks.model.memory.predict import GIB, Estimate, estimate
from benchmarks.model.time.calibration import fitted_rates
from benchmarks.model.time.engine_work import kv_held
from benchmarks.model.time.phase_seconds import StepTime, phase_work, timed
from benchmarks.model.time.work_rates import Rates, Work

ENGINES = ("colocate", "sleep", "server")
ENGINE_LEVERS = ("use_vllm", "vllm_mode", "vllm_enable_sleep_mode")
SERVER_GPUS = (1, 2, 4, 8)  # `trl vllm-serve --tensor_parallel_size`
SERVER_SHARE = 0.9  # vLLM's own default gpu_memory_utilization: a server has its GPUs to itself


@dataclass(frozen=True)
class Setup:
    """One configuration on one card: the trainer's levers on its ranks, the GPUs a vLLM server holds beside
    them, the predicted peak per GPU and step."""

    card: str
    hardware: Hardware
    levers: Levers
    server_gpus: int
    peak: float
    step: StepTime

    @property
    def gpus(self) -> int:
        """Every GPU the setup holds, the server's included."""
        return self.levers.world_size + self.server_gpus

    @property
    def headroom(self) -> float:
        return 1 - self.peak / (self.hardware.memory_gib * GIB)

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens a second of the whole setup (every trainer rank's rollout)."""
        return self.step.completion_tokens * self.levers.world_size / self.step.step_s

    def wall_s(self, recipe: guide.Recipe) -> float:
        """``recipe``'s steps, each one optimizer step of its global batch over the setup's GPUs."""
        return recipe.steps * self.step.step_s

    def gpu_hours(self, recipe: guide.Recipe) -> float:
        return self.gpus * self.wall_s(recipe) / 3600

    def words(self) -> str:
        return guide.in_words(self.levers, self.server_gpus)


@dataclass(frozen=True)
class Ask:
    """What a plan is asked: the shape, the levers it starts from and those the user fixed, the recipe (its step's
    global batch, lengths and steps)."""

    shape: Shape
    base: Levers = guide.GUIDE_BASE
    fixed: frozenset[str] = frozenset()
    recipe: guide.Recipe = guide.GUIDE_RECIPE
    dtype: str = guide.GUIDE_DTYPE

    @property
    def prompt_tokens(self) -> int:
        return self.recipe.prompt_tokens

    def predict(self, levers: Levers, hardware: Hardware) -> Estimate:
        """The memory model's estimate (shared: read it, never change it)."""
        return _predicted(self, levers, hardware)

    def fits(self, levers: Levers, hardware: Hardware) -> Estimate | None:
        """The estimate where ``levers`` run together and fit ``hardware``, else None."""
        if combination_problem(levers) is not None:
            return None
        predicted = self.predict(levers, hardware)
        return predicted if predicted.fits(hardware.memory_gib * GIB) else None

    def step(self, levers: Levers, rates: Rates) -> StepTime:
        """The time model's step. The phases' work is the same on every card, counted once, but where the card's
        memory bounds the sequences a vLLM engine decodes at once (``kv_held``)."""
        workload = self.recipe.workload(levers)
        held = kv_held(self.shape, self.dtype, levers, workload, rates.device_bytes)
        unshared = levers.changed(vllm_gpu_memory_utilization=1.0)
        work = _phase_work(self.shape, self.dtype, unshared, self.recipe, held)
        return timed(work, rates, workload, levers.world_size)

    def fed_counts(self) -> tuple[int, ...]:
        """The trainer GPU counts of ``GPU_COUNTS`` whose ranks the recipe's global batch splits over evenly."""
        return tuple(c for c in GPU_COUNTS if self.recipe.per_rank(on_gpus(self.base, c).world_size))

    def on(self, levers: Levers, count: int, hardware: Hardware) -> Levers | None:
        """``levers`` on ``count`` trainer GPUs, each rank its share of the recipe's global batch in micro-batches
        of the largest size, at most the levers', that splits it evenly; the colocated engine's share set by the one
        rule. None where the batch does not split evenly over the ranks."""
        spread = on_gpus(levers, count)
        share = self.recipe.per_rank(spread.world_size)
        if share is None:
            return None
        micro = max(b for b in range(1, min(share, levers.per_device_train_batch_size) + 1) if share % b == 0)
        tp = levers if "vllm_tensor_parallel_size" in self.fixed else spread
        spread = spread.changed(per_device_train_batch_size=micro, gradient_accumulation_steps=share // micro,
                         vllm_tensor_parallel_size=tp.vllm_tensor_parallel_size)  # fmt: skip
        fixed = "vllm_gpu_memory_utilization" in self.fixed
        return guide.engine_share(self.shape, self.dtype, spread, hardware, self.prompt_tokens, fixed)


@functools.lru_cache(maxsize=16384)
def _predicted(ask: Ask, levers: Levers, hardware: Hardware) -> Estimate:
    """One estimate a plan weighs, once: its search asks for the same levers on a card from several counts."""
    return estimate(ask.shape, ask.dtype, levers, ask.recipe.workload(levers), hardware, malloc_fixed=True)


@functools.lru_cache(maxsize=4096)
def _phase_work(shape: Shape, dtype: str, levers: Levers, recipe: guide.Recipe, held: float) -> dict[str, Work]:
    return phase_work(shape, dtype, levers, recipe.workload(levers), held=held)


def _axes(ask: Ask, ranks: int) -> dict[str, tuple]:
    """The values each free lever may take on ``ranks`` trainer GPUs; a fixed lever keeps the user's value."""
    base, fixed = ask.base, ask.fixed
    axes: dict[str, tuple] = {
        "model": MODELS,
        "optim": ("adamw_torch", "adamw_8bit"),
        "gradient_checkpointing": (False, True),
        "engine": ENGINES if base.use_vllm else ("generate",),
        "distributed_type": ("ddp", "zero3") if ranks > 1 else ("no",),
        "per_device_train_batch_size": tuple(b for b in (8, 4, 2, 1) if b <= ask.recipe.global_batch),
    }
    if fixed & set(ENGINE_LEVERS):
        axes["engine"] = (_engine_of(base),)
    if ranks not in GPU_COUNTS:  # only a server beside a trainer makes this count
        axes["engine"] = tuple(e for e in axes["engine"] if e == "server")
    if "per_device_train_batch_size" in fixed:
        axes["per_device_train_batch_size"] = (base.per_device_train_batch_size,)
    for name in fixed & axes.keys():
        axes[name] = (getattr(base, name),)
    return axes


def _engine_of(levers: Levers) -> str:
    if not levers.use_vllm:
        return "generate"
    return "server" if levers.vllm_mode == "server" else "sleep" if levers.vllm_enable_sleep_mode else "colocate"


def _with(ask: Ask, choice: dict) -> Levers:
    """The base with one choice of every axis applied (the micro-batch at most the chosen size: ``Ask.on``)."""
    levers = {k: v for k, v in choice.items() if k != "engine"}
    if choice["engine"] != "generate":
        levers |= dict(use_vllm=True, vllm_mode="server" if choice["engine"] == "server" else "colocate",
                       vllm_enable_sleep_mode=choice["engine"] == "sleep")  # fmt: skip
    return ask.base.changed(**levers)


def lightest(ask: Ask) -> Levers:
    """The lightest levers the plan weighs where the user left them free (a colocated engine asleep rather than a
    server, whose GPUs are a different count): what a why-not starts from when nothing fits."""
    axes = _axes(ask, GPU_COUNTS[-1])
    choice = {name: values[-1] for name, values in axes.items()}
    if "sleep" in axes["engine"]:
        choice["engine"] = "sleep"
    return _with(ask, choice)


def placements(ask: Ask, levers: Levers, count: int, hardware: Hardware) -> Iterator[tuple[Levers, int]]:
    """(the trainer's levers on its ranks, the server's GPUs) that hold ``count`` GPUs in all: a colocated engine
    split over each machine's ranks (``on_gpus``); a server on the fewest GPUs of ``SERVER_GPUS`` that hold its
    engine, beside a trainer on the rest."""
    if not (levers.use_vllm and levers.vllm_mode == "server"):
        placed = ask.on(levers, count, hardware) if count in GPU_COUNTS else None
        if placed is not None:
            yield placed, 0
        return
    for server in (s for s in SERVER_GPUS if count - s in GPU_COUNTS):
        served = levers.changed(vllm_server_tensor_parallel_size=server, vllm_gpu_memory_utilization=SERVER_SHARE)
        trainer = ask.on(served, count - server, hardware)
        if trainer is not None and ask.predict(trainer, hardware).engine_cannot_start is None:
            yield trainer, server
            return


# Every GPU count a plan weighs: 1 to 8 on one machine, then whole 8-GPU machines up to 64; with a vLLM server,
# its GPUs (``SERVER_GPUS``) beside a trainer's count.
COUNTS = tuple(sorted({t + s for t in GPU_COUNTS for s in (0, *SERVER_GPUS) if t + s <= GPU_COUNTS[-1]}))


def fastest(ask: Ask, hardware: Hardware, card: str, count: int) -> Setup | None:
    """The setup of ``count`` GPUs of ``hardware`` whose predicted step is the shortest among those that fit. A
    smaller micro-batch only adds passes, so the largest that fits is the one weighed; a choice is tried only at
    micro-batches no larger than the largest a lighter choice fit at (``heavier``), and not at all where a lighter
    one fit none."""
    axes = _axes(ask, count)
    micro_batches = axes.pop("per_device_train_batch_size")
    rates, best, bounded = fitted_rates(hardware), None, []  # (a choice, the largest micro-batch it fit at; 0: none)
    for values in itertools.product(*(reversed(v) for v in axes.values())):  # the lightest first
        choice = dict(zip(axes, values, strict=True))
        most = min((m for light, m in bounded if heavier(choice, light, axes)), default=micro_batches[0])
        if not most:
            continue
        micro, placed = _fitting(ask, choice, tuple(b for b in micro_batches if b <= most), count, hardware)
        if micro < micro_batches[0]:
            bounded.append((choice, micro))
        for levers, server, found in placed:
            setup = Setup(card, hardware, levers, server, found.peak, ask.step(levers, rates))
            if best is None or setup.step.step_s < best.step.step_s:
                best = setup
    return best


def heavier(choice: dict, other: dict, axes: dict[str, tuple]) -> bool:
    """Whether ``choice`` needs at least the memory of ``other`` on every axis (each axis lists its values from
    the heaviest; a server and a colocated engine are not compared): then, where ``other`` does not fit,
    ``choice`` does not either (tests/test_plan.py checks this holds in the memory model)."""
    for name, values in axes.items():
        mine, theirs = choice[name], other[name]
        if name == "engine" and "server" in (mine, theirs) and mine != theirs:
            return False
        if values.index(mine) > values.index(theirs):
            return False
    return True


def _fitting(
    ask: Ask, choice: dict, micro_batches: tuple, count: int, hardware: Hardware
) -> tuple[int, list[tuple[Levers, int, Estimate]]]:
    """The largest of ``micro_batches`` at which ``choice`` fits on ``count`` GPUs, and its placements with their
    estimates; (0, []) where none fits."""
    for micro in micro_batches:
        levers = _with(ask, choice | {"per_device_train_batch_size": micro})
        placed = [(p, server, ask.fits(p, hardware)) for p, server in placements(ask, levers, count, hardware)]
        placed = [item for item in placed if item[2] is not None]
        if placed:
            return micro, placed
    return 0, []


def plan(ask: Ask, cards: dict[str, Hardware]) -> list[Setup]:
    """Every card and count's fastest setup that fits (``fastest``); a unified-memory machine (DGX Spark) is one
    GPU."""
    found = []
    for card, hardware in cards.items():
        for count in COUNTS if hardware.unified_floor_gib is None else (1,):
            setup = fastest(ask, hardware, card, count)
            if setup is not None:
                found.append(setup)
    return found


def pareto(setups: list[Setup], job: guide.Job, prices: dict[str, float]) -> list[Setup]:
    """The setups no other beats on both wall time and cost: those worth renting. Cost is GPU-hours times
    ``prices`` (per GPU-hour by card); where prices are given, only priced cards are weighed, else GPU-hours."""
    if prices:
        setups = [s for s in setups if s.card in prices]

    def cost(s: Setup) -> float:
        return s.gpu_hours(job) * prices.get(s.card, 1.0)

    return [
        s
        for s in setups
        if not any(
            o.wall_s(job) <= s.wall_s(job)
            and cost(o) <= cost(s)
            and (o.wall_s(job), cost(o)) != (s.wall_s(job), cost(s))
            for o in setups
        )
    ]


@dataclass(frozen=True)
class WhyNot:
    """Why a setup does not fit: its binding term per GPU (``Binding``), whether that shrinks with GPUs, and the
    fewest lever changes that fit, with the setup that results."""

    bound: Binding
    capacity: float
    shrinks: bool
    change: dict  # empty: more GPUs alone
    setup: Setup | None

    def changed(self) -> str:
        return ", ".join(f"{k}={guide.spelled(v)}" for k, v in self.change.items()) or "more GPUs"


# Changes a why-not weighs, each one lever; up to three are combined, the fewest first.
CHANGES = (
    {"gradient_checkpointing": True},
    {"optim": "adamw_8bit"},
    {"vllm_enable_sleep_mode": True},
    {"model": "lora"},
    {"model": "qlora"},
    {"micro_batch": 1},
    {"vllm_mode": "server"},
)


def _changed(levers: Levers, change: dict) -> Levers | None:
    """``levers`` with ``change``; None where it changes nothing or cannot apply."""
    change = dict(change)
    if "micro_batch" in change:
        change = {k: v for k, v in change.items() if k != "micro_batch"} | {"per_device_train_batch_size": 1}
    if (change.get("vllm_enable_sleep_mode") or "vllm_mode" in change) and not levers.use_vllm:
        return None
    changed = levers.changed(**change)
    return None if changed == levers else changed


@dataclass(frozen=True)
class Binding:
    """What binds ``count`` GPUs of a card: the estimate's peak, its largest term in the peak phase, that term per
    GPU on ``most_gpus`` (64) whatever the batch, and why an engine cannot start where it cannot; ``fed_most`` is the
    most GPUs (up to 64) whose ranks the recipe's global batch splits over, where a search over counts stops."""

    term: str
    term_bytes: float
    peak: float
    most_gpus_bytes: float
    engine: str | None
    fed_most: int = GPU_COUNTS[-1]
    most_gpus: int = GPU_COUNTS[-1]


def binding(ask: Ask, hardware: Hardware, count: int) -> Binding:
    """The binding term of ``ask.base`` on ``count`` GPUs of ``hardware`` (the most up to ``count`` the batch feeds),
    and that term on more GPUs two ways: the batch spread over the most GPUs it feeds (a rank's activations shrink),
    and the states partitioned over 64 (ZeRO, FSDP), each rank with the whole batch (no fewer activations): whether a
    term shrinks is the partition's physics, not the batch's, and the batch may stop the search before it."""
    fed = ask.fed_counts()
    here = max(c for c in fed if c <= count)
    there = ask.predict(ask.on(ask.base, here, hardware), hardware)
    term, term_bytes = max(there.phases[there.peak_phase].items(), key=lambda item: item[1])
    spread = there if here == fed[-1] else ask.predict(ask.on(ask.base, fed[-1], hardware), hardware)
    on_fed = spread.phases.get(there.peak_phase, {}).get(term, term_bytes)
    wide = replace(ask, recipe=replace(ask.recipe, prompts=ask.recipe.prompts * GPU_COUNTS[-1]))
    sharded = wide.predict(wide.on(wide.base, GPU_COUNTS[-1], hardware), hardware)
    on_most = sharded.phases.get(there.peak_phase, {}).get(term, term_bytes)
    if fed[-1] < GPU_COUNTS[-1] and on_most < 0.99 * on_fed:
        return Binding(term, term_bytes, there.peak, on_most, there.engine_cannot_start, fed[-1])
    return Binding(term, term_bytes, there.peak, on_fed, there.engine_cannot_start, fed[-1], fed[-1])


def why_not(ask: Ask, hardware: Hardware, card: str, count: int = 1) -> WhyNot:
    """Why ``ask.base`` does not fit ``count`` GPUs of ``hardware``: its binding term there (``binding``), whether
    that term shrinks by 64 GPUs, and the fewest changes (more GPUs alone, then up to three of ``CHANGES``) that
    fit."""
    bound = binding(ask, hardware, count)
    found_change, found = {}, smallest(ask, hardware, card)
    for size in (1, 2, 3):
        if found is not None:
            break
        for combo in itertools.combinations(CHANGES, size):
            merged = {k: v for c in combo for k, v in c.items()}
            changed = _changed(ask.base, merged) if len(merged) == size else None  # not two values of one lever
            if changed is None:
                continue
            setup = smallest(replace(ask, base=changed, fixed=ask.fixed | set(merged)), hardware, card)
            if setup is not None and (found is None or setup.gpus < found.gpus):
                found_change, found = merged, setup
    shrinks = bound.most_gpus_bytes < bound.term_bytes * 0.99
    capacity = hardware.memory_gib * GIB
    return WhyNot(bound, capacity, shrinks, found_change, found)


def smallest(ask: Ask, hardware: Hardware, card: str) -> Setup | None:
    """The base levers as given, only the count free, on the fewest GPUs that fit."""
    rates = fitted_rates(hardware)
    for count in COUNTS:
        for placed, server in placements(ask, ask.base, count, hardware):
            found = ask.fits(placed, hardware)
            if found is not None:
                return Setup(card, hardware, placed, server, found.peak, ask.step(placed, rates))
    return None
