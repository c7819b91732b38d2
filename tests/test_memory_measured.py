"""The memory model's terms against what torch really keeps, measured here: autograd's saved tensors per layer
and position (LoRA against full fine-tuning), and the peak RSS of a checkpointed step, of the materialised and
of TRL's tiled loss. Apart from tests/test_estimate.py so that the two test workers share these slow ones."""

import dataclasses
import subprocess
import sys

import pytest

from benchmarks import REPO
from benchmarks.catalog.profiles import Levers, load_hardware, load_shapes
from benchmarks.model.memory.predict import MATERIALISED_COPIES, Workload, estimate, logits_bytes


def _saved_bytes_per_layer_position(shape, dtype, lora, autocast):
    """What autograd keeps for backward per decoder layer and position, counted by its saved-tensor
    hooks (unique storages, parameters left out) on 3 layers against 2."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from benchmarks.run.model_dirs import hf_config

    kept = []
    for layers in (2, 3):
        torch.manual_seed(0)
        config = hf_config(shape, dtype)
        # a small head: the embedding and logits cancel in 3 layers less 2, and a full vocabulary's random
        # initialisation was most of the test's time
        config.num_hidden_layers, config.use_cache, config.vocab_size = layers, False, 512
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        if lora:
            model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
        model.train()
        storages = {}

        def pack(tensor, storages=storages):
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        ids = torch.randint(3, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                model(input_ids=ids)
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        kept.append(sum(size for pointer, size in storages.items() if pointer not in weights))
    return (kept[1] - kept[0]) / ids.numel()


@pytest.mark.parametrize("name", ["135m", "0.5b"])
@pytest.mark.parametrize("dtype, autocast", [("float32", False), ("bfloat16", False), ("bfloat16", True)])
def test_lora_against_full_activations_agrees_with_what_autograd_keeps(name, dtype, autocast):
    """One might expect LoRA never to keep more than full fine-tuning; autograd says otherwise over a
    16-bit base (PEFT's fp32 adapters cast each adapted linear's input), and less in fp32. The model's
    LoRA-minus-full difference follows autograd in sign, within 5% of a full layer."""
    from benchmarks.model.memory.predict import layer_activation_bytes

    shape, act_bytes = load_shapes()[name], 4 if dtype == "float32" else 2
    measured = _saved_bytes_per_layer_position(shape, dtype, True, autocast) - _saved_bytes_per_layer_position(
        shape, dtype, False, autocast
    )
    full = layer_activation_bytes(shape, act_bytes, lora=False)
    modelled = layer_activation_bytes(shape, act_bytes, lora=True, autocast=autocast) - full
    assert (modelled > 0) == (measured > 0) and modelled == pytest.approx(measured, abs=0.05 * full)


PEAK_RSS = """
import resource
from benchmarks.run.grpo.worker import fix_malloc_thresholds
fix_malloc_thresholds(131072)  # large blocks mmapped and given back when freed: the RSS follows live tensors


def rss():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()


def reset_peak():  # VmHWM counts from here
    open("/proc/self/clear_refs", "w").write("5")


def peak():  # VmHWM: this process's peak RSS since the reset (ru_maxrss would keep the parent's)
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
"""


def measured(script: str, *args: str) -> float:
    """The last figure ``script`` prints, run in a fresh interpreter after PEAK_RSS's helpers."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS + script, *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.split()[-1])


