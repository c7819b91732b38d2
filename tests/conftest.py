import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import REPO
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
