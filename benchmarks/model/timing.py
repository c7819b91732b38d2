"""Seconds per phase of one GRPO step, per rank: the time model beside the memory model (``estimate``).

Each phase is work over a rate. ``phase_work`` counts the work from the shape, the levers and the workload;
``Rates`` are the machine's: on the machine at hand from its calibration (``benchmarks.run.pace``) and
coefficients fitted on one named run (``fit``), on a GPU class from its catalogued peaks times an efficiency
stated with its source (``assumed_rates``), an assumption until a run on that class replaces it.

- rollout: prefill's FLOPs; per decode step the bytes it moves (every weight, the batch's KV cache) and its
  FLOPs, added (a bound, not an overlap), and a per-step overhead (each layer's eager kernel launches and
  dispatch, or vLLM's per-step engine work); TRL's whole generation batch (every micro-batch of the step) at
  once; with vLLM colocated the policy's weights copied into the engine each step, asleep their transfer to
  and from the host, on a server their broadcast.
- logprob: a forward without gradients over the generation batch for the old policy (vLLM's importance
  sampling) and one for the reference (beta > 0).
- forward_backward: 6 FLOPs a parameter a token (8 with checkpointing's recompute; LoRA's frozen weights
  skip their weight gradients: 4, or 6), attention's own FLOPs, and ZeRO's collectives (2 model copies a
  step for stages 1 and 2, 3 for stage 3: the ZeRO paper's count).
- optimizer: AdamW reads parameters, gradients and two states and writes three; 8-bit AdamW's states are a
  byte each, and on a CPU its blockwise (de)quantisation costs a fitted time a parameter on top.
- reward: the completions times the seconds a completion of the reward that runs (the rewards part's figure).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

import numpy as np

from benchmarks.catalog.profiles import Hardware, Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.bandwidth import decode_step_bytes
from benchmarks.model.estimate import (
    DTYPE_BYTES,
    LORA_TARGETS,
    Workload,
    layer_activation_bytes,
    qlora_weight_bytes,
)
from benchmarks.model.terms import NF4_BYTES_PER_PARAM, quantised_params, trainable_element_bytes, trainable_params

# bitsandbytes' matmul_4bit multiplies one token's vector by the 4-bit weight directly (gemv_4bit); any larger input,
# and every backward, goes through MatMul4Bit, which dequantizes the weight to 16 bits first (bitsandbytes
# autograd/_functions.py; vLLM's bitsandbytes method calls matmul_4bit too): the 4-bit weight read, 16 bits written,
# then read by the matmul, a parameter each time.
DEQUANTISED_BYTES_PER_PARAM = NF4_BYTES_PER_PARAM + 2 + 2


def dequantised(shape: Shape, levers: Levers, passes: float) -> Work:
    """QLoRA's dequantization over ``passes`` of every quantised linear with more than one token: beyond the
    4-bit read the weights' bytes already count, the 16-bit copy written and read."""
    if levers.model != "qlora":
        return Work()
    return Work(bytes=quantised_params(shape) * (DEQUANTISED_BYTES_PER_PARAM - NF4_BYTES_PER_PARAM) * passes)


# pace._torch_work: 8 rounds of 4 (576 x 1536) linears on 512 rows, forward (4 matmuls) and backward (4 weight
# gradients, 3 input gradients: the first layer's input needs none), 2 FLOPs a multiply-add.
CALIBRATION_FLOPS = 8 * 11 * 2 * 512 * 576 * 1536
PHASES = ("rollout", "sleep_wake", "reward", "logprob", "forward_backward", "optimizer")
ZERO_COPIES = {"zero1": 2, "zero2": 2, "zero3": 3, "ddp": 2, "fsdp2": 3}  # model copies moved per step


