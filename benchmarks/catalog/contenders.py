"""The context search's contenders (``[context].contenders`` in a profile): each a stack in its own
venv (noxfile.py), how the worker builds its policy, and the logits path the analytic model gives it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BASELINE, OPTIMIZED = "trl-1.14.2", "trl-1.16"  # the unchunked setup, and TRL's own fused head


@dataclass(frozen=True)
class Contender:
    stack: str  # how the worker builds the policy: "trl" (GRPOTrainer + PEFT) or "unsloth" (FastLanguageModel)
    role: str
    logits_path: dict[str, str]  # per platform (cpu, cuda): a path of benchmarks.model.estimate.LOGITS_PATHS
    levers: dict[str, Any]  # GRPOConfig fields over the search's levers
    needs_cuda: str | None = None  # why it cannot run without CUDA


CONTENDERS = {
    "trl-1.14.2": Contender(
        "trl",
        "the unchunked setup: full (completions, tokens, vocab) logits",
        {"cpu": "materialised", "cuda": "materialised"},
        {},
    ),
    "trl-1.16": Contender(
        "trl", "TRL's fused, tiled LM head (since 1.15.0)", {"cpu": "trl-tiled", "cuda": "trl-tiled"}, {}
    ),
    "unsloth-2026.10.9": Contender(
        "unsloth",
        "Unsloth: on CUDA its GPU path (efficient GRPO loss); on CPU its CPU backend, stock TRL 1.15 "
        "GRPOTrainer with cpu_chunked_log_probs (its efficient GRPO loss runs only on the GPU path)",
        {"cpu": "row-chunked", "cuda": "unsloth-gpu"},
        {},
    ),
    # TRL 1.16 has no Liger GRPO loss: `use_liger_kernel=True` applies Liger's layer kernels (RMSNorm,
    # RoPE, SwiGLU) and turns Liger's fused linear cross-entropy off, keeping TRL's own fused LM head
    # (trl/trainer/grpo_trainer.py, "only its layer kernels are applied"). So this contender measures
    # Liger's layer kernels on top of TRL 1.16's tiled head, and its logits path is TRL's.
    "trl-1.16-liger": Contender(
        "trl",
        "TRL 1.16 with Liger's layer kernels (RMSNorm, RoPE, SwiGLU); the loss is TRL's own fused LM head "
        "(TRL 1.16 has no Liger GRPO loss)",
        {"cpu": "trl-tiled", "cuda": "trl-tiled"},
        {"use_liger_kernel": True},
        needs_cuda="Liger's kernels are Triton GPU kernels (no CPU backend)",
    ),
}
