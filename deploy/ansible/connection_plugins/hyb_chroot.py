# A connection to a directory tree through chroot(8), for the bootstrap test and image
# builds: ansible-core has no chroot connection (community.general's is not installed
# here). Commands run under `chroot ROOT /bin/sh -c`, files go in and out through
# `chroot ROOT dd`, so an absolute symlink inside the tree resolves inside it, never on
# the controller. The controller must be root; mounting /proc and /dev is the caller's job.
from __future__ import annotations

DOCUMENTATION = """
    name: hyb_chroot
    short_description: run tasks inside a chroot on the controller
    description:
        - Runs commands with chroot(8) in the directory named by ansible_host (or the inventory name).
    author: hybrid-kvm
    options:
        remote_addr:
            description: the root directory of the tree
            default: inventory_hostname
            vars:
                - name: inventory_hostname
                - name: ansible_host
    extends_documentation_fragment:
        - connection_pipelining
"""

import os
import shlex
import shutil
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.plugins.connection import ConnectionBase

# Nothing of the controller's environment (its venv, PYTHONPATH, PATH) leaks in.
CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "HOME": "/root", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
BUFSIZE = 65536


class Connection(ConnectionBase):
    transport = "hyb_chroot"
    has_pipelining = True
    default_user = "root"

    def _connect(self) -> Connection:
        root = self.get_option("remote_addr")
        if not os.path.isabs(root) or not os.path.isfile(os.path.join(root, "bin/sh")):
            raise AnsibleConnectionFailure(f"{root} is not a directory tree with /bin/sh")
        if os.geteuid() != 0:
            raise AnsibleConnectionFailure("chroot needs root on the controller")
        self.root = root
        self.chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        self._connected = True
        return self

    def _run(self, argv: list[str], stdin=subprocess.PIPE, in_data: bytes | None = None):
        p = subprocess.Popen([self.chroot, self.root, *argv], stdin=stdin, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=CHROOT_ENV)
        out, err = p.communicate(in_data)
        return p.returncode, out, err

    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = True):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        self._connect()
        return self._run(["/bin/sh", "-c", cmd], in_data=in_data)

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        self._connect()
        try:
            with open(in_path, "rb") as f:
                rc, _, err = self._run(["dd", f"of={out_path}", f"bs={BUFSIZE}", "status=none"], stdin=f)
        except OSError as e:
            raise AnsibleFileNotFound(f"cannot read {in_path}: {e}") from None
        if rc != 0:
            raise AnsibleError(f"put {out_path} into {self.root}: {err.decode(errors='replace')}")

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        self._connect()
        rc, out, err = self._run(["dd", f"if={in_path}", f"bs={BUFSIZE}", "status=none"])
        if rc != 0:
            msg = err.decode(errors="replace")
            raise AnsibleError(f"fetch {shlex.quote(in_path)} from {self.root}: {msg}")
        with open(out_path, "wb") as f:
            f.write(out)

    def close(self) -> None:
        self._connected = False
