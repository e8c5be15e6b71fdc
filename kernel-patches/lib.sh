# Shared by kernel-patches/check and kernel-patches/build (sourced, not run).
#
# Cache layout, keyed by the linux-source package version so a new Debian
# point release gets a fresh tree and never mixes with an old one:
#   $HYB_KERNEL_CACHE/<version>/src          pristine tree, git repo, tag "pristine"
#   $HYB_KERNEL_CACHE/<version>/build-check  O= dir of check (guest config, prepared)
#   $HYB_KERNEL_CACHE/<version>/src-build    git worktree used by build
#   $HYB_KERNEL_CACHE/<version>/build-guest  O= dir of build
#
# Environment:
#   HYB_KERNEL_CACHE    cache root (default /var/cache/hybrid-kvm/kernel)
#   HYB_KERNEL_TARBALL  source tarball (default /usr/src/linux-source-6.1.tar.xz)
#   HYB_KERNEL_JOBS     make -j (default 2; the work runs under nice -n 10)

KP_PKG=linux-source-6.1
KP_CACHE_ROOT=${HYB_KERNEL_CACHE:-/var/cache/hybrid-kvm/kernel}
KP_TARBALL=${HYB_KERNEL_TARBALL:-/usr/src/$KP_PKG.tar.xz}
KP_JOBS=${HYB_KERNEL_JOBS:-2}
KP_GIT=(git -c user.name="Hybrid KVM Team" -c user.email=hybrid-kvm@example.com
        -c advice.detachedHead=false -c gc.auto=0)

kp_log() { echo "$KP_NAME: $*"; }
kp_die() { echo "$KP_NAME: FAILED: $*" >&2; exit 1; }

kp_now() { date +%s.%N; }
# kp_since START -> seconds with one decimal
kp_since() { awk -v a="$1" -v b="$(kp_now)" 'BEGIN{printf "%.1f", b-a}'; }

# Run a command quietly; on failure show the tail of its output and die.
# kp_run LOGFILE DESCRIPTION CMD...
kp_run() {
  local log=$1 what=$2; shift 2
  if ! "$@" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    kp_die "$what (full log: $log)"
  fi
}

kp_version() {
  [ -r "$KP_TARBALL" ] || kp_die "$KP_TARBALL missing: apt-get install $KP_PKG (see kernel-patches/README.md)"
  local v
  if [ -z "${HYB_KERNEL_TARBALL:-}" ] && v=$(dpkg-query -W -f='${Version}' "$KP_PKG" 2>/dev/null) && [ -n "$v" ]; then
    echo "$v"
  else
    sha256sum "$KP_TARBALL" | cut -c1-16
  fi
}

# Sets KP_DIR and KP_SRC; extracts and commits the pristine tree on first use.
kp_prepare_pristine() {
  KP_VERSION=$(kp_version)
  KP_DIR=$KP_CACHE_ROOT/$KP_VERSION
  KP_SRC=$KP_DIR/src
  mkdir -p "$KP_DIR"
  exec 8>"$KP_DIR/.lock-src"
  flock -w 3600 8 || kp_die "another run holds $KP_DIR/.lock-src"
  if git -C "$KP_SRC" rev-parse -q --verify refs/tags/pristine >/dev/null 2>&1; then
    kp_log "pristine tree $KP_SRC ($KP_PKG $KP_VERSION, cached)"
    flock -u 8
    return
  fi
  local t0 tmp
  t0=$(kp_now)
  rm -rf "$KP_SRC" "$KP_DIR"/build-* "$KP_DIR"/src-build
  tmp=$(mktemp -d "$KP_DIR/extract.XXXXXX")
  kp_log "extracting $KP_TARBALL"
  nice -n 10 tar -xJf "$KP_TARBALL" -C "$tmp"
  mv "$tmp"/linux-source-* "$KP_SRC"
  rmdir "$tmp"
  # Debian's .gitignore ignores the whole top level: add everything with -f.
  (cd "$KP_SRC" && "${KP_GIT[@]}" init -q && "${KP_GIT[@]}" add -f -A . \
     && "${KP_GIT[@]}" commit -q -m "$KP_PKG $KP_VERSION pristine" \
     && "${KP_GIT[@]}" tag pristine) || kp_die "cannot commit the pristine tree in $KP_SRC"
  kp_log "pristine tree $KP_SRC ($KP_PKG $KP_VERSION, extracted and committed in $(kp_since "$t0") s)"
  flock -u 8
}

