"""The context search's contenders (``[context].contenders`` in a profile), read from
``profiles/contenders.toml``: each a stack in its own venv (nox builds it from the same entry's pins), how
the worker builds its policy, and the logits path the analytic model gives it."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

from benchmarks import REPO

CATALOG = REPO / "profiles" / "contenders.toml"
BASELINE, OPTIMIZED = "trl-1.14.2", "trl-1.16"  # the unchunked setup, and TRL's own fused head


@dataclass(frozen=True)
class Contender:
    stack: str  # how the worker builds the policy: "trl" (GRPOTrainer + PEFT) or "unsloth" (FastLanguageModel)
    role: str
    logits_path: dict[str, str]  # per platform (cpu, cuda): a path of benchmarks.model.memory.predict.LOGITS_PATHS
    pins: tuple[str, ...]  # what its venv installs beside the worker (nox)
    levers: dict[str, Any] = field(default_factory=dict)  # GRPOConfig fields over the search's levers
    needs_cuda: str | None = None  # why it cannot run without CUDA
    venv: str = "own"  # "own": a venv of its own (nox's contender-NAME); "context": the context session's


def load_contenders() -> dict[str, Contender]:
    """Every contender of the catalog; an unknown or missing key is an error naming the entry."""
    with open(CATALOG, "rb") as f:
        table = tomllib.load(f)
    try:
        return {name: Contender(**{**entry, "pins": tuple(entry["pins"])}) for name, entry in table.items()}
    except (TypeError, KeyError) as error:
        raise ValueError(f"{CATALOG}: {error}") from None


CONTENDERS = load_contenders()
