#!/usr/bin/env bash
# debs_lintian.sh BUILD: builds the .deb packages (cpack -G DEB in BUILD) and runs lintian on
# each: no error, and no warning that packaging/debian/*.lintian-overrides does not justify.
# Checks the man page sources with `man --warnings` too. Skips (77) without lintian or man.
set -euo pipefail
build=$1 src=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
command -v man >/dev/null || skip "man not installed (apt-get install man-db); nothing checked"
for page in "$src"/packaging/man/*.[0-9]; do
  out=$(LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$page" 2>&1 >/dev/null) \
    || fail "man $page"
  [ -z "$out" ] || fail "man --warnings $page: $out"
done
echo "man pages ok"
if ! command -v lintian >/dev/null; then
  skip "lintian not installed (apt-get install lintian); packages not checked"
fi
rm -f "$build"/*.deb
(cd "$build" && cpack -G DEB >cpack.log 2>&1) || { cat "$build/cpack.log"; fail "cpack"; }
debs=("$build"/*.deb)
for p in tierd libtier0 libtier-dev tier-train; do
  ls "$build/${p}_"*.deb >/dev/null 2>&1 || fail "no $p package"
done
# tierd must not pull in the trainer's libraries.
if dpkg-deb -f "$build"/tierd_*.deb Depends | grep -Eq 'openmpi|openblas'; then fail "tierd depends on MPI/BLAS"; fi
out=$(lintian --tag-display-limit 0 "${debs[@]}" 2>&1 | grep -v '^running with root privileges' || true)
if [ -n "$out" ]; then echo "$out"; fail "lintian reported tags"; fi
echo "lintian: no tags on ${#debs[@]} packages"
echo PASS
