"""The device's own memory bandwidth ceiling: copy, read and triad with torch, every byte read
and every byte written counted once; median and spread over repeats (on CPU with all its
threads). ``benchmarks.model.memory.decode_bytes`` says what a decode step must move against it.

torch is imported inside ``probe``, which runs in a process of its own on CUDA.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

# Arrays of the kernel's size each pass touches: copy c = a (read a, write c), read sum(a),
# triad c = a + s * b (read a and b, write c).
ARRAYS_TOUCHED = {"copy": 2, "read": 1, "triad": 3}


def probe(device: str = "cpu", array_bytes: int = 1 << 30, repeats: int = 10) -> dict[str, Any]:
    """Median and spread of copy/read/triad GB/s on ``device`` (torch; on CPU with all its threads).

    Arrays of ``array_bytes`` each: far past any cache (this machine reports a 300 MiB L3).
    """
    import torch

    count = array_bytes // 4
    a = torch.rand(count, device=device)
    b = torch.rand(count, device=device)
    c = torch.empty_like(a)
    kernels = {
        "copy": lambda: c.copy_(a),
        "read": lambda: a.sum(),
        "triad": lambda: torch.add(a, b, alpha=2.0, out=c),
    }

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    results: dict[str, Any] = {"device": device, "array_bytes": array_bytes, "repeats": repeats}
    if device == "cpu":
        results["threads"] = torch.get_num_threads()
    for name, kernel in kernels.items():
        kernel()  # first touch and warm-up
        sync()
        rates = []
        for _ in range(repeats):
            started = time.perf_counter()
            kernel()
            sync()
            rates.append(ARRAYS_TOUCHED[name] * array_bytes / (time.perf_counter() - started) / 1e9)
        results[name] = {
            "median_gb_s": statistics.median(rates),
            "min_gb_s": min(rates),
            "max_gb_s": max(rates),
            "bytes_per_pass": ARRAYS_TOUCHED[name] * array_bytes,
        }
    return results


def ceiling(probed: dict[str, Any]) -> dict[str, Any]:
    """The device's ceiling: the kernel with the highest median (on this CPU a GEMV streams
    weights faster than a 2-thread ``sum`` reads), with that kernel's spread."""
    kernel = max(ARRAYS_TOUCHED, key=lambda name: probed[name]["median_gb_s"])
    return {"kernel": kernel, **probed[kernel]}
