"""Seconds per phase of one GRPO step, per rank: the time model beside the memory model (``memory.predict``).

Each phase is work over a rate. ``phase_work`` counts the work from the shape, the levers and the workload;
``Rates`` (``work_rates``) are the machine's: on the machine at hand from its calibration
(``benchmarks.run.machine.pace``) and coefficients fitted on one named run (``rates.fit``), on a GPU class from
its catalogued peaks times an efficiency stated with its source (``calibration.fitted_rates``), an assumption until
a run on that class replaces it.

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

import math
from dataclasses import dataclass

from benchmarks.catalog.profiles import Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.predict import (
    DTYPE_BYTES,
    Workload,
    layer_activation_bytes,
)
from benchmarks.model.memory.terms import (
    trainable_element_bytes,
    trainable_params,
)
from benchmarks.model.time.engine_work import kv_held, rollout_work
from benchmarks.model.time.schedule import expected_longest
from benchmarks.model.time.work_rates import (
    Rates,
    Work,
    dequantised,
    eager_passes,
    forward_work,
    gathered,
    training_passes,
    weight_bytes,
)

PHASES = ("rollout", "sleep_wake", "reward", "logprob", "forward_backward", "optimizer")


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
