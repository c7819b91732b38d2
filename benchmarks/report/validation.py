"""The analytic model (``benchmarks.model.estimate``) against what GRPO result files measured, per
phase: the rows of ``model.md`` and the figures that stack the model's terms beside a measured peak."""

from __future__ import annotations

from benchmarks.catalog.profiles import Levers
from benchmarks.model.estimate import MODELLED_OPTIMIZERS, Estimate, Workload, estimate

TRAINING_PHASES = ("logprob", "forward_backward", "optimizer")


def headline_peak(summary: dict) -> tuple[int, str]:
    """A measured configuration's peak and what it measures: device memory on CUDA, host RSS on CPU
    (schema 1 files, all from CPU runs: host RSS)."""
    if "peak_bytes" in summary:
        return summary["peak_bytes"], summary["peak_measure"]
    return summary["peak_rss_bytes"], "host RSS of the worker and its children"


def peak_by_phase(summary: dict) -> dict[str, int]:
    return summary.get("peak_bytes_by_phase", summary.get("peak_rss_bytes_by_phase", {}))


def measured_phases(record: dict) -> dict[str, int]:
    """A measured configuration's peaks in the model's phases: on CUDA the device memory of the
    run's processes (vLLM and the context included), else the worker tree's RSS."""
    by_phase = peak_by_phase(record.get("summary") or {})
    out = {}
    if "rollout" in by_phase:
        out["rollout"] = by_phase["rollout"]
    training = [by_phase[p] for p in TRAINING_PHASES if p in by_phase]
    if training:
        out["training"] = max(training)
    return out


def predict_configuration(result: dict, record: dict, shapes: dict, hardware: dict) -> Estimate:
    """The model's estimate for one configuration of a GRPO result file, from what the file says."""
    grpo = result["profile"]["grpo"]
    levers = Levers(**record["levers"])
    work = Workload(levers.per_device_train_batch_size, grpo["prompt_words"], levers.max_completion_length)
    shape = shapes[result["shape"]["name"]]
    return estimate(shape, grpo["dtype"], levers, work, hardware[result["profile"]["hardware"]])


def validate(results: list[tuple[str, dict]], shapes: dict, hardware: dict) -> list[dict]:
    """Predicted against measured, per phase, for every configuration that ran in GRPO result
    files (``(name, data)`` pairs)."""
    rows = []
    for name, result in results:
        if result.get("kind") != "grpo":
            continue
        for record in result["configurations"]:
            if record["status"] != "ok" or record["levers"]["optim"] not in MODELLED_OPTIMIZERS:
                continue  # the model counts AdamW's states only
            predicted = predict_configuration(result, record, shapes, hardware)
            for phase, measured in measured_phases(record).items():
                value = predicted.total(phase)
                rows.append(
                    {
                        "file": name,
                        "hardware": result["profile"]["hardware"],
                        "configuration": record["name"],
                        "phase": phase,
                        "predicted_bytes": value,
                        "measured_bytes": measured,
                        "error": (value - measured) / measured,
                        "terms": predicted.phases[phase],
                    }
                )
    return rows
