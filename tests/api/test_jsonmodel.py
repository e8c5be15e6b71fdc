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


def test_threads_asking_for_a_new_types_converter_at_once_all_get_a_whole_one():
    """hostd's first read of a claim happened on a CreateVM and a libvirt event's thread at
    once; one of them got the converter published before its fields were made and built
    the object from no fields at all. Eight threads parse values of fresh types (made
    here, so no converter exists yet) at the same moment, over and over, with the
    interpreter switching threads every microsecond: every parse returns the whole value."""
    import sys
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _parse_fresh_types_at_once()
    finally:
        sys.setswitchinterval(old)


def _parse_fresh_types_at_once() -> None:
    import threading

    from api.jsonmodel import to_jsonable

    for round_ in range(20):
        leaf = dataclasses.make_dataclass(f"Leaf{round_}", [(f"x{i}", int) for i in range(8)], frozen=True)
        mid = dataclasses.make_dataclass(f"Mid{round_}", [(f"l{i}", leaf) for i in range(6)], frozen=True)
        top = dataclasses.make_dataclass(f"Top{round_}", [(f"m{i}", tuple[mid, ...]) for i in range(6)],
                                         frozen=True)
        value = top(**{f"m{i}": (mid(**{f"l{j}": leaf(*range(8)) for j in range(6)}),) for i in range(6)})
        doc = to_jsonable(value)
        start, got, errors = threading.Barrier(8), [], []

        def parse() -> None:
            start.wait()
            try:
                got.append(from_jsonable(top, doc, "top"))
            except Exception as e:  # noqa: BLE001 - what the test counts
                errors.append(e)
        threads = [threading.Thread(target=parse) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and got == [value] * 8, (round_, errors[:2])
