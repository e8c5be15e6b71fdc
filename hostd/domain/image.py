"""A guest image as a VM boots it: the manifest of hostd's image store
(``hostd/apply/images.py`` keeps, checks and lists them; the designer reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Image:
    name: str
    version: str
    kind: str  # "kernel" | "disk"
    files: dict[str, str]
    sha256: dict[str, str]
    cmdline: str = ""
    format: str = "raw"
    profiles: tuple[str, ...] = ()  # tuning profiles this image supports (guestimages/)
    labels: dict[str, str] = field(default_factory=dict)
    # What the guest kernel can do (hostd/domain/guest_profiles.py ImageCaps): nohlt_list, haltpoll...
    capabilities: dict[str, bool] = field(default_factory=dict)
