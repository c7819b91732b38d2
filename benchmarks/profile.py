"""Profiles: declarative TOML under ``profiles/``, inheriting ``base.toml``, validated on load.

An unknown key or a value of the wrong type is a :class:`ProfileError` naming the file and
the dotted key. ``--quick`` overlays the profile's ``[quick]`` table on the profile itself.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
BASE = "base"


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class RewardsBench:
    batch_sizes: tuple[int, ...]
    words: tuple[int, ...]
    formats: tuple[str, ...]
    execution_timeout_s: float
    execution_rounds: int
    seed_execution_batch: int
    seed_execution_rounds: int
    max_time_s: float
    min_rounds: int


@dataclass(frozen=True)
class Profile:
    name: str
    question: str
    hardware: str
    parts: tuple[str, ...]
    rewards: RewardsBench

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FORMATS = ("str", "conversational")
PARTS = ("rewards",)


def _merge(base: dict, overlay: dict) -> dict:
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _coerce(value: Any, hint: Any, file: str, key: str) -> Any:
    """``value`` as type ``hint`` (int, float, str, tuple[X, ...] or a dataclass), else ProfileError."""
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ProfileError(f"{file}: {key}: expected a table, got {type(value).__name__}")
        return _build(hint, value, file, f"{key}.")
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list):
            raise ProfileError(f"{file}: {key}: expected a list, got {type(value).__name__}")
        item = typing.get_args(hint)[0]
        return tuple(_coerce(v, item, file, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ProfileError(f"{file}: {key}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def _build(cls: type, data: dict, file: str, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ProfileError(f"{file}: unknown key {prefix}{key!s}")
    for name in names:
        if name not in data:
            raise ProfileError(f"{file}: missing key {prefix}{name}")
    return cls(**{name: _coerce(data[name], hints[name], file, prefix + name) for name in names})


def _read(path: Path) -> dict:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        raise ProfileError(f"{path}: not valid TOML: {error}") from None


def available() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml") if p.stem != BASE)


def load(name: str, quick: bool = False, directory: Path = PROFILES_DIR) -> Profile:
    """The profile ``name`` resolved on top of ``base.toml`` (and its ``[quick]`` overlay)."""
    path = directory / f"{name}.toml"
    if not path.is_file():
        raise ProfileError(f"no profile {name!r} in {directory} (have: {', '.join(available()) or 'none'})")
    base, own = _read(directory / f"{BASE}.toml"), _read(path)
    for data, file in ((base, directory / f"{BASE}.toml"), (own, path)):
        if "quick" in data and not isinstance(data["quick"], dict):
            raise ProfileError(f"{file}: quick: expected a table")
    data = _merge(base, own)
    overlay = data.pop("quick", {})
    if quick:
        data = _merge(data, overlay)
    profile = _build(Profile, {"name": name, **data}, str(path))
    _check(profile, str(path))
    if not quick:
        _build(Profile, _merge({"name": name, **data}, overlay), f"{path} [quick]")  # the overlay must be valid too
    return profile


def _check(profile: Profile, file: str) -> None:
    """Values a type alone does not rule out."""
    for i, fmt in enumerate(profile.rewards.formats):
        if fmt not in FORMATS:
            raise ProfileError(f"{file}: rewards.formats[{i}]: {fmt!r} is not one of {FORMATS}")
    for i, part in enumerate(profile.parts):
        if part not in PARTS:
            raise ProfileError(f"{file}: parts[{i}]: {part!r} is not one of {PARTS}")
    for key in ("batch_sizes", "words"):
        if any(v <= 0 for v in getattr(profile.rewards, key)):
            raise ProfileError(f"{file}: rewards.{key}: every value must be positive")
