"""The README's set-up, run as a newcomer runs it: on a system Python that refuses `pip install` (PEP 668: Debian,
Ubuntu, DGX OS), on a Python older than 3.11, and with pip reading PyPI and PyTorch's CPU index alone (none of this
machine's configuration, which carries a local copy of torch's CPU build); and the same commands in CI's script."""

import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import REPO
from benchmarks.catalog import install_plan

README = (REPO / "README.md").read_text()


def readme_commands() -> list[str]:
    """The commands of the README's "Run it" block, comments dropped."""
    block = README.split("## Run it", 1)[1].split("\n\n    ", 1)[1].split("\n\n", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines()]


def externally_managed_python() -> str | None:
    """A system python3 that carries PEP 668's marker, as a fresh Debian or Ubuntu has."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if not Path(candidate).exists():
            continue
        stdlib = subprocess.run(
            [candidate, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"], capture_output=True, text=True
        ).stdout.strip()
        if stdlib and (Path(stdlib) / "EXTERNALLY-MANAGED").exists():
            return candidate
    return None


def test_ci_runs_exactly_the_readme_s_set_up_and_test_commands():
    commands = readme_commands()
    script = (REPO / ".ci" / "run").read_text()
    test = next(c for c in commands if c.endswith("-s tests"))
    assert commands[0] in script and test in script and script.index(commands[0]) < script.index(test)


def test_the_readme_s_set_up_works_where_the_system_python_refuses_pip(tmp_path):
    python = externally_managed_python()
    if python is None:
        pytest.skip(f"no system python3 with PEP 668's EXTERNALLY-MANAGED here (ours: {sysconfig.get_path('stdlib')})")
    bin_dir = tmp_path / "bin"  # `python3` is the system's, first on PATH, as on a fresh Debian or Ubuntu
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    refused = subprocess.run(["python3", "-m", "pip", "install", "nox"], capture_output=True, text=True, env=env)
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr
    set_up = readme_commands()[0]
    assert re.match(r"python3 -m venv \S+ && \S+/pip install nox$", set_up), set_up
    done = subprocess.run(["bash", "-c", set_up], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    nox = shutil.which("nox", path=str(tmp_path / set_up.split()[3] / "bin"))
    version = subprocess.run([nox, "--version"], capture_output=True, text=True, env=env)
    assert version.returncode == 0 and re.search(r"\d{4}\.\d+", version.stdout + version.stderr)


def test_a_python_older_than_3_11_stops_in_one_line_naming_how_to_get_3_11():
    # the noxfile as nox loads it, on Ubuntu 22.04's python3 (3.10.12): stopped before anything needs tomllib
    code = "import nox, runpy, sys; sys.version_info = (3, 10, 12, 'final', 0); runpy.run_path('noxfile.py')"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "Python 3.10.12 found" in done.stderr
    # one stop names all three: the headers too, or a GPU machine meets a second stop for Python.h (install_plan)
    assert "sudo apt install python3.11 python3.11-venv python3.11-dev" in done.stderr and "Ubuntu 22.04" in README


class PipSession:
    """The part of a nox session the install steps use, over a venv of its own and pip isolated from this
    machine's configuration."""

    def __init__(self, root: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
        self.bin, self.root, self.logged = str(root / "venv" / "bin"), root, []

    def install(self, *args: str) -> None:
        command = [f"{self.bin}/python", "-m", "pip", "install", "-q", *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 and "Network is unreachable" in done.stderr + done.stdout:
            pytest.skip("PyPI is not reachable from here: torch's dependencies come from it")
        assert done.returncode == 0, done.stderr[-3000:]

    def create_tmp(self) -> str:
        return str(self.root)

    def log(self, line: str) -> None:
        self.logged.append(line)


@pytest.mark.registry
def test_the_cpu_torch_installs_from_pypi_and_pytorch_s_cpu_index_with_pip_isolated(
    tmp_path, torch_cpu_index, isolated_pip, noxfile
):
    session = PipSession(tmp_path)
    # the tests session's and a CPU bench's first step, its index standing in for PyTorch's
    constraint = noxfile._torch_first(session, replace(install_plan.cpu_stack(), torch_index=torch_cpu_index))
    assert session.logged == ["torch==2.13.0+cpu: not at hand here: from the stack's index"]  # PyPI lacks it
    assert Path(constraint[1]).read_text() == "torch==2.13.0+cpu\n"
    code = "import torch; print(torch.__version__, torch.cuda.is_available())"
    found = subprocess.run([f"{session.bin}/python", "-c", code], capture_output=True, text=True, timeout=300)
    assert found.stdout.split() == ["2.13.0+cpu", "False"], found.stderr[-2000:]
    listed = subprocess.run([f"{session.bin}/python", "-m", "pip", "list"], capture_output=True, text=True).stdout
    assert "nvidia-" not in listed  # no CUDA library came with it
