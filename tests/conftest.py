import functools
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import REPO
from benchmarks.catalog import install_plan
from benchmarks.results import schema
from rewards.sandbox import default_sandbox

if os.environ.get("PYTEST_XDIST_WORKER"):  # workers share the cores: a thread each, not a pool each
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def grpo_run():
    """A GRPO result record of the tiny shape on the cpu class: ``grpo_run(configurations=[...])``."""

    def make(**fields):
        return schema.GrpoFile(
            schema_version=schema.SCHEMA_VERSION,
            kind="grpo",
            started="2026-12-01T00:00:00+00:00",
            profile=schema.ProfileRecord(hardware="cpu"),
            shape=schema.ShapeRecord(name="tiny", param_count=1),
            **fields,
        )

    return make


@pytest.fixture(scope="session")
def sandbox():
    """The default bubblewrap boundary; tests that need it skip, with the reason, where it cannot run."""
    reason = default_sandbox().unavailable_reason()
    if reason:
        pytest.skip(f"default sandbox unavailable: {reason}")
    return default_sandbox()


@pytest.fixture(scope="session")
def committed_results(tmp_path_factory):
    """``results/runs`` as committed: its tracked files only, so that a run just made here (``nox -s bench``
    before ``nox -s tests`` on a fresh clone) changes nothing a test reads. Outside a git checkout every
    file there is what was shipped."""
    runs = REPO / "results" / "runs"
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", "results/runs"], cwd=REPO, capture_output=True)
    except OSError:
        return runs
    if listed.returncode != 0:
        return runs
    copy = tmp_path_factory.mktemp("committed") / "runs"
    for name in filter(None, listed.stdout.decode().split("\0")):
        target = copy / Path(name).relative_to("results/runs")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return copy


# How this machine reaches the registries (its certificate authority, a proxy): kept, since they choose no package
NETWORK = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


def isolated_pip_environ(home: Path) -> dict[str, str]:
    """pip as on a new user's machine: no configuration file of this one (PIP_CONFIG_FILE=/dev/null skips them all)
    and no PIP_* variable that names a package source (this machine's find-links hold torch's CPU build), so PyPI
    alone unless told."""
    network = {name: os.environ[name] for name in NETWORK if name in os.environ}
    return {**network, "PATH": os.environ["PATH"], "HOME": str(home), "PIP_CONFIG_FILE": os.devnull}


@pytest.fixture(scope="session")
def torch_cpu_index(tmp_path_factory) -> str:
    """A stand-in for PyTorch's CPU wheel index, which this machine cannot reach: a simple index holding the CPU
    stack's torch wheel, fetched as pip is configured here (a local copy), else from the stack's own index."""
    stack = install_plan.cpu_stack()
    project = tmp_path_factory.mktemp("torch-cpu-index") / "torch"
    for source in ((), ("--extra-index-url", stack.torch_index)):
        download = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(project), stack.torch]
        if subprocess.run([*download, *source], capture_output=True, timeout=900).returncode == 0:
            break
    else:
        pytest.skip(f"{stack.torch} is neither at hand here nor reachable at {stack.torch_index}")
    links = "".join(f'<a href="{w.name.replace("+", "%2B")}">{w.name}</a>' for w in project.glob("*.whl"))
    (project / "index.html").write_text(f"<html><body>{links}</body></html>")
    return project.parent.as_uri()


@pytest.fixture(scope="session")
def new_user_home(tmp_path_factory) -> Path:
    """One home for every test that plays a new user, so that their pip shares a download cache."""
    return tmp_path_factory.mktemp("new-user-home")


@pytest.fixture
def isolated_pip(new_user_home, monkeypatch) -> dict[str, str]:
    """This process's environment made a new user's for pip (``isolated_pip_environ``), so that every pip started
    from the test, directly or by the code under test, reads PyPI alone unless told."""
    isolated = isolated_pip_environ(new_user_home)
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in isolated.items():
        monkeypatch.setenv(name, value)
    return isolated


