"""The caches the suite fills on a fresh machine, one function each, and the warmer that
fills them all beside the tests (``make test``).

On a new machine a third of the suite's time went to building what later runs find
cached: the online guest image (mmdebstrap, ~4 min), the bootstrap's Debian tarball and
wheel bundle, OpenStack Placement's venv for the baseline bench, the kernel tree for the
patch check. Each was built by the first test that needed it, on that test's worker and
in the middle of its group, while the other workers' tests waited on it or went on
without it. ``tools/dev/run-tests.sh`` starts :func:`main` in the background as pytest
starts, so the builds overlap the tests that need none of them; a test that needs one
takes the same lock and finds it built (or waits for the build already running, never
starts a second).

Every builder is idempotent and locks: the image recipes and the kernel scripts lock
themselves, the Python ones here take an ``flock`` beside their cache. The warmer holds
the quiet tests' shared lock (tests/conftest.py) while it builds, so no test that
measures the machine runs beside a build.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HYB_CACHE_DIR", "/var/cache/hybrid-kvm"))
SMOKE_DIR = Path(os.environ.get("HYB_SMOKE_DIR", str(CACHE / "smoke")))
ONLINE_DIR = Path(os.environ.get("HYB_ONLINE_DIR", str(CACHE / "online")))
PLACEMENT_VENV = CACHE / "placement-venv"
BOOTSTRAP = CACHE / "bootstrap"
BOOTSTRAP_SUITE = "bookworm"  # the release bundle's wheels are for the controller's Python: 3.11
# No service may start inside the bootstrap's tree while apt installs libvirt (invoke-rc.d asks this).
POLICY_RC_HOOK = ('printf "#!/bin/sh\\nexit 101\\n" > "$1/usr/sbin/policy-rc.d"; '
                  'chmod 0755 "$1/usr/sbin/policy-rc.d"')


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created) for the block: one builder at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def smoke_image() -> Path:
    """The smoke guest (kernel + initramfs), by its recipe (which locks its output)."""
    subprocess.run(["bash", str(REPO / "guestimages/smoke/build.sh"), str(SMOKE_DIR)], check=True)
    return SMOKE_DIR


def online_image() -> Path:
    """The online guest image, by its recipe (which locks its output), below normal priority."""
    subprocess.run(["nice", "-n", "10", "bash", str(REPO / "guestimages/online/build.sh"), str(ONLINE_DIR)],
                   check=True, timeout=1800)
    return ONLINE_DIR


def checked_manifest(out: Path) -> dict:
    """A built image's manifest, its files checked against the manifest's sha256 (an
    AssertionError names the file that differs). A file checked before and not modified
    since (the same inode, size and modification time, as recorded in ``.checked.json``
    beside it) is not hashed again: the online image's 2 GiB disk cost 1.4 CPU-s from
    the page cache and up to ~13 s from the disk, on every run."""
    import json

    from hostd.apply.images import keep_stamps, matching_stamp, read_stamps  # hostd's own rule for its images

    m = json.loads((out / "manifest.json").read_text())
    record = out / ".checked.json"
    seen = read_stamps(record)
    now = {}
    for role, f in m["files"].items():
        stamp = matching_stamp(out / f, m["sha256"][role], seen.get(role))
        assert stamp is not None, f"{out / f} does not match its manifest's sha256"
        now[role] = stamp
    if now != seen:
        keep_stamps(record, now)
    return m


def debian_mirror() -> str:
    """This machine's apt sources when they are bookworm's (mmdebstrap reads a .sources or
    .list file given as the mirror), else Debian's CDN; HYB_DEBIAN_MIRROR wins."""
    if os.environ.get("HYB_DEBIAN_MIRROR"):
        return os.environ["HYB_DEBIAN_MIRROR"]
    for f in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if f.is_file() and re.search(rf"\b{BOOTSTRAP_SUITE}\b", f.read_text()):
            return str(f)
    return "http://deb.debian.org/debian"


