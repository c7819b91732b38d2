"""The machine ``nox -s bench`` runs on, and what it decides there before installing anything: the package stack
its Python, NVIDIA driver, CUDA driver library, compiler and architecture can run (``profiles/stacks.toml``), the
profile its GPUs' class and count call for, and so the extras to install. Standard library only: the noxfile imports
it before any package is there.

A machine is read from ``nvidia-smi``, ``libcuda`` and the system (``machine_probe.read``) or taken from a recorded
description (``profiles/machines.toml``), so that tests make each decision for every machine the suite promises to
run on.
"""

from __future__ import annotations

import functools
import json
import platform
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.catalog import gpus, interpreter
from benchmarks.catalog.levers import ProfileError
from benchmarks.catalog.profiles import load, load_hardware

PROFILES_DIR = REPO / "profiles"


@dataclass(frozen=True)
class Machine:
    """What the choices read of a machine: its architecture and Python, its NVIDIA driver as ``nvidia-smi`` gives it
    (or the error it gave), the CUDA version its driver library offers (``cuDriverGetVersion``: a forward-compatibility
    libcuda raises it above the kernel driver's), its first GPU (name, memory as the driver gives it; on unified
    memory MemTotal), how many GPUs CUDA sees, whether a CUDA toolkit is there, and whether a C compiler and the
    Python headers are (Triton compiles a C module at first use)."""

    architecture: str  # platform.machine(): x86_64, aarch64
    driver: str | None = None  # None: no NVIDIA driver (a CPU machine)
    gpu_name: str = ""
    gpu_memory_gib: float = 0.0
    gpus: int = 0
    toolkit: bool = False  # nvcc on PATH or CUDA_HOME set
    python: str = field(default_factory=platform.python_version)
    cuda_driver: str | None = None  # libcuda's CUDA version, "13.0"; None where libcuda did not answer
    compiler: bool = True  # $CC, gcc or clang on PATH, as Triton looks for one
    python_headers: bool = True  # Python.h in this Python's include directory
    smi_error: str = ""  # nvidia-smi is there but failed: its own words
    gpu_refusal: str = ""  # the GPUs cannot be measured as listed (MIG): the one line that says why
    gpu_note: str = ""  # mixed models: which run and which stay idle
    placed: str | None = None  # the CUDA_VISIBLE_DEVICES that pins the run to its GPUs (mixed models only)

    @property
    def driver_branch(self) -> int:
        return int(str(self.driver).split(".")[0])

    @property
    def consumer_gpu(self) -> bool:
        """A GeForce or TITAN card: NVIDIA's CUDA forward compatibility is not offered on them."""
        return bool(re.search(r"\b(GeForce|TITAN)\b", self.gpu_name, re.IGNORECASE))


@dataclass(frozen=True)
class Stack:
    """torch and the rollout engine pinned together, and where they run: a CUDA stack names the CUDA they are built
    for and the driver that runs it; the CPU stack (``cuda`` None) names the index that serves torch's CPU build."""

    name: str
    torch: str
    engine: str
    architectures: tuple[str, ...]
    cuda: str | None = None
    min_driver: int = 0  # a driver branch: 580 runs every CUDA 13.x
    driver_source: str = ""
    torch_index: str | None = None  # an index beside PyPI, used where torch's build is not already at hand

    @property
    def pins(self) -> tuple[str, str]:
        return (self.torch, self.engine)


@functools.cache
def load_stacks() -> dict[str, Stack]:
    return {name: Stack(name=name, **_listed(table)) for name, table in _toml("stacks").items()}


def cpu_stack() -> Stack:
    """The stack a run without a GPU installs, and the tests' torch."""
    return load_stacks()["cpu"]


@dataclass(frozen=True)
class Recorded:
    """A recorded machine and the ``--profile`` its user gives (None: the machine's own)."""

    machine: Machine
    profile: str | None = None
    others_gib: float = 0.0  # what other processes hold on its first GPU before a run (a display server)


@functools.cache
def load_machines() -> dict[str, Recorded]:
    """Every recorded machine: its fields as given, or, where it records ``devices`` (and the
    ``cuda_visible_devices`` its user sets), its GPUs decided from those as ``read`` decides them."""
    recorded = {}
    for name, table in _toml("machines").items():
        profile, others = table.pop("profile", None), table.pop("others_gib", 0.0)
        listed = table.pop("cuda_visible_devices", None)
        if "devices" in table:
            table["devices"] = _recorded_devices(table["devices"])
            recorded[name] = Recorded(with_devices(listed=listed, **table), profile, others)
        else:
            recorded[name] = Recorded(Machine(**table), profile, others)
    return recorded


