"""Convert frozen dataclasses to JSON-able data and back, with typed checks.

Used for the interfaces that travel as JSON (topology, layout, carve journal).
Errors name the field path ("topology.cpus[3].node: expected an integer").
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


class SchemaError(ValueError):
    """JSON data does not match the expected shape; the message names the field."""


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


def from_jsonable(tp: Any, value: Any, path: str) -> Any:
    """Build an instance of ``tp`` from JSON data, checking every field."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected an object")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            sub = f"{path}.{f.name}"
            if f.name not in value:
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                    continue
                raise SchemaError(f"{sub}: missing")
            kwargs[f.name] = from_jsonable(hints[f.name], value[f.name], sub)
        return tp(**kwargs)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected a list")
        return tuple(from_jsonable(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        kt, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected an object")
        return {_key(kt, k, path): from_jsonable(vt, v, f"{path}.{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise SchemaError(f"{path}: must not be null")
        (inner,) = [a for a in args if a is not type(None)]
        return from_jsonable(inner, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise SchemaError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise SchemaError(f"{path}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported type {tp!r} at {path}")  # programming error


def _key(kt: Any, k: str, path: str) -> Any:
    if kt is int:
        try:
            return int(k)
        except ValueError:
            raise SchemaError(f"{path}: key {k!r} is not an integer") from None
    return k
