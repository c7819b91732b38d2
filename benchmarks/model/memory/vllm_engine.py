"""What a vLLM engine holds beside its weights and KV cache, as vLLM's own start-up profiling accounts it: the
memory outside torch (the CUDA context's growth, NCCL's buffers where tensor parallelism runs), the activation
peak of its profile run, and its CUDA graphs. The first two come out of the ``gpu_memory_utilization`` share
before the KV cache does; the graphs are captured after the share is sized, on top of it.

Calibrated on vLLM's own logs, never fitted on what the suite scores: llm-d-planner committed vLLM 0.19.0's start-up
logs on H100 80GB (``accuracy/results/v0.19.0/logs/`` at llm-d-incubation/llm-d-planner@d3121e05), each with
``non_torch_memory``, ``PyTorch activation peak memory`` and the graphs' ``took N GiB``, at vLLM's defaults there:
``max_num_seqs`` 1024, ``max_num_batched_tokens`` 8192, graphs captured; tests/test_vllm_memory.py quotes them and
holds this model to them.

- Outside torch: 0.24-0.27 GiB on one GPU, 2.06-2.13 GiB a GPU under tensor parallelism of 2 or 4 (NCCL).
- The activation peak is the profile run's larger pass: the sampler over ``max_num_seqs`` rows of the vocabulary in
  fp32, about four copies (15.2-15.9 bytes a row and vocabulary entry over four dense models: the peak follows the
  vocabulary, not the width, and does not move with tensor parallelism), or the forward pass of
  ``max_num_batched_tokens`` tokens, whose widest point is the MLP's gate and up projections and its activation
  (3 x its width a token). At vLLM's defaults the sampler binds; TRL's colocated engine samples few rows and the
  forward of its 4096 tokens binds.
- CUDA graphs: 0.40 GiB and 0.01625 GiB a layer on one GPU (least squares over 28-40 layers, within 0.03 GiB of each),
  0.64 + 0.36 / TP of that under tensor parallelism (7B and 8B at TP 2 and 4, within 0.02 GiB). Captured for
  vLLM's default sizes (up to 512 sequences): for an engine of few sequences an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.catalog.profiles import Levers
from benchmarks.catalog.shapes import Shape

GIB = 2**30
NON_TORCH_BYTES = {1: int(0.25 * GIB), "parallel": int(2.1 * GIB)}
SAMPLER_BYTES_PER_LOGIT = 15.4  # the activation peak over max_num_seqs x vocab_size, at vLLM's defaults
FORWARD_WIDTHS = 3  # the MLP's gate and up projections and its activation, live at once a token
GRAPH_BYTES = int(0.40 * GIB)
GRAPH_BYTES_PER_LAYER = int(0.01625 * GIB)
# TRL 1.16's colocated engine: max_num_batched_tokens=4096 ("the V1 profiler is misled by the high default"),
# max_num_seqs = per_device_train_batch_size x vllm_tensor_parallel_size x steps_per_generation
TRL_BATCHED_TOKENS = 4096
# vLLM's own defaults (the engine `trl vllm-serve` starts, as llm-d-planner's logs show them on H100)
VLLM_DEFAULT_SEQS, VLLM_DEFAULT_BATCHED_TOKENS = 1024, 8192
# On unified memory (DGX Spark's GB10) vLLM reads free memory as the host's MemAvailable and charges every byte the
# host grows while the engine starts (Inductor's and Triton's compile heaps and page cache among them) to its memory
# outside torch, out of the KV cache, for good: 31.6 GiB in eugr/spark-vllm-docker pull request #286 (2026-06-12:
# "up to 30GB+", the KV cache "restricted to only 9.5 GiB instead of ... 40+ GiB", "recovering the lost ~31.6 GiB").
# One model's compile there: taken as the allowance a colocated engine's share keeps for it, an upper bound.
UNIFIED_START_GROWTH = int(31.6 * GIB)


@dataclass(frozen=True)
class Overheads:
    """An engine's own memory a GPU, in bytes: inside its share (outside torch, the profile run's activation
    peak) and on top of it (CUDA graphs)."""

    non_torch: int
    activations: int
    graphs: int

    @property
    def in_share(self) -> int:
        return self.non_torch + self.activations

    def words(self) -> str:
        return (
            f"outside torch {self.non_torch / GIB:.2f} + activation peak {self.activations / GIB:.2f} GiB "
            f"(vLLM's profiling), CUDA graphs {self.graphs / GIB:.2f} GiB on top"
        )


def overheads(shape: Shape, dtype_bytes: float, tp: int, max_num_seqs: int, batched_tokens: int) -> Overheads:
    """An engine's own memory a GPU, for ``shape`` over ``tp`` GPUs sampling ``max_num_seqs`` rows and profiling
    ``batched_tokens`` tokens in its forward."""
    sampler = max_num_seqs * shape.vocab_size * SAMPLER_BYTES_PER_LOGIT
    forward = batched_tokens * FORWARD_WIDTHS * shape.mlp_width * dtype_bytes / tp
    graphs = (GRAPH_BYTES + GRAPH_BYTES_PER_LAYER * shape.num_hidden_layers) * (0.64 + 0.36 / tp)
    non_torch = NON_TORCH_BYTES[1] if tp == 1 else NON_TORCH_BYTES["parallel"]
    return Overheads(non_torch, int(max(sampler, forward)), int(graphs))


def engine_overheads(shape: Shape, dtype_bytes: float, levers: Levers) -> Overheads:
    """The engine TRL 1.16 starts: colocated, with its own batch and token limits; a server at vLLM's defaults."""
    if levers.vllm_mode == "server":
        tp = levers.vllm_server_tensor_parallel_size
        return overheads(shape, dtype_bytes, tp, VLLM_DEFAULT_SEQS, VLLM_DEFAULT_BATCHED_TOKENS)
    tp = levers.vllm_tensor_parallel_size
    seqs = levers.per_device_train_batch_size * tp * levers.generation_steps
    return overheads(shape, dtype_bytes, tp, seqs, TRL_BATCHED_TOKENS)