# KP_PATCHES=(patch file names of series dir $1, in order): its "series" file,
# one name per line, # comments. Runs in the calling shell so a bad entry exits.
kp_series() {
  local dir=$1 p
  [ -f "$dir/series" ] || kp_die "$dir/series missing (one patch file name per line, in order)"
  KP_PATCHES=()
  while read -r p; do
    p=${p%%#*}; p=${p//[[:space:]]/}
    [ -n "$p" ] || continue
    [ -f "$dir/$p" ] || kp_die "$dir/series lists $p, which does not exist"
    KP_PATCHES+=("$p")
  done < "$dir/series"
  [ ${#KP_PATCHES[@]} -gt 0 ] || kp_die "$dir/series lists no patches"
}

# Reset worktree $1 to pristine and git-am the series in $2 onto it.
# Files that come out with the same content as before the reset get their old
# mtime back, so make rebuilds only what the series change really touches
# (include/linux/cpu.h alone is behind hundreds of objects).
kp_apply_series() {
  local tree=$1 dir=$2 p f old keep
  kp_series "$dir"
  (cd "$tree" && { "${KP_GIT[@]}" am --abort >/dev/null 2>&1 || true; })
  old=$(git -C "$tree" rev-parse -q --verify HEAD || true)
  keep=$KP_LOGDIR/mtimes
  rm -rf "$keep"; mkdir -p "$keep"
  if [ -n "$old" ]; then
    git -C "$tree" diff --name-only pristine "$old" | while read -r f; do
      if [ -f "$tree/$f" ]; then mkdir -p "$keep/$(dirname "$f")"; touch -r "$tree/$f" "$keep/$f"; fi
    done
  fi
  (cd "$tree" && "${KP_GIT[@]}" checkout -q -f --detach pristine && "${KP_GIT[@]}" clean -q -f -d -x) \
     || kp_die "cannot reset $tree to pristine"
  for p in "${KP_PATCHES[@]}"; do
    if ! (cd "$tree" && "${KP_GIT[@]}" am -q "$dir/$p") >"$KP_LOGDIR/am.log" 2>&1; then
      cat "$KP_LOGDIR/am.log" >&2
      (cd "$tree" && "${KP_GIT[@]}" am --abort >/dev/null 2>&1)
      kp_die "patch $p does not apply to $KP_PKG $KP_VERSION"
    fi
    kp_log "applied $p"
  done
  if [ -n "$old" ]; then
    (cd "$keep" && find . -type f -printf '%P\n') | while read -r f; do
      if [ -f "$tree/$f" ] && git -C "$tree" diff --quiet "$old" HEAD -- "$f"; then
        touch -r "$keep/$f" "$tree/$f"
      fi
    done
  fi
}

# Configure O=dir $2 of tree $1 for a KVM guest, plus optional fragments ($3...),
# and run "make prepare"; skipped when the stamp says it was done with the
# same fragments.
kp_configure() {
  local tree=$1 out=$2; shift 2
  local frags="defconfig kvm_guest.config" stamp=$out/.hyb-prepared t0 f
  for f in "$@"; do frags+=" $(basename "$f"):$(sha256sum "$f" | cut -c1-12)"; done
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$frags" ] && [ -f "$out/.config" ]; then
    kp_log "guest config $out/.config ($frags, cached)"
    return
  fi
  t0=$(kp_now)
  rm -rf "$out"; mkdir -p "$out"
  local extra=()
  for f in "$@"; do
    cp "$f" "$tree/kernel/configs/hyb-$(basename "$f")"
    extra+=("hyb-$(basename "$f")")
  done
  kp_run "$KP_LOGDIR/config.log" "make defconfig kvm_guest.config ${extra[*]}" \
    nice -n 10 make -C "$tree" O="$out" defconfig kvm_guest.config "${extra[@]}"
  rm -f "${extra[@]/#/$tree/kernel/configs/}"
  kp_log "guest config: make defconfig kvm_guest.config${extra[*]:+ ${extra[*]}} ($(kp_since "$t0") s)"
  t0=$(kp_now)
  kp_run "$KP_LOGDIR/prepare.log" "make prepare" \
    nice -n 10 make -C "$tree" O="$out" -j"$KP_JOBS" prepare
  echo "$frags" > "$stamp"
  kp_log "make prepare ($(kp_since "$t0") s)"
}
