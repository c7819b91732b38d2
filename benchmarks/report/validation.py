"""The analytic model (``benchmarks.model.memory.predict``) against what GRPO result files measured, per
phase: the rows of ``model.md`` and the figures that stack the model's terms beside a measured peak."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.catalog.profiles import Hardware, load_hardware, load_shapes
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.predict import GIB, MODELLED_OPTIMIZERS, OUTSIDE_ALLOCATED, Estimate, Workload, estimate
from benchmarks.results.schema import TORCH_ALLOCATED, Configuration, GrpoFile, Result

TRAINING_PHASES = ("logprob", "forward_backward", "optimizer")
PHASE_ORDER = ("setup", "rollout", "sleep_wake", "reward", "scoring", "logprob", "forward_backward", "optimizer")


@dataclass(frozen=True)
class Check:
    """The model against one measured configuration in one of its phases (rollout, training)."""

    file: str
    hardware: str
    configuration: str
    phase: str
    predicted_bytes: int
    measured_bytes: int
    terms: dict[str, int]
    held_out: bool  # a configuration no constant of the model was fitted on
    measure: str = ""  # what the phase's figure measures (the summary's), and so which terms it is held to
    heap: str = ""  # CPU: under glibc's own malloc thresholds or fixed ones (``heap_of``)

    @property
    def error(self) -> float:
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def measured_phases(configuration: Configuration) -> dict[str, int]:
    """A measured configuration's peaks in the model's phases, each phase's own: on CUDA torch's
    allocator in the phase (``on_allocator``), else the worker tree's RSS."""
    by_phase = configuration.summary.peak_bytes_by_phase if configuration.summary else {}
    out = {}
    if "rollout" in by_phase:
        out["rollout"] = by_phase["rollout"]
    training = [by_phase[p] for p in TRAINING_PHASES if p in by_phase]
    if training:
        out["training"] = max(training)
    return out


def on_allocator(configuration: Configuration) -> bool:
    """Whether its phases were measured as the tensors torch's allocator held (CUDA): the model's terms
    outside them (``predict.OUTSIDE_ALLOCATED``) are then left out of the comparison."""
    return bool(configuration.summary and configuration.summary.phase_peak_measure == TORCH_ALLOCATED)


def heap_of(run: GrpoFile) -> str:
    """How a CPU run's heap was kept: glibc's thresholds fixed (every run since the profile recorded it) or its own."""
    if run.profile.hardware != "cpu":
        return ""
    threshold = run.profile.malloc_mmap_threshold
    return f"thresholds fixed at {threshold // 1024} KiB" if threshold else "glibc's own thresholds"


def predict_configuration(
    run: GrpoFile, configuration: Configuration, shapes: dict[str, Shape], hardware: dict[str, Hardware]
) -> Estimate:
    """The model's estimate for one configuration of a GRPO result file, from what the file says (per
    rank for a configuration of many ranks)."""
    grpo = getattr(run.profile, run.kind)
    levers = configuration.lever_values
    work = Workload.from_levers(levers, grpo.prompt_words)
    fixed = run.profile.malloc_mmap_threshold > 0
    return estimate(
        shapes[run.shape.name], grpo.dtype, levers, work, hardware[run.profile.hardware], malloc_fixed=fixed
    )


# The measured constants of the model were fitted on these runs (and the context probes): the CPU runtime under
# glibc's own thresholds (estimate.RUNTIME_BYTES["cpu"]) on the 0.5B class's one-device runs and a DeepSpeed
# rank's transient on a CPU (estimate.CPU_DEEPSPEED_TRANSIENT_GRADIENTS) on its ZeRO run; the runtime under
# fixed thresholds ("cpu-fixed") on the 135M class's GRPO part of the run that first fixed them; the PEFT bf16
# generate transient on the context probes. Every other run fitted nothing and is held out.
FITTED_FILES = (
    "cpu/20261130T074121Z-grpo.json",
    "cpu/20261130T200906Z-distributed.json",
    "cpu/20261201T175857Z-grpo.json",
)


def validate(results: list[Result], shapes: dict[str, Shape], hardware: dict[str, Hardware]) -> list[Check]:
    """Predicted against measured, per phase, for every configuration that ran in GRPO result files, one
    device or many ranks (per rank: the largest rank's peak against the model's rank); the model counts
    AdamW's states only, so other optimizers are left out."""
    checks = []
    for result in results:
        if result.kind not in ("grpo", "distributed"):
            continue
        for configuration in result.record.configurations:
            if configuration.status != "ok" or configuration.lever_values.optim not in MODELLED_OPTIMIZERS:
                continue
            predicted = predict_configuration(result.record, configuration, shapes, hardware)
            allocator = on_allocator(configuration)
            summary = configuration.summary
            measure = f"{TORCH_ALLOCATED}, against every term but {', '.join(OUTSIDE_ALLOCATED)}" if allocator else ""
            for phase, measured in measured_phases(configuration).items():
                terms = {k: v for k, v in predicted.phases[phase].items() if not (allocator and k in OUTSIDE_ALLOCATED)}
                checks.append(
                    Check(
                        file=result.path,
                        hardware=result.hardware,
                        configuration=configuration.name,
                        phase=phase,
                        predicted_bytes=sum(terms.values()),
                        measured_bytes=measured,
                        terms=terms,
                        held_out=result.path not in FITTED_FILES,
                        measure=measure or summary.peak_measure,
                        heap=heap_of(result.record),
                    )
                )
    return checks


def phase_lines(result: Result) -> list[str]:
    """The model beside each measured phase of a GRPO result, a line each, as a run prints them."""
    return [
        f"  {check.configuration[:60]:60} {check.phase:9} measured {check.measured_bytes / GIB:7.2f} GiB, "
        f"model {check.predicted_bytes / GIB:7.2f} GiB ({check.error:+.0%})"
        for check in validate([result], load_shapes(), load_hardware())
    ]