def _recorded_devices(listed: list[dict]) -> list[gpus.Device]:
    """A recorded machine's GPUs in PCI order: each entry ``count`` times (default once), its UUID the one recorded
    or ``GPU-<index, 8 digits>-recorded``."""
    rows = [dict(entry) for entry in listed for _ in range(entry.get("count", 1))]
    return [
        gpus.Device(
            index=i, uuid=row.pop("uuid", f"GPU-{i:08d}-recorded"), **{k: v for k, v in row.items() if k != "count"}
        )
        for i, row in enumerate(rows)
    ]


def with_devices(devices: list[gpus.Device], listed: str | None, driver: str, **system: Any) -> Machine:
    """A machine whose GPUs are ``devices`` (in PCI order) under ``CUDA_VISIBLE_DEVICES`` = ``listed``: the
    ones ``gpus.choose`` leaves (none visible: a CPU machine), or the line that refuses them."""
    choice = gpus.choose(devices, listed)
    if isinstance(choice, str):
        return Machine(**system, driver=driver, gpu_refusal=choice)
    if not choice.devices:
        return Machine(**system)
    first = choice.devices[0]
    return Machine(
        **system,
        driver=driver,
        gpu_name=first.name,
        gpu_memory_gib=first.memory_gib,
        gpus=len(choice.devices),
        gpu_note=choice.note,
        placed=choice.placed,
    )


def _toml(name: str) -> dict:
    with (PROFILES_DIR / f"{name}.toml").open("rb") as file:
        return tomllib.load(file)


def _listed(table: dict) -> dict:
    return {key: tuple(value) if isinstance(value, list) else value for key, value in table.items()}


def machine_stack(machine: Machine) -> Stack | str:
    """The stack a machine's own GPU runs (a CUDA stack; the CPU stack where it has no driver), or why none does."""
    return choose_stack(machine) if machine.driver else cpu_stack()


CPU_PROFILE = "`nox -s bench -- --profile cpu` (the CPU stack, the GPUs hidden from the run)"


def choose_stack(machine: Machine, stacks: dict[str, Stack] | None = None) -> Stack | str:
    """The newest declared CUDA stack this machine's driver and architecture run, or the one line that says why none
    does and what would. A driver runs a stack where its libcuda offers the stack's CUDA (forward compatibility
    included), or, where libcuda did not answer, where its branch is the stack's or newer."""
    stacks = load_stacks() if stacks is None else stacks
    fitting = [s for s in stacks.values() if s.cuda and machine.architecture in s.architectures]
    if not fitting:
        known = ", ".join(sorted({a for s in stacks.values() if s.cuda for a in s.architectures}))
        return f"no CUDA stack for architecture {machine.architecture} (declared: {known}); on the CPU: {CPU_PROFILE}"
    runs = [s for s in fitting if _runs(machine, s)]
    if runs:
        return max(runs, key=lambda s: _version(s.cuda))
    return _old_driver(machine, min(fitting, key=lambda s: s.min_driver))


def _runs(machine: Machine, stack: Stack) -> bool:
    if machine.cuda_driver is not None:
        return _version(machine.cuda_driver) >= _version(stack.cuda)
    return machine.driver_branch >= stack.min_driver


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _old_driver(machine: Machine, need: Stack) -> str:
    """The stop line of a driver older than every stack's: what was found, what is needed, and what runs instead;
    forward compatibility offered only where NVIDIA offers it (not on GeForce or TITAN cards)."""
    offers = f" (CUDA {machine.cuda_driver} in its libcuda)" if machine.cuda_driver else ""
    compat = f"cuda-compat-{need.cuda.replace('.', '-')}"
    forward = (
        f"NVIDIA's forward-compatibility package {compat} on a data-centre GPU, its libcuda on LD_LIBRARY_PATH "
        "(this check reads libcuda's version and then takes it); "
        if not machine.consumer_gpu
        else ""
    )
    not_offered = f" (NVIDIA's forward compatibility, {compat}, is not offered on GeForce cards)" if not forward else ""
    return (
        f"NVIDIA driver {machine.driver} found{offers}; every stack on PyPI that TRL 1.16 runs with "
        f"({need.torch}, {need.engine}: CUDA {need.cuda}) needs driver {need.min_driver} or newer. Alternatives: "
        f"a driver of branch {need.min_driver}+{not_offered}; {forward}or the CPU profile, {CPU_PROFILE}"
    )


