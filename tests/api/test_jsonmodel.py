"""``api/jsonmodel.from_jsonable``, whose checkers are built once per type: a layout
reads back as written, and every kind of bad value is refused with the message (field
path and reason) it always had."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from api.jsonmodel import SchemaError, from_jsonable
from api.layout import Layout
from tools.dev.host_shapes import SHAPES, make_layout


def _data(shape=SHAPES[0]) -> dict:  # type: ignore[no-untyped-def]
    layout, _ = make_layout(shape)
    return json.loads(layout.to_json())


def test_a_layout_reads_back_as_written():
    for shape in SHAPES:
        layout, _ = make_layout(shape)
        assert Layout.from_dict(json.loads(layout.to_json())) == layout


def _set(d: dict, path: tuple, value):  # type: ignore[no-untyped-def]
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


@pytest.mark.parametrize(("path", "value", "message"), [
    (("nodes", 0, "vm_cpus", 1), "x", "layout.nodes[0].vm_cpus[1]: expected an integer, got 'x'"),
    (("nodes", 0, "vm_cpus", 1), True, "layout.nodes[0].vm_cpus[1]: expected an integer, got True"),
    (("nodes", 0, "vm_cpus", 1), None, "layout.nodes[0].vm_cpus[1]: expected an integer, got None"),
    (("nodes", 0, "vm_cpus", 1), 1.5, "layout.nodes[0].vm_cpus[1]: expected an integer, got 1.5"),
    (("nodes", 0, "vm_cpus"), {}, "layout.nodes[0].vm_cpus: expected a list"),
    (("nodes", 0, "node"), "0", "layout.nodes[0].node: expected an integer, got '0'"),
    (("nodes", 0), [], "layout.nodes[0]: expected an object"),
    (("nodes",), {}, "layout.nodes: expected a list"),
])
def test_a_bad_value_is_named_with_its_path(path, value, message):
    d = _data()
    _set(d, path, value)
    with pytest.raises(SchemaError) as e:
        Layout.from_dict(d)
    assert str(e.value) == message


def test_a_missing_field_and_optional_ones():
    d = _data()
    del d["nodes"][0]["node"]
    with pytest.raises(SchemaError, match=r"^layout\.nodes\[0\]\.node: missing$"):
        Layout.from_dict(d)


@dataclasses.dataclass(frozen=True)
class _Inner:
    n: int
    flag: bool = False
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class _Outer:
    items: tuple[_Inner, ...]
    by_id: dict[int, str]
    odd: float = 0.0  # a type from_jsonable does not read: refused only when sent


def test_scalars_unions_dicts_and_an_unsupported_type():
    got = from_jsonable(_Outer, {"items": [{"n": 1}, {"n": 2, "flag": True, "note": None}], "by_id": {"7": "x"}}, "o")
    assert got == _Outer((_Inner(1), _Inner(2, True, None)), {7: "x"})
    for bad, message in [
        ({"items": [{"n": 1, "flag": 1}], "by_id": {}}, "o.items[0].flag: expected true/false, got 1"),
        ({"items": [{"n": 1, "note": 3}], "by_id": {}}, "o.items[0].note: expected a string, got 3"),
        ({"items": [], "by_id": {"x": "y"}}, "o.by_id: key 'x' is not an integer"),
        ({"items": [], "by_id": {"1": None}}, "o.by_id.1: expected a string, got None"),
        ({"items": [], "by_id": []}, "o.by_id: expected an object"),
    ]:
        with pytest.raises(SchemaError) as e:
            from_jsonable(_Outer, bad, "o")
        assert str(e.value) == message
    with pytest.raises(TypeError, match="unsupported type"):
        from_jsonable(_Outer, {"items": [], "by_id": {}, "odd": 1.0}, "o")


def test_the_same_data_twice_is_read_the_same():
    d = _data(SHAPES[1])
    assert Layout.from_dict(copy.deepcopy(d)) == Layout.from_dict(d)
