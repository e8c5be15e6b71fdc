#!/usr/bin/env bash
# Build the smoke-test guest: Debian's cloud kernel + a tiny busybox initramfs
# whose /init prints a marker with the guest's CPU count and memory to the
# serial console, then stays up until the VM is shut down or destroyed.
#
# With hyb.profile=NAME on the cmdline it also applies that tuning profile's guest
# side (guestimages/common/hyb-profile-apply) and prints the one-line
# HYB-GUEST-REPORT {json} (guestimages/common/hyb-guest-report) after the marker.
#
# Usage: guestimages/smoke/build.sh [OUTDIR]   (default /var/cache/hybrid-kvm/smoke)
# Output: OUTDIR/vmlinuz, OUTDIR/initrd.img, OUTDIR/manifest.json
# Needs: apt-get (downloads .debs only, installs nothing), dpkg-deb, cpio, gzip, python3.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gi=$(dirname "$here")
repo=$(dirname "$gi")
out=${1:-/var/cache/hybrid-kvm/smoke}
mkdir -p "$out"
# one build at a time (parallel test workers share the cache); the check runs under it
exec 9>"$out/.lock"
flock -w 1800 9 || { echo "smoke: another build holds $out/.lock" >&2; exit 1; }
uptodate=1
[ -s "$out/vmlinuz" ] && [ -s "$out/initrd.img" ] || uptodate=0
for f in "$here/init" "$0" "$gi"/common/* "$gi"/profiles/*.toml "$repo/hostd/domain/guest_profiles.py"; do
  [ "$out/initrd.img" -nt "$f" ] || uptodate=0
done
[ "$uptodate" = 1 ] && exit 0   # up to date

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

kpkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
[ -n "$kpkg" ] || { echo "smoke: cannot resolve linux-image-cloud-amd64 (run apt-get update)" >&2; exit 1; }
apt-get download -qq -o APT::Sandbox::User=root "$kpkg" busybox-static >/dev/null
dpkg-deb -x "$kpkg"_*.deb kernel
dpkg-deb -x busybox-static_*.deb bb

kver=$(ls kernel/lib/modules)
cp kernel/boot/vmlinuz-"$kver" "$out/vmlinuz.tmp"

root="$work/initramfs"
mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,lib/modules}
cp bb/bin/busybox "$root/bin/busybox"
for app in sh mount cat echo sleep grep awk nproc insmod dd sync poweroff reboot ls head tr uname \
           sed cut mkdir mv rm sort printf; do
  ln -s busybox "$root/bin/$app"
done
# virtio drivers are modules in the cloud kernel: ship the few the smoke checks
# need (a raw disk visible as /dev/vdX, a virtio NIC for IRQ affinity), in load order (no modprobe in busybox-init).
mods="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk failover net_failover virtio_net"
: > "$root/lib/modules/load-order"
for m in $mods; do
  f=$(find kernel/lib/modules/"$kver" -name "$m.ko*" | head -n1)
  [ -n "$f" ] || { echo "smoke: module $m missing from $kpkg" >&2; exit 1; }
  case "$f" in
    *.xz) xz -dc "$f" > "$root/lib/modules/$m.ko" ;;
    *) cp "$f" "$root/lib/modules/$m.ko" ;;
  esac
  echo "$m.ko" >> "$root/lib/modules/load-order"
done
install -m 0755 "$here/init" "$root/init"
# Tuning profiles (guest side) and the in-guest report, shared with the online image.
mkdir -p "$root/usr/local/sbin" "$root/etc/hyb/profiles"
install -m 0755 "$gi/common/hyb-profile-apply" "$gi/common/hyb-guest-report" "$gi/common/hyb-innodb-atomic" \
  "$root/usr/local/sbin/"
(cd "$repo" && python3 -c 'import sys; from hostd.domain.guest_profiles import write_guest_env_files
write_guest_env_files(sys.argv[1], sys.argv[2])' "$gi/profiles" "$root/etc/hyb/profiles")
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -9 > "$out/initrd.img.tmp"
mv "$out/vmlinuz.tmp" "$out/vmlinuz"
mv "$out/initrd.img.tmp" "$out/initrd.img"
cat > "$out/manifest.json" <<JSON
{"name": "smoke", "kernel_package": "$kpkg", "kernel_version": "$kver",
 "cmdline": "console=ttyS0 panic=-1",
 "vmlinuz_sha256": "$(sha256sum "$out/vmlinuz" | cut -d' ' -f1)",
 "initrd_sha256": "$(sha256sum "$out/initrd.img" | cut -d' ' -f1)"}
JSON
echo "smoke: built $out (kernel $kver)"
