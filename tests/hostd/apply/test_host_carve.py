"""The machine side of the carve (hostd/apply/host_carve.py) that needs no machine: the
mounts a carve records on a host tree, and the hugetlbfs mount a VM's memory needs
(a VM on a host without it is refused as not carved)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostd.apply.host_carve import TreeMounter, missing_pool_mount
from hostd.errors import ApplyFailed


@pytest.mark.parametrize("mounts", ["", "proc /proc proc rw 0 0\n", "proc /proc proc rw 0 0"])
def test_tree_mounts_are_recorded_in_the_tree_and_undone_byte_for_byte(tmp_path: Path, mounts: str) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/mounts").write_text(mounts)
    mp = tmp_path / "dev/hugepages-2M"
    mp.mkdir(parents=True)
    m = TreeMounter(tmp_path)
    m.mount_hugetlbfs(mp, 2048)
    assert m.is_mounted(mp)
    assert "hugetlbfs /dev/hugepages-2M hugetlbfs rw,relatime,pagesize=2048K 0 0" in \
        (tmp_path / "proc/mounts").read_text().splitlines()
    m.umount(mp)
    assert not m.is_mounted(mp) and (tmp_path / "proc/mounts").read_text() == mounts
    (tmp_path / "dev/file").write_text("")
    with pytest.raises(ApplyFailed, match="not a directory"):
        m.mount_hugetlbfs(tmp_path / "dev/file", 2048)


def test_a_vm_pool_needs_a_hugetlbfs_mount_of_its_page_size(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1000 kB\nHugepagesize:       2048 kB\n")
    (tmp_path / "proc/mounts").write_text("proc /proc proc rw 0 0\n")
    assert "no hugetlbfs mount with 2048 kB pages" in missing_pool_mount(tmp_path, 2048)
    mp = tmp_path / "dev/hugepages-2M"
    mp.mkdir(parents=True)
    TreeMounter(tmp_path).mount_hugetlbfs(mp, 2048)  # what the carve does on a tree
    assert missing_pool_mount(tmp_path, 2048) == ""
    assert "1048576 kB" in missing_pool_mount(tmp_path, 1048576)
    # a mount without pagesize= has the default size
    (tmp_path / "proc/mounts").write_text("hugetlbfs /dev/hugepages hugetlbfs rw,relatime 0 0\n")
    assert missing_pool_mount(tmp_path, 2048) == ""
    assert "cannot read" in missing_pool_mount(tmp_path / "nowhere", 2048)
