"""libvirt's own schema check, for every XML the tests generate."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def virt_xml_validate(path: Path) -> None:
    """Fail (never skip) when the validator is missing: `make deps` installs it
    (libvirt-clients, plus libxml2-utils for the xmllint it runs)."""
    tool = shutil.which("virt-xml-validate")
    if tool is None:
        pytest.fail("virt-xml-validate not found: run `make deps` (Debian: libvirt-clients)")
    if shutil.which("xmllint") is None:
        pytest.fail("xmllint not found (virt-xml-validate runs it): run `make deps` (libxml2-utils)")
    r = subprocess.run([tool, str(path), "domain"], capture_output=True, text=True)
    assert r.returncode == 0, f"virt-xml-validate {path}:\n{r.stdout}{r.stderr}"
