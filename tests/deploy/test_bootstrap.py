"""The bootstrap role (deploy/ansible/) against a throwaway Debian 12 root, for real.

A minbase tree from mmdebstrap (the tarball cached under /var/cache/hybrid-kvm/bootstrap/
by tools/dev/caches.py, keyed by everything that shapes it) is unpacked under tmp_path, /proc is mounted in it, and
deploy/ansible/bootstrap.yml runs against it through the role's own chroot connection
(deploy/ansible/connection_plugins/hyb_chroot.py: ansible-core has none). apt inside the
tree needs this machine's Debian mirror. HYB_BOOTSTRAP_LIGHT=1 skips the hypervisor
packages (libvirt, QEMU) where the mirror is slow; python3-venv and the rest still install.

The template test at the bottom is functional (no root, no network): the rendered hostd.toml
goes through hostd's own loader.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from tools.dev import caches

pytestmark = [pytest.mark.xdist_group("bootstrap")]  # a chroot of its own: not the machine group

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "deploy/ansible"
VENV_BIN = REPO / ".venv/bin"
HOST = "chroot-test"
LIGHT = os.environ.get("HYB_BOOTSTRAP_LIGHT") == "1"


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below root, deepest first (/proc/mounts escapes spaces as \\040)."""
    prefix = str(root)
    found = []
    for line in Path("/proc/mounts").read_text().splitlines():
        mnt = line.split()[1].replace("\\040", " ")
        if mnt == prefix or mnt.startswith(prefix + "/"):
            found.append(mnt)
    return sorted(found, key=len, reverse=True)


def _processes_in(root: Path) -> list[int]:
    """PIDs whose root directory is the tree: anything a package script left running."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "root") == str(root.resolve()):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.fixture
def debian_root(tmp_path: Path) -> Iterator[Path]:
    """An unpacked Debian tree with /proc mounted; unmounted and removed afterwards. The tree
    is only removed once nothing is mounted in it, so a failed umount never reaches the host.
    A process still running in the tree (started by this test, through apt) is killed by PID
    and fails the test: no package script may start a daemon in a chroot."""
    tar = caches.debian_tarball()
    root = tmp_path / "root"
    root.mkdir()
    leftover: list[int] = []
    try:
        # On a tmpfs of its own: dpkg syncs every file it unpacks, and ~400 packages'
        # syncs to disk were most of this test's time; the cleanup below unmounts it.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6g,mode=0755", "hyb-bootstrap", str(root)], check=True)
        subprocess.run(["tar", "--numeric-owner", "-xpf", str(tar), "-C", str(root)], check=True)
        subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
        # The packages apt downloads are kept across runs (apt checks each against the
        # signed index, and locks the directory): a second run installs without fetching.
        archives = caches.BOOTSTRAP / "apt-archives"
        (archives / "partial").mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(archives), str(root / "var/cache/apt/archives")], check=True)
        yield root
    finally:
        leftover = _processes_in(root)
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        for mnt in _mounts_under(root):
            subprocess.run(["umount", "--lazy", mnt], check=False)
        left = _mounts_under(root)
        assert not left, f"still mounted, tree kept: {left}"
        shutil.rmtree(root)
    assert not leftover, f"processes left running in the tree (killed): {leftover}"


@pytest.fixture(scope="session")
def release_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release bundle of HEAD (dependency wheels cached by build-release.sh)."""
    out = tmp_path_factory.mktemp("release") / "bundle"
    subprocess.run(["bash", str(ANSIBLE / "build-release.sh"), str(out)], check=True, timeout=900)
    return out


def _secrets(tmp_path: Path) -> Path:
    """secrets/<host>/ as an operator keeps it: the dev CA's hostd certificate and a token."""
    ca = tmp_path / "ca"
    subprocess.run(["bash", str(REPO / "tools/dev/make-dev-ca.sh"), str(ca), HOST], check=True,
                   capture_output=True)
    host = tmp_path / "secrets" / HOST
    host.mkdir(parents=True)
    for name in ("ca.crt", "hostd.crt", "hostd.key"):
        shutil.copy(ca / name, host / name)
    (host / "scheduler.token").write_text("hyb-host-token-123\n")
    return host.parent