MATERIALISED_LOSS = """
import sys
import torch
from trl.trainer.utils import selective_log_softmax
completions, tokens, vocab, hidden, dtype = 4, 256, 32768, 64, getattr(torch, sys.argv[1])
weight = torch.randn(vocab, hidden, dtype=dtype) / 8
ids = torch.randint(0, vocab, (completions, tokens))
for length in (2, tokens):  # a small pass first, so that the measured one allocates only its tensors
    states = torch.randn(completions, length + 1, hidden, dtype=dtype, requires_grad=True)
    start = rss()
    reset_peak()
    logits = (states @ weight.T)[:, :-1]  # the model's logits for tokens + 1 positions, the last dropped
    selective_log_softmax(logits, ids[:, :length]).sum().backward()
    del logits
print((peak() - start) / (completions * tokens * vocab * dtype.itemsize))
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_materialised_logits_path_peaks_at_the_copies_the_model_counts(dtype):
    """TRL <= 1.14's loss on materialised logits (its `selective_log_softmax`, unchanged in TRL 1.16),
    forward and backward, peaks at MATERIALISED_COPIES copies of the logits above what was live before."""
    pytest.importorskip("trl")
    assert measured(MATERIALISED_LOSS, dtype) == pytest.approx(MATERIALISED_COPIES, abs=0.3)


CHECKPOINTED_STEP = """
import dataclasses, sys
import peft, torch
from transformers import AutoModelForCausalLM
from benchmarks.catalog.profiles import load_shapes
from benchmarks.run.model_dirs import hf_config
shape, lora = dataclasses.replace(load_shapes()[sys.argv[1]], num_hidden_layers=4), sys.argv[2] == "lora"
config = hf_config(shape, "float32")
config.vocab_size, config.use_cache = 512, False  # a small head: the layers' share is what is measured
model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
if lora:
    model.enable_input_require_grads()
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
model.train()
peaks = []
for tokens in (8, 96, 192):  # the first only warms up
    model.zero_grad(set_to_none=True)
    ids = torch.randint(3, 512, (8, tokens), generator=torch.Generator().manual_seed(0))
    start = rss()
    reset_peak()
    model(input_ids=ids).logits.sum().backward()
    peaks.append(peak() - start)
print((peaks[2] - peaks[1]) / (8 * 96))
"""


@pytest.mark.parametrize("name, model", [("135m", "lora"), ("0.5b", "full")])  # LoRA at 0.5B: the same count
def test_a_checkpointed_step_peaks_per_position_as_the_model_counts(name, model):
    """Gradient checkpointing on 4 layers: the step's peak grows per position by what the model keeps
    (each layer's input, and CHECKPOINTED_RECOMPUTE_LAYERS of a layer recomputed), within 10%. Two whole
    layers, the model's count before this was measured, read 54-67% high."""
    pytest.importorskip("peft")
    shape = dataclasses.replace(load_shapes()[name], num_hidden_layers=4)
    levers = Levers(gradient_checkpointing=True, model=model, per_device_train_batch_size=1)
    work = Workload(completions=1, prompt_tokens=0, completion_tokens=1)
    modelled = estimate(shape, "float32", levers, work, load_hardware()["cpu"]).phases["training"]["activations"]
    assert measured(CHECKPOINTED_STEP, name, model) == pytest.approx(modelled, rel=0.1)


TILED_LOSS = """
import torch
from trl.kernels import ChunkedLogProbFunction
vocab, hidden_size = 32768, 64  # one vocabulary tile
weight = torch.randn(vocab, hidden_size) / 8
peaks = []
for rows in (8, 256, 512):  # the first only warms up
    hidden = torch.randn(rows, hidden_size, requires_grad=True)
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(0))
    start = rss()
    reset_peak()
    logprobs, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, vocab, None, 1.0, ("entropy",))
    (-logprobs.sum()).backward()
    peaks.append(peak() - start)
print((peaks[2] - peaks[1]) / 256)
"""


def test_trl_s_tiled_loss_without_triton_peaks_per_row_as_the_model_counts():
    """TRL >= 1.15's chunked log-probabilities on a CPU (its torch fold, no Triton): forward and backward
    peak per scored row at what the model counts for the trl-tiled path, within 10% (the tile's buffer
    and seven fp32 temporaries; three, the count before this was measured, read half)."""
    pytest.importorskip("trl.kernels")
    shape = dataclasses.replace(load_shapes()["135m"], vocab_size=32768)
    per_row = logits_bytes("trl-tiled", shape, Workload(completions=1, prompt_tokens=0, completion_tokens=1), 4, False)
    assert measured(TILED_LOSS) == pytest.approx(per_row, rel=0.1)
