"""VmManager's render step, in one object: the guest kernel cmdline from the VM's
tuning profile and vCPU layout (``guest_profiles``), then the domain
(``design_domain``, which also checks the claimed devices exist and makes the
console log directory). The image it is handed is the one the VM boots, its root
overlay made already (``hostd/apply/overlays.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hostd.domain.designer import HostFacts, design_domain
from hostd.domain.guest_profiles import Profile, cmdline_for_vm
from hostd.domain.image import Image
from hostd.domain.metadata import VmMetadata


class DomainRenderer:
    def __init__(self, facts: HostFacts, profiles: Mapping[str, Profile]):
        self.facts = facts
        self.profiles = profiles

    def __call__(self, md: VmMetadata, image: Image) -> str:
        if md.spec.profile and "kernel" in image.files:
            manifest = {"name": image.name, "cmdline": image.cmdline,
                        "profiles": list(image.profiles) or None, "capabilities": image.capabilities}
            image = dataclasses.replace(image, cmdline=cmdline_for_vm(
                self.profiles, manifest, md.spec.profile, vcpus=md.spec.vcpus))
        return design_domain(md, image, self.facts).to_xml()
