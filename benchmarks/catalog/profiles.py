"""Profiles: declarative TOML under ``profiles/``, inheriting ``base.toml``, validated on load.

An unknown key or a value of the wrong type is a :class:`ProfileError` naming the file and
the dotted key. ``--quick`` overlays the profile's ``[quick]`` table on the profile itself.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.catalog.contenders import CONTENDERS
from benchmarks.catalog.levers import (
    DISTRIBUTED_TYPES,
    GRPO_CONFIG,
    LAUNCHER,
    LEVER_KINDS,
    MODEL_LOADING,
    MODELS,
    OFFLOAD_DEVICES,
    OPTIMIZERS,
    SERVER,
    STEP_REWARDS,
    TRAINER,
    VLLM_MODES,
    Levers,
    ProfileError,
    check_lever,
    check_levers,
    combination_problem,
    lever,
    levers_of_kind,
    positive,
)
from benchmarks.catalog.shapes import Shape
from benchmarks.catalog.toml_tables import build, merge, read_table

# Profiles are read with their levers: the levers' names (``levers``) are read as ``profiles.<name>`` too.
__all__ = [
    "DISTRIBUTED_TYPES",
    "GRPO_CONFIG",
    "LAUNCHER",
    "LEVER_KINDS",
    "Levers",
    "MODELS",
    "MODEL_LOADING",
    "OFFLOAD_DEVICES",
    "OPTIMIZERS",
    "ProfileError",
    "SERVER",
    "STEP_REWARDS",
    "TRAINER",
    "VLLM_MODES",
    "check_lever",
    "check_levers",
    "combination_problem",
    "lever",
    "levers_of_kind",
    "positive",
]

PROFILES_DIR = REPO / "profiles"
BASE = "base"


@dataclass(frozen=True)
class RewardsBench:
    batch_sizes: tuple[int, ...]
    words: tuple[int, ...]
    formats: tuple[str, ...]
    execution_timeout_s: float
    execution_rounds: int
    seed_execution_batch: int
    seed_execution_rounds: int
    max_time_s: float
    min_rounds: int


@dataclass(frozen=True)
class Hardware:
    name: str
    gpu_class: str  # the guide's grouping: 24gb, a100, h100, h200, b200, spark, cpu
    memory_gib: float  # what the driver exposes, in GiB (0: not known in advance, the device's own)
    memory_source: str
    datasheet_memory: str | None = None  # the datasheet's words, quoted (decimal GB, rounded)
    spec_bandwidth_gb_s: float | None = None
    bandwidth_source: str | None = None
    sustained_bandwidth_gb_s: tuple[float, ...] | None = None  # (low, high) where a budget is known
    sustained_source: str | None = None
    # The time model's peaks (benchmarks.model.time.calibration.fitted_rates), each with its source
    peak_bf16_tflops: float | None = None  # dense, FP32 accumulate
    flops_source: str | None = None
    host_link_gb_s: float | None = None  # device <-> host, one direction
    gpu_link_gb_s: float | None = None  # GPU <-> GPU in one machine, one direction (None: through the host link)
    node_link_gb_s: float | None = None  # a GPU's share of its machine's network to the others, one direction
    link_source: str | None = None
    # Detection (benchmarks.catalog.install_plan.classify): words of a CUDA device's name that make it this class (the
    # closest memory wins among classes sharing one), the profile such a machine runs by default, the one it runs
    # where several of its GPUs are visible, and the profiles a person with four or more of them is pointed to
    device_names: tuple[str, ...] = ()
    profile: str | None = None
    node_profile: str | None = None
    cluster_profiles: tuple[str, ...] = ()
    # Unified memory (the host's and the GPU's one pool): the worker tree is stopped, and recorded as oom, when
    # the host's MemAvailable falls below this, before the machine itself runs out
    unified_floor_gib: float | None = None


FORMATS = ("str", "conversational")
SEARCHES = ("guided", "doubling")  # the context search's ways to its bracket
PARTS = ("rewards", "decode", "grpo", "distributed")
GRPO_PARTS = ("grpo", "distributed")  # parts that run GRPO configurations
DTYPES = ("float32", "bfloat16", "float16")
WEIGHTS = ("saved", "on-device")  # benchmarks.run.model_dirs.materialise
ENGINE_SHARES = ("levers", "rollout")  # GrpoBench.engine_share
# transformers generate eager; with a static KV cache and CUDA graphs; vLLM
DECODE_ENGINES = ("transformers", "transformers-graphs", "vllm")


@dataclass(frozen=True)
class GrpoBench:
    shape: str  # a key of profiles/shapes.toml
    dtype: str  # float32 | bfloat16 | float16: the policy's weights
    warmup_steps: int
    measured_steps: int
    prompt_words: int  # prompt length in tokens
    memory_budget_gib: float  # CPU: a worker tree above this is stopped and recorded as oom
    configuration_timeout_s: float  # a worker still running after this is stopped and recorded as timeout
    levers: Levers  # the base configuration
    matrix: dict[str, list] = dataclasses.field(default_factory=dict)  # lever -> values: every combination runs
    extra: tuple[dict, ...] = ()  # single configurations beside the matrix: levers over the base
    # saved: random weights written once to a model directory (vLLM loads it); on-device: made by each
    # worker on its device from the shape, nothing on disk (the 32B and 70B classes; no vLLM)
    weights: str = "saved"
    # levers: a colocated engine's share is vllm_gpu_memory_utilization as given (TRL's 0.3 by default); rollout:
    # the memory model sizes it to the rollout (its weights, KV cache and overheads, 10% slack) on this class
    engine_share: str = "levers"


@dataclass(frozen=True)
class DecodeBench:
    probe_array_mib: int  # per array: far past the last-level cache
    probe_repeats: int
    # The sweep: shape x engine x batch x context, exactly new_tokens decoded per sequence.
    shape: str
    dtype: str
    engines: tuple[str, ...]  # transformers (generate) and vllm
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    new_tokens: int
    repeats: int
    max_prefill_tokens: int  # a point whose batch x context passes this is skipped as too slow here
    engine_limit_s: float  # one engine's worker, start to last point: stopped past it, with an error row
    # One GRPO step's rollout, for the projections: prompts x num_generations sequences.
    rollout_prompts: int
    rollout_num_generations: int
    rollout_prompt_tokens: int
    rollout_completion_tokens: int
    projection_dtype_bytes: float  # weights and KV cache: 2 for bf16
    projection_shapes: tuple[str, ...]  # size classes to project
    weights: str = "saved"  # as GrpoBench's: on-device for a class too large to write to disk


@dataclass(frozen=True)
class ContextBench:
    """The max-context search (``python -m benchmarks context``): the longest completion one
    whole GRPO step fits in under a memory budget, per contender stack."""

    shape: str
    dtype: str
    budget_gib: float  # CPU: peak RSS of the worker tree; CUDA: the allocator's per-process fraction
    prompt_words: int  # the prompt is fixed; the search varies the completion length
    probe_timeout_s: float  # a probe still running after this is stopped (status timeout)
    start_tokens: int  # doubling starts here (halving below it if it does not fit)
    max_tokens: int  # the search's ceiling
    resolution: float  # bisection stops once the first failing length <= last passing x (1 + resolution)
    granule: int  # lengths probed are multiples of this
    contenders: tuple[str, ...]  # names of benchmarks.catalog.contenders.CONTENDERS
    levers: Levers  # every contender runs these
    search: str = "guided"  # guided (measured peaks and the model pick each length) or doubling (then bisection)
    # CPU: glibc's mmap and trim thresholds fixed at this many bytes in each probe (0: glibc's own, which
    # keeps freed tensors in its heap), so that the RSS budget holds live memory (worker.fix_malloc_thresholds)
    malloc_mmap_threshold: int = 0
    # one untimed step of each stack before its first probe, at `granule` tokens (within a probe's time
    # limit): imports, and on CUDA the compiles whose caches later probes reuse, paid before the search
    warmup_probe: bool = False


@dataclass(frozen=True)
class Profile:
    name: str
    question: str
    hardware: str
    parts: tuple[str, ...]
    rewards: RewardsBench
    decode: DecodeBench
    grpo: GrpoBench | None = None
    distributed: GrpoBench | None = None  # GRPO steps on many ranks: the same bench, its levers spread over ranks
    context: ContextBench | None = None
    time_limit_min: float | None = None  # the whole profile's time target, recorded in its last part's file
    # CPU: glibc's mmap and trim thresholds fixed at this many bytes in every part's processes (0: glibc's own,
    # which keeps freed tensors in its heap), so that RSS follows live tensors and runs compare on equal terms
    malloc_mmap_threshold: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# tables of classes, shapes, stacks, machines and images, not run profiles
CATALOGS = ("hardware", "shapes", "contenders", "stacks", "machines", "images")


def available(directory: Path = PROFILES_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.toml") if p.stem not in (BASE, *CATALOGS))


def load(name: str, quick: bool = False, directory: Path = PROFILES_DIR, hardware: str | None = None) -> Profile:
    """The profile ``name`` resolved on top of ``base.toml`` (and its ``[quick]`` overlay), on
    ``hardware`` (a class of hardware.toml) where given instead of the profile's own."""
    path = directory / f"{name}.toml"
    if not path.is_file():
        raise ProfileError(f"no profile {name!r} in {directory} (have: {', '.join(available(directory)) or 'none'})")
    data = _inherited(path, directory, seen=(name,))
    if hardware is not None:
        data["hardware"] = hardware
    overlay = data.pop("quick", {})
    if quick:
        data = merge(data, overlay)
    profile = build(Profile, {"name": name, **data}, str(path))
    _check(profile, str(path))
    if not quick:
        build(Profile, merge({"name": name, **data}, overlay), f"{path} [quick]")  # the overlay must be valid too
    return profile


