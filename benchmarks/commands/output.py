"""Where the commands read and write result files unless told, and how they print a path."""

from __future__ import annotations

from pathlib import Path

from benchmarks import REPO

RESULTS = REPO / "results" / "runs"


def shown(path: Path) -> Path:
    """A path as printed: relative to the checkout where it lies in it."""
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path
