#!/usr/bin/env bash
# Build the hostd release bundle the bootstrap role installs (deploy/ansible/README.md):
#   deploy/ansible/build-release.sh OUTDIR [GIT_REF]      (GIT_REF default: HEAD)
# OUTDIR gets
#   wheels/            hybrid-kvm's wheel (gRPC stubs generated) and a wheel of every dependency
#   requirements.txt   name==version of every wheel: what the hosts install, offline
#   python-version     the Python the wheels are for (3.11); the role checks the host has it
#   guestimages/profiles/  the guest tuning profiles hostd serves (profiles_dir)
#   systemd/hostd.service  the unit, README.md its Documentation=
#   SHA256SUMS         of all of the above; the role reinstalls when it changes
# The layout is that of the install prefix (/opt/hybrid-kvm) the role copies it to.
# The wheels are built with $PYTHON (default: .venv/bin/python), whose minor version must be
# the hosts' (Debian 12: 3.11). Built from the committed tree (git archive), never from a
# working copy with edits in progress. Dependency wheels are cached in
# $HYB_WHEEL_CACHE (default /var/cache/hybrid-kvm/wheels/<hash of setup.cfg + Python>), so a
# rebuild with unchanged dependencies needs no network.
set -euo pipefail
out=${1:?usage: build-release.sh OUTDIR [GIT_REF]}
ref=${2:-HEAD}
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}

src=$(mktemp -d)
trap 'rm -rf "$src" "$src.log"' EXIT
git -C "$repo" archive "$ref" | tar -x -C "$src"
"$py" -m grpc_tools.protoc -I"$src" --python_out="$src" --grpc_python_out="$src" "$src/api/hostd.proto"

pyver=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
key=$(cat "$src/setup.cfg" "$src/pyproject.toml" | sha256sum | cut -c1-16)
cache=${HYB_WHEEL_CACHE:-/var/cache/hybrid-kvm/wheels/$pyver-$key}

rm -rf "$out"
mkdir -p "$out/wheels" "$out/guestimages" "$out/systemd"
mkdir -p "$cache"
exec 9>"$cache.lock"  # one filler of the cache at a time; the others wait and find it complete
flock -w 1800 9 || { echo "build-release: another build holds $cache.lock" >&2; exit 1; }
if [ ! -f "$cache/.complete" ]; then
  echo "build-release: dependency wheels for $pyver (setup.cfg $key) -> $cache"
  # libvirt-python has no wheel on PyPI: built here once (gcc, libvirt-dev, python3-dev),
  # never on the storage hosts.
  if ! "$py" -m pip wheel -q --wheel-dir "$cache" "$src" > "$src.log" 2>&1; then
    cat "$src.log" >&2; exit 1
  fi
  rm -f "$cache"/hybrid_kvm-*.whl
  touch "$cache/.complete"
fi
cp "$cache"/*.whl "$out/wheels/"
# The build python's setuptools (no isolated build env: no network). Same commit, same bytes:
# zip timestamps from the commit time.
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct "$ref")
find "$src" -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
if ! "$py" -m pip wheel -q --no-deps --no-build-isolation --wheel-dir "$out/wheels" "$src" \
    > "$src.log" 2>&1; then
  cat "$src.log" >&2; exit 1
fi

# name==version from the wheel file names (PEP 427: NAME-VERSION-...whl)
for w in "$out"/wheels/*.whl; do
  b=$(basename "$w")
  echo "${b%%-*}==$(echo "$b" | cut -d- -f2)"
done | sort > "$out/requirements.txt"
"$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' > "$out/python-version"
cp -r "$src/guestimages/profiles" "$out/guestimages/profiles"
cp "$src/hostd/systemd/hostd.service" "$out/systemd/"
cp "$src/README.md" "$out/README.md"
(cd "$out" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum > SHA256SUMS)
echo "build-release: $(git -C "$repo" rev-parse --short "$ref") -> $out ($(ls "$out/wheels" | wc -l) wheels)"
