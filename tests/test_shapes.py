"""Shapes: closed-form parameter counts, a tokenizer covering the vocabulary, offline model directories."""

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from benchmarks.catalog.profiles import load_shapes  # noqa: E402
from benchmarks.run.model_dirs import build_tokenizer, hf_config, materialise, word  # noqa: E402


@pytest.mark.parametrize("name", list(load_shapes()))
def test_closed_form_parameter_count_matches_the_built_model(name):
    shape = load_shapes()[name]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config(shape, "float32"))
    assert shape.param_count() == sum(p.numel() for p in model.parameters())


def test_the_real_half_billion_shape_has_its_published_size():
    assert round(load_shapes()["0.5b"].param_count() / 1e6, 1) == 494.0


def test_the_tokenizer_covers_the_whole_vocabulary():
    tokenizer = build_tokenizer(512)
    assert len(tokenizer) == 512
    assert tokenizer(f"{word(3)} {word(511)}", add_special_tokens=False)["input_ids"] == [3, 511]
    assert tokenizer.decode([3, 511]) == f"{word(3)} {word(511)}"
    assert tokenizer.eos_token_id == 1 and tokenizer.pad_token_id == 0


def test_a_model_directory_loads_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    directory = materialise(load_shapes()["tiny"], "float32", root=tmp_path)
    assert materialise(load_shapes()["tiny"], "float32", root=tmp_path) == directory  # built once
    assert json.loads((directory / "config.json").read_text())["vocab_size"] == 512
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(directory)
    ids = tokenizer(" ".join(word(i) for i in range(3, 11)), return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape == (1, 8, 512)
