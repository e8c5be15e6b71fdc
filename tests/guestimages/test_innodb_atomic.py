"""guestimages/common/hyb-innodb-atomic: the doublewrite rule (a pure shell function) on
sysfs values from the trees the project keeps, and the whole boot step on guest sysfs
trees built from them.

The rule runs inside the guest, which has no Python (Debian minbase / busybox), so it is
shell; these tests run it with the same POSIX shell (dash here) the image runs. Values:
the NVMe namespaces of the constructed 6.12 host tree of part 1
(tests/data/hosts/1s-4c-nvme-atomic-6.12: nvme0n1 unit 4096..16384, nvme1n1 all 0), this
machine's virtio disk on a 6.18 kernel (read from its sysfs: all 0) and the online image's
6.1 guest kernel (no atomic_write_* files at all, as its boot test shows).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "guestimages/common/hyb-innodb-atomic"
APPLY = REPO / "guestimages/common/hyb-profile-apply"
HOST612 = REPO / "tests/data/hosts/1s-4c-nvme-atomic-6.12/sys/devices/pci0000:00"
NVME_ATOMIC = HOST612 / "0000:00:1a.0/0000:31:00.0/nvme/nvme0/block/nvme0n1/queue"
NVME_NONE = HOST612 / "0000:00:1b.0/0000:32:00.0/nvme/nvme1/block/nvme1n1/queue"
ATOMIC_FILES = ("atomic_write_unit_min_bytes", "atomic_write_unit_max_bytes", "atomic_write_boundary_bytes",
                "atomic_write_max_bytes")
VIRTIO_618 = dict.fromkeys(ATOMIC_FILES, "0")  # /sys/block/vda/queue on this machine (6.18)
GUEST_61: dict[str, str] = {}  # Debian 12's 6.1 cloud kernel: the files do not exist


def sh(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True, check=True,
                          env={"PATH": os.environ["PATH"], **(env or {})}).stdout


def decide(*args: str) -> tuple[str, str]:
    out = dict(line.split("=", 1) for line in sh("decide", *args).splitlines())
    assert set(out) == {"doublewrite", "why"}, out
    return out["doublewrite"], out["why"]


def recorded(queue: Path) -> dict[str, str]:
    return {f: (queue / f).read_text().strip() for f in ATOMIC_FILES}


# -- the rule ------------------------------------------------------------------

def test_off_only_when_the_unit_covers_the_page():
    q = recorded(NVME_ATOMIC)
    assert q["atomic_write_unit_max_bytes"] == "16384"  # the kept tree is what we think it is
    dw, why = decide("nvme0n1", q["atomic_write_unit_max_bytes"], "16384", q["atomic_write_unit_min_bytes"],
                     q["atomic_write_boundary_bytes"])
    assert dw == "OFF" and "nvme0n1" in why and "16384 >= InnoDB page 16384" in why
    dw, why = decide("nvme0n1", q["atomic_write_unit_max_bytes"], "32768")  # innodb_page_size=32k
    assert dw == "ON" and "atomic unit 16384 < InnoDB page 32768" in why
    assert decide("nvme0n1", "65536", "8192")[0] == "OFF"


@pytest.mark.parametrize("umax, page, umin, boundary, reason", [
    ("", "16384", "", "", "no queue/atomic_write_unit_max_bytes"),  # 6.1 guest kernel
    ("0", "16384", "0", "0", "device has no atomic write unit"),  # virtio-blk, an NVMe without AWUPF
    ("4096", "16384", "4096", "0", "atomic unit 4096 < InnoDB page 16384"),
    ("garbage", "16384", "", "", "unreadable"),
    ("16384", "16384", "32768", "0", "atomic unit min 32768 > InnoDB page 16384"),
    ("65536", "16384", "4096", "24576", "boundary 24576 is not a multiple of the page 16384"),
    ("65536", "invalid:12345", "", "", "page size unknown"),
])
def test_every_other_case_keeps_doublewrite_on_and_names_why(umax, page, umin, boundary, reason):
    dw, why = decide("vdb", umax, page, umin, boundary)
    assert dw == "ON" and reason in why, why


def test_a_boundary_that_pages_cannot_straddle_is_fine():
    assert decide("nvme0n1", "65536", "16384", "4096", "131072")[0] == "OFF"


def test_no_block_device_keeps_it_on():
    dw, why = decide("", "", "16384")
    assert dw == "ON" and "no block device" in why


@pytest.mark.parametrize("value, want", [("", "16384"), ("16k", "16384"), ("16K", "16384"), ("4k", "4096"),
                                         ("65536", "65536"), ("64k", "65536"), ("12345", ""), ("3k", ""),
                                         ("abc", ""), ("128k", "")])
def test_innodb_page_size_as_mariadb_takes_it(value, want):
    assert sh("page-bytes", value).strip() == want


# -- the boot step on guest trees ------------------------------------------------

def guest_tree(tmp: Path, queue: dict[str, str], *, disk: str = "vdb", majmin: str = "254:16",
               partition: bool = False, datadir_mount: str = "/var/lib/mysql") -> dict[str, str]:
    """A guest's /sys (the data disk, its queue files, /sys/dev/block/<maj:min>), its
    mountinfo (/ on vda, the datadir's mount on the data disk or its partition 1) and a
    my_print_defaults that prints what tests put in ``mpd.out``; returns the env."""
    sys_ = tmp / "sys"
    ddir = sys_ / f"devices/pci0000:00/0000:00:05.0/virtio3/block/{disk}"
    (ddir / "queue").mkdir(parents=True)
    for k, v in queue.items():
        (ddir / "queue" / k).write_text(v + "\n")
    target = ddir
    if partition:
        target = ddir / f"{disk}1"
        target.mkdir()
        (target / "partition").write_text("1\n")
    (sys_ / "dev/block").mkdir(parents=True)
    (sys_ / "dev/block" / majmin).symlink_to(target)
    (tmp / "mountinfo").write_text(
        "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "23 22 0:21 / /proc rw,nosuid - proc proc rw\n"
        f"30 22 {majmin} / {datadir_mount} rw,noatime - ext4 /dev/{disk} rw\n"
        "31 22 0:25 / /run rw,nosuid - tmpfs tmpfs rw\n")
    mpd = tmp / "my_print_defaults"
    mpd.write_text(f"#!/bin/sh\n[ \"$1\" = --mysqld ] && cat {tmp}/mpd.out 2>/dev/null\nexit 0\n")
    mpd.chmod(0o755)
    (tmp / "cnf").mkdir()
    return {"HYB_SYSFS": str(sys_), "HYB_MOUNTINFO": str(tmp / "mountinfo"), "HYB_MYCNF_DIR": str(tmp / "cnf"),
            "HYB_MY_PRINT_DEFAULTS": str(mpd), "HYB_STATUS_DIR": str(tmp / "run")}


def decision(tmp: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (tmp / "run/innodb").read_text().splitlines())


def test_atomic_nvme_data_disk_turns_doublewrite_off_in_the_snippet(tmp_path):
    env = guest_tree(tmp_path, recorded(NVME_ATOMIC), disk="nvme0n1", majmin="259:0", partition=True)
    assert sh("apply", env=env).startswith("OFF (nvme0n1: atomic unit 16384 >= InnoDB page 16384")
    d = decision(tmp_path)
    assert d == {"datadir": "/var/lib/mysql", "disk": "nvme0n1", "unit_max_bytes": "16384", "page_size": "16384",
                 "doublewrite": "OFF", "why": d["why"], "cnf": str(tmp_path / "cnf/99-hyb-doublewrite.cnf")}
    cnf = (tmp_path / "cnf/99-hyb-doublewrite.cnf").read_text()
    assert "[mysqld]\ninnodb_doublewrite = OFF\n" in cnf and "# nvme0n1: atomic unit 16384" in cnf


def test_configured_page_size_and_datadir_come_from_my_cnf(tmp_path):
    env = guest_tree(tmp_path, recorded(NVME_ATOMIC), disk="nvme0n1", majmin="259:0", datadir_mount="/srv/db")
    # innodb_page_size=32k: one page is two atomic units, a tear is possible again
    (tmp_path / "mpd.out").write_text("--datadir=/srv/db/mysql\n--innodb-page-size=32k\n")
    assert sh("apply", env=env).startswith("ON ")
    d = decision(tmp_path)
    assert (d["datadir"], d["disk"], d["page_size"], d["doublewrite"]) == ("/srv/db/mysql", "nvme0n1", "32768", "ON")
    assert "atomic unit 16384 < InnoDB page 32768" in d["why"]
    assert "innodb_doublewrite = ON" in (tmp_path / "cnf/99-hyb-doublewrite.cnf").read_text()


def test_datadir_on_the_root_disk_is_judged_by_the_root_disk(tmp_path):
    env = guest_tree(tmp_path, recorded(NVME_ATOMIC), disk="nvme0n1", majmin="259:0", datadir_mount="/srv/db")
    (tmp_path / "sys/dev/block/254:0").symlink_to(tmp_path / "sys/devices/pci0000:00/0000:00:05.0/virtio3/block/vda")
    vda = tmp_path / "sys/devices/pci0000:00/0000:00:05.0/virtio3/block/vda/queue"
    vda.mkdir(parents=True)  # a 6.1 guest kernel: no atomic_write_* files
    sh("apply", env=env)  # datadir /var/lib/mysql is on /, i.e. vda, not on the atomic disk
    d = decision(tmp_path)
    assert (d["disk"], d["unit_max_bytes"], d["doublewrite"]) == ("vda", "", "ON")
    assert "no queue/atomic_write_unit_max_bytes" in d["why"]


@pytest.mark.parametrize("queue, reason", [(VIRTIO_618, "device has no atomic write unit"),
                                           (GUEST_61, "no queue/atomic_write_unit_max_bytes"),
                                           ("nvme1n1", "device has no atomic write unit")])
def test_disks_without_a_unit_keep_it_on(tmp_path, queue, reason):
    env = guest_tree(tmp_path, recorded(NVME_NONE) if queue == "nvme1n1" else queue)
    assert sh("apply", env=env).startswith("ON ")
    d = decision(tmp_path)
    assert d["doublewrite"] == "ON" and d["disk"] == "vdb" and reason in d["why"]


def test_without_mariadb_the_decision_is_still_recorded(tmp_path):
    env = guest_tree(tmp_path, VIRTIO_618)
    env["HYB_MYCNF_DIR"] = str(tmp_path / "no-such-dir")
    sh("apply", env=env)
    assert decision(tmp_path)["cnf"].startswith("not written: no ")
    assert not (tmp_path / "no-such-dir").exists()


def test_datadir_on_tmpfs_keeps_it_on(tmp_path):
    env = guest_tree(tmp_path, recorded(NVME_ATOMIC), disk="nvme0n1", majmin="259:0")
    (tmp_path / "mpd.out").write_text("--datadir=/run/mysql-data\n")
    sh("apply", env=env)
    d = decision(tmp_path)
    assert (d["disk"], d["doublewrite"]) == ("", "ON") and "no block device" in d["why"]


def test_profile_apply_runs_the_step_and_clear_removes_only_with_no_innodb_table(tmp_path):
    """hyb-profile-apply early with the rendered online env runs the step; baseline removes
    the snippet a previous boot wrote."""
    env = guest_tree(tmp_path, recorded(NVME_ATOMIC), disk="nvme0n1", majmin="259:0")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "p.env").write_text("HYB_INNODB_DOUBLEWRITE=auto\n")
    (profiles / "b.env").write_text("HYB_INNODB_DOUBLEWRITE=''\n")
    cmdline = tmp_path / "cmdline"

    def early(profile: str) -> str:
        cmdline.write_text(f"root=/dev/vda hyb.profile={profile}\n")
        # the kernel cmdline from a file; no systemd manager touched on this machine
        script = APPLY.read_text().replace("$(cat /proc/cmdline)", f"$(cat {cmdline})") \
            .replace("/run/systemd/system", str(tmp_path / "no-systemd"))
        (tmp_path / "apply.sh").write_text(script)
        return subprocess.run(["sh", str(tmp_path / "apply.sh"), "early"], capture_output=True, text=True,
                              env={"PATH": os.environ["PATH"], **env, "HYB_PROFILES_DIR": str(profiles),
                                   "HYB_INNODB_ATOMIC": str(SCRIPT)}).stdout

    assert "innodb=OFF (nvme0n1" in early("p")
    assert (tmp_path / "cnf/99-hyb-doublewrite.cnf").exists()
    assert "innodb=snippet removed" in early("b")
    assert not (tmp_path / "cnf/99-hyb-doublewrite.cnf").exists()
