"""The block throttle (libvirt ``<iotune>``) is named in four places: the gRPC contract
(``api/hostd.proto`` ``IoTune``), the scheduler's REST schema (``IoTuneIn``), hostd's VM
spec (``hostd/carve/vmspec.py``) and the domain XML element (``hostd/domain/devices.py``,
which knows every limit libvirt 9.0 has). A field added to one and not the others would
be dropped silently on the way from the API to the domain: this test fails instead."""

from __future__ import annotations

import dataclasses

from api import hostd_pb2 as pb
from hostd.carve.vmspec import IoTune as SpecIoTune
from hostd.domain.devices import IoTune as XmlIoTune
from hostd.rpc.servicer import _iotune
from scheduler.schemas.vms import IoTuneIn


def proto_fields() -> list[str]:
    return [f.name for f in pb.IoTune.DESCRIPTOR.fields]


def test_contract_schema_and_spec_carry_the_same_fields_in_the_same_order() -> None:
    spec = [f.name for f in dataclasses.fields(SpecIoTune)]
    assert proto_fields() == spec
    assert list(IoTuneIn.model_fields) == spec


def test_the_domain_element_can_write_every_field() -> None:
    assert set(proto_fields()) <= {f.name for f in dataclasses.fields(XmlIoTune)}


def test_every_field_survives_proto_to_spec() -> None:
    m = pb.IoTune(**{name: i + 1 for i, name in enumerate(proto_fields()) if name != "group_name"},
                  group_name="g1")
    got = dataclasses.asdict(_iotune(m))
    assert got == {name: getattr(m, name) for name in proto_fields()}
