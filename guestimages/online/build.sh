#!/usr/bin/env bash
# Build the "online service" guest image: Debian 12 (bookworm) minbase + the
# cloud kernel + systemd + atop + jemalloc, from Debian's packages only, with
# the tuning profiles of guestimages/profiles/ baked in (selected per VM at boot
# by hyb.profile=NAME on the kernel cmdline).
#
# Usage: guestimages/online/build.sh [OUTDIR]   (default /var/cache/hybrid-kvm/online)
# Output (OUTDIR):
#   online.raw      ext4 root filesystem, no partition table (root=/dev/vda)
#   online.qcow2    the same, qemu-img converted
#   vmlinuz, initrd.img   for direct kernel boot
#   manifest.json   packages + versions, kernel, default cmdline, capabilities,
#                   profiles, sha256 of every output
# Two cached stages, each skipped when its inputs are unchanged:
#   1. mmdebstrap -> OUTDIR/.stage1/rootfs.tar (+ kernel, initrd, package list);
#      inputs: packages.txt, initramfs/*, the apt sources, SOURCE_DATE_EPOCH.
#   2. tar + rootfs/ overlay + rendered profiles -> mke2fs -d -> raw, qcow2,
#      manifest; inputs: stage 1 and everything else under guestimages/.
# No loop mounts: mke2fs -d populates the filesystem from a directory.
#
# Environment:
#   SOURCE_DATE_EPOCH  timestamps of every file, the tar and the filesystem
#                      (default 1735689600 = 2025-01-01T00:00:00Z)
#   HYB_APT_SOURCES    deb822 .sources (or .list) file for mmdebstrap; default:
#                      this host's Debian sources. Point it at a snapshot archive
#                      to pin the package set (see README.md, "Reproducibility").
#   HYB_DISK_SIZE      size of the raw image (default 2G; sparse)
# Needs (as root): mmdebstrap, e2fsprogs >= 1.43 (mke2fs -d), qemu-utils, python3.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gi=$(dirname "$here")
repo=$(dirname "$gi")
out=${1:-/var/cache/hybrid-kvm/online}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1735689600}
sources=${HYB_APT_SOURCES:-/etc/apt/sources.list.d/debian.sources}
size=${HYB_DISK_SIZE:-2G}
# Fixed filesystem identity: same UUID and directory-hash seed on every build.
FS_UUID=8f1e3c2a-5b7d-4e69-a0c4-6879626f6e6c
HASH_SEED=2d6b1f4e-93a8-4c75-b1e0-6879626f6e6c
FS_LABEL=hyb-online

