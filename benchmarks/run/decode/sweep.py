"""The decode part: the device's bandwidth ceiling probed, then one worker process per engine over the sweep's points
(``engines``), each stopped at its limit, each row judged against what physics allows
(``benchmarks.run.ceilings``) and written as it is measured, then the rollout's projections per hardware class.

This module imports no torch, transformers or vLLM: it runs the sweep from the parent, which must not initialise
CUDA through them."""

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
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.catalog.profiles import Hardware, load_hardware, load_shapes
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.decode_bytes import projections, projections_at_fraction
from benchmarks.results import schema
from benchmarks.run.ceilings import INVALID, decode_fault
from benchmarks.run.machine import nvml_gpus, provenance
from benchmarks.run.machine.bandwidth_probe import ceiling as ceiling_of
from benchmarks.run.model_dirs import materialise_recorded
from benchmarks.run.vllm_env import VLLM_CPU_ENV, sampler_env


def run_sweep(
    profile: Any,
    model_dir: str,
    shape: Shape,
    ceiling: schema.BestKernel,
    hardware: Hardware,
    add: Callable[[schema.DecodePoint], None],
    pinned: dict[str, str] | None = None,
) -> None:
    """Every engine x point of the profile's sweep, one worker process per engine, each stopped at its limit; each
    row ``add``ed as it is measured, and judged against what physics allows on ``hardware``."""
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


WORKER = [sys.executable, "-m", "benchmarks.run.decode.engines"]  # one engine's decode worker: the job on stdin


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
    """``python -m benchmarks.run.decode.engines`` with ``job`` on stdin: the bandwidth probe, stopped at ``limit_s``
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
    """The decode part: the device's ceiling, the decode sweep, then the rollout projections; returns the result
    file."""
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