def _inherited(path: Path, directory: Path, seen: tuple[str, ...]) -> dict:
    """A profile's table over what it ``inherits``: another profile (itself resolved the same way), else
    ``base.toml``."""
    own = read_table(path)
    if "quick" in own and not isinstance(own["quick"], dict):
        raise ProfileError(f"{path}: quick: expected a table")
    if path.stem == BASE:
        return own
    parent = own.pop("inherits", BASE)
    if not isinstance(parent, str) or not (directory / f"{parent}.toml").is_file() or parent in seen:
        raise ProfileError(f"{path}: inherits: {parent!r} is not another profile of {directory}")
    return merge(_inherited(directory / f"{parent}.toml", directory, (*seen, parent)), own)


def _check(profile: Profile, file: str) -> None:
    """Values a type alone does not rule out, and names that must exist in the catalogs."""
    if profile.hardware not in load_hardware():
        raise ProfileError(f"{file}: hardware: {profile.hardware!r} is not in profiles/hardware.toml")
    if profile.malloc_mmap_threshold < 0:
        raise ProfileError(f"{file}: malloc_mmap_threshold: must be at least 0")
    for i, part in enumerate(profile.parts):
        if part not in PARTS:
            raise ProfileError(f"{file}: parts[{i}]: {part!r} is not one of {PARTS}")
    for part in GRPO_PARTS:
        if getattr(profile, part) is not None:
            _check_grpo(getattr(profile, part), file, part)
        if part in profile.parts and getattr(profile, part) is None:
            raise ProfileError(f"{file}: parts lists {part} but there is no [{part}] table")
    _check_decode(profile.decode, file)
    if profile.context is not None:
        _check_context(profile.context, file)
    _check_rewards(profile.rewards, file)


