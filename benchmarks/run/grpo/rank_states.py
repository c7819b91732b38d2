"""What a rank holds and how it runs, read from the trainer as accelerate prepared it: the bytes of its
model states (parameters, fp32 master, optimizer states, gradients), and the world size, distributed type
and ZeRO stage it really runs, checked against what the levers asked for (``RanLessThanAsked`` where they differ)."""

from __future__ import annotations

from typing import Any

from benchmarks.catalog.levers import Levers
from benchmarks.run.grpo.phases import RANK


def tensor_bytes(tensors: Any) -> int:
    import torch

    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes held in the optimizer's state tensors (exact, unlike RSS, which holds caches too)."""
    return sum(tensor_bytes(state.values()) for state in optimizer.state.values())


def local_bytes(parameter: Any) -> int:
    """The storage a rank holds for one parameter: its ZeRO-3 partition, its FSDP2 shard, else itself."""
    held = getattr(parameter, "ds_tensor", None)
    if held is None:
        held = parameter.to_local() if hasattr(parameter, "to_local") else parameter.data
    return held.numel() * held.element_size()


def full_numel(parameter: Any) -> int:
    return getattr(parameter, "ds_numel", parameter.numel())


def model_states(trainer: Any, grad_bytes: int) -> dict[str, int]:
    """The model states this rank holds, read from its tensors (``schema.ModelStates``). Under
    DeepSpeed the optimizer is its ZeRO optimizer: fp32 master partitions, the inner optimizer's
    state, and its flat gradient partition (gradients never reach ``param.grad`` there)."""
    parameters = sum(local_bytes(p) for p in trainer.model.parameters())
    engine = getattr(trainer, "deepspeed", None)
    zero = getattr(engine, "optimizer", None) if engine is not None else None
    if zero is not None and hasattr(zero, "optimizer"):
        masters = getattr(zero, "single_partition_of_fp32_groups", None) or getattr(
            zero, "fp32_partitioned_groups_flat", []
        )
        master, inner = tensor_bytes(masters), zero.optimizer
        buffers = [getattr(zero, "grads_in_partition", None), getattr(zero, "grad_partitions_flat_buffer", None)]
        grad_bytes = tensor_bytes(buffers)
    else:
        master, inner = 0, trainer.optimizer
    optimizer = optimizer_state_bytes(inner)
    total = parameters + master + optimizer + grad_bytes
    return {"parameters": parameters, "master": master, "optimizer": optimizer, "gradients": grad_bytes, "total": total}


# What each lever value asks accelerate for (its DistributedType names), CPU and CUDA.
EXPECTED_TYPE = {"no": "NO", "zero1": "DEEPSPEED", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "fsdp2": "FSDP"}


class RanLessThanAsked(RuntimeError):
    """The launch ran less than the levers asked for (fewer ranks, another distributed type, no partitioning)."""


def distribution(trainer: Any, levers: Levers, cuda: bool) -> dict[str, Any]:
    """What really runs on this rank, checked against the levers; RanLessThanAsked names any mismatch."""
    import torch.distributed as dist

    state = trainer.accelerator.state
    world = dist.get_world_size() if dist.is_initialized() else 1
    kind = state.distributed_type.name
    expected_world = levers.num_processes * levers.num_machines
    expected_kind = EXPECTED_TYPE.get(levers.distributed_type) or ("MULTI_GPU" if cuda else "MULTI_CPU")
    plugin = getattr(state, "deepspeed_plugin", None)
    stage = plugin.zero_stage if plugin is not None else None
    fsdp = getattr(state, "fsdp_plugin", None)
    parameters = list(trainer.model.parameters())
    held = sum(local_bytes(p) / p.element_size() for p in parameters) / max(1, sum(full_numel(p) for p in parameters))
    found = {
        "world_size": world,
        "accelerate_processes": state.num_processes,
        "distributed_type": kind,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "zero_stage": stage,
        "fsdp_version": getattr(fsdp, "fsdp_version", None) if fsdp is not None else None,
        "held_parameter_fraction": held,
    }
    problems = []
    if world != expected_world or state.num_processes != expected_world:
        problems.append(
            f"{expected_world} ranks asked for, but torch.distributed has {world} and accelerate {state.num_processes}"
        )
    if kind != expected_kind:
        problems.append(f"distributed_type {levers.distributed_type!r} asked for, but accelerate runs {kind}")
    wanted_stage = int(levers.distributed_type[-1]) if levers.distributed_type.startswith("zero") else None
    if wanted_stage is not None and stage != wanted_stage:
        problems.append(f"ZeRO stage {wanted_stage} asked for, but DeepSpeed runs stage {stage}")
    if levers.distributed_type in ("zero3", "fsdp2") and expected_world > 1 and held > 1.5 / expected_world:
        problems.append(
            f"{levers.distributed_type} partitions the parameters over {expected_world} ranks, "
            f"but this rank holds {held:.0%} of them"
        )
    if problems:
        raise RanLessThanAsked("; ".join(problems) + f" (seen on rank {RANK}: {found})")
    if plugin is not None:
        found["notes"] = [
            "DeepSpeed steps its optimizer inside accelerate's backward: the optimizer's time and memory "
            "are in forward_backward"
        ]
    return found
