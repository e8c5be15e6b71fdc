"""The machine side of the carve (hostd/apply/carve_state.py) that needs no machine: the
mounts a carve records on a host tree, and the hugetlbfs mount a VM's memory needs
(a VM on a host without it is refused as not carved)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostd.apply.carve_state import TreeMounter, missing_pool_mount
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


def test_a_carve_killed_after_its_mkdir_carves_again_on_a_simulated_host(tmp_path: Path, monkeypatch) -> None:
    """hostd killed between a cgroup's mkdir and its first write (the fleet fault test's
    kill lands there now and then): the journal keeps the mkdir, and the next carve
    plans from the host as it is. On a real cgroupfs the new cgroup has its (empty)
    control files; the simulated host's animator makes them as the kernel does
    (``cgroup_files``), so the carve goes on instead of reading a file no host lacks."""
    from hostd.apply.carve_service import Where, discover_for
    from hostd.apply.carve_state import carve
    from hostd.apply.steps import WriteAttr
    from hostd.carve.plan import plan_host
    from hostd.carve.policy import loads_policy
    from tools.dev.fleetsim import POLICY
    from tools.dev.fleetsim_tree import CPUSET, cgroup_files, write_tree

    root, state = tmp_path / "sim", tmp_path / "state"
    write_tree(root, "sim")
    policy = loads_policy(POLICY)
    where = Where(root=root, state_dir=state, policy_file=tmp_path / "p.toml", virt_type="kvm")
    layout = plan_host(discover_for(policy, where), policy)

    def killed(self, ctx):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt  # not an Exception: nothing is rolled back, as after SIGKILL
    monkeypatch.setattr(WriteAttr, "apply", killed)
    with pytest.raises(KeyboardInterrupt):
        carve(POLICY, policy, layout, root=root, state_dir=state)
    monkeypatch.undo()
    io = root / CPUSET / "hyb-io"
    assert io.is_dir() and not (io / "cpuset.cpus").exists()
    cgroup_files(root)  # the animator's next tick
    assert (io / "cpuset.cpus").read_text() == ""
    out = carve(POLICY, policy, layout, root=root, state_dir=state)
    assert out.changed and (io / "cpuset.cpus").read_text().strip() == "0"
    (io / "cpuset.mems").write_text("0\n")
    cgroup_files(root)  # never replaces what was written
    assert (io / "cpuset.mems").read_text() == "0\n"
