"""hostd's element in a domain's ``<metadata>``: what makes a domain ours, and
enough to adopt it after the ledger is lost (vm id, request id, claim, spec).

    <hyb:vm xmlns:hyb="https://hybrid-kvm.example/xmlns/hostd/1" version="1">
      <hyb:vm-id>...</hyb:vm-id>
      <hyb:request-id>...</hyb:request-id>
      <hyb:created>1763900000</hyb:created>
      <hyb:claim>{json}</hyb:claim>
      <hyb:spec>{json}</hyb:spec>
    </hyb:vm>

libvirt hands the element back from ``virDomainGetMetadata`` with its own
namespace prefix choice, so parsing goes by local names only.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from api.jsonmodel import SchemaError
from hostd.carve.vmclaim import Claim
from hostd.carve.vmspec import VmSpec
from hostd.errors import BadMetadata

NS = "https://hybrid-kvm.example/xmlns/hostd/1"
PREFIX = "hyb"
VERSION = "1"


@dataclass(frozen=True)
class VmMetadata:
    vm_id: str
    request_id: str
    created: int
    claim: Claim
    spec: VmSpec

    def element(self) -> ET.Element:
        root = ET.Element(f"{{{NS}}}vm", {"version": VERSION})
        for tag, text in (("vm-id", self.vm_id), ("request-id", self.request_id),
                          ("created", str(self.created)),
                          ("claim", json.dumps(self.claim.to_dict(), sort_keys=True)),
                          ("spec", json.dumps(self.spec.to_dict(), sort_keys=True))):
            ET.SubElement(root, f"{{{NS}}}{tag}").text = text
        return root

    def to_xml(self) -> str:
        ET.register_namespace(PREFIX, NS)
        return ET.tostring(self.element(), encoding="unicode")

    @classmethod
    def from_xml(cls, text: str) -> "VmMetadata":
        try:
            root = ET.fromstring(text)
        except ET.ParseError as e:
            raise BadMetadata(f"not XML: {e}", field="metadata") from None
        vals = {_local(child.tag): (child.text or "") for child in root}
        try:
            return cls(vm_id=vals["vm-id"], request_id=vals["request-id"],
                       created=int(vals.get("created") or 0),
                       claim=Claim.from_dict(json.loads(vals["claim"])),
                       spec=VmSpec.from_dict(json.loads(vals["spec"])))
        except KeyError as e:
            raise BadMetadata(f"missing element {e.args[0]}", field="metadata") from None
        except (ValueError, SchemaError) as e:  # JSONDecodeError is a ValueError
            raise BadMetadata(str(e), field="metadata") from None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]
