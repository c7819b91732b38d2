"""The rollout's work, by the engine that runs it (``engine_of``: a colocated vLLM engine, a server, or
transformers' generate): prefill once a prompt, decode steps each the longer of their bytes and FLOPs in runs of
alike steps, the KV cache an engine holds (``kv_held``), and what each step pays beyond the roofline. The phase
itself is priced in ``phase_seconds``."""

from __future__ import annotations

import functools
import math

import numpy as np

from benchmarks.catalog.profiles import Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.decode_bytes import decode_step_bytes, kv_bytes_per_token
from benchmarks.model.memory.predict import DTYPE_BYTES, Workload
from benchmarks.model.memory.terms import engine_need
from benchmarks.model.memory.vllm_engine import VLLM_DEFAULT_SEQS
from benchmarks.model.time.schedule import Engine, decode_schedule, running_age
from benchmarks.model.time.work_rates import (
    Work,
    attention_flops,
    dequantised,
    eager_passes,
    gathered,
    matmul_params,
    weight_bytes,
)

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
