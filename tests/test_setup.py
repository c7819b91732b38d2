"""The README's set-up, run as a newcomer runs it on a system Python that refuses `pip install` (PEP 668: Debian,
Ubuntu, DGX OS), and the same commands in CI's script."""

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from benchmarks import REPO

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