def _one_of(values: Sequence[Any], allowed: Sequence[Any], file: str, key: str) -> None:
    for i, value in enumerate(values):
        if value not in allowed:
            raise ProfileError(f"{file}: {key}[{i}]: {value!r} is not one of {', '.join(map(str, allowed))}")


def _check_decode(decode: DecodeBench, file: str) -> None:
    if decode.shape not in load_shapes():
        raise ProfileError(f"{file}: decode.shape: {decode.shape!r} is not in profiles/shapes.toml")
    lengths = ("probe_array_mib", "probe_repeats", "new_tokens", "repeats", "max_prefill_tokens")
    _positive(decode, lengths, file, "decode")
    for key in ("batches", "contexts"):
        if any(v <= 0 for v in getattr(decode, key)):
            raise ProfileError(f"{file}: decode.{key}: every value must be positive")
    _one_of(decode.engines, DECODE_ENGINES, file, "decode.engines")
    if decode.weights not in WEIGHTS:
        raise ProfileError(f"{file}: decode.weights: {decode.weights!r} is not one of {', '.join(WEIGHTS)}")
    if decode.weights == "on-device" and "vllm" in decode.engines:
        raise ProfileError(f"{file}: decode: vLLM loads weights from disk; weights = 'on-device' leaves none there")
    for i, name in enumerate(decode.projection_shapes):
        if name not in load_shapes():
            raise ProfileError(f"{file}: decode.projection_shapes[{i}]: {name!r} is not in profiles/shapes.toml")


def _check_rewards(rewards: RewardsBench, file: str) -> None:
    _one_of(rewards.formats, FORMATS, file, "rewards.formats")
    for key in ("batch_sizes", "words"):
        if any(v <= 0 for v in getattr(rewards, key)):
            raise ProfileError(f"{file}: rewards.{key}: every value must be positive")