def stack_requirements(stack: install_plan.Stack) -> list[str]:
    """What the bench session installs from wheels for a stack: the project's dependencies and its bench and grpo
    extras (with those they name), and the stack's pins. DeepSpeed is left out: it is built from its source
    distribution against the pinned torch."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras, wanted, found = project["optional-dependencies"], ["bench", "grpo"], list(project["dependencies"])
    while wanted:
        for requirement in extras[wanted.pop()]:
            named = re.fullmatch(r"grpo-bench\[(.+)\]", requirement)
            wanted += named.group(1).split(",") if named else []
            found += [] if named else [requirement]
    return sorted(set(found)) + list(stack.pins)


def _resolve_command(stack: install_plan.Stack, architecture: str, report: Path) -> list[str]:
    """pip's dry run of ``stack`` on ``architecture``: a CUDA stack for Python 3.12 and glibc 2.39 (Ubuntu 24.04,
    DGX OS) and older; the CPU stack on this machine, with its torch index beside PyPI."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    command += ["--report", str(report), "--only-binary", ":all:"]
    if stack.cuda:  # pip takes the legacy manylinux2014 tag only by its own name
        tags = [f"manylinux_2_{glibc}_{architecture}" for glibc in range(39, 16, -1)]
        tags += [f"manylinux2014_{architecture}"]
        command += ["--target", str(report.parent / "never"), "--python-version", "3.12", "--implementation", "cp"]
        command += [arg for tag in tags for arg in ("--platform", tag)]
    else:
        command += ["--extra-index-url", stack.torch_index]
    return command + stack_requirements(stack)


@pytest.fixture(scope="session")
def resolves(request, tmp_path_factory, new_user_home):
    """(stack, architecture) -> what pip, isolated from this machine's configuration, would install: name ->
    version. Every resolve a selected test asks for starts with the session, all at once: each waits mostly on
    PyPI, so they overlap one another and the tests that run meanwhile."""
    items = [item for item in request.session.items if "resolves" in getattr(item, "fixturenames", ())]
    wanted = {getattr(item, "callspec", None) and item.callspec.params.get("stack") or "cpu" for item in items}
    running = {}
    for stack in (s for s in install_plan.load_stacks().values() if s.name in wanted):
        try:
            stack = stack if stack.cuda else replace(stack, torch_index=request.getfixturevalue("torch_cpu_index"))
        except pytest.skip.Exception as skipped:
            running[stack.name, platform.machine()] = str(skipped)
            continue
        for architecture in stack.architectures if stack.cuda else [platform.machine()]:
            report = tmp_path_factory.mktemp(f"resolve-{stack.name}-{architecture}") / "report.json"
            environ = isolated_pip_environ(new_user_home)
            command = _resolve_command(stack, architecture, report)
            process = subprocess.Popen(command, env=environ, stderr=subprocess.PIPE, text=True)
            running[stack.name, architecture] = (process, report)
    return functools.partial(_resolved, running)


def _resolved(running: dict, stack: str, architecture: str) -> dict[str, str]:
    """A resolve's result, once its pip has ended: name -> version."""
    if isinstance(running[stack, architecture], str):
        pytest.skip(running[stack, architecture])
    process, report = running[stack, architecture]
    stderr = process.communicate(timeout=900)[1]
    if process.returncode != 0 and "Network is unreachable" in stderr:
        pytest.skip("PyPI is not reachable from here: the resolve needs its index")
    assert process.returncode == 0, stderr[-3000:]
    installed = json.loads(report.read_text())["install"]
    return {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"] for i in installed}


@pytest.fixture(scope="session", autouse=True)
def _resolves_start_with_the_session(request):
    """The resolves begin before the first test, not at their own (late in the order), where any is selected."""
    if any("resolves" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("resolves")


@pytest.fixture(scope="session")
def noxfile():
    """The checkout's noxfile as a module, its sessions callable with a stand-in session."""
    spec = importlib.util.spec_from_file_location("noxfile_under_test", REPO / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