def _ansible_env(tmp_path: Path) -> dict[str, str]:
    """Ansible with its defaults: no ansible.cfg of the developer's, no colour."""
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    return {**os.environ, "ANSIBLE_CONFIG": str(cfg), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"), "ANSIBLE_RETRY_FILES_ENABLED": "0"}


def _playbook(tmp_path: Path, inventory: Path, *extra: str) -> tuple[int, str, dict[str, int]]:
    env = _ansible_env(tmp_path)
    r = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory),
                        str(ANSIBLE / "bootstrap.yml"), *extra],
                       check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    m = re.search(rf"^{HOST}\s*:\s*(.*)$", r.stdout, re.MULTILINE)
    recap = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))} if m else {}
    return r.returncode, r.stdout + r.stderr, recap


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_bootstrap_installs_hostd_in_a_debian_root(debian_root: Path, release_dir: Path,
                                                   tmp_path: Path) -> None:
    secrets = _secrets(tmp_path)
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        "[storage]\n"
        f"{HOST} ansible_host={debian_root} ansible_connection=hyb_chroot rack=r12 "
        "labels=\"{'disk': 'nvme', 'wave': '3'}\"\n")
    policy = REPO / "tools/dev/demo-policy.toml"
    extra = ["-e", f"hostd_release_dir={release_dir}", "-e", f"hostd_secrets_root={secrets}",
             "-e", f"hostd_policy_file={policy}", "-e", "hostd_scheduler_url=https://sched.example:8700",
             "-e", "hostd_io_probe=tcp:127.0.0.1:6800",
             "-e", f"hostd_install_hypervisor={'false' if LIGHT else 'true'}"]

    rc, out, recap = _playbook(tmp_path, inventory, *extra)
    assert rc == 0 and recap.get("failed") == 0, out[-6000:]
    assert recap["changed"] > 0

    etc = debian_root / "etc/hostd"
    cfg = tomllib.loads((etc / "hostd.toml").read_text())
    assert cfg["host_name"] == HOST and cfg["rack"] == "r12"
    assert cfg["labels"] == {"disk": "nvme", "wave": "3"}
    assert cfg["scheduler_url"] == "https://sched.example:8700"
    assert cfg["io_probe"] == "tcp:127.0.0.1:6800"
    assert cfg["listen"] == "[::]:7443"
    assert cfg["profiles_dir"] == "/opt/hybrid-kvm/guestimages/profiles"
    assert (debian_root / "opt/hybrid-kvm/guestimages/profiles/online.toml").is_file()
    assert (etc / "policy.toml").read_bytes() == policy.read_bytes()
    for name, mode in [("hostd.toml", 0o644), ("policy.toml", 0o644), ("scheduler.token", 0o600),
                       ("tls/ca.crt", 0o644), ("tls/hostd.crt", 0o644), ("tls/hostd.key", 0o600)]:
        assert _mode(etc / name) == mode, name
        assert (etc / name).stat().st_uid == 0, name
    for name in ("ca.crt", "hostd.crt", "hostd.key"):
        assert (etc / "tls" / name).read_bytes() == (secrets / HOST / name).read_bytes()
    assert (etc / "scheduler.token").read_text() == "hyb-host-token-123\n"

    unit = debian_root / "etc/systemd/system/hostd.service"
    assert unit.read_bytes() == (REPO / "hostd/systemd/hostd.service").read_bytes()
    wants = debian_root / "etc/systemd/system/multi-user.target.wants/hostd.service"
    assert wants.is_symlink() and os.readlink(wants) == "/etc/systemd/system/hostd.service"

    # The venv works inside the tree, and reads the config the role wrote.
    def in_root(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["chroot", str(debian_root), *argv], check=False, capture_output=True, text=True,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    r = in_root("/opt/hybrid-kvm/.venv/bin/hostd", "--help")
    assert r.returncode == 0 and "usage: hostd" in r.stdout, r.stderr
    r = in_root("/opt/hybrid-kvm/.venv/bin/python", "-c",
                "from hostd.config import load_config; from pathlib import Path; "
                "c = load_config(Path('/etc/hostd/hostd.toml')); print(c.rack, c.labels['disk'])")
    assert r.stdout.split() == ["r12", "nvme"], r.stderr
    if not LIGHT:
        for tool in ("/usr/bin/qemu-img", "/usr/bin/virsh", "/usr/bin/qemu-system-x86_64"):
            assert (debian_root / tool.lstrip("/")).exists(), tool
        # live migration's TLS streams with this host's own certificate, as QEMU names them
        mig = etc / "tls/migration"
        assert _mode(mig) == 0o750
        for name, src, mode in [("ca-cert.pem", "ca.crt", 0o644), ("server-cert.pem", "hostd.crt", 0o644),
                                ("server-key.pem", "hostd.key", 0o600), ("client-cert.pem", "hostd.crt", 0o644),
                                ("client-key.pem", "hostd.key", 0o600), ("cacert.pem", "ca.crt", 0o644),
                                ("servercert.pem", "hostd.crt", 0o644), ("serverkey.pem", "hostd.key", 0o600),
                                ("clientcert.pem", "hostd.crt", 0o644), ("clientkey.pem", "hostd.key", 0o600)]:
            assert (mig / name).read_bytes() == (secrets / HOST / src).read_bytes(), name
            assert _mode(mig / name) == mode, name
        qemu_conf = (debian_root / "etc/libvirt/qemu.conf").read_text()
        assert re.search(r'^migrate_tls_x509_cert_dir = "/etc/hostd/tls/migration"$', qemu_conf, re.MULTILINE)
        assert re.search(r"^migrate_tls_x509_verify = 1$", qemu_conf, re.MULTILINE)
        # libvirtd's control connection between hosts (qemu+tls): served with the same
        # certificate, and presented by this host's libvirtd when it dials a peer
        libvirtd_conf = (debian_root / "etc/libvirt/libvirtd.conf").read_text()
        for key, name in (("key_file", "serverkey.pem"), ("cert_file", "servercert.pem"), ("ca_file", "cacert.pem")):
            assert re.search(rf'^{key} = "/etc/hostd/tls/migration/{name}"$', libvirtd_conf, re.MULTILINE), key
        assert 'migration_client_pki = "/etc/hostd/tls/migration"' in (etc / "hostd.toml").read_text()

    rc, out, recap = _playbook(tmp_path, inventory, *extra)
    assert rc == 0 and recap.get("changed") == 0, out[-6000:]

    # A policy hostd's loader refuses never reaches the host.
    bad = tmp_path / "bad-policy.toml"
    bad.write_text('[io_service]\nprocess = "x"\ncpus = "not-a-cpu-list"\n')
    rc, out, _ = _playbook(tmp_path, inventory, *extra, "-e", f"hostd_policy_file={bad}")
    assert rc != 0 and "failed to validate" in out, out[-3000:]
    assert (etc / "policy.toml").read_bytes() == policy.read_bytes()

    if not LIGHT:
        # A hostd certificate that cannot be a migration stream's client, or that libvirtd
        # would not serve with, is refused before anything is copied (the preflight),
        # naming what it lacks.
        ca = tmp_path / "ca"
        for name, usage, eku, why in [
                ("server-only", "digitalSignature,keyEncipherment", "serverAuth",
                 "extendedKeyUsage must hold serverAuth and clientAuth"),
                ("no-encipherment", "digitalSignature", "serverAuth,clientAuth",
                 "keyUsage must hold keyEncipherment")]:
            bad, ext = tmp_path / f"secrets-{name}", tmp_path / f"{name}.ext"
            shutil.copytree(secrets, bad)
            ext.write_text(f"basicConstraints=CA:FALSE\nkeyUsage=critical,{usage}\n"
                           f"extendedKeyUsage={eku}\nsubjectAltName=DNS:{HOST}\n")
            subprocess.run(["openssl", "req", "-new", "-key", str(ca / "hostd.key"), "-subj", f"/CN={HOST}",
                            "-out", str(tmp_path / "s.csr")], check=True, capture_output=True)
            subprocess.run(["openssl", "x509", "-req", "-in", str(tmp_path / "s.csr"), "-CA", str(ca / "ca.crt"),
                            "-CAkey", str(ca / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(ext),
                            "-out", str(bad / HOST / "hostd.crt")], check=True, capture_output=True)
            rc, out, _ = _playbook(tmp_path, inventory, *extra, "-e", f"hostd_secrets_root={bad}")
            assert rc != 0 and why in out, (name, out[-3000:])
            assert (etc / "tls/hostd.crt").read_bytes() == (secrets / HOST / "hostd.crt").read_bytes()


def test_hostd_toml_template_loads(tmp_path: Path) -> None:
    """The template with awkward values (quotes, a backslash, a numeric rack, extra keys)
    renders TOML that hostd's own loader accepts with the same values. Local connection, no root."""
    out = tmp_path / "hostd.toml"
    play = tmp_path / "render.yml"
    play.write_text(f"""
- hosts: localhost
  gather_facts: false
  vars_files: [{ANSIBLE}/roles/hostd/defaults/main.yml]
  tasks:
    - ansible.builtin.template:
        src: {ANSIBLE}/roles/hostd/templates/hostd.toml.j2
        dest: {out}
""")
    extra = {"rack": 12, "labels": {"disk": 'nv"me', "example.com/path_x": "a b\\c"},
             "hostd_io_probe": "command:/bin/true --flag", "hostd_virt_type": "qemu",
             "hostd_config_extra": {"watchdog_s": 3.5, "plaintext": False},
             "ansible_python_interpreter": sys.executable}
    r = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        str(play), "-e", json.dumps(extra)], cwd=tmp_path, env=_ansible_env(tmp_path),
                       check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    from hostd.config import load_config

    cfg = load_config(out)
    assert cfg.rack == "12" and cfg.host_name == "localhost"
    assert cfg.labels == {"disk": 'nv"me', "example.com/path_x": "a b\\c"}
    assert cfg.io_probe == "command:/bin/true --flag"
    assert cfg.watchdog_s == 3.5 and cfg.plaintext is False and cfg.virt_type == "qemu"
    assert str(cfg.tls_key) == "/etc/hostd/tls/hostd.key"
