"""The result files: their typed records, their schema version, the one writer and the one loader.

Result files are the suite's contract with every other machine and every later version. Every
harness builds a record (``FILES``: GrpoFile, DecodeFile, ContextFile, RewardsFile, and the records
inside them) and writes it here only (``write``: atomically, 0644, without the measuring machine's
paths); every report reads it here only (``read_result``, ``load_results``: validated, a bad or
truncated file is an error naming the file and the key; an older schema upgraded as it is read).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import signal
import tempfile
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks import REPO
from benchmarks.catalog.profiles import Levers, configurations


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# Result files travel between machines: no path of the machine that made them. A path inside an
# installed package keeps its place in the package; one inside the checkout, its place there; any
# other absolute path keeps only its last component.
_SITE_PACKAGES = re.compile(r"(?<![\w.:/-])/[^\s\"'\\]*?/(?:site|dist)-packages/")
_ABSOLUTE = re.compile(r"(?<![\w.:/<>-])(?!/(?:proc|sys|dev)/)(?:/[\w.+@~-]+)+/([\w.+@~-]+)")


def scrub_paths(value: Any) -> Any:
    """``value`` (a result's data) with the measuring machine's absolute paths cut down."""
    if isinstance(value, str):
        value = _SITE_PACKAGES.sub("<site-packages>/", value).replace(f"{REPO}/", "<repo>/")
        return _ABSOLUTE.sub(r"<path>/\1", value)
    if isinstance(value, dict):
        return {key: scrub_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [scrub_paths(item) for item in value]
    return value


def write(path: Path, record: Any) -> None:
    """The one way a result file is written: a record (one of FILES), whole or not at all, 0644,
    without the measuring machine's paths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".partial", delete=False) as f:
        json.dump(scrub_paths(encode(record)), f, indent=1)
    os.chmod(f.name, 0o644)
    os.replace(f.name, path)


# 2: `complete` (and `ended_early`), device peaks per phase on CUDA, `peak_bytes` with its `peak_measure`.
# 3: a commit's `dirty` may be unknown (null) and says its `source`; on CUDA each phase's peak is torch's
#    allocator in that phase (`peak_bytes_by_phase`, `phase_peak_measure`), NVML's beside it; a context
#    search records its allocator settings.
SCHEMA_VERSION = 3


class Stopped(Exception):
    """SIGTERM (a scheduler's or a timeout's) turned into an exception, so that the result file is
    marked before the process ends."""


@contextlib.contextmanager
def marked_incomplete(path: Path, result: RunFile) -> Iterator[None]:
    """Around a run that writes ``result`` to ``path`` as it goes: on a normal end the file says
    ``complete: true``; on an interrupt, SIGTERM or an error it says ``complete: false`` and why, so
    that no table cites it as a whole measurement. (SIGKILL leaves ``complete: false`` as written.)"""

    def stop(signum: int, frame: Any) -> None:
        raise Stopped(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except BaseException as error:
        reason = str(error) if isinstance(error, Stopped) else type(error).__name__
        result.complete, result.ended_early, result.finished = False, f"{reason} at {now()}", now()
        write(path, result)
        print(f"\n{reason}: kept {path.name}, marked complete: false ({kept(result)})", flush=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    result.complete, result.finished = True, now()
    write(path, result)


def kept(result: RunFile) -> str:
    """What an interrupted run's file holds, in a few words."""
    for name in ("configurations", "contenders", "sweep"):
        if hasattr(result, name):
            return f"{len(getattr(result, name))} {name} recorded"
    return "its header"


class SchemaError(ValueError):
    """A result file that is not what its schema says: names the file and the key."""


# The records. Every field a reader uses is declared; a key a file holds beyond them is kept in the
# file and ignored here. Optional fields are those an older file or a status that ended early lacks.


@dataclass(kw_only=True)
class Target:
    """A target the run measured itself against (quoted from its issue), never asserted in a test."""

    claim: str
    measured: float | None
    limit: float
    met: bool | None

    @classmethod
    def at_most(cls, claim: str, measured: float | None, limit: float) -> Target:
        """A target met when ``measured`` is at most ``limit``; not measured (None) where nothing was."""
        return cls(claim=claim, measured=measured, limit=limit, met=None if measured is None else measured <= limit)

    def line(self) -> str:
        """The target as a run prints it."""
        met = {True: "met", False: "MISSED", None: "not measured"}[self.met]
        return f"target: {self.claim}: {met} (measured {self.measured}, limit {self.limit})"


@dataclass(kw_only=True)
class GrpoSettings:
    """The resolved profile's ``[grpo]`` table as the run had it: what the model needs to predict it,
    and the lever matrix that says how many configurations the profile defines."""

    dtype: str
    prompt_words: int
    levers: dict[str, Any]
    matrix: dict[str, list[Any]] = field(default_factory=dict)
    extra: list[dict[str, Any]] = field(default_factory=list)
    shape: str = ""


@dataclass(kw_only=True)
class DecodeSettings:
    shape: str = ""  # the first decode runs measured the ceiling alone, with no sweep of a shape
    dtype: str = ""


@dataclass(kw_only=True)
class ProfileRecord:
    """The resolved profile a run used (``benchmarks.catalog.profiles.Profile``; the file holds all of it)."""

    hardware: str
    name: str = ""
    grpo: GrpoSettings | None = None
    distributed: GrpoSettings | None = None
    decode: DecodeSettings | None = None
    # CPU: glibc's mmap and trim thresholds fixed at this in every part's processes (0: glibc's own, which
    # keeps freed blocks in its heap; every run before the setting was recorded)
    malloc_mmap_threshold: int = 0


@dataclass(kw_only=True)
class Gpu:
    """A GPU as NVML describes it; ``memory_source`` says where its memory figure comes from."""

    index: int
    name: str
    uuid: str = ""
    memory_gib: float = 0.0
    memory_source: str = "NVML"
    driver: str = ""


@dataclass(kw_only=True)
class Machine:
    """The machine's fingerprint: CPU, cores, RAM; GPUs by NVML (name, memory, driver)."""

    cpu: str = "unknown"
    cores: int | None = None
    ram_gib: float | None = None
    gpus: list[Gpu] = field(default_factory=list)
    hostname: str = ""
    platform: str = ""
    python: str = ""


@dataclass(kw_only=True)
class Commit:
    """The commit a run's tree was, and whether its tracked files differed from it (None: not known,
    as where the tree travelled without ``.git`` or a provenance file); ``source`` says how it was read."""

    id: str | None = None
    dirty: bool | None = False
    source: str = "git"

    @property
    def short(self) -> str:
        state = {True: " (dirty)", False: "", None: " (dirty unknown)"}[self.dirty]
        return (self.id or "unknown")[:7] + state


@dataclass(kw_only=True)
class Calibration:
    """A few seconds of fixed work, timed before a profile runs (``benchmarks.run.pace``): how fast this
    machine does what the parts do, to scale an earlier run's times by."""

    python_s: float  # a fixed pure-Python workload (regular expressions, JSON), one thread
    spawn_s: float  # starting an isolated interpreter, the median of several
    torch_s: float  # a fixed fp32 forward and backward through MLP blocks, every core
    bandwidth_gb_s: float | None = None  # the bandwidth probe's ceiling on 256 MiB arrays (None: not yet recorded)


@dataclass(kw_only=True)
class Pace:
    """How long a part took against what was estimated before it started. The last part of a run also
    holds the whole run's time, its estimate and the profile's time targets."""

    calibration: Calibration
    part_s: float
    estimated_s: float | None  # None: no earlier run of this profile and part here to scale
    reference: str | None  # the result file the estimate scaled, under results/runs
    scale: float | None = None  # this machine's calibration over the reference's, for this part
    run_s: float | None = None
    run_estimated_s: float | None = None
    run_targets: list[Target] = field(default_factory=list)


@dataclass(kw_only=True)
class RunFile:
    """What every result file of the harness opens with: kind and schema, when, where, with what,
    from which commit, the resolved profile; whether the run is complete and why it ended early."""

    schema_version: int
    kind: str
    started: str
    quick: bool = False
    machine: Machine = field(default_factory=Machine)
    versions: dict[str, str] = field(default_factory=dict)
    commit: Commit = field(default_factory=Commit)
    profile: ProfileRecord
    complete: bool = False
    finished: str | None = None
    ended_early: str | None = None
    targets: list[Target] = field(default_factory=list)
    pace: Pace | None = None  # written when the part has ended (python -m benchmarks bench)


@dataclass(kw_only=True)
class ShapeRecord:
    """The shape a run measured, with its parameter count (``benchmarks.catalog.shapes``)."""

    name: str
    param_count: int
    architecture: str = ""
    hidden_size: int = 0
    num_hidden_layers: int = 0
    vocab_size: int = 0


@dataclass(kw_only=True)
class CudaPeaks:
    """torch's allocator in one phase on CUDA, and the device as the driver saw it at the phase's end."""

    allocated: int
    reserved: int
    device_used_at_end: int = 0


@dataclass(kw_only=True)
class Step:
    """One optimizer step of a worker: time per phase (exclusive), tokens, exact state bytes, and the
    peak memory per phase (host RSS; on CUDA the device memory of the run's processes too)."""

    step: int
    warmup: bool
    wall_s: float
    phase_s: dict[str, float]
    completion_tokens: int = 0
    completion_tokens_per_s: float = 0.0
    optimizer_state_bytes: int = 0
    grad_bytes: int = 0
    trainable_params: int = 0
    reference_model_bytes: int = 0
    model_states: ModelStates | None = None
    cuda_peak_bytes: dict[str, CudaPeaks] = field(default_factory=dict)
    peak_rss_bytes: dict[str, int] = field(default_factory=dict)
    peak_device_bytes: dict[str, int] | None = None
    peak_device_used_bytes: dict[str, int] | None = None

    @property
    def peaks(self) -> dict[str, int]:
        """Per phase, the memory that stands for the step: device memory on CUDA, else host RSS."""
        return self.peak_device_bytes if self.peak_device_bytes is not None else self.peak_rss_bytes

    @property
    def phase_peaks(self) -> dict[str, int]:
        """Per phase, that phase's own peak: on CUDA the tensors torch's allocator held in the phase (its
        peak statistics reset at every boundary; the device figures, and torch's reserved pool, keep the
        pool's high-water mark from phase to phase), else ``peaks``."""
        if self.cuda_peak_bytes:
            return {phase: peaks.allocated for phase, peaks in self.cuda_peak_bytes.items()}
        return self.peaks


HOST_RSS = "host RSS of the worker and its children"
TORCH_ALLOCATED = "torch.cuda.max_memory_allocated in the phase (statistics reset at each phase boundary)"
TORCH_RESERVED = "torch.cuda.max_memory_reserved in the phase (statistics reset at each phase boundary)"


@dataclass(kw_only=True)
class ModelStates:
    """Bytes of model state one rank holds after an optimizer step, read from its tensors: its own
    parameter storage (a ZeRO-3 or FSDP2 shard where they partition), DeepSpeed's fp32 master
    partition, the optimizer's state tensors, and the gradient storage still held."""

    parameters: int
    master: int
    optimizer: int
    gradients: int
    total: int


@dataclass(kw_only=True)
class Summary:
    """Medians and peaks over a configuration's measured steps; ``peak_bytes`` is its headline,
    ``peak_measure`` says what it measures (device memory on CUDA, host RSS on CPU)."""

    measured_steps: int
    step_s_median: float
    step_s_min: float
    step_s_max: float
    completion_tokens_per_s_median: float
    phase_s_median: dict[str, float]
    peak_bytes: int
    peak_bytes_by_phase: dict[str, int]
    peak_measure: str
    peak_rss_bytes: int
    peak_rss_bytes_by_phase: dict[str, int]
    peak_repeat_spread: float
    # what ``peak_bytes_by_phase`` measures where it is not ``peak_measure`` (CUDA: TORCH_ALLOCATED), and
    # there the device figure per phase beside it
    phase_peak_measure: str = ""
    peak_device_bytes_by_phase: dict[str, int] | None = None
    optimizer_state_bytes: int
    grad_bytes: int
    trainable_params: int
    reference_model_bytes: int
    model_states: ModelStates | None = None


@dataclass(kw_only=True)
class Harness:
    """The harness's own cost for one worker, and the GPUs (NVML indices) whose memory it read."""

    wall_s: float
    sampler_cpu_s: float
    samples: int
    overhead_fraction: float
    gpus: list[int] = field(default_factory=list)
    launcher_peak_rss_bytes: int = 0  # accelerate's launcher and torch's agent: memory that is no rank's


@dataclass(kw_only=True)
class Distribution:
    """How the ranks really ran, as every rank reported it (never the levers' word): world size,
    machines, accelerate's distributed type, the ZeRO stage DeepSpeed ran, the share of the model's
    parameters the rank holding most held, and how they were launched."""

    world_size: int | None  # None: no rank got as far as saying
    num_machines: int
    distributed_type: str  # accelerate's DistributedType: NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP
    backend: str | None  # torch.distributed's: gloo, nccl
    zero_stage: int | None = None
    fsdp_version: int | None = None
    held_parameter_fraction: float | None  # of the model's parameter elements, on the rank holding most
    launcher: str  # "python" (one process) or "accelerate launch"
    config: dict[str, Any] | None = None  # the accelerate config it was launched with, DeepSpeed's inside
    notes: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Rank:
    """One rank's own figures: its steps' summary (its memory: host RSS of its process and children
    on CPU, NVML's device memory of them on CUDA) and its model states."""

    rank: int
    machine_rank: int = 0
    summary: Summary | None = None


@dataclass(kw_only=True)
class WorkerRecord:
    """One worker process: status ``ok``, ``oom`` or ``timeout`` (with its phase), ``skipped`` or
    ``error`` (with the reason); its steps and their summary."""

    status: str
    steps: list[Step] = field(default_factory=list)
    summary: Summary | None = None
    harness: Harness | None = None
    versions: dict[str, str] = field(default_factory=dict)
    device: dict[str, Any] | None = None  # what the worker said of the GPU it ran on, and its budget there
    phase: str | None = None
    reason: str | None = None
    error: str | None = None
    log_tail: str | None = None
    setup_peak_rss_bytes: int = 0
    unfinished_peak_rss_bytes: dict[str, int] | None = None
    unfinished_peak_device_bytes: dict[str, int] | None = None
    # CUDA: torch's allocator in the phase a worker ran out of memory in (``phase`` names it)
    unfinished_cuda_peak_bytes: CudaPeaks | None = None
    # Many ranks: how they ran and each one's figures; ``steps`` and ``summary`` are then the maximum
    # over ranks per step and phase (completions summed), the configuration's figure.
    distribution: Distribution | None = None
    ranks: list[Rank] = field(default_factory=list)


@dataclass(kw_only=True)
class Configuration(WorkerRecord):
    """A GRPO configuration: its name (the levers its profile varied) and every lever as run."""

    name: str
    levers: dict[str, Any]

    @property
    def lever_values(self) -> Levers:
        return Levers.recorded(self.levers)


@dataclass(kw_only=True)
class GrpoFile(RunFile):
    shape: ShapeRecord
    configurations: list[Configuration] = field(default_factory=list)


@dataclass(kw_only=True)
class KernelRate:
    median_gb_s: float
    min_gb_s: float
    max_gb_s: float
    bytes_per_pass: int


@dataclass(kw_only=True)
class Ceiling:
    """The bandwidth probe: every kernel's rate, and the one that stands as the device's ceiling."""

    device: str
    array_bytes: int
    repeats: int
    copy: KernelRate
    read: KernelRate
    triad: KernelRate
    threads: int | None = None


@dataclass(kw_only=True)
class BestKernel(KernelRate):
    kernel: str


@dataclass(kw_only=True)
class RolloutShape:
    sequences: int
    prompt_tokens: int
    completion_tokens: int
    dtype_bytes: float
    what: str


@dataclass(kw_only=True)
class Projection:
    """Predicted rollout seconds of one GRPO step for a size class on a hardware class at a bandwidth."""

    hardware: str
    shape: str
    basis: str
    gb_per_s: float
    rollout_s: float
    weights_gib: float
    predicted: bool = True


@dataclass(kw_only=True)
class DecodePoint:
    """One engine at one batch x context: time to first token, decode speed and achieved GB/s; or
    skipped or error with the reason."""

    engine: str
    status: str
    batch: int | None = None
    context: int | None = None
    reason: str | None = None
    new_tokens: int | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    decode_tokens_per_s: float | None = None
    bytes_per_step: float | None = None
    bytes_per_step_midway: dict[str, Any] | None = None
    achieved_gb_s: float | None = None
    repeats: int | None = None
    execution: str | None = None
    warmup_s: float | None = None  # the untimed first call at this size (graphs: the compile)
    efficiency_vs_ceiling: float | None = None
    within_ceiling: bool | None = None
    efficiency_vs_spec: float | None = None


@dataclass(kw_only=True)
class DecodeFile(RunFile):
    ceiling: Ceiling
    projection_rollout: RolloutShape | None = None
    device_ceiling: BestKernel | None = None
    projections: list[Projection] = field(default_factory=list)
    sweep: list[DecodePoint] = field(default_factory=list)


@dataclass(kw_only=True)
class Search:
    """The context search's settings: ``benchmarks.catalog.profiles.ContextBench`` as it ran."""

    shape: str
    dtype: str
    budget_gib: float
    prompt_words: int
    start_tokens: int
    max_tokens: int
    resolution: float
    granule: int
    contenders: list[str]
    levers: dict[str, Any]
    searched: str
    budget_enforced_by: str
    completions_per_step: int
    probe_timeout_s: float | None = None
    search: str = "doubling"  # files before the guided search searched this way
    malloc_mmap_threshold: int = 0  # CPU: glibc's thresholds fixed at this (0: glibc's own)
    allocator_conf: str = ""  # CUDA: the PYTORCH_ALLOC_CONF every contender's probes ran under
    warmup_probe: bool = False  # each stack ran one untimed step before its first probe


@dataclass(kw_only=True)
class Probe:
    """One probe of the search: a whole GRPO step at one completion length, fitting or not."""

    completion_tokens: int
    status: str
    fits: bool
    peak_bytes: int | None
    peak_measure: str
    predicted_peak_bytes: int
    wall_s: float
    peak_bytes_by_phase: dict[str, int] = field(default_factory=dict)
    phase: str | None = None
    reason: str | None = None
    step_s: float | None = None
    phase_s: dict[str, float] | None = None
    device: dict[str, Any] | None = None
    log_tail: str | None = None


@dataclass(kw_only=True)
class ContenderRun:
    """One contender's search: every probe, the longest fitting and first failing length, and the
    analytic model's maxima (alone, and anchored on the smallest fitting probe)."""

    name: str
    role: str
    stack: str
    logits_path: str
    status: str  # measured, skipped or error
    probes: list[Probe] = field(default_factory=list)
    reason: str | None = None
    versions: dict[str, str] | None = None
    max_completion_tokens: int | None = None
    first_failing_tokens: int | None = None
    at_ceiling: bool = False
    predicted_max_completion_tokens: int | None = None
    anchored_max_completion_tokens: int | None = None
    warmup_s: float | None = None  # the untimed first step of this stack (imports, compiles), where one ran


@dataclass(kw_only=True)
class Verdict:
    seed_claim: str
    unsloth_claim: str
    claimed_ratio: float
    measured_ratio_vs_unchunked: float | None
    predicted_ratio_vs_unchunked: float | None
    text: str
    anchored_ratio_vs_unchunked: float | None = None


@dataclass(kw_only=True)
class LogitsShare:
    """The analytic model's training phase at a contender's maximum: the logits term against the rest."""

    completion_tokens: int
    logits_bytes: int
    rest_bytes: int
    terms: dict[str, int]


@dataclass(kw_only=True)
class EarlierSearch:
    """The newest earlier search of the same settings on the same hardware class, that this one is
    checked against: its file, and per contender its maximum, first failing length and probe count."""

    file: str
    contenders: dict[str, dict[str, int | None]]


@dataclass(kw_only=True)
class ContextFile(RunFile):
    search: Search
    shape: ShapeRecord
    contenders: list[ContenderRun] = field(default_factory=list)
    ratios: dict[str, dict[str, float | None]] | None = None
    verdict: Verdict | None = None
    prediction: dict[str, LogitsShare] = field(default_factory=dict)
    earlier: EarlierSearch | None = None


@dataclass(kw_only=True)
class RowInfo:
    """What a reward benchmark row measured: which reward, whose code, on which inputs, how fast."""

    reward: str
    implementation: str
    batch: int
    words: int
    format: str
    completions_per_s: float
    p50_latency_s: float | None = None
    p99_latency_s: float | None = None


@dataclass(kw_only=True)
class RowStats:
    """pytest-benchmark's statistics of a row (seconds per call); its raw rounds are not kept."""

    median: float
    iqr: float
    rounds: int = 0


@dataclass(kw_only=True)
class BenchmarkRow:
    name: str
    extra_info: RowInfo
    stats: RowStats


@dataclass(kw_only=True)
class Comparison:
    """Our row over the guide's on the same case: the ratio of completions/s, and the rows' noise."""

    row: str
    ratio: float
    met: bool | None = None  # the first files recorded neither the verdict per row nor its noise
    noise: float | None = None


@dataclass(kw_only=True)
class RewardTarget:
    claim: str
    minimum_ratio: float
    lowest_ratio: float | None
    met: bool | None
    within_noise: bool = False
    name: str = ""
    comparisons: list[Comparison] = field(default_factory=list)


@dataclass(kw_only=True)
class RewardsBlock:
    """The suite's block inside pytest-benchmark's file: schema, class, profile, versions, sandbox,
    skipped rows with their reasons, targets against the guide's code."""

    schema_version: int
    kind: str
    hardware_class: str
    profile: dict[str, Any]
    versions: dict[str, str]
    sandbox: dict[str, Any]
    skipped: list[dict[str, str]]
    targets: list[RewardTarget]
    quick: bool = False
    complete: bool = True
    rewritten: dict[str, str] | None = None
    pace: Pace | None = None


@dataclass(kw_only=True)
class RewardsFile:
    """pytest-benchmark's JSON with the suite's ``grpo_bench`` block."""

    datetime: str
    benchmarks: list[BenchmarkRow]
    grpo_bench: RewardsBlock


def benchmark_rows(output_json: dict) -> list[BenchmarkRow]:
    """pytest-benchmark's rows as it is about to write them, typed: each gains ``completions_per_s``
    (its batch over the median call) and loses its raw per-round timings (``stats.data``, up to tens
    of thousands a row), so that the file stays small and ``pytest-benchmark compare`` reads it still."""
    for row in output_json["benchmarks"]:
        row["stats"].pop("data", None)
        row["extra_info"]["completions_per_s"] = row["extra_info"]["batch"] / row["stats"]["median"]
    return [
        decode(BenchmarkRow, row, f"pytest-benchmark: benchmarks[{i}]")
        for i, row in enumerate(output_json["benchmarks"])
    ]


def attach_rewards_block(output_json: dict, block: RewardsBlock) -> None:
    """The suite's block in pytest-benchmark's file."""
    output_json["grpo_bench"] = encode(block)


# A ``distributed`` run is a GRPO run whose configurations spread over ranks: the same records.
FILES: dict[str, type] = {
    "grpo": GrpoFile,
    "distributed": GrpoFile,
    "decode": DecodeFile,
    "context": ContextFile,
    "rewards": RewardsFile,
}


def decode(cls: type, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as the record type ``cls``; a SchemaError naming ``where`` and the key."""
    hints = typing.get_type_hints(cls)
    if not isinstance(value, dict):
        raise SchemaError(f"{where}: expected an object, got {type(value).__name__}")
    given = {}
    for item in dataclasses.fields(cls):
        if item.name in value:
            given[item.name] = _decoded(hints[item.name], value[item.name], _key(where, item.name))
        elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            raise SchemaError(f"{where}: missing key {item.name!r}")
    record = cls(**given)
    record._more = {key: item for key, item in value.items() if key not in given}  # kept, written back as read
    return record


def _key(where: str, key: str) -> str:
    """``file: a.b[2].c``: the file, then the key's path inside it."""
    return f"{where}.{key}" if ": " in where else f"{where}: {key}"


def _decoded(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _decoded(next(a for a in args if a is not type(None)), value, where)
    if dataclasses.is_dataclass(hint):
        return decode(hint, value, where)
    if hint is Any:
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise SchemaError(f"{where}: expected a list, got {type(value).__name__}")
        return [_decoded(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: expected an object, got {type(value).__name__}")
        return {key: _decoded(args[1], item, _key(where, key)) for key, item in value.items()}
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if (hint is float and number) or (hint is int and number and float(value).is_integer()):
        return hint(value)
    if hint in (str, bool) and isinstance(value, hint):
        return value
    raise SchemaError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__} {value!r}")


def encode(value: Any) -> Any:
    """A record as the JSON its file holds: its fields, and whatever else the file it came from held."""
    if dataclasses.is_dataclass(value):
        fields = {item.name: encode(getattr(value, item.name)) for item in dataclasses.fields(value)}
        return {**getattr(value, "_more", {}), **fields}
    if isinstance(value, list | tuple):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    return value


@dataclass(frozen=True)
class Result:
    """A result file as loaded: its record (one of FILES), and what the tables need to choose it."""

    path: str  # relative to the results directory, or as named
    record: Any  # GrpoFile, DecodeFile, ContextFile or RewardsFile
    kind: str
    hardware: str
    date: str  # YYYY-MM-DD the run started
    complete: bool = True  # False: the run ended early; never cited as a measurement
    whole: bool = True  # False: a subset of its profile (a GRPO run with --only)
    quick: bool = False  # a --quick smoke run
    shape: str | None = None  # the shape a GRPO run or a context search measured

    @property
    def series(self) -> tuple:
        """What a newer result of the same series supersedes: kind, hardware class, shape, quick."""
        return (self.kind, self.hardware, self.shape, self.quick)


def is_complete(data: dict, kind: str) -> bool:
    """Whether a result file holds a whole run. Schema 2 files say so (``complete``); schema 1 files
    were whole when they reached their last field: a GRPO run its targets, a context search its
    verdict, a decode run its projections (the first decode runs measured the ceiling alone);
    rewards files were written whole."""
    header = data.get("grpo_bench", data)
    if "complete" in header:
        return bool(header["complete"])
    last_field = {"grpo": "targets", "context": "verdict", "decode": "projections"}.get(kind)  # before schema 2
    return last_field is None or last_field in data


def is_whole(record: Any) -> bool:
    """Whether a GRPO run measured every configuration its profile defines (not an --only subset)."""
    if not isinstance(record, GrpoFile):
        return True
    grpo = getattr(record.profile, record.kind)
    if grpo is None:
        return True
    defined = configurations(SimpleNamespace(levers=Levers.recorded(grpo.levers), matrix=grpo.matrix, extra=grpo.extra))
    return len(record.configurations) >= len(defined)


def upgrade(data: dict, kind: str) -> dict:
    """A file of an older schema as the current records read it (the file itself is never edited):
    schema 1 had no ``complete`` flag, and its GRPO summaries headlined host RSS only."""
    header = data.get("grpo_bench", data)
    if "complete" not in header:
        header = {**header, "complete": is_complete(data, kind)}
        data = {**data, "grpo_bench": header} if "grpo_bench" in data else header
    if kind == "grpo":
        data = {**data, "configurations": [_upgraded_configuration(c) for c in data.get("configurations", [])]}
    return data


def _upgraded_configuration(record: dict) -> dict:
    summary = record.get("summary") or None
    if summary and "peak_bytes" not in summary:
        by_phase = summary.get("peak_rss_bytes_by_phase", {})
        summary = {**summary, "peak_bytes": summary.get("peak_rss_bytes", 0), "peak_bytes_by_phase": by_phase}
        summary["peak_measure"] = HOST_RSS
    return {**record, "summary": summary}


def read_result(path: Path, name: str) -> Result:
    """One result file, ``name`` as it is to be cited; an error naming the file and the key that
    is missing or bad."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SchemaError(f"{name}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise SchemaError(f"{name}: expected an object, got {type(data).__name__}")
    header = data.get("grpo_bench", data)  # pytest-benchmark's file holds the suite's header inside
    kind = header.get("kind") if isinstance(header, dict) else None
    if kind not in FILES:
        raise SchemaError(f"{name}: kind {kind!r} is not one of {', '.join(FILES)}")
    version = header.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise SchemaError(
            f"{name}: schema_version {version} is newer than this suite reads ({SCHEMA_VERSION}): "
            "update grpo-bench to read it"
        )
    record = decode(FILES[kind], upgrade(data, kind), name)
    if isinstance(record, RewardsFile):
        block, shape = record.grpo_bench, None
        hardware, started, complete, quick = block.hardware_class, record.datetime, block.complete, block.quick
    else:
        hardware, started, complete, quick = record.profile.hardware, record.started, record.complete, record.quick
        shape = record.shape.name if isinstance(record, GrpoFile | ContextFile) else None
    return Result(name, record, kind, hardware, started[:10], complete, is_whole(record), quick, shape)


def load_results(directory: Path) -> list[Result]:
    """Every result file under ``directory`` (``<hardware>/<time>-<kind>.json``), oldest first; a
    directory that does not exist or holds no result file is an error."""
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such results directory")
    found = [read_result(path, str(path.relative_to(directory))) for path in sorted(directory.glob("*/*.json"))]
    if not found:
        raise ValueError(f"{directory}: no result file (<hardware>/<time>-<kind>.json) under it")
    return sorted(found, key=lambda r: (r.date, r.path))
