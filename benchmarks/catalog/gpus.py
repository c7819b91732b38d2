"""The GPUs a run uses, decided once for install and run alike: the devices ``nvidia-smi`` (at install) or NVML (at
run time) lists, in their PCI order, narrowed by ``CUDA_VISIBLE_DEVICES`` as CUDA reads it, then one model's
devices chosen where several models are visible. A GPU in MIG mode, or a MIG slice named in
``CUDA_VISIBLE_DEVICES``, is refused in one line: a slice's memory and bandwidth are no hardware class of
``profiles/hardware.toml``, and its out-of-memory rows would be filed as the whole card's. Standard library only:
the noxfile imports it before any package is there.

A device is anything with ``index``, ``name``, ``uuid``, ``memory_gib`` and ``mig`` (``Device`` here,
``schema.Gpu`` in a result file)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

# CUDA numbers devices fastest first unless told otherwise; nvidia-smi and NVML number them by PCI bus. The run
# takes the PCI order, so that an index means the same device to the person, the plan, NVML and every worker.
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@dataclass(frozen=True)
class Device:
    """One GPU as ``nvidia-smi`` lists it (a recorded machine's too)."""

    index: int
    name: str
    uuid: str
    memory_gib: float
    mig: bool = False  # MIG mode enabled on it


@dataclass(frozen=True)
class Choice:
    """The devices a run uses (one model), and what the person should know of the choice."""

    devices: tuple[Any, ...] = ()
    note: str = ""  # mixed models: which ones run and which stay idle
    placed: str | None = None  # the CUDA_VISIBLE_DEVICES that pins the run to ``devices`` (mixed models only)


def visible(devices: list[Any], listed: str | None) -> list[Any] | str:
    """The devices ``CUDA_VISIBLE_DEVICES`` (``listed``; None: unset, all) leaves, in its order, as CUDA reads it:
    an index (PCI order), a ``GPU-`` UUID or its prefix; ``-1``, an empty list or an entry naming no device ends
    the list there. A ``MIG-`` entry is refused: the line that says so."""
    if listed is None:
        return list(devices)
    chosen = []
    for item in (part.strip() for part in listed.split(",")):
        if item.startswith("MIG-"):
            return mig_refusal(f"CUDA_VISIBLE_DEVICES names the MIG slice {item}")
        match = [d for d in devices if str(d.index) == item or (item.startswith("GPU-") and d.uuid.startswith(item))]
        if not item or not match:  # CUDA stops at the first entry it cannot resolve (-1 among them)
            break
        chosen.append(match[0])
    return chosen


def mig_refusal(what: str) -> str:
    return (
        f"{what}: MIG slices are not measured here (a slice's memory and bandwidth are no hardware class, and its "
        "out-of-memory rows would be filed as the whole card's). Run on whole GPUs: list them in "
        "CUDA_VISIBLE_DEVICES by index or GPU- UUID, or disable MIG (`sudo nvidia-smi -i N -mig 0`)"
    )


def choose(devices: list[Any], listed: str | None) -> Choice | str:
    """The devices a run uses: those ``listed`` leaves, every one of one model (the most numerous; among as many,
    the first's); a device in MIG mode refused in one line."""
    left = visible(devices, listed)
    if isinstance(left, str):
        return left
    for device in left:
        if device.mig:
            return mig_refusal(f"GPU {device.index} ({device.name}) has MIG mode enabled")
    models = Counter(d.name for d in left)
    if len(models) <= 1:
        return Choice(tuple(left))
    name = max(models, key=models.get)  # Counter keeps first-seen order: ties go to the first device's model
    used = tuple(d for d in left if d.name == name)
    idle = ", ".join(f"{models[n]} x {n}" for n in models if n != name)
    placed = ",".join(d.uuid for d in used)
    note = (
        f"mixed GPUs: the run uses the {len(used)} x {name} (GPU {', '.join(str(d.index) for d in used)}, pinned "
        f"by CUDA_VISIBLE_DEVICES), one class, one question; {idle} stay idle. To measure those instead, list them "
        "in CUDA_VISIBLE_DEVICES"
    )
    return Choice(used, note, placed)
