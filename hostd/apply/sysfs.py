"""The one privileged writer: every sysfs / cgroupfs attribute write goes here.

EBUSY (a device or cgroup that is momentarily busy: a VF still bound, a pool
being resized) is retried a bounded number of times with a short back-off and
then raised as ``DeviceBusy`` naming the attribute.
"""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path

from hostd.errors import DeviceBusy

log = logging.getLogger(__name__)

BUSY_RETRIES = 5
BUSY_DELAY_S = 0.05


def read_attr(path: Path) -> str:
    return path.read_text().strip()


def write_attr(path: Path, value: str | int, *, retries: int = BUSY_RETRIES,
               delay_s: float = BUSY_DELAY_S) -> None:
    """Write ``value`` to a kernel attribute file, retrying EBUSY ``retries`` times."""
    data = str(value)
    for attempt in range(retries + 1):
        try:
            # One write(2) per value: kernel attributes do not accept partial writes.
            with open(path, "w") as f:
                f.write(data)
            log.debug("write_attr path=%s value=%s", path, data)
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            if attempt == retries:
                raise DeviceBusy(f"{path} stayed busy after {retries} retries writing {data!r}",
                                 field=str(path)) from e
            time.sleep(delay_s * (attempt + 1))
