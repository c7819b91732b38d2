"""This machine read before anything is installed: its GPUs from ``nvidia-smi``, the CUDA version its driver
library offers (``libcuda``, in a child process), a C compiler and the Python headers; as the ``Machine`` the
install plan decides from. Standard library only: the noxfile reads it first."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from benchmarks.catalog import gpus
from benchmarks.catalog.install_plan import Machine, with_devices


def read(environ: dict[str, str] | None = None) -> Machine:
    """This machine, from ``nvidia-smi`` and ``libcuda`` (no CUDA context, nothing installed); a CPU machine where
    there is no ``nvidia-smi``, one with ``smi_error`` where it fails."""
    environ = os.environ if environ is None else environ
    system = {"architecture": platform.machine(), "compiler": _compiler(environ), "python_headers": _python_headers()}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Machine(**system)
    query = [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return Machine(**system, smi_error=f"{type(error).__name__}: {error}")
    if done.returncode != 0:
        said = " ".join((done.stdout + done.stderr).split())[:300] or "no output"
        return Machine(**system, smi_error=f"exit {done.returncode}: {said}")
    rows = [[field.strip() for field in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    if not rows:
        return Machine(**system)
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    system.update(toolkit=bool(shutil.which("nvcc") or environ.get("CUDA_HOME")), cuda_driver=cuda_driver_version())
    return with_devices([_device(row) for row in rows], listed, driver=rows[0][4], **system)


SMI_FIELDS = "index,uuid,name,memory.total,driver_version,mig.mode.current"


def _device(row: list[str]) -> gpus.Device:
    """One ``SMI_FIELDS`` row of nvidia-smi (MIG mode '[N/A]' where the card has none)."""
    index, uuid, name, memory, _, mig = row
    return gpus.Device(int(index), name, uuid, _gib(memory), mig == "Enabled")


# cuInit, then cuDriverGetVersion, in a child of its own (a driver that hangs cannot hang the session): the CUDA
# version the driver library loaded here offers. A forward-compatibility libcuda (cuda-compat-13-0 on
# LD_LIBRARY_PATH) answers 13000 over a 570 kernel driver, which nvidia-smi still reports; on a GPU where
# compatibility is not supported, cuInit fails (CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE) and nothing is offered.
LIBCUDA_PROBE = (
    "import ctypes\n"
    "cuda = ctypes.CDLL('libcuda.so.1')\n"
    "version = ctypes.c_int()\n"
    "if cuda.cuInit(0) == 0 and cuda.cuDriverGetVersion(ctypes.byref(version)) == 0:\n"
    "    print(version.value)\n"
)


def cuda_driver_version() -> str | None:
    """The CUDA version libcuda offers ("13.0"), or None where it cannot be loaded or initialised."""
    try:
        done = subprocess.run([sys.executable, "-I", "-c", LIBCUDA_PROBE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    found = done.stdout.strip()
    if done.returncode != 0 or not found.isdigit():
        return None
    return f"{int(found) // 1000}.{int(found) % 1000 // 10}"


def _compiler(environ: dict[str, str]) -> bool:
    """A C compiler where Triton looks for one: $CC, else gcc, else clang."""
    return any(shutil.which(c) for c in (environ.get("CC"), "gcc", "clang") if c)


def _python_headers() -> bool:
    return (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()


def _gib(memory_mib: str) -> float:
    """nvidia-smi's MiB in GiB; unified memory ('[N/A]'): /proc/meminfo's MemTotal."""
    if re.fullmatch(r"\d+(\.\d+)?", memory_mib):
        return round(float(memory_mib) / 1024, 2)
    found = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
    return round(int(found.group(1)) / 2**20, 2) if found else 0.0
