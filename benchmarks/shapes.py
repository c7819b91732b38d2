"""Model shapes: parameter counts in closed form, and offline model directories built from them.

Memory and speed depend on a model's shapes, not its weights, so nothing is downloaded: a
shape becomes ``config.json``, a local word-level tokenizer whose vocabulary covers the
whole ``vocab_size``, and random weights (safetensors, so that vLLM can load the directory
too). Built directories are cached by content under ``$GRPO_BENCH_CACHE``
(default ``~/.cache/grpo-bench``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


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

    def hf_config(self, dtype: str) -> Any:
        from transformers import AutoConfig

        fields = {k: v for k, v in asdict(self).items() if k not in ("architecture", "source")}
        return AutoConfig.for_model(
            self.architecture,
            **fields,
            architectures=[ARCHITECTURES[self.architecture]],
            dtype=dtype,
            pad_token_id=SPECIAL_TOKENS.index(PAD),
            eos_token_id=SPECIAL_TOKENS.index(EOS),
            bos_token_id=None,
        )


def word(index: int) -> str:
    """The vocabulary's word for token ``index`` (past the special tokens)."""
    return f"w{index}"


def build_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer with exactly ``vocab_size`` entries: specials, then ``w<i>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update((word(i), i) for i in range(len(SPECIAL_TOKENS), vocab_size))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK)


def cache_root() -> Path:
    return Path(os.environ.get("GRPO_BENCH_CACHE", Path.home() / ".cache" / "grpo-bench"))


def materialise(shape: Shape, dtype: str = "float32", root: Path | None = None) -> Path:
    """The model directory for ``shape`` in ``dtype`` (built once, then reused)."""
    import torch
    from transformers import AutoModelForCausalLM

    key = hashlib.sha256(json.dumps([asdict(shape), dtype, 1], sort_keys=True).encode()).hexdigest()[:16]
    target = (
        (root or cache_root())
        / "models"
        / f"{shape.architecture}-{shape.hidden_size}x{shape.num_hidden_layers}-{dtype}-{key}"
    )
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(shape.hf_config(dtype), dtype=getattr(torch, dtype))
        model.save_pretrained(scratch)
        build_tokenizer(shape.vocab_size).save_pretrained(scratch)
        os.replace(scratch, target)  # whole or not at all
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target
