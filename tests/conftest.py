import pytest

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
