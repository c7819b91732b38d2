"""Offline model directories built from shapes (``benchmarks.catalog.shapes``).

Memory and speed depend on a model's shapes, not its weights, so nothing is downloaded: a
shape becomes ``config.json``, a local word-level tokenizer whose vocabulary covers the
whole ``vocab_size``, and random weights (safetensors, so that vLLM can load the directory
too). Built directories are cached by content under ``$GRPO_BENCH_CACHE``
(default ``~/.cache/grpo-bench``).

torch, tokenizers and transformers are imported inside the functions that build a model: the
shapes alone need none of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.catalog.shapes import Shape

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}


def hf_config(shape: Shape, dtype: str) -> Any:
    """The transformers config of ``shape`` with the suite's special tokens."""
    from transformers import AutoConfig

    fields = {k: v for k, v in asdict(shape).items() if k not in ("architecture", "source")}
    if not shape.moe:  # a dense config carries no expert fields
        fields = {
            k: v for k, v in fields.items() if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
        }
    return AutoConfig.for_model(
        shape.architecture,
        **fields,
        architectures=[ARCHITECTURES[shape.architecture]],
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
        model = AutoModelForCausalLM.from_config(hf_config(shape, dtype), dtype=getattr(torch, dtype))
        model.save_pretrained(scratch)
        build_tokenizer(shape.vocab_size).save_pretrained(scratch)
        os.replace(scratch, target)  # whole or not at all
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target
