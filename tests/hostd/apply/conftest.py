"""Fixtures of the live carve tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

@pytest.fixture
def standin(tmp_path: Path):
    tag = f"hyb-io-standin-test-{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-m", "tools.dev.io_service_standin", "--tag", tag,
                             "--dir", str(tmp_path)])
    time.sleep(0.3)
    try:
        yield proc, tag
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
