"""Model shapes (``profiles/shapes.toml``): the dimensions that memory and speed depend on, and
the parameter count in closed form. ``benchmarks.run.model_dirs`` builds a model directory from one."""

from __future__ import annotations

import functools
from dataclasses import dataclass

ARCHITECTURES = ("qwen2", "llama", "qwen3", "qwen3_moe", "gpt_oss")


@dataclass(frozen=True)
class Shape:
    architecture: str  # a transformers model_type of ARCHITECTURES
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int  # the dense MLP's width; gpt_oss: each expert's
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    source: str
    head_dim: int = 0  # 0: hidden_size / num_attention_heads
    # Mixture of experts: every expert resident in memory, num_experts_per_tok of them run per token.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's MLP width

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def mlp_width(self) -> int:
        """The MLP width one token runs through: the dense MLP's, or its experts' together."""
        return self.num_experts_per_tok * self.moe_intermediate_size if self.moe else self.intermediate_size

    def attention_params(self) -> int:
        """One layer's attention: q, k, v, o (Qwen2 adds q/k/v biases; Qwen3, dense or MoE, per-head q/k
        norms; gpt-oss biases on all four and a sink per head)."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        params = 2 * h * q + 2 * h * kv
        if self.architecture == "qwen2":
            params += q + 2 * kv
        elif self.architecture in ("qwen3", "qwen3_moe"):
            params += 2 * self.head_dim
        elif self.architecture == "gpt_oss":
            params += q + 2 * kv + h + self.num_attention_heads
        return params

    def expert_params(self) -> int:
        """One expert's gated MLP (gpt-oss: with biases)."""
        h, f = self.hidden_size, self.moe_intermediate_size
        return 3 * h * f + (2 * f + h if self.architecture == "gpt_oss" else 0)

    def mlp_params(self, experts: int | None = None) -> int:
        """One layer's MLP: the dense one, or the router and ``experts`` experts (default: all)."""
        h = self.hidden_size
        if not self.moe:
            return 3 * h * self.intermediate_size
        router = h * self.num_experts + (self.num_experts if self.architecture == "gpt_oss" else 0)
        return router + (self.num_experts if experts is None else experts) * self.expert_params()

    @functools.cache  # a shape is frozen: the models ask for its count thousands of times a plan
    def param_count(self, experts: int | None = None) -> int:
        """Parameters in closed form: embeddings, per-layer attention and MLP (every expert, or
        ``experts`` of them), two RMSNorms per layer, the final norm, the LM head if untied."""
        h = self.hidden_size
        layer = self.attention_params() + self.mlp_params(experts) + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_hidden_layers * layer + h

    def active_param_count(self) -> int:
        """Parameters one token runs through: a MoE's router and its num_experts_per_tok experts."""
        return self.param_count(self.num_experts_per_tok) if self.moe else self.param_count()
