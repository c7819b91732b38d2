"""The bytes one decode step moves, and the rollout seconds they imply at a bandwidth.

Decode is bandwidth-bound: each step streams every weight once and reads the whole KV cache
of every sequence in the batch. This byte model says what a decode step must move, so that
achieved GB/s = bytes per step x steps / decode time can be set against the device's measured
ceiling (``benchmarks.run.machine.bandwidth_probe``), the spec, and DGX Spark's 180-192 GB/s budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.catalog.shapes import Shape


@dataclass(frozen=True)
class DecodeBytes:
    """What one decode step of ``batch`` sequences at ``context`` tokens moves, in bytes."""

    weights: int  # every weight read once (an input embedding is only looked up: B rows)
    kv_read: int  # the whole KV cache of every sequence
    kv_write: int  # one new K and V per layer per sequence

    @property
    def total(self) -> int:
        return self.weights + self.kv_read + self.kv_write


def kv_bytes_per_token(shape: Shape, dtype_bytes: float) -> float:
    return 2 * shape.num_hidden_layers * shape.num_key_value_heads * shape.head_dim * dtype_bytes


def experts_read(shape: Shape, batch: int) -> float:
    """Distinct experts per layer that a decode step of ``batch`` tokens reads, each token picking
    num_experts_per_tok of num_experts: E x (1 - (1 - k/E)^batch) with uniform routing, the most a
    batch can touch on average (skewed routing touches fewer)."""
    experts, k = shape.num_experts, shape.num_experts_per_tok
    return experts * (1 - (1 - k / experts) ** batch)


def decode_step_bytes(
    shape: Shape, dtype_bytes: float, batch: int, context: int, kv_dtype_bytes: float | None = None
) -> DecodeBytes:
    """The bytes of one decode step: weights in ``dtype_bytes`` per parameter (0.516 for NF4 with double
    quantization, 1 for FP8), the KV cache in ``kv_dtype_bytes`` per element (default: the weights'; 1 for
    an FP8 KV cache). A MoE streams its attention, routers and only the experts the batch reads
    (``experts_read``); every expert stays resident all the same."""
    if shape.moe:
        streamed = (
            shape.param_count(experts=0) + shape.num_hidden_layers * experts_read(shape, batch) * shape.expert_params()
        )
    else:
        streamed = shape.param_count()
    if not shape.tie_word_embeddings:  # the untied input table is looked up, not streamed
        streamed -= shape.vocab_size * shape.hidden_size
    per_token = kv_bytes_per_token(shape, dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes)
    return DecodeBytes(
        weights=round(streamed * dtype_bytes),
        kv_read=round(batch * context * per_token),
        kv_write=round(batch * per_token),
    )


def rollout_seconds(
    shape: Shape,
    dtype_bytes: float,
    sequences: int,
    prompt_tokens: int,
    completion_tokens: int,
    gb_per_s: float,
    kv_dtype_bytes: float | None = None,
) -> float:
    """Decode time of one GRPO rollout (``sequences`` = prompts x num_generations, decoded
    together) if every step ran at ``gb_per_s``: bandwidth-bound decode only, prefill apart.
    Step ``s`` reads a cache of ``prompt_tokens + s`` tokens per sequence."""
    first = decode_step_bytes(shape, dtype_bytes, sequences, prompt_tokens, kv_dtype_bytes)
    steps = completion_tokens
    kv = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    growing_cache = sequences * kv_bytes_per_token(shape, kv) * steps * (steps - 1) / 2
    return (steps * first.total + growing_cache) / (gb_per_s * 1e9)


def projections(profile: Any, ceiling_gb_s: float) -> list[dict[str, Any]]:
    """Rollout seconds of one GRPO step per size class x hardware class x bandwidth basis:
    this run's measured ceiling for the profile's own hardware, every class's spec, and a
    sustained budget where one is known (DGX Spark: 180 and 192 GB/s)."""
    rows = []
    for hardware_name, hardware in load_hardware().items():
        bases = []
        if hardware_name == profile.hardware:
            bases.append(("measured ceiling (this run)", ceiling_gb_s))
        if hardware.spec_bandwidth_gb_s:
            bases.append(("spec", hardware.spec_bandwidth_gb_s))
        for budget in hardware.sustained_bandwidth_gb_s or ():
            bases.append((f"sustained budget {budget:g}", budget))
        rows += _rollout_rows(profile.decode, hardware_name, bases)
    return rows


def projections_at_fraction(profile: Any, fraction: float) -> list[dict[str, Any]]:
    """The same rollouts on every class with a spec, at the fraction of its spec that this run's decode
    achieved (the median of its valid rows not bound by kernel launches): what this engine would do there."""
    basis = f"decode as achieved here: {fraction:.0%} of spec"
    return [
        row
        for name, hardware in load_hardware().items()
        if hardware.spec_bandwidth_gb_s
        for row in _rollout_rows(profile.decode, name, [(basis, fraction * hardware.spec_bandwidth_gb_s)])
    ]


def _rollout_rows(settings: Any, hardware_name: str, bases: list[tuple[str, float]]) -> list[dict[str, Any]]:
    sequences = settings.rollout_prompts * settings.rollout_num_generations
    rows = []
    for shape_name in settings.projection_shapes:
        shape = load_shapes()[shape_name]
        for basis, gb_per_s in bases:
            seconds = rollout_seconds(
                shape,
                settings.projection_dtype_bytes,
                sequences,
                settings.rollout_prompt_tokens,
                settings.rollout_completion_tokens,
                gb_per_s,
            )
            rows.append(
                {
                    "hardware": hardware_name,
                    "shape": shape_name,
                    "basis": basis,
                    "gb_per_s": gb_per_s,
                    "rollout_s": seconds,
                    "weights_gib": shape.param_count() * settings.projection_dtype_bytes / 2**30,
                    "predicted": True,
                }
            )
    return rows
