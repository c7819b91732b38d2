import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import REPO
from benchmarks.catalog import machines
from benchmarks.results import schema
from rewards.sandbox import default_sandbox


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


@pytest.fixture(scope="module")
def torch_cpu_index(tmp_path_factory) -> str:
    """A stand-in for PyTorch's CPU wheel index, which this machine cannot reach: a simple index holding the CPU
    stack's torch wheel, fetched as pip is configured here (a local copy), else from the stack's own index."""
    stack = machines.cpu_stack()
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


@pytest.fixture
def isolated_pip(tmp_path, monkeypatch) -> dict[str, str]:
    """This process's environment made a new user's for pip (``isolated_pip_environ``), so that every pip started
    from the test, directly or by the code under test, reads PyPI alone unless told."""
    isolated = isolated_pip_environ(tmp_path)
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in isolated.items():
        monkeypatch.setenv(name, value)
    return isolated
