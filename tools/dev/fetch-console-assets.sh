#!/usr/bin/env bash
# The console's JavaScript, fetched from the npm registry at pinned versions, checked
# against the sha256 recorded here, unpacked into scheduler/console/static/vendor/ (which
# git ignores: it is never committed) and served by the scheduler itself (never a CDN).
# Idempotent: a second run with the files present does no network access.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=scheduler/console/static/vendor
REGISTRY=${NPM_REGISTRY:-https://registry.npmjs.org}
# name version sha256-of-the-tarball file-in-the-tarball
PKGS=(
  "echarts 5.6.0 e1b82487dd7f8d9f0438eec1f1433051148e0095ac7a15d4db890afda45cf610 dist/echarts.min.js"
  "htmx.org 2.0.4 a34988d1b9f005a458d593aa8d7486537cb878b8ac3b82703db1268983123ecc dist/htmx.min.js"
)
mkdir -p "$DEST"
for p in "${PKGS[@]}"; do
  read -r name version sum file <<<"$p"
  out="$DEST/$(basename "$file")"
  stamp="$DEST/.$(basename "$file").$version"
  [ -f "$out" ] && [ -f "$stamp" ] && continue
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  curl -sSfL --retry 3 -o "$tmp/pkg.tgz" "$REGISTRY/$name/-/$(basename "$name")-$version.tgz"
  echo "$sum  $tmp/pkg.tgz" | sha256sum -c --quiet - || { echo "fetch-console-assets: $name $version: checksum mismatch" >&2; exit 1; }
  tar -xzf "$tmp/pkg.tgz" -C "$tmp" "package/$file"
  install -m 0644 "$tmp/package/$file" "$out"
  rm -f "$DEST"/."$(basename "$file")".*
  touch "$stamp"
  echo "fetch-console-assets: $name $version -> $out"
  rm -rf "$tmp"
  trap - EXIT
done
