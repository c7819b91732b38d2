"""The time model's units: the work a phase does (``Work``: FLOPs, bytes over each path, eager passes, engine steps,
collectives) and the rates a machine does each at (``Rates``), so that a phase's seconds are its work over rates;
and the work of the passes every phase is counted from (a forward, training's passes, attention's FLOPs, QLoRA's
dequantisation, the weights' bytes)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from benchmarks.catalog.profiles import Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.predict import DTYPE_BYTES, LORA_TARGETS, qlora_weight_bytes
from benchmarks.model.memory.terms import NF4_BYTES_PER_PARAM, quantised_params

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


@dataclass(frozen=True)
class Work:
    """One phase's work, in the units a rate divides."""

    flops: float = 0.0  # matmul and attention FLOPs
    expert_flops: float = 0.0  # a mixture of experts' routed experts' matmuls in training and log-probs
    bytes: float = 0.0  # bytes streamed through memory (decode's weights and KV, the optimizer's states)
    # runs of alike decode steps, each (steps, FLOPs a step, bytes a step): a step takes the longer of its FLOPs
    # and its bytes (it is bound by one or the other, both overlap), not their sum
    roofline: tuple[tuple[float, float, float], ...] = ()
    layer_passes: float = 0.0  # a layer run once eagerly: its kernel launches, its Python dispatch
    adapter_passes: float = 0.0  # a LoRA adapter run once eagerly (seven a layer, on every linear)
    engine_steps: float = 0.0  # vLLM decode steps: its scheduler and sampler
    link_bytes: float = 0.0  # bytes between ranks of one machine (ZeRO, tensor parallelism) or to a vLLM server
    network_bytes: float = 0.0  # bytes between ranks of different machines, per GPU
    collectives: float = 0.0  # small collectives whose latency, not their bytes, costs (TP's all-reduces)
    host_bytes: float = 0.0  # bytes between device and host (sleep mode)
    quantised_params: float = 0.0  # parameters 8-bit AdamW (de)quantises
    faulted_bytes: float = 0.0  # fresh pages a CPU maps and zero-fills each step (glibc's thresholds fixed)
    completions: float = 0.0  # completions the reward scores

    def __add__(self, other: Work) -> Work:
        return Work(**{name: getattr(self, name) + getattr(other, name) for name in WORK_FIELDS})

    def __mul__(self, times: float) -> Work:
        scaled = {name: getattr(self, name) * times for name in WORK_FIELDS if name != "roofline"}
        return Work(**scaled, roofline=tuple((steps * times, f, b) for steps, f, b in self.roofline))

    def bound(self, flop_s: float, bytes_s: float) -> tuple[float, float]:
        """The decode runs' FLOPs where they bind at these rates, and their bytes where those do."""
        flops = sum(steps * f for steps, f, b in self.roofline if f / flop_s >= b / bytes_s)
        nbytes = sum(steps * b for steps, f, b in self.roofline if f / flop_s < b / bytes_s)
        return flops, nbytes


WORK_FIELDS = tuple(f.name for f in fields(Work))


@dataclass(frozen=True)
class Rates:
    """What a machine achieves: each a rate of its own, so that phases are work over rates."""

    flop_s: float
    expert_flop_s: float  # a MoE's routed experts: small grouped GEMMs, tokens permuted to them and back
    bytes_s: float
    layer_pass_s: float
    adapter_pass_s: float
    engine_step_s: float
    link_bytes_s: float
    host_bytes_s: float
    quantised_param_s: float  # seconds a parameter of 8-bit AdamW's (de)quantisation
    faulted_bytes_s: float  # fresh pages mapped and zero-filled per second
    reward_s: float = 0.0  # seconds a completion of the reward that runs
    network_bytes_s: float = float("inf")  # per GPU between machines
    # a decode step takes the longer of its FLOPs and bytes (a GPU's kernels overlap them); False: their sum, as
    # this suite's CPU runs fit better (held out: 34% worst against 36%), eager generate at their small sizes
    overlapped: bool = True
    collective_s: float = 0.0  # a small collective's latency
    device_bytes: float = math.inf  # each device's memory: a vLLM engine's share of it bounds its KV cache
    source: str = ""

    def roofline_s(self, work: Work) -> float:
        join = max if self.overlapped else (lambda a, b: a + b)
        return sum(steps * join(flops / self.flop_s, nbytes / self.bytes_s) for steps, flops, nbytes in work.roofline)

    def seconds(self, work: Work) -> float:
        return (
            work.flops / self.flop_s
            + work.expert_flops / self.expert_flop_s
            + work.bytes / self.bytes_s
            + self.roofline_s(work)
            + work.layer_passes * self.layer_pass_s
            + work.adapter_passes * self.adapter_pass_s
            + work.engine_steps * self.engine_step_s
            + work.link_bytes / self.link_bytes_s
            + work.network_bytes / self.network_bytes_s
            + work.collectives * self.collective_s
            + work.host_bytes / self.host_bytes_s
            + work.quantised_params * self.quantised_param_s
            + work.faulted_bytes / self.faulted_bytes_s
            + work.completions * self.reward_s
        )


def matmul_params(shape: Shape) -> int:
    """The parameters a token multiplies through: an untied input embedding is only looked up."""
    untied_input = 0 if shape.tie_word_embeddings else shape.vocab_size * shape.hidden_size
    return shape.active_param_count() - untied_input


def routed_params(shape: Shape) -> int:
    """The routed experts' parameters a token multiplies through: ``num_experts_per_tok`` a layer (none if dense)."""
    return shape.num_hidden_layers * shape.num_experts_per_tok * shape.expert_params() if shape.moe else 0


def forward_work(shape: Shape, sequences: float, length: int) -> Work:
    """One training forward over ``sequences`` of ``length`` tokens: 2 FLOPs a parameter a token through every
    matmul, a MoE's routed experts apart (``Work.expert_flops``), and attention's own."""
    routed = routed_params(shape)
    dense = 2 * (matmul_params(shape) - routed) * sequences * length + attention_flops(shape, sequences, length)
    return Work(flops=dense, expert_flops=2 * routed * sequences * length)


def training_passes(levers: Levers) -> int:
    """Forwards' worth of a backward: the forward, input gradients, weight gradients (not under PEFT), and a
    recompute with checkpointing."""
    return 2 + (0 if levers.peft else 1) + (1 if levers.gradient_checkpointing else 0)


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


def gathered(levers: Levers, nbytes: float, times: float = 1.0) -> Work:
    """An all-gather (or reduce-scatter) of ``nbytes`` over every rank, ``times`` over: each rank sends and receives
    all but its own share, over NVLink within a machine, over the network between machines (each GPU's own NIC:
    a ring crossing machines runs at its slowest hop)."""
    n = levers.world_size
    moved = nbytes * (n - 1) / n * times
    return Work(network_bytes=moved) if levers.num_machines > 1 else Work(link_bytes=moved)