@dataclass(frozen=True)
class Work:
    """One phase's work, in the units a rate divides."""

    flops: float = 0.0  # matmul and attention FLOPs
    bytes: float = 0.0  # bytes streamed through memory (decode's weights and KV, the optimizer's states)
    layer_passes: float = 0.0  # a layer run once eagerly: its kernel launches, its Python dispatch
    adapter_passes: float = 0.0  # a LoRA adapter run once eagerly (seven a layer, on every linear)
    engine_steps: float = 0.0  # vLLM decode steps: its scheduler and sampler
    link_bytes: float = 0.0  # bytes between ranks (ZeRO) or to a vLLM server
    host_bytes: float = 0.0  # bytes between device and host (sleep mode)
    quantised_params: float = 0.0  # parameters 8-bit AdamW (de)quantises
    faulted_bytes: float = 0.0  # fresh pages a CPU maps and zero-fills each step (glibc's thresholds fixed)
    completions: float = 0.0  # completions the reward scores

    def __add__(self, other: Work) -> Work:
        return Work(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Work)))

    def __mul__(self, times: float) -> Work:
        return Work(*(getattr(self, f.name) * times for f in fields(Work)))


@dataclass(frozen=True)
class Rates:
    """What a machine achieves: each a rate of its own, so that phases are work over rates."""

    flop_s: float
    bytes_s: float
    layer_pass_s: float
    adapter_pass_s: float
    engine_step_s: float
    link_bytes_s: float
    host_bytes_s: float
    quantised_param_s: float  # seconds a parameter of 8-bit AdamW's (de)quantisation
    faulted_bytes_s: float  # fresh pages mapped and zero-filled per second
    reward_s: float = 0.0  # seconds a completion of the reward that runs
    source: str = ""

    def seconds(self, work: Work) -> float:
        return (
            work.flops / self.flop_s
            + work.bytes / self.bytes_s
            + work.layer_passes * self.layer_pass_s
            + work.adapter_passes * self.adapter_pass_s
            + work.engine_steps * self.engine_step_s
            + work.link_bytes / self.link_bytes_s
            + work.host_bytes / self.host_bytes_s
            + work.quantised_params * self.quantised_param_s
            + work.faulted_bytes / self.faulted_bytes_s
            + work.completions * self.reward_s
        )


def matmul_params(shape: Shape) -> int:
    """The parameters a token multiplies through: an untied input embedding is only looked up."""
    untied_input = 0 if shape.tie_word_embeddings else shape.vocab_size * shape.hidden_size
    return shape.active_param_count() - untied_input


def attention_flops(shape: Shape, sequences: int, length: int) -> float:
    """Scores and weighted values of a causal forward over ``length`` tokens: 2 matmuls of 2 FLOPs a
    multiply-add, each token against half the sequence on average."""
    width = shape.num_attention_heads * shape.head_dim
    return 2 * shape.num_hidden_layers * width * length * length * sequences


def eager_passes(shape: Shape, levers: Levers, passes: float) -> Work:
    """``passes`` of every layer run eagerly, each of its LoRA adapters too under PEFT."""
    adapters = len(LORA_TARGETS) if levers.peft else 0
    return Work(
        layer_passes=shape.num_hidden_layers * passes, adapter_passes=shape.num_hidden_layers * adapters * passes
    )


def weight_bytes(shape: Shape, dtype: str, levers: Levers) -> float:
    b = DTYPE_BYTES[dtype]
    return qlora_weight_bytes(shape, b) if levers.model == "qlora" else shape.param_count() * b


