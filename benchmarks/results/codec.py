"""Records to and from the JSON their files hold: ``decode`` checks every key against its record's type (a
SchemaError naming the file and the key's path), ``encode`` writes a record back with whatever else the file it
came from held. Read through ``schema``, the one entry to the contract."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from benchmarks.results.records import SchemaError


def decode(cls: type, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as the record type ``cls``; a SchemaError naming ``where`` and the key."""
    hints = _hints(cls)
    if not isinstance(value, dict):
        raise SchemaError(f"{where}: expected an object, got {type(value).__name__}")
    given = {}
    for item in dataclasses.fields(cls):
        if item.name in value:
            given[item.name] = _decoded(hints[item.name], value[item.name], _key(where, item.name))
        elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            raise SchemaError(f"{where}: missing key {item.name!r}")
    record = cls(**given)
    record._more = {key: item for key, item in value.items() if key not in given}  # kept, written back as read
    return record


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A record type's resolved annotations, once a process (resolving them costs more than decoding a file)."""
    return typing.get_type_hints(cls)


def _key(where: str, key: str) -> str:
    """``file: a.b[2].c``: the file, then the key's path inside it."""
    return f"{where}.{key}" if ": " in where else f"{where}: {key}"


def _decoded(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _decoded(next(a for a in args if a is not type(None)), value, where)
    if dataclasses.is_dataclass(hint):
        return decode(hint, value, where)
    if hint is Any:
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise SchemaError(f"{where}: expected a list, got {type(value).__name__}")
        return [_decoded(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: expected an object, got {type(value).__name__}")
        return {key: _decoded(args[1], item, _key(where, key)) for key, item in value.items()}
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if (hint is float and number) or (hint is int and number and float(value).is_integer()):
        return hint(value)
    if hint in (str, bool) and isinstance(value, hint):
        return value
    raise SchemaError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__} {value!r}")


def encode(value: Any) -> Any:
    """A record as the JSON its file holds: its fields, and whatever else the file it came from held."""
    if dataclasses.is_dataclass(value):
        fields = {item.name: encode(getattr(value, item.name)) for item in dataclasses.fields(value)}
        return {**getattr(value, "_more", {}), **fields}
    if isinstance(value, list | tuple):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    return value
