"""What physics allows a measured rate: a decode row's bytes a second can exceed neither the device's datasheet
bandwidth nor the bandwidth probe's own best (the larger of the two is the ceiling: a CPU has no datasheet
figure, a GPU's probe may fall short of its datasheet), its FLOPs a second not the device's peak, and its decode time
is a positive difference of two timed calls; a GRPO step cannot do its least arithmetic faster than its GPUs' peak.
A row beyond a ceiling is a timing fault, never a measurement: it is recorded ``invalid`` with the reason, and every
table and projection reads ``ok`` rows only."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.catalog.shapes import Shape

INVALID = "invalid"


def decode_fault(
    row: Any, shape: Shape, probe_max_gb_s: float, spec_gb_s: float | None, peak_tflops: float | None
) -> str | None:
    """Why a decode row (``schema.DecodePoint``) cannot be a measurement, or None where physics allows it."""
    full, first = statistics.median(row.generate_s_each), statistics.median(row.ttft_s_each)
    if full <= first:
        return (
            f"decode time not positive: the {row.new_tokens + 1}-token calls' median ({full:.4g} s) is not above "
            f"the 1-token calls' ({first:.4g} s); timing noise, not a decode"
        )
    ceiling = max(probe_max_gb_s, spec_gb_s or 0.0)
    if row.achieved_gb_s > ceiling:
        whose = "the datasheet's" if spec_gb_s and spec_gb_s >= probe_max_gb_s else "the bandwidth probe's best"
        return f"achieved {row.achieved_gb_s:.4g} GB/s is above {whose} {ceiling:.4g} GB/s: beyond physics"
    if peak_tflops:
        tflops = 2 * shape.active_param_count() * row.batch * row.new_tokens / row.decode_s / 1e12
        if tflops > peak_tflops:
            return f"{tflops:.4g} TFLOP/s of weight matmuls is above the device's peak {peak_tflops:g}: beyond physics"
    return None


def step_fault(summary: Any, shape: Shape, peak_tflops: float | None, gpus: int) -> str | None:
    """Why a GRPO configuration's measured steps (``schema.Summary``) cannot be a measurement, or None. The least
    arithmetic of a step: each completion token generated (2 FLOPs a parameter run) and then scored in the training
    forward (2 more), backward and prompts left out; ``gpus`` at their peak bound it (no peak, a CPU: no bound)."""
    if summary is None or not peak_tflops or not summary.completion_tokens_per_s_median:
        return None
    tflops = 4 * shape.active_param_count() * summary.completion_tokens_per_s_median / 1e12
    if tflops > peak_tflops * gpus:
        return (
            f"{summary.completion_tokens_per_s_median:.4g} completion tokens/s needs at least {tflops:.4g} TFLOP/s, "
            f"above {gpus} x the device's peak {peak_tflops:g}: beyond physics"
        )
    return None
