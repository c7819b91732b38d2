"""Model states per rank: how ZeRO's stages and FSDP2 partition parameters, gradients, the fp32 master and the
optimizer states over the ranks, what offload moves to the host, and the largest layer gathered at once
(``rank_model_states``; DeepSpeed's own estimators count the same)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.catalog.profiles import Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.terms import DTYPE_BYTES, qlora_weight_bytes, trainable_element_bytes, trainable_params

# The ZeRO stage each distributed type runs (DDP: none; FSDP2 shards like stage 3).
ZERO_STAGE = {"no": 0, "ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp2": 3}


def largest_layer_params(shape: Shape) -> int:
    """The most parameters one module holds of its own: what ZeRO-3 and FSDP2 gather at once, and what
    DeepSpeed's estimator takes as ``largest_layer_params`` (``estimate_zero3_model_states_mem_needs_all_live``
    takes the largest module's own parameters): the embedding, a dense MLP's widest linear, or a MoE's
    experts, which transformers 5 holds as one module of 3-D tensors."""
    h = shape.hidden_size
    within = shape.num_experts * shape.expert_params() if shape.moe else h * shape.intermediate_size
    return max(shape.vocab_size * h, within)


@dataclass(frozen=True)
class RankModelStates:
    """Predicted bytes of model state on one rank's device (``schema.ModelStates``'s terms, and DeepSpeed's
    fp32 gradient copy); ``gathered`` is the largest layer gathered at once (ZeRO-3, FSDP2), ``host`` what
    offload keeps in host memory instead."""

    parameters: int
    master: int
    optimizer: int
    gradients: int
    fp32_gradients: int = 0
    gathered: int = 0
    host: int = 0

    @property
    def total(self) -> int:
        """The states a rank holds across the step (what it holds after an optimizer step, but for
        ZeRO-1/2, which free their gradient partition then)."""
        return self.parameters + self.master + self.optimizer + self.gradients


def rank_model_states(shape: Shape, dtype: str, levers: Levers) -> RankModelStates:
    """Model states per rank over ``levers.world_size`` ranks, as the ZeRO paper partitions them
    (Rajbhandari et al. 2020: ZeRO-1 optimizer states, ZeRO-2 + gradients, ZeRO-3 + parameters) and as
    DeepSpeed counts them in its own estimators (``estimate_zero2/3_model_states_mem_needs``: per parameter
    2 B 16-bit parameters, and of each rank's partition 2 B 16-bit and 4 B fp32 gradients, 4 B fp32
    master, 8 B AdamW states; ZeRO-3 accumulates gradients in fp32 only; the largest layer gathered at
    4 B a parameter). DeepSpeed keeps the fp32 master even for fp32 parameters (``clone().float()`` in
    stage_1_and_2.py and stage3.py). Optimizer offload moves master, states and gradients to the host,
    parameter offload (ZeRO-3) the parameter partitions too. Without DeepSpeed (DDP, FSDP2) the optimizer
    keeps its states in the parameters' dtype and there is no master; FSDP2 shards all three."""
    b = DTYPE_BYTES[dtype]
    params = shape.param_count()
    peft = levers.peft
    trainable = trainable_params(shape, levers)
    trainable_bytes = trainable_element_bytes(levers, dtype)
    world, stage = levers.world_size, ZERO_STAGE[levers.distributed_type]
    deepspeed = levers.distributed_type.startswith("zero")
    weights = qlora_weight_bytes(shape, b) if levers.model == "qlora" else params * b
    parameters = weights + (trainable * trainable_bytes if peft else 0)
    if stage == 3:
        parameters /= world
    states = 1 if levers.optim.endswith("8bit") else (4 if deepspeed else trainable_bytes)
    optimizer = 2 * trainable * states / (world if stage >= 1 else 1)
    if deepspeed and stage == 3:
        gradients = trainable * 4 / world  # fp32 accumulation partition
    else:
        gradients = trainable * trainable_bytes / (world if stage >= 2 else 1)
    master = trainable * 4 / world if deepspeed else 0
    fp32_gradients = trainable * 4 / world if deepspeed and stage < 3 and trainable_bytes < 4 else 0
    gathered = 4 * largest_layer_params(shape) if stage == 3 else 0
    host = 0.0
    if deepspeed and levers.offload_optimizer_device == "cpu":
        host += master + optimizer + gradients + fp32_gradients
        master = optimizer = gradients = fp32_gradients = 0
    if deepspeed and levers.offload_param_device == "cpu":
        host, parameters = host + parameters, 0
    return RankModelStates(
        parameters=int(parameters),
        master=int(master),
        optimizer=int(optimizer),
        gradients=int(gradients),
        fp32_gradients=int(fp32_gradients),
        gathered=int(gathered),
        host=int(host),
    )