def _positive(section: object, names: tuple[str, ...], file: str, prefix: str) -> None:
    for name in names:
        value = getattr(section, name)
        if value <= 0:
            raise ProfileError(f"{file}: {prefix}.{name}: must be positive, got {value!r}")


def _check_shape_and_dtype(section: str, shape: str, dtype: str, file: str) -> None:
    if shape not in load_shapes():
        raise ProfileError(f"{file}: {section}.shape: {shape!r} is not in profiles/shapes.toml")
    if dtype not in DTYPES:
        raise ProfileError(f"{file}: {section}.dtype: {dtype!r} is not one of {DTYPES}")


def _check_grpo(grpo: GrpoBench, file: str, part: str) -> None:
    _check_shape_and_dtype(part, grpo.shape, grpo.dtype, file)
    if grpo.weights not in WEIGHTS:
        raise ProfileError(f"{file}: {part}.weights: {grpo.weights!r} is not one of {', '.join(WEIGHTS)}")
    if grpo.engine_share not in ENGINE_SHARES:
        raise ProfileError(
            f"{file}: {part}.engine_share: {grpo.engine_share!r} is not one of {', '.join(ENGINE_SHARES)}"
        )
    _positive(grpo, ("measured_steps", "prompt_words", "memory_budget_gib", "configuration_timeout_s"), file, part)
    if grpo.warmup_steps < 0:
        raise ProfileError(f"{file}: {part}.warmup_steps: must be at least 0, got {grpo.warmup_steps}")
    for name, value in dataclasses.asdict(grpo.levers).items():
        check_lever(name, value, file, f"{part}.levers.{name}")
    for name, values in grpo.matrix.items():
        for i, value in enumerate(values):
            build(Levers, {name: value}, file, f"{part}.matrix[{i}].", partial=True)
            check_lever(name, value, file, f"{part}.matrix.{name}[{i}]")
    for i, extra in enumerate(grpo.extra):
        for name, value in extra.items():
            check_lever(name, value, file, f"{part}.extra[{i}].{name}")
    for name, levers in configurations(grpo):
        check_levers(levers, file, f"{part} configuration {name!r}")
        if grpo.weights == "on-device" and levers.use_vllm:
            raise ProfileError(f"{file}: {part} configuration {name!r}: vLLM loads weights from disk, not on-device")


def _check_context(context: ContextBench, file: str) -> None:
    _check_shape_and_dtype("context", context.shape, context.dtype, file)
    for i, name in enumerate(context.contenders):
        if name not in CONTENDERS:
            raise ProfileError(f"{file}: context.contenders[{i}]: {name!r} is not one of {', '.join(CONTENDERS)}")
    if not 0 < context.resolution < 1 or context.granule <= 0 or not 0 < context.start_tokens <= context.max_tokens:
        raise ProfileError(f"{file}: context: need 0 < resolution < 1, granule > 0, 0 < start_tokens <= max_tokens")
    _positive(context, ("budget_gib", "prompt_words", "probe_timeout_s"), file, "context")
    if context.malloc_mmap_threshold < 0:
        raise ProfileError(f"{file}: context.malloc_mmap_threshold: must be at least 0")
    if context.search not in SEARCHES:
        raise ProfileError(f"{file}: context.search: {context.search!r} is not one of {', '.join(SEARCHES)}")
    check_levers(context.levers, file, "context.levers")


def configurations(grpo: GrpoBench) -> list[tuple[str, Levers]]:
    """Every configuration of a GRPO bench: the matrix's product over the base levers, then
    each extra; named by the levers the profile varies (``optim=adamw_8bit use_vllm=True``)."""
    combos = [grpo.levers]
    for name, values in grpo.matrix.items():
        combos = [dataclasses.replace(c, **{name: v}) for c in combos for v in values]
    combos += [dataclasses.replace(grpo.levers, **extra) for extra in grpo.extra]
    varied = list(dict.fromkeys([*grpo.matrix, *(k for extra in grpo.extra for k in extra)]))
    named = {" ".join(f"{k}={getattr(c, k)}" for k in varied) or "base": c for c in combos}
    return list(named.items())


def _catalog(name: str, cls: type) -> dict[str, Any]:
    path = PROFILES_DIR / f"{name}.toml"
    return {key: build(cls, table, str(path), f"{key}.") for key, table in read_table(path).items()}


@functools.cache
def load_shapes() -> dict[str, Shape]:
    return _catalog("shapes", Shape)


@functools.cache
def load_hardware() -> dict[str, Hardware]:
    return _catalog("hardware", Hardware)
