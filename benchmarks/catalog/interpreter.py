"""The Python the suite runs on: 3.11 or newer (``tomllib``, ``requires-python``). Standard library only and free of
``tomllib``: the noxfile asks it first, so that an older Python stops in one line rather than a traceback."""

from __future__ import annotations

OLDEST = (3, 11)


def too_old(version: tuple[int, ...]) -> str | None:
    """The one line that stops ``version`` (major, minor, micro), or None where it runs the suite."""
    if tuple(version[:2]) >= OLDEST:
        return None
    found = ".".join(str(part) for part in version[:3])
    return (
        f"Python {found} found; grpo-bench needs Python 3.11 or newer. On Ubuntu 22.04 (python3 is 3.10): "
        "`sudo apt install python3.11 python3.11-venv python3.11-dev` (the headers: Triton compiles a C module on a "
        "GPU machine), then `rm -rf .venv && python3.11 -m venv .venv && .venv/bin/pip install nox` and run again "
        "(or `uv python install 3.12` and make the venv with that Python)"
    )
