"""GPUs as the harness sees them from the parent process, through NVML (never a CUDA context of
its own): which devices there are, which profile and hardware class they are, which of them a
worker uses, and how much device memory the worker's processes hold.

Every function takes the NVML module (``pynvml`` from nvidia-ml-py, or a stand-in in tests).
Device memory of a run is read two ways and both are kept:

- per process: NVML's ``usedGpuMemory`` of each process of the worker tree (vLLM's engine
  included, which lives outside torch's allocator), on the devices the worker uses;
- per device: memory used on those devices minus what was used before the worker started, for
  where NVML lists no process of ours (a container that hides host PIDs).

On unified-memory devices (DGX Spark's GB10) NVML answers NOT_SUPPORTED for memory: the device's
capacity is then ``/proc/meminfo``'s MemTotal and its use MemTotal - MemAvailable, and the
result file says so. There the pool's use above the baseline is the run's footprint (its CPU-side
memory lives in the same pool), while NVML's per-process figure, which GB10 does answer, counts its
device allocations only: the first is the headline, the second stands beside it. A floor on
MemAvailable (``unified_floor_gib`` of the device's class) stops the worker tree before the host runs
out, since running unified memory out can wedge the whole machine instead of raising an error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.catalog import gpus
from benchmarks.catalog.install_plan import classify
from benchmarks.catalog.profiles import load_hardware
from benchmarks.results import schema

GIB = 2**30
MEMINFO = Path("/proc/meminfo")
UNIFIED = "unified memory: /proc/meminfo (NVML answers NOT_SUPPORTED for this device's memory)"


def load_nvml() -> Any | None:
    """pynvml, initialised; None without the library or a driver."""
    try:
        import pynvml  # optional: nvidia-ml-py comes with the worker extra
    except ImportError:  # nvidia-ml-py comes with the worker extra; without it there is no NVML to read
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver, no device
        return None
    return pynvml


def meminfo_bytes(path: Path = MEMINFO) -> tuple[int, int]:
    """(MemTotal, MemTotal - MemAvailable) in bytes."""
    fields = dict(re.findall(r"^(\w+):\s+(\d+) kB", path.read_text(), re.MULTILINE))
    total = int(fields["MemTotal"]) * 1024
    return total, total - int(fields["MemAvailable"]) * 1024


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def describe(nvml: Any, meminfo: Path = MEMINFO) -> list[schema.Gpu]:
    """Every GPU NVML sees: index, name, UUID, memory (GiB) and where that figure comes from, driver."""
    if nvml is None:
        return []
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    found = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            memory, source = nvml.nvmlDeviceGetMemoryInfo(handle).total, "NVML"
        except nvml.NVMLError_NotSupported:
            memory, source = meminfo_bytes(meminfo)[0], UNIFIED
        found.append(
            schema.Gpu(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                memory_gib=round(memory / GIB, 2),
                memory_source=source,
                driver=driver,
                mig=_mig(nvml, handle),
            )
        )
    return found


def _mig(nvml: Any, handle: Any) -> bool:
    """Whether MIG mode is enabled on a device (NOT_SUPPORTED on a card without MIG)."""
    try:
        return bool(nvml.nvmlDeviceGetMigMode(handle)[0])
    except nvml.NVMLError:
        return False


def choice(nvml: Any = None, environ: dict[str, str] | None = None) -> gpus.Choice | str:
    """The GPUs the run uses (``nvml``, default pynvml; ``environ``'s CUDA_VISIBLE_DEVICES), decided as the
    install decided them (``benchmarks.catalog.gpus.choose``), or the line that refuses them."""
    listed = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    return gpus.choose(describe(load_nvml() if nvml is None else nvml), listed)


def visible_gpus(nvml: Any = None) -> list[schema.Gpu]:
    """The GPUs the run uses here; none without NVML or a driver. A refused list (MIG) stops the run with its
    line: nothing may be measured on a slice as if it were the card."""
    chosen = choice(nvml)
    if isinstance(chosen, str):
        raise SystemExit(chosen)
    return list(chosen.devices)


# Memory another process holds on a GPU of the run at its start is memory none of its configurations can have: a fit
# measured beside it is short by that much. Said at any size, refused above this share of a device (a desktop's
# display server holds some 0.3-1.5 GiB of a 24 GB card: inside it).
OTHERS_REFUSED_SHARE = 0.10


def held_by_others(nvml: Any = None) -> tuple[str, bool] | None:
    """What other processes hold on the GPUs the run uses before it starts any (NVML's compute and graphics
    processes), in a line, and whether that refuses the run; None where they hold nothing."""
    nvml = load_nvml() if nvml is None else nvml
    found = [(g, held) for g in visible_gpus(nvml) if (held := _processes(nvml, g.index))]
    if not found:
        return None
    words = "; ".join(
        f"GPU {g.index} ({g.name}): {sum(held.values()) / GIB:.2f} GiB held by process(es) "
        f"{', '.join(map(str, sorted(held)))}"
        for g, held in found
    )
    if any(sum(held.values()) > OTHERS_REFUSED_SHARE * g.memory_gib * GIB for g, held in found):
        return (
            f"refused: {words}: above {OTHERS_REFUSED_SHARE:.0%} of a device, every fit measured beside it would be "
            "short by what they hold; free the GPU, or pin the run to another with CUDA_VISIBLE_DEVICES"
        ), True
    return (
        f"other processes on the run's GPUs: {words} (inside the {OTHERS_REFUSED_SHARE:.0%} a device tolerates)",
        False,
    )


def _processes(nvml: Any, index: int) -> dict[int, int]:
    """The device memory of every process NVML lists on GPU ``index``, by PID (none where it cannot say)."""
    handle, held = nvml.nvmlDeviceGetHandleByIndex(index), {}
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            processes = getattr(nvml, query)(handle) if hasattr(nvml, query) else []
        except nvml.NVMLError:  # NOT_SUPPORTED: nothing to say of it
            continue
        held |= {p.pid: p.usedGpuMemory for p in processes if p.usedGpuMemory}
    return held


@dataclass
class Split:
    """The GPUs of one machine's launch: the trainer's ranks' and ``trl vllm-serve``'s, as
    CUDA_VISIBLE_DEVICES values."""

    trainer: list[str]
    server: list[str]


def split(gpus: list[schema.Gpu], trainer: int, server: int) -> Split | str:
    """The first ``trainer`` visible GPUs for the ranks (one each), the next ``server`` for the vLLM
    server (TRL's weight sync is an NCCL group: two ranks on one device fail with 'Duplicate GPU
    detected'); the reason where there are too few."""
    if trainer + server <= len(gpus):
        return Split(
            trainer=[g.uuid for g in gpus[:trainer]], server=[g.uuid for g in gpus[trainer : trainer + server]]
        )
    if server:
        return (
            f"vLLM server mode needs {server} GPU(s) of its own for `trl vllm-serve` beside the trainer's {trainer} "
            "(TRL's weight sync is an NCCL group: two ranks on one device fail with 'Duplicate GPU detected'); "
            f"{len(gpus)} visible here"
        )
    return f"{trainer} ranks need a GPU each; {len(gpus)} visible here"


class DeviceMemory:
    """Device memory held by a process tree on the GPUs it uses; baseline read at construction,
    before the worker starts."""

    def __init__(self, nvml: Any, gpus: list[schema.Gpu], meminfo: Path | None = None, floor_gib: float = 0.0) -> None:
        self.nvml = nvml
        self.meminfo = meminfo or MEMINFO
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(g.index) for g in gpus]
        self.unified = any(g.memory_source == UNIFIED for g in gpus)
        self.floor_bytes = int(floor_gib * GIB) if self.unified else 0
        self.available_bytes = 0  # unified memory: MemAvailable at the last read
        self.baseline = self._used()
        self.source = (
            UNIFIED + ", used minus the baseline before the worker started"
            if self.unified
            else "NVML: usedGpuMemory of the worker's processes on its devices "
            "(else device memory used minus the baseline before the worker started)"
        )

    def below_floor(self) -> bool:
        """Unified memory only: the host's MemAvailable under the floor, as the last sweep read it."""
        return bool(self.floor_bytes) and self.available_bytes < self.floor_bytes

    def _used(self) -> int:
        if self.unified:
            total, used = meminfo_bytes(self.meminfo)
            self.available_bytes = total - used  # the floor's figure, from the same read
            return used
        return sum(self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles)

    def read(self, groups: dict[Any, set[int]]) -> tuple[dict[Any, int | None], int]:
        """One sweep of these devices: per group of PIDs (a rank's processes), the bytes NVML attributes
        to them, or None where it lists none of them; and the bytes used above the baseline."""
        held: dict[Any, int | None] = dict.fromkeys(groups)
        for handle in self.handles:
            try:
                processes = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except self.nvml.NVMLError:  # NOT_SUPPORTED on unified memory: the device figure stands
                continue
            for process in processes:
                if process.usedGpuMemory is None:
                    continue
                for group, pids in groups.items():
                    if process.pid in pids:
                        held[group] = (held[group] or 0) + process.usedGpuMemory
        return held, max(0, self._used() - self.baseline)


def unified_floor_gib(gpus: list[schema.Gpu]) -> float:
    """The MemAvailable floor of the unified-memory GPUs among ``gpus`` (their class's), 0 where none has one."""
    floors = [
        load_hardware()[classify(g.name, g.memory_gib)[1]].unified_floor_gib or 0.0
        for g in gpus
        if g.memory_source == UNIFIED
    ]
    return max(floors, default=0.0)
