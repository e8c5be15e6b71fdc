"""Convert frozen dataclasses to JSON-able data and back, with typed checks.

Used for the interfaces that travel as JSON (topology, layout, carve journal).
Errors name the field path ("topology.cpus[3].node: expected an integer").
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import types
import typing
from collections.abc import Callable
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
    return _converter(tp)(value, path)


_CONVERTERS: dict[Any, Callable[[Any, str], Any]] = {}
# Converters of the build under way (``_BUILD`` held), published to ``_CONVERTERS`` when
# it ends. A dataclass's converter exists before its fields' (a type may contain itself),
# and one published then was found by another thread with no fields: hostd's first
# ledger read of a claim, on a CreateVM and a libvirt event at once, built a Claim from
# nothing ("missing 7 required positional arguments").
_BUILDING: dict[Any, Callable[[Any, str], Any]] = {}
_BUILD = threading.RLock()


def _converter(tp: Any) -> Callable[[Any, str], Any]:
    """The checker-builder for ``tp``, made once per type (a host registration's layout
    holds hundreds of values: asking ``typing`` what each one's type is, value by value,
    was most of its parse). Error messages as they always were. Thread-safe: a converter
    is published only once every converter it calls is complete."""
    got = _CONVERTERS.get(tp)
    if got is not None:
        return got
    with _BUILD:
        got = _CONVERTERS.get(tp) or _BUILDING.get(tp)
        if got is not None:
            return got
        # nothing under way: what this call builds depends on nothing unfinished
        outermost = not _BUILDING
        try:
            got = _BUILDING[tp] = _make(tp)
            if outermost:
                _CONVERTERS.update(_BUILDING)
        finally:
            if outermost:
                _BUILDING.clear()
        return got


def _make(tp: Any) -> Callable[[Any, str], Any]:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        fields: list[tuple[str, Callable[[Any, str], Any], bool]] = []

        def dataclass_of(value: Any, path: str) -> Any:
            if not isinstance(value, dict):
                raise SchemaError(f"{path}: expected an object")
            kwargs = {}
            for name, conv, optional in fields:
                if name not in value:
                    if optional:
                        continue
                    raise SchemaError(f"{path}.{name}: missing")
                kwargs[name] = conv(value[name], f"{path}.{name}")
            return tp(**kwargs)
        _BUILDING[tp] = dataclass_of  # before its fields: a type may contain itself
        fields.extend((name, _converter(hint), optional) for name, hint, optional in _fields(tp))
        return dataclass_of
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        if inner in _SCALARS:
            check = _SCALARS[inner]

            def scalars(value: Any, path: str) -> Any:
                if not isinstance(value, list):
                    raise SchemaError(f"{path}: expected a list")
                for i, v in enumerate(value):
                    if not check(v):
                        _scalar(inner, v, f"{path}[{i}]")  # raises the message
                return tuple(value)
            return scalars
        conv = _converter(inner)

        def tuple_of(value: Any, path: str) -> Any:
            if not isinstance(value, list):
                raise SchemaError(f"{path}: expected a list")
            return tuple(conv(v, f"{path}[{i}]") for i, v in enumerate(value))
        return tuple_of
    if origin is dict:
        kt, vt = typing.get_args(tp)
        vconv = _converter(vt)

        def dict_of(value: Any, path: str) -> Any:
            if not isinstance(value, dict):
                raise SchemaError(f"{path}: expected an object")
            return {_key(kt, k, path): vconv(v, f"{path}.{k}") for k, v in value.items()}
        return dict_of
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        nullable = type(None) in args
        inner = [a for a in args if a is not type(None)]
        conv = _converter(inner[0]) if len(inner) == 1 else _make(object)  # a union of several: unsupported

        def union_of(value: Any, path: str) -> Any:
            if value is None:
                if nullable:
                    return None
                raise SchemaError(f"{path}: must not be null")
            return conv(value, path)
        return union_of
    if tp in _SCALARS:
        return lambda value, path: _scalar(tp, value, path)

    def unsupported(value: Any, path: str) -> Any:  # raised when such a value comes, as always
        raise TypeError(f"unsupported type {tp!r} at {path}")  # programming error
    return unsupported


def _scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise SchemaError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{path}: expected an integer, got {value!r}")
        return value
    if not isinstance(value, str):
        raise SchemaError(f"{path}: expected a string, got {value!r}")
    return value


# the scalar types, each with its quick check (a value that fails it gets ``_scalar``'s message)
_SCALARS: dict[Any, Callable[[Any], bool]] = {
    bool: lambda v: v is True or v is False,
    int: lambda v: type(v) is int or (isinstance(v, int) and not isinstance(v, bool)),
    str: lambda v: isinstance(v, str),
}


@functools.cache
def _fields(tp: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, resolved type, has a default) of each of dataclass ``tp``'s fields, once per
    class: ``typing.get_type_hints`` evaluates every annotation string on each call, and
    that was 30 % of a host registration's CPU (a layout holds hundreds of objects)."""
    hints = typing.get_type_hints(tp)
    return tuple((f.name, hints[f.name], f.default is not dataclasses.MISSING
                  or f.default_factory is not dataclasses.MISSING) for f in dataclasses.fields(tp))


def _key(kt: Any, k: str, path: str) -> Any:
    if kt is int:
        try:
            return int(k)
        except ValueError:
            raise SchemaError(f"{path}: key {k!r} is not an integer") from None
    return k