def _build_tools(machine: Machine, why: str) -> str | None:
    """The stop line where a C compiler or the Python headers are missing and ``why`` needs them."""
    missing = [
        m for m, there in (("a C compiler", machine.compiler), ("Python.h", machine.python_headers)) if not there
    ]
    if not missing:
        return None
    minor = ".".join(machine.python.split(".")[:2])
    return (
        f"{' and '.join(missing)} not found: {why}. Install them first: `sudo apt install build-essential "
        f"python{minor}-dev` (Debian, Ubuntu, DGX OS) or `sudo dnf install gcc python3-devel` (Fedora, RHEL), then "
        "run again"
    )


TRITON = "Triton compiles a small C module at first use, and vLLM's engine and every CUDA-graph decode go through it"
DEEPSPEED_CPU = "DeepSpeed's shared-memory all-reduce, which the CPU ranks use, is compiled at install"


def classify(name: str, memory_gib: float, gpus: int = 1) -> tuple[str, str]:
    """(profile, hardware class) for ``gpus`` CUDA devices named ``name``: the class of ``profiles/hardware.toml``
    whose ``device_names`` has the longest match in ``name`` (the closest memory among several), and its profile (its
    ``node_profile`` where several GPUs are visible and it has one); else a 24 GB card's profile, or the ``gpu``
    profile, on the generic ``gpu`` class (its memory: the device's own, in the result file)."""
    named = [
        (len(word), key, hardware)
        for key, hardware in load_hardware().items()
        for word in hardware.device_names
        if re.search(rf"\b{re.escape(word)}\b", name)
    ]
    if named:  # the longest name that matches ("H100 PCIe" over "H100"), then the closest memory
        _, key, hardware = min(named, key=lambda item: (-item[0], abs(item[2].memory_gib - memory_gib)))
        node = hardware.node_profile if gpus > 1 else None
        return node or hardware.profile or "gpu", key
    if 20 <= memory_gib <= 26:
        return "24gb", "gpu"
    return "gpu", "gpu"


@dataclass(frozen=True)
class BenchPlan:
    """What ``nox -s bench`` installs and runs on a machine: the stack (the CPU stack where no GPU is used), the
    profile and class, its parts, whether the machine's GPUs are hidden from the run (the CPU profile on a GPU
    machine), and notes for the person at the machine."""

    machine: Machine
    stack: Stack
    profile: str
    hardware: str | None
    parts: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def extras(self) -> str:
        """The project's extras to install: DeepSpeed's only where a part runs many ranks."""
        return ",".join(["bench", "grpo", *(["distributed"] if "distributed" in self.parts else [])])

    @property
    def hides_gpus(self) -> bool:
        return self.stack.cuda is None and bool(self.machine.driver or self.machine.smi_error)

    @property
    def env(self) -> dict[str, str]:
        """The run's environment: no GPU visible to a CPU stack's run on a GPU machine (CUDA and NVML's reading of
        ``CUDA_VISIBLE_DEVICES`` alike), so that nothing it measures is filed from a GPU under the cpu class; on
        GPUs, CUDA numbering them as NVML does, pinned to the chosen ones where models are mixed."""
        if self.hides_gpus:
            return {"CUDA_VISIBLE_DEVICES": "-1"}
        if not self.stack.cuda:
            return {}
        return {**gpus.DEVICE_ORDER, **({"CUDA_VISIBLE_DEVICES": self.machine.placed} if self.machine.placed else {})}

    def lines(self) -> list[str]:
        machine = self.machine
        seen = (
            f"{machine.gpus} x {machine.gpu_name} ({machine.gpu_memory_gib:g} GiB), driver {machine.driver}"
            + (f", CUDA {machine.cuda_driver} in libcuda" if machine.cuda_driver else "")
            if machine.driver
            else f"nvidia-smi failed ({machine.smi_error})"
            if machine.smi_error
            else "no NVIDIA GPU"
        )
        stack = self.stack
        built = f"CUDA {stack.cuda}" if stack.cuda else "CPU build"
        where = f" on class {self.hardware}" if self.hardware else ""
        hidden = ["the GPUs are hidden from the run (CUDA_VISIBLE_DEVICES=-1): the cpu profile measures the CPU"]
        return [
            f"{seen} on {machine.architecture}, Python {machine.python}: "
            f"stack {stack.name}: {', '.join(stack.pins)} ({built})",
            f"profile {self.profile}{where}: parts {', '.join(self.parts)}; extras {self.extras}",
            *(hidden if self.hides_gpus else []),
            *self.notes,
        ]


