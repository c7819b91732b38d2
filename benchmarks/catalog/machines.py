"""The machine ``nox -s bench`` runs on, and what it decides there before installing anything: the package stack
its NVIDIA driver and architecture can run (``profiles/stacks.toml``), the profile its GPUs' class and count call
for, and so the extras to install. Standard library only: the noxfile imports it before any package is there.

A machine is read from ``nvidia-smi`` (:func:`read`) or taken from a recorded description
(``profiles/machines.toml``), so that tests make each decision for every machine the suite promises to run on.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from benchmarks import REPO
from benchmarks.catalog.levers import ProfileError
from benchmarks.catalog.profiles import load, load_hardware

PROFILES_DIR = REPO / "profiles"


@dataclass(frozen=True)
class Machine:
    """What the choices read of a machine: its architecture, NVIDIA driver and first GPU (name, memory as the
    driver gives it; on unified memory MemTotal), how many GPUs CUDA sees, and whether a CUDA toolkit is there."""

    architecture: str  # platform.machine(): x86_64, aarch64
    driver: str | None = None  # None: no NVIDIA driver (a CPU machine)
    gpu_name: str = ""
    gpu_memory_gib: float = 0.0
    gpus: int = 0
    toolkit: bool = False  # nvcc on PATH or CUDA_HOME set

    @property
    def driver_branch(self) -> int:
        return int(str(self.driver).split(".")[0])


@dataclass(frozen=True)
class Stack:
    """A CUDA stack: torch and vLLM pinned together, the CUDA they are built for and the driver that runs it."""

    name: str
    cuda: str
    torch: str
    engine: str
    min_driver: int  # a driver branch: 580 runs every CUDA 13.x
    driver_source: str
    architectures: tuple[str, ...]

    @property
    def pins(self) -> tuple[str, str]:
        return (self.torch, self.engine)


@functools.cache
def load_stacks() -> dict[str, Stack]:
    return {name: Stack(name=name, **_listed(table)) for name, table in _toml("stacks").items()}


@functools.cache
def load_machines() -> dict[str, Machine]:
    return {name: Machine(**table) for name, table in _toml("machines").items()}


def _toml(name: str) -> dict:
    with (PROFILES_DIR / f"{name}.toml").open("rb") as file:
        return tomllib.load(file)


def _listed(table: dict) -> dict:
    return {key: tuple(value) if isinstance(value, list) else value for key, value in table.items()}


def read(environ: dict[str, str] | None = None) -> Machine:
    """This machine, from ``nvidia-smi`` (no CUDA context, nothing installed); a CPU machine where there is none."""
    environ = os.environ if environ is None else environ
    architecture = platform.machine()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Machine(architecture)
    query = [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]
    try:
        rows = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):  # a driver that does not answer: no usable GPU
        return Machine(architecture)
    gpus = [[field.strip() for field in line.split(",")] for line in rows.splitlines() if line.strip()]
    gpus = _visible(gpus, environ.get("CUDA_VISIBLE_DEVICES"))
    if not gpus:
        return Machine(architecture)
    name, memory, driver = gpus[0]
    toolkit = bool(shutil.which("nvcc") or environ.get("CUDA_HOME"))
    return Machine(architecture, driver, name, _gib(memory), len(gpus), toolkit)


def _visible(gpus: list[list[str]], listed: str | None) -> list[list[str]]:
    """The rows CUDA_VISIBLE_DEVICES leaves (indices only; a UUID list keeps them all, as counted by it)."""
    if listed is None:
        return gpus
    items = [item.strip() for item in listed.split(",") if item.strip()]
    if all(item.isdigit() for item in items):
        return [gpus[int(item)] for item in items if int(item) < len(gpus)]
    return gpus[: len(items)]


def _gib(memory_mib: str) -> float:
    """nvidia-smi's MiB in GiB; unified memory ('[N/A]'): /proc/meminfo's MemTotal."""
    if re.fullmatch(r"\d+(\.\d+)?", memory_mib):
        return round(float(memory_mib) / 1024, 2)
    found = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
    return round(int(found.group(1)) / 2**20, 2) if found else 0.0


def choose_stack(machine: Machine, stacks: dict[str, Stack] | None = None) -> Stack | str:
    """The newest declared stack this machine's driver and architecture run, or the one line that says why none
    does and what would."""
    stacks = load_stacks() if stacks is None else stacks
    fitting = [s for s in stacks.values() if machine.architecture in s.architectures]
    if not fitting:
        known = ", ".join(sorted({a for s in stacks.values() for a in s.architectures}))
        return (
            f"no CUDA stack for architecture {machine.architecture} (declared: {known}); "
            "run on the CPU with `nox -s bench -- --profile cpu`"
        )
    runs = [s for s in fitting if machine.driver_branch >= s.min_driver]
    if runs:
        return max(runs, key=lambda s: s.min_driver)
    need = min(fitting, key=lambda s: s.min_driver)
    return (
        f"NVIDIA driver {machine.driver} found; every stack on PyPI that TRL 1.16 runs with "
        f"({need.torch}, {need.engine}: CUDA {need.cuda}) needs driver {need.min_driver} or newer. Alternatives: "
        f"a driver of branch {need.min_driver}+; NVIDIA's forward-compatibility package "
        f"cuda-compat-{need.cuda.replace('.', '-')} (data-centre GPUs); or the CPU profile, "
        "`nox -s bench -- --profile cpu`"
    )


def classify(name: str, memory_gib: float, gpus: int = 1) -> tuple[str, str]:
    """(profile, hardware class) for ``gpus`` CUDA devices named ``name``: the class of ``profiles/hardware.toml``
    whose ``device_names`` has a word of ``name`` (the closest memory among several), and its profile (its
    ``node_profile`` where several GPUs are visible and it has one); else a 24 GB card's profile, or the ``gpu``
    profile, on the generic ``gpu`` class (its memory: the device's own, in the result file)."""
    named = [
        (key, hardware)
        for key, hardware in load_hardware().items()
        if any(re.search(rf"\b{re.escape(word)}\b", name) for word in hardware.device_names)
    ]
    if named:
        key, hardware = min(named, key=lambda item: abs(item[1].memory_gib - memory_gib))
        node = hardware.node_profile if gpus > 1 else None
        return node or hardware.profile or "gpu", key
    if 20 <= memory_gib <= 26:
        return "24gb", "gpu"
    return "gpu", "gpu"


@dataclass(frozen=True)
class BenchPlan:
    """What ``nox -s bench`` installs and runs on a machine: the stack (None on a CPU: pyproject's ``torch``
    group and ``cpu`` extra), the profile and class, its parts, and notes for the person at the machine."""

    machine: Machine
    stack: Stack | None
    profile: str
    hardware: str | None
    parts: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def extras(self) -> str:
        """The project's extras to install: DeepSpeed's only where a part runs many ranks."""
        extras = ["bench", "grpo", *(["distributed"] if "distributed" in self.parts else [])]
        return ",".join(extras if self.stack else [*extras, "cpu"])

    def lines(self) -> list[str]:
        machine = self.machine
        seen = (
            f"{machine.gpus} x {machine.gpu_name} ({machine.gpu_memory_gib:g} GiB), driver {machine.driver}"
            if machine.driver
            else "no NVIDIA GPU"
        )
        stack = (
            f"stack {self.stack.name}: {', '.join(self.stack.pins)} (CUDA {self.stack.cuda})"
            if self.stack
            else "the CPU stack"
        )
        where = f" on class {self.hardware}" if self.hardware else ""
        return [
            f"{seen} on {machine.architecture}: {stack}",
            f"profile {self.profile}{where}: parts {', '.join(self.parts)}; extras {self.extras}",
            *self.notes,
        ]


def plan(machine: Machine, profile: str | None = None) -> BenchPlan | str:
    """The bench session's choices for ``machine`` (``profile``: the user's ``--profile``, else the machine's
    own), or the one line that says why it cannot run there."""
    hardware = None
    if profile is None and machine.driver:
        profile, hardware = classify(machine.gpu_name, machine.gpu_memory_gib, machine.gpus)
    profile = profile or "cpu"
    try:
        loaded = load(profile, hardware=hardware)
    except ProfileError as error:
        return str(error)
    stack = choose_stack(machine) if machine.driver and loaded.hardware != "cpu" else None
    if isinstance(stack, str):
        return stack
    return BenchPlan(machine, stack, profile, hardware, loaded.parts, tuple(_notes(machine, hardware)))


def _notes(machine: Machine, hardware: str | None) -> list[str]:
    """What the person at the machine should know before it starts."""
    notes = []
    cluster = load_hardware()[hardware].cluster_profiles if hardware else ()
    if machine.gpus >= 4 and cluster:
        runs = ", ".join(f"`nox -s bench -- --profile {name}`" for name in cluster)
        notes.append(f"{machine.gpus} GPUs visible: the larger size classes over many of them are {runs}")
    return notes
