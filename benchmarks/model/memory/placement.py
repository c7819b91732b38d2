"""A lever set placed before it is priced: over a count of GPUs (``on_gpus``: ranks a machine, ZeRO-3 for many,
a colocated engine's tensor-parallel split), with a colocated engine's share sized to its rollout, and as a run of
a profile hands it to the trainer (``as_run``)."""

from __future__ import annotations

from benchmarks.catalog.profiles import GrpoBench, Hardware, Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.terms import GIB, Workload, engine_need

# GPU counts a size class is sized for: one machine's 1, 2, 4, 8 GPUs, then whole 8-GPU machines.
GPU_COUNTS = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def on_gpus(levers: Levers, count: int) -> Levers:
    """``levers`` over ``count`` GPUs: up to 8 ranks a machine; many ranks with no distributed type
    given run ZeRO-3 (TRL's recipe for large models); a colocated engine split over a machine's ranks
    (tensor parallel), as TRL's ``vllm_tensor_parallel_size`` does. Levers already on ``count`` GPUs keep their
    split into machines."""
    machines = levers.num_machines if levers.world_size == count else max(1, count // 8)
    ranks = count // machines
    kind = levers.distributed_type if count == 1 or levers.distributed_type != "no" else "zero3"
    tp = (
        ranks
        if levers.use_vllm and levers.vllm_mode == "colocate" and levers.vllm_tensor_parallel_size == 1
        else levers.vllm_tensor_parallel_size
    )
    offloaded = "cpu" in (levers.offload_param_device, levers.offload_optimizer_device)
    return levers.changed(
        num_processes=ranks,
        num_machines=machines,
        distributed_type="no" if count == 1 and not offloaded else kind,  # ZeRO offload runs on one rank too
        vllm_tensor_parallel_size=tp if ranks % tp == 0 else 1,
    )


def engine_sized_to_rollout(shape: Shape, dtype: str, levers: Levers, work: Workload, hardware: Hardware) -> Levers:
    """A colocated engine's share sized to the rollout: its weights in its own precision (4-bit for QLoRA, as TRL
    starts it), the workload's KV cache and vLLM's overheads, with 10% slack (at most 0.95 of the device)."""
    need = engine_need(shape, dtype, levers, work, unified=bool(hardware.unified_floor_gib)).total
    return levers.changed(vllm_gpu_memory_utilization=min(0.95, 1.1 * need / (hardware.memory_gib * GIB)))


def as_run(bench: GrpoBench, levers: Levers, shape: Shape, hardware: Hardware) -> Levers:
    """The levers as a run of ``bench`` hands them to the trainer: an unset ``vllm_max_model_length`` becomes the
    workload's prompt + completion (+ 8 for special tokens), so that vLLM reserves KV for this run's sequences and
    not the shape's whole context; with ``engine_share = "rollout"``, a colocated engine on a GPU of known memory
    gets the share its rollout needs."""
    if levers.vllm_max_model_length is None:
        levers = levers.changed(vllm_max_model_length=bench.prompt_words + levers.max_completion_length + 8)
    colocated = levers.use_vllm and levers.vllm_mode == "colocate" and hardware.gpu_class != "cpu"
    if bench.engine_share == "rollout" and colocated and hardware.memory_gib:
        work = Workload.from_levers(levers, bench.prompt_words)
        levers = engine_sized_to_rollout(shape, bench.dtype, levers, work, hardware)
    return levers