log() { echo "online: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap --mode=root, file ownership in the image)"
[ -r "$sources" ] || die "apt sources $sources not readable (set HYB_APT_SOURCES)"
for t in mmdebstrap mke2fs qemu-img python3 tar; do
  command -v "$t" >/dev/null || die "$t not found (tools/dev/install-deps.sh installs it)"
done

mkdir -p "$out"
exec 9>"$out/.lock"
flock -w 3600 9 || die "another build holds $out/.lock"
t_all=$(now)

# ---------------------------------------------------------------- stage 1
s1=$out/.stage1
pkgs=$(grep -v -e '^#' -e '^[[:space:]]*$' "$here/packages.txt" | LC_ALL=C sort -u | paste -sd, -)
key1=$( { echo "stage1-v1 $SOURCE_DATE_EPOCH $pkgs"; cat "$sources";
          cat "$here/initramfs/hyb.conf" "$here/initramfs/modules"; } | sha256sum | cut -d' ' -f1)
if [ -s "$s1/rootfs.tar" ] && [ "$(cat "$s1/.key" 2>/dev/null)" = "$key1" ]; then
  log "stage 1 up to date ($s1)"
else
  t0=$(now)
  rm -rf "$s1"; mkdir -p "$s1"
  log "stage 1: mmdebstrap bookworm minbase + $pkgs"
  # Hooks run on this host with the chroot as $1. The essential hook puts the
  # initramfs config in place before the kernel's postinst builds the initrd.
  nice -n 10 mmdebstrap --mode=root --format=tar --variant=minbase \
    --include="$pkgs" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --essential-hook="mkdir -p \"\$1/etc/initramfs-tools/conf.d\" \"\$1/usr/share/initramfs-tools/modules.d\"
      cp '$here/initramfs/hyb.conf' \"\$1/etc/initramfs-tools/conf.d/hyb.conf\"
      cp '$here/initramfs/modules' \"\$1/usr/share/initramfs-tools/modules.d/hyb\"" \
    --customize-hook="chroot \"\$1\" dpkg-query -W -f='\${Package}\t\${Version}\n' | LC_ALL=C sort > '$s1/packages.tsv'
      cp \"\$1\"/boot/vmlinuz-* '$s1/vmlinuz'
      cp \"\$1\"/boot/initrd.img-* '$s1/initrd.img'
      ls \"\$1/lib/modules\" > '$s1/kernel-version'" \
    bookworm "$s1/rootfs.tar.tmp" "$sources" \
    > "$s1/mmdebstrap.log" 2>&1 || { tail -n 30 "$s1/mmdebstrap.log" >&2; die "mmdebstrap failed (log: $s1/mmdebstrap.log)"; }
  mv "$s1/rootfs.tar.tmp" "$s1/rootfs.tar"
  echo "$key1" > "$s1/.key"
  since "$t0" > "$s1/seconds"
  log "stage 1 done in $(cat "$s1/seconds") s"
fi

# ---------------------------------------------------------------- stage 2
# Paths in the key are relative to the repo: a clone elsewhere (CI's) finds the image built.
key2=$( { echo "stage2-v1 $key1 $size $FS_UUID $HASH_SEED";
          sha256sum "$s1/rootfs.tar" "$s1/vmlinuz" "$s1/initrd.img";
          cd "$gi" && find online profiles common -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z \
            | xargs -0 sha256sum;
          cd "$repo" && sha256sum hostd/domain/guest_profiles.py; } | sha256sum | cut -d' ' -f1)
outputs="online.raw online.qcow2 vmlinuz initrd.img manifest.json"
uptodate=1
for f in $outputs; do [ -s "$out/$f" ] || uptodate=0; done
if [ "$uptodate" = 1 ] && [ "$(cat "$out/.key" 2>/dev/null)" = "$key2" ]; then
  log "up to date ($out)"
  exit 0
fi
t0=$(now)
work=$(mktemp -d "$out/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir "$root"
tar -C "$root" --numeric-owner -xpf "$s1/rootfs.tar"

# Our files: overlay (root-owned), shared guest scripts, rendered profiles.
cp -rT --no-preserve=ownership "$here/rootfs" "$root"
install -m 0755 "$gi/common/hyb-guest-report" "$root/usr/local/sbin/hyb-guest-report"
install -m 0755 "$gi/common/hyb-profile-apply" "$root/usr/local/sbin/hyb-profile-apply"
install -m 0755 "$gi/common/hyb-innodb-atomic" "$root/usr/local/sbin/hyb-innodb-atomic"
mkdir -p "$root/etc/hyb/profiles"
profiles=$(cd "$repo" && python3 -c 'import sys; from hostd.domain.guest_profiles import write_guest_env_files
print(" ".join(write_guest_env_files(sys.argv[1], sys.argv[2])))' "$gi/profiles" "$root/etc/hyb/profiles")
[ -n "$profiles" ] || die "no profiles rendered from $gi/profiles"
# Enable our units (what "systemctl enable" would do, without needing systemd here).
for u in hyb-profile-early.service hyb-irq-affinity.service hyb-guest-report.service; do
  [ -f "$root/etc/systemd/system/$u" ] || die "unit $u missing from the overlay"
done
mkdir -p "$root/etc/systemd/system/sysinit.target.wants" "$root/etc/systemd/system/multi-user.target.wants"
ln -sf ../hyb-profile-early.service "$root/etc/systemd/system/sysinit.target.wants/"
ln -sf ../hyb-irq-affinity.service "$root/etc/systemd/system/multi-user.target.wants/"
ln -sf ../hyb-guest-report.service "$root/etc/systemd/system/multi-user.target.wants/"
chmod 0755 "$root/usr/local/sbin/"*
# Every file we touched gets the fixed timestamp (mke2fs copies inode times).
find "$root" -newermt "@$SOURCE_DATE_EPOCH" -print0 | xargs -0r touch -h -d "@$SOURCE_DATE_EPOCH"

# ext4 from the directory: fixed UUID, hash seed and timestamps (mke2fs 1.47
# reads SOURCE_DATE_EPOCH for the superblock times). No resize_inode/journal
# randomness: the journal is created empty.
rm -f "$work/online.raw"
truncate -s "$size" "$work/online.raw"
E2FSPROGS_FAKE_TIME=$SOURCE_DATE_EPOCH mke2fs -q -t ext4 -L "$FS_LABEL" -U "$FS_UUID" \
  -E "hash_seed=$HASH_SEED,root_owner=0:0,lazy_itable_init=0,nodiscard" \
  -d "$root" "$work/online.raw" \
  || die "mke2fs -d failed"
e2fsck -fn "$work/online.raw" > "$work/fsck.log" 2>&1 || { cat "$work/fsck.log" >&2; die "e2fsck found errors"; }
nice -n 10 qemu-img convert -q -f raw -O qcow2 "$work/online.raw" "$work/online.qcow2"
cp "$s1/vmlinuz" "$work/vmlinuz"
cp "$s1/initrd.img" "$work/initrd.img"

kver=$(cat "$s1/kernel-version")
# Capabilities of the guest kernel, from its config and symbols: the
# nohlt_list= patch (kernel-patches/) adds nohlt_list symbols.
kconf=$root/boot/config-$kver
[ -r "$kconf" ] || die "no $kconf in the image"
nohlt=false; hp=false; hpgov=false
grep -q ' nohlt_list' "$root/boot/System.map-$kver" 2>/dev/null && nohlt=true
grep -Eq '^CONFIG_HALTPOLL_CPUIDLE=[ym]' "$kconf" && hp=true
grep -Eq '^CONFIG_CPU_IDLE_GOV_HALTPOLL=y' "$kconf" && hpgov=true
python3 - "$work" "$s1/packages.tsv" "$kver" "$nohlt,$hp,$hpgov" "$profiles" \
  "$SOURCE_DATE_EPOCH" "$FS_UUID" <<'PY'
import hashlib, json, sys
from pathlib import Path
work, pkgs, kver, caps, profiles, epoch, uuid = sys.argv[1:]
caps = dict(zip(("nohlt_list", "haltpoll", "haltpoll_governor"), (c == "true" for c in caps.split(","))))
w = Path(work)
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
packages = dict(line.split("\t", 1) for line in Path(pkgs).read_text().splitlines() if line)
files = {"disk": "online.raw", "qcow2": "online.qcow2", "kernel": "vmlinuz", "initrd": "initrd.img"}
m = {
    "name": "online", "version": f"bookworm-{kver}-{epoch}", "kind": "disk",
    "kernel_version": kver, "kernel_package": "linux-image-" + kver,
    "cmdline": "root=/dev/vda ro console=ttyS0 panic=-1",
    "capabilities": caps,
    "profiles": profiles.split(), "files": files,
    "sha256": {role: sha(w / f) for role, f in files.items()},
    "packages": packages, "source_date_epoch": int(epoch), "fs_uuid": uuid,
}
(w / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
PY
for f in $outputs; do mv "$work/$f" "$out/$f"; done
echo "$key2" > "$out/.key"
log "stage 2 done in $(since "$t0") s; built $out (kernel $kver, profiles: $profiles) in $(since "$t_all") s"