def plan(machine: Machine, profile: str | None = None) -> BenchPlan | str:
    """The bench session's choices for ``machine`` (``profile``: the user's ``--profile``, else the machine's
    own), or the one line that says why it cannot run there."""
    old = interpreter.too_old(_version(machine.python))
    if old:
        return old
    if machine.gpu_refusal and profile != "cpu":
        return machine.gpu_refusal
    if machine.smi_error and profile != "cpu":
        return (
            f"nvidia-smi is installed but failed ({machine.smi_error}): the NVIDIA driver does not answer, so no GPU "
            "can be used. After a driver update ('Driver/library version mismatch') a reboot loads the new kernel "
            f"module; else reinstall the driver. To measure the CPU meanwhile: {CPU_PROFILE}"
        )
    hardware = None
    if profile is None and machine.driver:
        profile, hardware = classify(machine.gpu_name, machine.gpu_memory_gib, machine.gpus)
    profile = profile or "cpu"
    try:
        loaded = load(profile, hardware=hardware)
    except ProfileError as error:
        return str(error)
    stack = choose_stack(machine) if machine.driver and loaded.hardware != "cpu" else cpu_stack()
    if isinstance(stack, str):
        return stack
    stop = _build_tools(machine, TRITON) if stack.cuda else None
    if stop is None and not stack.cuda and "distributed" in loaded.parts:
        stop = _build_tools(machine, DEEPSPEED_CPU)
    if stop:
        return stop
    notes = _notes(machine, hardware, many_ranks="distributed" in loaded.parts)
    return BenchPlan(machine, stack, profile, hardware, loaded.parts, tuple(notes))


INSTALL = "GRPO_BENCH_INSTALL"  # the bench session's install, handed to the run as JSON, recorded in its first file


def recorded_install(stack: Stack, results: Path = REPO / "results" / "runs") -> str:
    """What installing ``stack`` in a new environment took, as the newest run that did it recorded (its first part's
    ``pace.install``), said before a first run installs."""
    found = []
    for path in results.glob("*/*.json"):
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        install = ((run.get("grpo_bench") or run).get("pace") or {}).get("install") or {}
        if install.get("stack") == stack.name and install.get("fresh"):
            found.append((path.name, install["seconds"], path, (run.get("machine") or {}).get("cpu", "")))
    if not found:
        return (
            f"installing stack {stack.name} in a new environment: no such install recorded yet"
            f"{' (torch with its CUDA libraries: several GB)' if stack.cuda else ''}: minutes, not in the estimate"
        )
    _, seconds, path, cpu = max(found)
    return (
        f"installing stack {stack.name} in a new environment: ~{int(seconds) // 60}:{int(seconds) % 60:02d} as "
        f"recorded by {path.relative_to(results.parent.parent)} ({cpu}); the run's estimate follows it"
    )


def _notes(machine: Machine, hardware: str | None, many_ranks: bool) -> list[str]:
    """What the person at the machine should know before it starts: among it, GPUs its profile leaves idle."""
    notes = [machine.gpu_note] if machine.gpu_note else []
    if hardware and machine.gpus > 1 and not many_ranks:
        notes.append(
            f"{machine.gpus} GPUs visible: this profile measures on the first alone and leaves {machine.gpus - 1} "
            "idle (no profile of this class runs many ranks); CUDA_VISIBLE_DEVICES chooses another"
        )
    cluster = load_hardware()[hardware].cluster_profiles if hardware else ()
    if machine.gpus >= 4 and cluster:
        runs = ", ".join(f"`nox -s bench -- --profile {name}`" for name in cluster)
        notes.append(f"{machine.gpus} GPUs visible: the larger size classes over many of them are {runs}")
    return notes