def debian_tarball() -> Path:
    """A minbase bookworm tarball for the bootstrap test's throwaway root, built once per
    content key (mmdebstrap version, options, hook, and the mirror's text)."""
    mirror = debian_mirror()
    version = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    mirror_text = Path(mirror).read_text() if Path(mirror).is_file() else mirror
    shape = repr((version, BOOTSTRAP_SUITE, "minbase", POLICY_RC_HOOK, mirror_text))
    key = hashlib.sha256(shape.encode()).hexdigest()[:16]
    tar = BOOTSTRAP / f"{BOOTSTRAP_SUITE}-minbase-{key}.tar"
    with locked(BOOTSTRAP / ".lock"):
        if tar.exists():
            return tar
        part = tar.with_suffix(f".part{os.getpid()}")
        try:
            subprocess.run(["nice", "-n", "10", "mmdebstrap", "--quiet", "--variant=minbase", "--format=tar",
                            f"--customize-hook={POLICY_RC_HOOK}", BOOTSTRAP_SUITE, str(part), mirror],
                           check=True, timeout=600)
            part.rename(tar)
        finally:
            part.unlink(missing_ok=True)
    return tar


def release_wheels() -> None:
    """The release bundle's dependency wheels (deploy/ansible/build-release.sh caches them
    under its own lock); the bundle built here is thrown away."""
    with tempfile.TemporaryDirectory(prefix="hyb-warm-release-") as d:
        subprocess.run(["nice", "-n", "10", "bash", str(REPO / "deploy/ansible/build-release.sh"),
                        str(Path(d) / "bundle")], check=True, timeout=900, stdout=subprocess.DEVNULL)


def placement_venv(venv: Path = PLACEMENT_VENV) -> Path:
    """OpenStack Placement's own venv, for the placement baseline (bench/placement.py)."""
    with locked(venv.parent / f".{venv.name}.lock"):
        if (venv / "bin" / "gunicorn").exists() and (venv / "bin" / "placement-manage").exists():
            return venv
        py = venv / "bin" / "python"
        venv.parent.mkdir(parents=True, exist_ok=True)
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        out = subprocess.run(["nice", "-n", "10", str(py), "-m", "pip", "install", "-q", "openstack-placement",
                              "psycopg2-binary", "gunicorn"], capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"pip install openstack-placement failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return venv


def kernel_tree() -> None:
    """The kernel check's pristine tree and prepared guest build (kernel-patches/check
    --prepare-only, under the check's own lock)."""
    subprocess.run([str(REPO / "kernel-patches/check"), "--prepare-only"], check=True, timeout=3600,
                   stdout=subprocess.DEVNULL)


def nested_runtime() -> Path:
    """The nested-SVM guest's runtime disk (tools/dev/nested_svm.py: Python + bpftrace)."""
    from tools.dev import nested_svm
    return nested_svm.runtime_disk()


# In the order the suite's groups need them: the smoke guest at once (the machine group's
# first guests), the online image for the guest-boot and nested groups, the rest for single
# long tests.
WARMERS: list[tuple[str, Callable[[], object]]] = [
    ("smoke", smoke_image), ("online", online_image), ("nested-runtime", nested_runtime),
    ("bootstrap-tarball", debian_tarball),
    ("release-wheels", release_wheels), ("placement-venv", placement_venv), ("kernel-tree", kernel_tree)]


def main(argv: list[str] | None = None) -> int:
    """Fills every cache in turn, holding the quiet tests' lock shared while it builds; a
    failed one is reported and left to the test that needs it (which then fails on it)."""
    ap = argparse.ArgumentParser(prog="caches", description=main.__doc__)
    ap.add_argument("--quiet-lock-fd", type=int, help="an inherited descriptor of the run's quiet-test lock, "
                    "already locked shared (tests/conftest.py): kept open until every cache is built")
    ap.add_argument("--only", action="append", choices=[n for n, _ in WARMERS], help="only these (repeatable)")
    args = ap.parse_args(argv)
    failed = 0
    for name, build in WARMERS:
        if args.only and name not in args.only:
            continue
        t0 = time.monotonic()
        try:
            build()
            print(f"caches: {name} ready ({time.monotonic() - t0:.0f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - each cache on its own; the test that needs it reports
            failed += 1
            print(f"caches: {name} FAILED after {time.monotonic() - t0:.0f} s: {e}", flush=True)
    if args.quiet_lock_fd is not None:
        os.close(args.quiet_lock_fd)  # the last holder: quiet tests may run
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
