"""The result files' records: what every file opens with (machine, commit, profile, pace, targets) and the
GRPO file's configurations, steps and summaries. Every field a reader uses is declared; a key a file holds
beyond them is kept in the file and ignored here. Optional fields are those an older file or a status that
ended early lacks. ``benchmarks.results.schema`` reads and writes them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from benchmarks.catalog.profiles import Levers


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
        """The target as a run prints it: four significant digits at most (the file keeps the raw values)."""
        met = {True: "met", False: "MISSED", None: "not measured"}[self.met]
        return f"target: {self.claim}: {met} (measured {readable(self.measured)}, limit {readable(self.limit)})"


def readable(value: float | None) -> str:
    """A figure as a person reads it: four significant digits, thousands separated, never in scientific notation;
    "none" where nothing was."""
    if value is None:
        return "none"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = 3 - math.floor(math.log10(abs(value)))  # decimals that keep four significant digits
    rounded = round(value, digits)
    return f"{rounded:,.{max(0, digits)}f}".rstrip("0").rstrip(".") if digits > 0 else f"{rounded:,.0f}"


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
    mig: bool = False  # MIG mode enabled: refused by the run (benchmarks.catalog.gpus)


@dataclass(kw_only=True)
class Machine:
    """The machine's fingerprint: CPU, cores, RAM; GPUs by NVML (name, memory, driver), every one the machine has,
    and ``CUDA_VISIBLE_DEVICES`` as the run saw it (``-1``: the GPUs hidden, a CPU profile on a GPU machine)."""

    cpu: str = "unknown"
    cores: int | None = None
    ram_gib: float | None = None
    gpus: list[Gpu] = field(default_factory=list)
    hostname: str = ""
    platform: str = ""
    python: str = ""
    cuda_visible_devices: str | None = None  # None: unset, every GPU visible


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
    """A few seconds of fixed work, timed before a profile runs (``benchmarks.run.machine.pace``): how fast this
    machine does what the parts do, to scale an earlier run's times by."""

    python_s: float  # a fixed pure-Python workload (regular expressions, JSON), one thread
    spawn_s: float  # starting an isolated interpreter, the median of several
    torch_s: float  # a fixed fp32 forward and backward through MLP blocks, every core
    bandwidth_gb_s: float | None = None  # the bandwidth probe's ceiling on 256 MiB arrays (None: not yet recorded)


@dataclass(kw_only=True)
class Install:
    """The bench session's install before the run (``nox -s bench``): which stack, how long, and whether its
    environment was new (a first run: every package downloaded or unpacked) or reused."""

    stack: str
    seconds: float
    fresh: bool


@dataclass(kw_only=True)
class BuiltModel:
    """A model directory a part built from its shape before it measured (a first run on a machine: later runs
    reuse it from the cache): its size on disk and how long building it took."""

    shape: str
    dtype: str
    gib: float
    seconds: float


@dataclass(kw_only=True)
class Pace:
    """How long a part took against what was estimated before it started. The last part of a run also
    holds the whole run's time, its estimate and the profile's time targets."""

    calibration: Calibration | None  # None: a GPU profile, whose parts run on the device (no CPU calibration)
    part_s: float
    estimated_s: float | None  # None: no earlier run of this profile and part here to scale, and no prediction
    reference: str | None  # the result file the estimate scaled, under results/runs (None: predicted, or none)
    scale: float | None = None  # this machine's calibration over the reference's, for this part
    run_s: float | None = None
    run_estimated_s: float | None = None
    run_targets: list[Target] = field(default_factory=list)
    predicted: bool = False  # the estimate came from the time model (a first run on a GPU class), not a reference
    install: Install | None = None  # the first part's file: the session's install before the run
    first_run_s: float | None = None  # of the estimate: building this part's models, not yet built here


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
    built_models: list[BuiltModel] = field(default_factory=list)  # models this part built before measuring


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
    # unified memory: NVML's usedGpuMemory of the worker's processes, beside the pool's use (the headline)
    peak_device_process_bytes: dict[str, int] | None = None

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
    """One worker process: status ``ok``, ``oom`` or ``timeout`` (with its phase), ``skipped``, ``error`` or
    ``invalid`` (steps faster than physics allows: benchmarks.run.ceilings) with the reason; its steps and their
    summary."""

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
