"""Model shapes (``profiles/shapes.toml``): the dimensions that memory and speed depend on, and
the parameter count in closed form. ``benchmarks.run.models`` builds a model directory from one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    source: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def param_count(self) -> int:
        """Parameters in closed form: embeddings, per-layer attention (Qwen2 adds q/k/v
        biases), gated MLP, two RMSNorms per layer, the final norm, the LM head if untied."""
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        attention = 2 * h * h + 2 * h * kv
        if self.architecture == "qwen2":
            attention += h + 2 * kv
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_hidden_layers * layer + h
