"""The records of the decode, context and rewards result files (the GRPO file's are in ``records``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks.results.records import Gpu, Pace, RunFile, ShapeRecord


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
    ttft_s_each: list[float] | None = None  # each repeat's one-token call
    generate_s_each: list[float] | None = None  # each repeat's call of new_tokens + 1 tokens
    execution: str | None = None
    warmup_s: float | None = None  # the untimed first call at this size (graphs: the compile)
    efficiency_vs_ceiling: float | None = None
    within_ceiling: bool | None = None
    efficiency_vs_spec: float | None = None

    @property
    def launch_bound(self) -> bool:
        """A CUDA row whose speed is its kernel launches' (eager), not its bandwidth."""
        return "kernel launches" in (self.execution or "")


@dataclass(kw_only=True)
class DecodeFile(RunFile):
    ceiling: Ceiling
    projection_rollout: RolloutShape | None = None
    device_ceiling: BestKernel | None = None
    projections: list[Projection] = field(default_factory=list)
    sweep: list[DecodePoint] = field(default_factory=list)
    gpu: Gpu | None = None  # the one GPU the probe and every engine ran on (CUDA_VISIBLE_DEVICES: its UUID)


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
    machine_info: dict[str, Any] = field(default_factory=dict)  # pytest-benchmark's: the CPU as ``cpu.brand_raw``
    commit_info: dict[str, Any] = field(default_factory=dict)  # pytest-benchmark's: ``id``, ``dirty``