def rollout_work(shape: Shape, dtype: str, levers: Levers, work: Workload) -> dict[str, Work]:
    """The rollout of the whole generation batch, and sleep mode's transfers."""
    sequences, prompt, steps = work.rollout_sequences, work.prompt_tokens, work.completion_tokens
    n = matmul_params(shape)
    weights = weight_bytes(shape, dtype, levers)
    per_byte = weights / shape.param_count()
    midway = decode_step_bytes(shape, per_byte, sequences, prompt + steps // 2)
    decode_flops = (
        2 * n * sequences * steps
        + attention_flops(shape, sequences, prompt + steps)
        - attention_flops(shape, sequences, prompt)
    )
    prefill = Work(flops=2 * n * sequences * prompt + attention_flops(shape, sequences, prompt))
    prefill += dequantised(shape, levers, 1)
    decode = Work(flops=decode_flops, bytes=steps * midway.total) + dequantised(shape, levers, steps * (sequences > 1))
    if levers.distributed_type == "zero3" and levers.ds3_gather_for_generation and levers.world_size > 1:
        prefill += Work(link_bytes=weights * (levers.world_size - 1) / levers.world_size)  # gathered to generate
    if not levers.use_vllm:
        return {"rollout": prefill + decode + eager_passes(shape, levers, steps + 1)}
    engine = prefill + decode + Work(engine_steps=steps + 1)
    if levers.vllm_mode == "server":
        engine += Work(link_bytes=weights)  # the policy's weights broadcast to the server each step
    else:
        engine += Work(bytes=2 * weights)  # copied into the colocated engine: read and written
    out = {"rollout": engine}
    if levers.vllm_enable_sleep_mode:
        out["sleep_wake"] = Work(host_bytes=2 * weights)  # offloaded after the rollout, back before the next
    return out


def training_work(shape: Shape, dtype: str, levers: Levers, work: Workload) -> dict[str, Work]:
    """Log-probs, forward and backward, the optimizer: over every micro-batch of the step."""
    length = work.prompt_tokens + work.completion_tokens
    sequences = work.rollout_sequences
    micro_batches = sequences / work.completions
    forward = (
        Work(flops=2 * matmul_params(shape) * sequences * length + attention_flops(shape, sequences, length))
        + eager_passes(shape, levers, micro_batches)
        + dequantised(shape, levers, micro_batches)
    )
    peft = levers.peft
    # forward, input gradients, weight gradients (not under PEFT), and a recompute with checkpointing
    passes = 2 + (0 if peft else 1) + (1 if levers.gradient_checkpointing else 0)
    out = {"forward_backward": forward * passes}
    logprob_forwards = (1 if levers.use_vllm else 0) + (1 if levers.beta > 0 else 0)
    if logprob_forwards:
        out["logprob"] = forward * logprob_forwards
    out["optimizer"] = optimizer_work(shape, dtype, levers)
    copies = ZERO_COPIES.get(levers.distributed_type)
    if copies and levers.world_size > 1:
        share = (levers.world_size - 1) / levers.world_size
        model = trainable_params(shape, levers) * DTYPE_BYTES[dtype] * copies * share
        out["forward_backward"] += Work(link_bytes=model)
        if levers.distributed_type.startswith("zero"):  # DeepSpeed steps inside accelerate's backward
            out["forward_backward"] += out.pop("optimizer")
    return out


def optimizer_work(shape: Shape, dtype: str, levers: Levers) -> Work:
    """AdamW: parameters, gradients and two states read, parameters and states written, on this rank's
    partition under ZeRO; 8-bit states a byte each, quantised and dequantised."""
    trainable = trainable_params(shape, levers)
    if levers.distributed_type.startswith("zero") and levers.world_size > 1:
        trainable /= levers.world_size
    b = trainable_element_bytes(levers, dtype)
    eight_bit = levers.optim.endswith("8bit")
    state = 1 if eight_bit else b
    return Work(
        bytes=trainable * (3 * b + 4 * state),
        layer_passes=shape.num_hidden_layers,
        quantised_params=trainable if eight_bit else 0,
    )


def faulted_work(shape: Shape, dtype: str, levers: Levers, work: Workload) -> dict[str, Work]:
    """On a CPU with glibc's thresholds fixed every block over them is mapped fresh and zero-filled on first
    touch, each step: forward and backward's activations (made again by checkpointing's recompute) and the
    gradients, the optimizer's temporaries (two a parameter in AdamW's update)."""
    b = DTYPE_BYTES[dtype]
    peft = levers.peft
    trainable = trainable_params(shape, levers) * trainable_element_bytes(levers, dtype)
    positions = work.rollout_sequences * (work.prompt_tokens + work.completion_tokens)
    layer = layer_activation_bytes(shape, b, peft, lora_r=levers.lora_r)
    return {
        "forward_backward": Work(faulted_bytes=shape.num_hidden_layers * layer * positions + trainable),
        "optimizer": Work(faulted_bytes=2 * trainable),
    }


def phase_work(shape: Shape, dtype: str, levers: Levers, work: Workload, malloc_fixed: bool = False) -> dict[str, Work]:
    """Every phase's work for one optimizer step of one rank, in ``PHASES`` order; ``malloc_fixed``: on a CPU
    under fixed glibc thresholds (``faulted_work``)."""
    found = {
        **rollout_work(shape, dtype, levers, work),
        "reward": Work(completions=work.rollout_sequences),
        **training_work(shape, dtype, levers, work),
    }
    if malloc_fixed:
        for phase, extra in faulted_work(shape, dtype, levers, work).items():
            phase = phase if phase in found else "forward_backward"  # DeepSpeed steps inside backward
            found[phase] += extra
    return {phase: found[phase] for phase in PHASES if phase in found}


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds per phase of one step of one rank, and what they add up to."""

    phases: dict[str, float]
    completion_tokens: int  # generated by this rank in the step
    gpus: int

    @property
    def step_s(self) -> float:
        return sum(self.phases.values())

    @property
    def rollout_share(self) -> float:
        rollout = self.phases.get("rollout", 0.0) + self.phases.get("sleep_wake", 0.0)
        return rollout / self.step_s if self.step_s else 0.0

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.completion_tokens / self.step_s if self.step_s else 0.0

    def gpu_hours(self, steps: int = 1000) -> float:
        return self.step_s * steps * self.gpus / 3600


def step_time(
    shape: Shape, dtype: str, levers: Levers, work: Workload, rates: Rates, malloc_fixed: bool = False
) -> StepTime:
    return timed(phase_work(shape, dtype, levers, work, malloc_fixed), rates, work, levers.world_size)


def timed(phases: dict[str, Work], rates: Rates, work: Workload, gpus: int) -> StepTime:
    """Each phase's work at ``rates``: one rank's step."""
    seconds = {phase: rates.seconds(w) for phase, w in phases.items()}
    return StepTime(seconds, work.rollout_sequences * work.completion_tokens, gpus)


# GPU classes: peaks times these efficiencies, each an assumption with its source until a run replaces it.
TRAINING_MFU = 0.40  # dense training MFU on H100 BF16, 40-46% for 7B-70B (MosaicML llm-foundry throughput tables)
DECODE_MBU = 0.70  # decode at 60-85% of peak bandwidth in good inference stacks (Databricks' MBU)
EAGER_LAYER_PASS_S = 20 * 7.5e-6  # eager: ~20 kernels a layer at 5-10 us a launch (launch-bound eager decode)
EAGER_ADAPTER_PASS_S = 4 * 7.5e-6  # a LoRA adapter: dropout, two matmuls, a scaled add
# vLLM replays CUDA graphs; its scheduler and sampler still take a few milliseconds a decode step (assumed,
# not measured by this suite yet: a GPU run's decode rows replace it)
ENGINE_STEP_S = 2e-3
GPU_ASSUMPTIONS = (
    f"assumed: {TRAINING_MFU:.0%} of peak bf16 FLOP/s (MosaicML llm-foundry MFU), {DECODE_MBU:.0%} of spec "
    f"bandwidth (Databricks MBU), {ENGINE_STEP_S * 1e3:g} ms a vLLM decode step, links at their spec"
)


def assumed_rates(hardware: Hardware, decode_gb_s: float | None = None, reward_s: float = 0.0) -> Rates:
    """A GPU class's rates from its catalogued peaks; ``decode_gb_s`` replaces its assumed bandwidth
    (DGX Spark's 180-192 GB/s budget)."""
    if not (hardware.peak_bf16_tflops and hardware.spec_bandwidth_gb_s and hardware.host_link_gb_s):
        raise ValueError(f"{hardware.name}: no peak FLOP/s, bandwidth or host link in profiles/hardware.toml")
    gb_s = decode_gb_s or DECODE_MBU * hardware.spec_bandwidth_gb_s
    basis = f"{decode_gb_s:g} GB/s" if decode_gb_s else GPU_ASSUMPTIONS
    return Rates(
        flop_s=TRAINING_MFU * hardware.peak_bf16_tflops * 1e12,
        bytes_s=gb_s * 1e9,
        layer_pass_s=EAGER_LAYER_PASS_S,
        adapter_pass_s=EAGER_ADAPTER_PASS_S,
        engine_step_s=ENGINE_STEP_S,
        link_bytes_s=(hardware.gpu_link_gb_s or hardware.host_link_gb_s) * 1e9,
        host_bytes_s=hardware.host_link_gb_s * 1e9,
        quantised_param_s=0.0,  # bitsandbytes' fused CUDA kernels: within the bytes
        faulted_bytes_s=float("inf"),  # a CPU's heap only
        reward_s=reward_s,
        source=f"{hardware.name}: {basis}",
    )


# The machine at hand: each rate is a calibration figure times a fitted coefficient.
@dataclass(frozen=True)
class Coefficients:
    """Fitted on one run: how the phases' work relates to the calibration's fixed work. Each is the
    seconds of its work per unit of the calibration's (1 / efficiency for FLOPs and bytes)."""

    flops: float  # per second of the calibration's matmuls
    bytes: float  # per second of streaming at the probe's bandwidth
    layer_passes: float  # per pass, in calibration Python workloads
    adapter_passes: float  # per pass, in calibration Python workloads
    engine_steps: float  # per vLLM step, in calibration Python workloads
    link_bytes: float  # per second of streaming at the probe's bandwidth
    quantised_params: float  # per parameter, in the calibration's matmul FLOPs
    faulted_bytes: float  # per second of streaming at the probe's bandwidth
    fitted_on: str = ""


FITTED = (
    "flops",
    "bytes",
    "layer_passes",
    "adapter_passes",
    "engine_steps",
    "link_bytes",
    "quantised_params",
    "faulted_bytes",
)


def calibration_units(work: Work, torch_s: float, python_s: float, gb_s: float, sharing: int = 1) -> np.ndarray:
    """``work`` as seconds of the calibration's own kinds of work, in ``FITTED`` order; ``sharing``: ranks that
    split the machine's cores (the calibration's matmuls ran on all of them)."""
    matmul_s = torch_s * sharing / CALIBRATION_FLOPS
    return np.array(
        [
            work.flops * matmul_s,
            work.bytes / (gb_s * 1e9),
            work.layer_passes * python_s,
            work.adapter_passes * python_s,
            work.engine_steps * python_s,
            work.link_bytes / (gb_s * 1e9),
            work.quantised_params * matmul_s,
            work.faulted_bytes / (gb_s * 1e9),
        ]
    )


def measured_rates(
    coefficients: Coefficients, torch_s: float, python_s: float, gb_s: float, sharing: int = 1, reward_s: float = 0.0
) -> Rates:
    """The rates of one rank on a machine with this calibration, ``sharing`` its cores with as many ranks."""
    c = coefficients
    matmul_s = torch_s * sharing / CALIBRATION_FLOPS
    return Rates(
        flop_s=1 / (c.flops * matmul_s),
        bytes_s=gb_s * 1e9 / c.bytes,
        layer_pass_s=c.layer_passes * python_s,
        adapter_pass_s=c.adapter_passes * python_s,
        engine_step_s=c.engine_steps * python_s,
        link_bytes_s=gb_s * 1e9 / c.link_bytes if c.link_bytes else float("inf"),
        host_bytes_s=gb_s * 1e9,
        quantised_param_s=c.quantised_params * matmul_s,
        faulted_bytes_s=gb_s * 1e9 / c.faulted_bytes if c.faulted_bytes else float("inf"),
        reward_s=reward_s,
        source=f"this machine's calibration x coefficients fitted on {c.fitted_on}",
    )


def fit(rows: list[tuple[np.ndarray, float]], fitted_on: str) -> Coefficients:
    """Non-negative coefficients minimising the relative error over ``rows`` (each a phase's work in
    calibration units and its measured seconds): every subset of coefficients solved by least squares,
    the best whose solution is non-negative. A coefficient no row exercises stays 0."""
    units = np.array([u for u, _ in rows])
    seconds = np.array([s for _, s in rows])
    weighted = units / seconds[:, None]  # relative error: each row scaled by its measured seconds
    used = [i for i in range(units.shape[1]) if units[:, i].any()]
    best, best_residual = np.zeros(units.shape[1]), float("inf")
    for size in range(1, len(used) + 1):
        for subset in itertools.combinations(used, size):
            solution, *_ = np.linalg.lstsq(weighted[:, subset], np.ones(len(rows)), rcond=None)
            if (solution < 0).any():
                continue
            full = np.zeros(units.shape[1])
            full[list(subset)] = solution
            residual = float(np.sum((weighted @ full - 1) ** 2))
            if residual < best_residual:
                best, best_residual = full, residual
    return Coefficients(*best, fitted_on=fitted_on)
