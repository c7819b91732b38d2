"""Seconds per phase of one GRPO step, per rank: the time model beside the memory model (``memory.predict``).

Each phase is work over a rate. ``phase_work`` counts the work from the shape, the levers and the workload;
``Rates`` are the machine's: on the machine at hand from its calibration (``benchmarks.run.pace``) and
coefficients fitted on one named run (``fit``), on a GPU class from its catalogued peaks times an efficiency
stated with its source (``calibration.fitted_rates``), an assumption until a run on that class replaces it.

- rollout: by the engine that runs it (``engine_of``): a colocated vLLM engine decodes its tensor-parallel
  group's sequences, a server every rank's, transformers' generate a rank's own. Prefill's FLOPs (a prompt once
  for its generations under vLLM's prefix cache); each decode step the longer of its bytes (1 / TP of the
  weights, the live sequences' KV cache) and its FLOPs at their rates, plus a per-step overhead (eager kernel
  launches and dispatch, or vLLM's engine step) and TP's all-reduces. The rollout lasts until its longest
  completion ends, the batch thinning as shorter ones do, sequences beyond what the engine's KV cache holds
  waiting their turn (``schedule``). With vLLM colocated the policy's weights are copied into the engine each
  step, asleep moved to and from the host, on a server broadcast.
- logprob: a forward without gradients over the generation batch for the old policy (vLLM's importance
  sampling) and one for the reference (beta > 0), ZeRO-3 gathering the weights for each micro-batch.
- forward_backward: 6 FLOPs a parameter a token (8 with checkpointing's recompute; LoRA's frozen weights
  skip their weight gradients: 4, or 6) over micro-batches padded to their longest completion, attention's
  own FLOPs (a MoE's routed experts' at a rate of their own), and the ranks' collectives
  (``collective_work``), over NVLink in a machine and each GPU's share of the network between machines.
- optimizer: AdamW reads parameters, gradients and two states and writes three; 8-bit AdamW's states are a
  byte each, and on a CPU its blockwise (de)quantisation costs a fitted time a parameter on top.
- reward: the completions times the seconds a completion of the reward that runs (the rewards part's figure).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from benchmarks.catalog.profiles import Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.decode_bytes import decode_step_bytes, kv_bytes_per_token
from benchmarks.model.memory.predict import (
    DTYPE_BYTES,
    Workload,
    layer_activation_bytes,
)
from benchmarks.model.memory.terms import (
    engine_need,
    trainable_element_bytes,
    trainable_params,
)
from benchmarks.model.memory.vllm_engine import VLLM_DEFAULT_SEQS
from benchmarks.model.time.schedule import Engine, decode_schedule, expected_longest, running_age
from benchmarks.model.time.work_rates import (
    Rates,
    Work,
    attention_flops,
    dequantised,
    eager_passes,
    forward_work,
    matmul_params,
    training_passes,
    weight_bytes,
)

PHASES = ("rollout", "sleep_wake", "reward", "logprob", "forward_backward", "optimizer")


SEGMENTS = 16  # a rollout's decode steps priced in this many runs of alike steps


def decode_work(shape: Shape, per_byte: float, engine: Engine, work: Workload) -> Work:
    """Every decode step of one GPU of ``engine``: the weights it holds (1 / TP of them) and the KV cache of the
    live sequences (its share of the KV heads) read, against 1 / TP of the step's FLOPs, the larger of the two
    deciding (``Work.roofline``); each step two all-reduces a layer of the live batch's hidden states where
    TP > 1."""
    tp = engine.tensor_parallel
    live, ages = decode_schedule(engine, work.completion_tokens, work.mean_completion_tokens)
    kv_split = min(tp, shape.num_key_value_heads)
    width = shape.num_attention_heads * shape.head_dim
    n = matmul_params(shape)
    edges = np.linspace(0, len(live), min(SEGMENTS, len(live)) + 1).astype(int)
    steps = np.diff(edges)
    batches = np.add.reduceat(live, edges[:-1]) / steps
    contexts = work.prompt_tokens + np.add.reduceat(ages, edges[:-1]) / steps + 1
    kv = batches * (contexts + 1) * kv_bytes_per_token(shape, per_byte) / kv_split
    flops = (2 * n * batches + 4 * shape.num_hidden_layers * width * contexts * batches) / tp
    runs = []
    for count, batch, run_flops, run_kv in zip(steps.tolist(), batches.tolist(), flops.tolist(), kv.tolist()):
        weights = streamed_weights(shape, per_byte, max(1, round(batch)))
        runs.append((float(count), run_flops, weights / tp + run_kv))
    out = Work(roofline=tuple(runs))
    if tp > 1:
        reduced = 2 * shape.num_hidden_layers * shape.hidden_size * 2 * float(live.sum())  # bf16 activations
        out += Work(link_bytes=2 * (tp - 1) / tp * reduced, collectives=2 * shape.num_hidden_layers * len(live))
    return out


@functools.lru_cache(maxsize=4096)
def streamed_weights(shape: Shape, per_byte: float, batch: int) -> int:
    """The weight bytes a decode step of ``batch`` sequences reads (a MoE's experts depend on the batch)."""
    return decode_step_bytes(shape, per_byte, batch, 0).weights


def prefill_work(shape: Shape, engine: Engine, work: Workload) -> Work:
    """The prompts' forward on one GPU of ``engine``: a prompt once for all its generations where they share it."""
    prompts = engine.sequences / engine.generations if engine.shared_prefill else engine.sequences
    n = matmul_params(shape)
    flops = 2 * n * prompts * work.prompt_tokens + attention_flops(shape, prompts, work.prompt_tokens)
    return Work(flops=flops / engine.tensor_parallel)


def engine_of(levers: Levers, work: Workload, held: float = math.inf) -> Engine:
    """The engine a rank's rollout runs on: transformers' generate on the rank's own sequences; a colocated vLLM
    engine over ``vllm_tensor_parallel_size`` ranks, decoding all their sequences (TRL gathers the group's
    prompts and sizes its max_num_seqs to them); a server decoding every rank's, split over its data-parallel
    engines, at most vLLM's default max_num_seqs of them at once (`trl vllm-serve` sets none); a vLLM engine's KV
    cache holding ``held`` sequences at once."""
    if not levers.use_vllm:
        return Engine(work.rollout_sequences)
    if levers.vllm_mode == "server":
        sequences = work.rollout_sequences * levers.world_size
        engines = levers.vllm_server_data_parallel_size
        tp = levers.vllm_server_tensor_parallel_size
        return Engine(math.ceil(sequences / engines), tp, levers.num_generations, True, min(held, VLLM_DEFAULT_SEQS))
    tp = levers.vllm_tensor_parallel_size
    return Engine(work.rollout_sequences * tp, tp, levers.num_generations, True, held)


def kv_held(shape: Shape, dtype: str, levers: Levers, work: Workload, device_bytes: float) -> float:
    """Sequences a vLLM engine's KV cache holds at once, where fewer than the engine is given (``engine_of``): its
    share of each of its GPUs' ``device_bytes`` less its weights and vLLM's own overheads (``engine_need``, as the
    memory model holds them), over a running sequence's KV at its prompt and mean age (``running_age``); each GPU
    holds 1 / TP of the KV heads (all of them where TP exceeds their count). Unbounded where it holds them all,
    without vLLM or a device size, and where the share cannot start the engine at all: the memory model refuses
    that setup, and the time model times it as if its share held the rollout."""
    if not levers.use_vllm or math.isinf(device_bytes):
        return math.inf
    need = engine_need(shape, dtype, levers, work)
    room = levers.vllm_gpu_memory_utilization * device_bytes - need.weights - need.overhead
    if room < need.kv_one_sequence:
        return math.inf
    tp = levers.vllm_server_tensor_parallel_size if levers.vllm_mode == "server" else levers.vllm_tensor_parallel_size
    per_token = kv_bytes_per_token(shape, DTYPE_BYTES[dtype]) / min(tp, shape.num_key_value_heads)
    age = running_age(work.completion_tokens, work.mean_completion_tokens)
    held = room / per_token / (work.prompt_tokens + age)
    return held if held < engine_of(levers, work).sequences else math.inf


def generation_work(shape: Shape, per_byte: float, engine: Engine, work: Workload) -> Work:
    """A vLLM engine's whole generation on one of its GPUs: the prompts' prefill, every decode step, and the engine's
    own work each step (the prefill's included)."""
    steps = len(decode_schedule(engine, work.completion_tokens, work.mean_completion_tokens)[0])
    return prefill_work(shape, engine, work) + decode_work(shape, per_byte, engine, work) + Work(engine_steps=steps + 1)


def rollout_work(shape: Shape, dtype: str, levers: Levers, work: Workload, held: float) -> dict[str, Work]:
    """The rollout of the whole generation batch by the engine that runs it (``engine_of``), its KV cache holding
    ``held`` sequences at once, and sleep mode's transfers."""
    weights = weight_bytes(shape, dtype, levers)
    engine = engine_of(levers, work, held)
    per_byte = weights / shape.param_count()
    steps = len(decode_schedule(engine, work.completion_tokens, work.mean_completion_tokens)[0])
    extra = dequantised(shape, levers, 1 + steps * (engine.sequences > 1))
    if levers.distributed_type == "zero3" and levers.ds3_gather_for_generation and levers.world_size > 1:
        extra += gathered(levers, weights)  # every partition gathered to generate (or to sync the engine)
    if not levers.use_vllm:
        eager = prefill_work(shape, engine, work) + decode_work(shape, per_byte, engine, work)
        return {"rollout": (eager + extra + eager_passes(shape, levers, steps + 1)) * work.rollouts}
    engine_work = generation_work(shape, per_byte, engine, work) + extra
    if levers.vllm_mode == "server":
        engine_work += Work(link_bytes=weights)  # the policy's weights broadcast to the server each step
    else:
        engine_work += Work(bytes=2 * weights / engine.tensor_parallel)  # copied into its engine: read and written
    out = {"rollout": engine_work * work.rollouts}
    if levers.vllm_enable_sleep_mode:
        out["sleep_wake"] = Work(host_bytes=2 * weights / engine.tensor_parallel) * work.rollouts  # to the host, back
    return out


def gathered(levers: Levers, nbytes: float, times: float = 1.0) -> Work:
    """An all-gather (or reduce-scatter) of ``nbytes`` over every rank, ``times`` over: each rank sends and receives
    all but its own share, over NVLink within a machine, over the network between machines (each GPU's own NIC:
    a ring crossing machines runs at its slowest hop)."""
    n = levers.world_size
    moved = nbytes * (n - 1) / n * times
    return Work(network_bytes=moved) if levers.num_machines > 1 else Work(link_bytes=moved)


def training_work(shape: Shape, dtype: str, levers: Levers, work: Workload) -> dict[str, Work]:
    """Log-probs, forward and backward, the optimizer: over every micro-batch of the step. TRL pads each micro-batch
    to its longest completion: with lengths below the maximum, the longest of ``completions`` of them; a packed
    micro-batch (``Workload.packed``) runs its sequences' own lengths, their mean each."""
    if work.packed:
        longest = work.mean_completion_tokens
    else:
        longest = expected_longest(work.completions, work.completion_tokens, work.mean_completion_tokens)
    length = work.prompt_tokens + longest
    sequences = work.step_sequences
    micro_batches = sequences / work.completions
    forward = (
        forward_work(shape, sequences, length)
        + eager_passes(shape, levers, micro_batches)
        + dequantised(shape, levers, micro_batches)
    )
    out = {"forward_backward": forward * training_passes(levers)}
    logprob_forwards = (1 if levers.use_vllm else 0) + (1 if levers.beta > 0 else 0)
    if logprob_forwards:
        out["logprob"] = forward * logprob_forwards
    out["optimizer"] = optimizer_work(shape, dtype, levers)
    if levers.world_size > 1 and levers.distributed_type != "no":
        collectives = collective_work(shape, dtype, levers, micro_batches, logprob_forwards)
        for phase, moved in collectives.items():
            out[phase] += moved
        if levers.distributed_type.startswith("zero"):  # DeepSpeed steps inside accelerate's backward
            out["forward_backward"] += out.pop("optimizer")
    return out


# DeepSpeed ZeRO-3 keeps a gathered parameter whose next use comes within this many parameters of the trace
# (``stage3_max_reuse_distance``, default 1e9), rather than releasing it and gathering it again
ZERO3_REUSE_DISTANCE = 1e9


def regathered_for_backward(shape: Shape) -> float:
    """The share of the weights ZeRO-3 gathers again for the backward: a layer's weights are reused within the
    reuse distance where the forward and backward of the layers after it hold fewer parameters (about twice the
    parameters after it); checkpointing's recompute runs just before its layer's backward and shares the gather."""
    return max(0.0, 1 - ZERO3_REUSE_DISTANCE / (2 * shape.param_count()))


def collective_work(
    shape: Shape, dtype: str, levers: Levers, micro_batches: float, logprob_forwards: int
) -> dict[str, Work]:
    """What the ranks exchange in a step. DDP all-reduces the accumulated gradients once (twice their bytes);
    ZeRO-1 reduce-scatters them once and ZeRO-2 at every micro-batch, both gathering the updated parameters
    once; ZeRO-3 and FSDP gather every weight, the frozen base included, for the forward of every micro-batch and
    again for its backward (``regathered_for_backward``), and reduce-scatter the gradients at each (the ZeRO
    paper's 3 copies a step for one micro-batch of a large model)."""
    gradients = trainable_params(shape, levers) * DTYPE_BYTES[dtype]
    kind = levers.distributed_type
    if kind == "ddp":
        return {"forward_backward": gathered(levers, gradients, 2)}
    if kind in ("zero1", "zero2"):
        reductions = micro_batches if kind == "zero2" else 1
        return {"forward_backward": gathered(levers, gradients, reductions + 1)}
    weights = weight_bytes(shape, dtype, levers)
    gathers = 1 + regathered_for_backward(shape)
    reduced = gathered(levers, gradients, micro_batches)
    out = {"forward_backward": gathered(levers, weights, gathers * micro_batches) + reduced}
    if logprob_forwards:
        out["logprob"] = gathered(levers, weights, logprob_forwards * micro_batches)
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
    positions = work.step_sequences * (work.prompt_tokens + work.completion_tokens)
    layer = layer_activation_bytes(shape, b, peft, lora_r=levers.lora_r)
    return {
        "forward_backward": Work(faulted_bytes=shape.num_hidden_layers * layer * positions + trainable),
        "optimizer": Work(faulted_bytes=2 * trainable),
    }


def phase_work(
    shape: Shape,
    dtype: str,
    levers: Levers,
    work: Workload,
    malloc_fixed: bool = False,
    held: float = math.inf,
) -> dict[str, Work]:
    """Every phase's work for one optimizer step of one rank, in ``PHASES`` order; ``malloc_fixed``: on a CPU
    under fixed glibc thresholds (``faulted_work``); ``held``: the sequences a vLLM engine's KV cache holds at
    once (``kv_held``)."""
    found = {
        **rollout_work(shape, dtype, levers, work, held),
        "reward": Work(completions=work.step_sequences),
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
    completion_tokens: float  # generated by this rank in the step
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
    held = kv_held(shape, dtype, levers, work, rates.device_bytes)
    phases = phase_work(shape, dtype, levers, work, malloc_fixed, held)
    return timed(phases, rates, work, levers.world_size)


def timed(phases: dict[str, Work], rates: Rates, work: Workload, gpus: int) -> StepTime:
    """Each phase's work at ``rates``: one rank's step."""
    seconds = {phase: rates.seconds(w) for phase, w in phases.items()}
    return StepTime(seconds, work.step_sequences * work.mean_completion_tokens, gpus)
