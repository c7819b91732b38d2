"""TOML tables as typed records, for profiles and every catalog read alike: a table merged over the one it
inherits, each value coerced to its field's type and each table built into its dataclass, an unknown or missing key
or a value of the wrong type a ``ProfileError`` naming the file and the dotted key."""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from benchmarks.catalog.levers import Levers, ProfileError


def merge(base: dict, overlay: dict) -> dict:
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def coerce(value: Any, hint: Any, file: str, key: str) -> Any:
    """``value`` as type ``hint`` (int, float, str, bool, X | None, tuple[X, ...], dict[str, list],
    a dataclass), else ProfileError."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [h for h in typing.get_args(hint) if h is not type(None)]
        return None if value is None else coerce(value, options[0], file, key)
    if hint is Levers and isinstance(value, dict):
        return build(Levers, value, file, f"{key}.", partial=True)
    if hint is dict:  # a partial table of levers, kept as given
        if not isinstance(value, dict):
            raise ProfileError(f"{file}: {key}: expected a table, got {type(value).__name__}")
        build(Levers, value, file, f"{key}.", partial=True)
        return dict(value)
    if typing.get_origin(hint) is dict:
        if not isinstance(value, dict):
            raise ProfileError(f"{file}: {key}: expected a table, got {type(value).__name__}")
        return {k: coerce(v, list, file, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ProfileError(f"{file}: {key}: expected a table, got {type(value).__name__}")
        return build(hint, value, file, f"{key}.")
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list):
            raise ProfileError(f"{file}: {key}: expected a list, got {type(value).__name__}")
        item = typing.get_args(hint)[0]
        return tuple(coerce(v, item, file, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ProfileError(f"{file}: {key}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def build(cls: type, data: dict, file: str, prefix: str = "", partial: bool = False) -> Any:
    """``cls`` from a table; ``partial``: missing keys take the field defaults."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise ProfileError(f"{file}: unknown key {prefix}{key!s}")
    for name, field in fields.items():
        has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        if name not in data and not (partial or has_default):
            raise ProfileError(f"{file}: missing key {prefix}{name}")
    return cls(**{name: coerce(value, hints[name], file, prefix + name) for name, value in data.items()})


def read_table(path: Path) -> dict:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        raise ProfileError(f"{path}: not valid TOML: {error}") from None
