"""Helpers shared by the element classes (``elements.py``, ``devices.py``)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

UNITS_KIB = {"b": 1 / 1024, "bytes": 1 / 1024, "k": 1, "kib": 1, "kb": 1000 / 1024,
             "m": 1024, "mib": 1024, "mb": 1000**2 / 1024, "g": 1024**2, "gib": 1024**2,
             "gb": 1000**3 / 1024, "t": 1024**3, "tib": 1024**3}


class ElementError(ValueError):
    """XML that the element classes cannot read; the message names the element."""


def sub(parent: ET.Element, tag: str, text: object = None, **attrs: object) -> ET.Element:
    """Append ``<tag>``; attributes whose value is None are left out (``type_`` -> ``type``)."""
    el = ET.SubElement(parent, tag, {k.rstrip("_"): fmt(v) for k, v in attrs.items() if v is not None})
    if text is not None:
        el.text = fmt(text)
    return el


def fmt(v: object) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def opt_int(el: ET.Element | None, attr: str | None = None, *, where: str = "") -> int | None:
    """An attribute (or the text when ``attr`` is None) as int; None when absent."""
    if el is None:
        return None
    raw = el.text if attr is None else el.get(attr)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip(), 0)
    except ValueError:
        raise ElementError(f"{where or el.tag}: {raw!r} is not an integer") from None


def req_int(el: ET.Element | None, attr: str | None, where: str) -> int:
    v = opt_int(el, attr, where=where)
    if v is None:
        raise ElementError(f"{where}: missing")
    return v


def yes(v: str | None) -> bool | None:
    """libvirt's yes/no and on/off; None when absent."""
    return None if v is None else v in ("yes", "on")


def to_kib(n: int, unit: str | None, where: str) -> int:
    u = (unit or "KiB").lower()
    if u not in UNITS_KIB:
        raise ElementError(f"{where}: unknown unit {unit!r}")
    return int(n * UNITS_KIB[u])


def need(el: ET.Element | None, where: str) -> ET.Element:
    if el is None:
        raise ElementError(f"{where}: missing")
    return el


class XmlElement:
    """Base of every element class: ``to_element``/``from_element`` are the tree
    form each class writes; ``to_xml``/``from_xml`` the text form."""

    def to_element(self) -> ET.Element:
        raise NotImplementedError

    @classmethod
    def from_element(cls, el: ET.Element):  # -> Self
        raise NotImplementedError

    def to_xml(self) -> str:
        el = self.to_element()
        ET.indent(el, "  ")
        return ET.tostring(el, encoding="unicode")

    @classmethod
    def from_xml(cls, text: str):  # -> Self
        try:
            el = ET.fromstring(text)
        except ET.ParseError as e:
            raise ElementError(f"{cls.__name__}: XML does not parse: {e}") from None
        return cls.from_element(el)
