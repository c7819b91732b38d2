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
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.catalog.profiles import WEIGHTS, load_shapes
from benchmarks.catalog.shapes import Shape
from benchmarks.results import schema

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
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


def model_dir(shape: Shape, dtype: str = "float32", root: Path | None = None, weights: str = "saved") -> Path:
    """Where ``shape`` in ``dtype`` is (or will be) built: a directory named by the content it holds."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r}: one of {', '.join(WEIGHTS)}")
    saved = weights == "saved"
    key = hashlib.sha256(json.dumps([asdict(shape), dtype, 1 if saved else 2], sort_keys=True).encode()).hexdigest()
    name = f"{shape.architecture}-{shape.hidden_size}x{shape.num_hidden_layers}-{dtype}-{key[:16]}"
    return (root or cache_root()) / "models" / (name if saved else f"{name}-config-only")


def is_built(shape: Shape, dtype: str = "float32", weights: str = "saved") -> bool:
    return (model_dir(shape, dtype, weights=weights) / "config.json").exists()


def materialise(shape: Shape, dtype: str = "float32", root: Path | None = None, weights: str = "saved") -> Path:
    """The model directory for ``shape`` in ``dtype`` (built once, then reused): with ``weights="saved"``
    random weights in safetensors (what vLLM loads); with ``"on-device"`` its config and tokenizer only,
    the weights built by the worker on its device (``build_on_device``): a 32B or 70B class never touches
    the disk."""
    import torch
    from transformers import AutoModelForCausalLM

    target = model_dir(shape, dtype, root, weights)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        if weights == "saved":
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(hf_config(shape, dtype), dtype=getattr(torch, dtype))
            model.save_pretrained(scratch)
        else:
            hf_config(shape, dtype).save_pretrained(scratch)
        build_tokenizer(shape.vocab_size).save_pretrained(scratch)
        os.replace(scratch, target)  # whole or not at all
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target


def materialise_recorded(name: str, dtype: str, weights: str, built: list[schema.BuiltModel]) -> Path:
    """``materialise`` of the shape named ``name``; where it had to be built, what that took appended to
    ``built`` (a part's ``built_models``: a first run's cost, which the next first run's estimate reads)."""
    shape = load_shapes()[name]
    target = model_dir(shape, dtype, weights=weights)
    if (target / "config.json").exists():
        return target
    started = time.monotonic()
    materialise(shape, dtype, weights=weights)
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    seconds = round(time.monotonic() - started, 2)
    built.append(schema.BuiltModel(shape=name, dtype=dtype, gib=round(size / 2**30, 3), seconds=seconds))
    return target


def build_on_device(model_dir: str | Path, dtype: Any, device: Any, four_bit: bool = False) -> Any:
    """The model of ``model_dir``'s config with random weights, made on ``device`` (nothing read from disk
    but the config); ``four_bit``: every decoder linear in bitsandbytes NF4 (double quantisation, computing
    in ``dtype``), made one layer at a time, so that no more than a layer is ever held in ``dtype``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(0)
    if not four_bit:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        layers = config.num_hidden_layers
        config.num_hidden_layers = 1  # the rest follow one at a time
        default = torch.get_default_dtype()
        try:
            torch.set_default_dtype(dtype)  # each new layer made in dtype, never in fp32 first
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype)
                decoder = model.model.layers
                quantise_linears(decoder[0], dtype)
                for index in range(1, layers):
                    layer = type(decoder[0])(config, index)
                    quantise_linears(layer, dtype)
                    decoder.append(layer)
        finally:
            torch.set_default_dtype(default)
        model.config.num_hidden_layers = layers
        model.is_loaded_in_4bit = True  # as transformers marks a 4-bit load: TRL keeps the adapters in bf16
    model.config.name_or_path = str(model_dir)
    return model


def quantise_linears(module: Any, dtype: Any) -> None:
    """Every ``nn.Linear`` under ``module`` replaced, in place, by a bitsandbytes NF4 ``Linear4bit`` of its
    weights (quantised where they lie)."""
    import bitsandbytes as bnb
    import torch

    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear):
                continue
            weight = child.weight.data
            quantised = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                compute_dtype=dtype,
                compress_statistics=True,
                quant_type="nf4",
                device="meta",
            )
            quantised.weight = bnb.nn.Params4bit(
                weight, requires_grad=False, compress_statistics=True, quant_type="nf4", module=quantised
            ).to(weight.device)
            if child.bias is not None:
                quantised.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, quantised)
