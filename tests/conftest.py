import pytest

from rewards.sandbox import default_sandbox


@pytest.fixture(scope="session")
def sandbox():
    """The default bubblewrap boundary; tests that need it skip, with the reason, where it cannot run."""
    reason = default_sandbox().unavailable_reason()
    if reason:
        pytest.skip(f"default sandbox unavailable: {reason}")
    return default_sandbox()
