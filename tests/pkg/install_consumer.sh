#!/usr/bin/env bash
# install_consumer.sh BUILD CONSUMER_SRC CMAKE CXX LIBDIR SBINDIR [FLAGS]
# (LIBDIR, SBINDIR relative to the prefix; FLAGS: compiler and linker flags for the consumer,
# the sanitizer flags when libtier is instrumented)
# Installs BUILD into a temporary prefix, checks the layout, builds CONSUMER_SRC against it with
# find_package(tier) and with pkg-config, and runs both: without a daemon they must print a
# clean Unavailable error (exit 3); against the installed tierd they must round-trip a tensor.
set -euo pipefail
build=$1 src=$2 cmake=$3 cxx=$4 libdir_rel=$5 sbindir_rel=$6 flags=${7:-}

tmp_tag=pkg
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# loads_installed_libtier BIN: the libtier BIN resolves (ldd, by RUNPATH or LD_LIBRARY_PATH) is
# the installed one.
loads_installed_libtier() {
  local got
  got=$(ldd "$1" | sed -n 's/^[[:space:]]*libtier\.so[.0-9]* => \([^ ]*\) .*/\1/p')
  [ -n "$got" ] && [ "$(readlink -f "$got")" = "$(readlink -f "$libdir/$soname")" ]
}

prefix=$tmp/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
libdir=$prefix/$libdir_rel

# --- layout -------------------------------------------------------------------------------
for f in include/tier/client.hpp include/tier/export.hpp include/tier/status.hpp include/tier/types.hpp \
         "$libdir_rel/cmake/tier/tierConfig.cmake" "$libdir_rel/cmake/tier/tierConfigVersion.cmake" \
         "$libdir_rel/cmake/tier/tierTargets.cmake" "$libdir_rel/pkgconfig/tier.pc" \
         lib/systemd/system/tierd.service lib/systemd/system/tierd.service.d/10-user.conf; do
  [ -e "$prefix/$f" ] || fail "missing $f"
done
[ -L "$libdir/libtier.so" ] || fail "libtier.so is not the dev symlink"
soname=$(readelf -d "$libdir/libtier.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ "$soname" =~ ^libtier\.so\.[0-9]+$ ]] || fail "SONAME is '$soname'"
[ -e "$libdir/$soname" ] || fail "missing $soname"
# libtier.so exports the public API only (TIER_EXPORT, hidden visibility for the rest): the
# client and Status are there, the wire codec and the connection are not.
exports=$(nm -DC --defined-only "$libdir/libtier.so" | grep -E ' [TW] ' || true)
grep -q 'tier::Client::lease(' <<<"$exports" || fail "libtier.so does not export tier::Client::lease"
grep -q 'tier::Status::to_string' <<<"$exports" || fail "libtier.so does not export tier::Status::to_string"
internal=$(grep -E 'tier::(wire|client)::|tier::Client::Impl::|format_size|parse_size' <<<"$exports" || true)
[ -z "$internal" ] || fail "libtier.so exports internals: $(head -5 <<<"$internal")"
# The unit runs the tierd of the prefix it was installed to.
grep -q "^ExecStart=$prefix/$sbindir_rel/tierd " "$prefix/lib/systemd/system/tierd.service" \
  || fail "unit does not run $prefix/$sbindir_rel/tierd: $(grep ExecStart "$prefix/lib/systemd/system/tierd.service")"
if grep -q tier_wire "$prefix/$libdir_rel/cmake/tier/"*.cmake; then fail "export names tier_wire"; fi
for b in tierctl tier-bench tier-train; do
  if [ -x "$build/bin/$b" ]; then [ -x "$prefix/bin/$b" ] || fail "missing bin/$b"; fi
done
if [ -x "$build/bin/tierd" ]; then [ -x "$prefix/$sbindir_rel/tierd" ] || fail "missing $sbindir_rel/tierd"; fi
echo "layout ok (SONAME $soname)"

# --- find_package(tier) ---------------------------------------------------------------------
"$cmake" -S "$src" -B "$tmp/c1" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  >"$tmp/c1.log" 2>&1 || { cat "$tmp/c1.log"; fail "configure consumer"; }
"$cmake" --build "$tmp/c1" >>"$tmp/c1.log" 2>&1 || { cat "$tmp/c1.log"; fail "build consumer (find_package)"; }
loads_installed_libtier "$tmp/c1/consumer" || fail "find_package consumer does not load the installed libtier"

# --- pkg-config ------------------------------------------------------------------------------
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(cd "$(pkg-config --variable=prefix tier)" && pwd -P)" = "$(cd "$prefix" && pwd -P)" ] \
  || fail "tier.pc prefix $(pkg-config --variable=prefix tier) is not $prefix"
# shellcheck disable=SC2046
# shellcheck disable=SC2086
"$cxx" -std=c++23 -O1 $flags -o "$tmp/c2" "$src/consumer.cpp" $(pkg-config --cflags --libs tier) \
  || fail "build consumer (pkg-config)"
echo "consumers built"

# --- no daemon: a clean Unavailable ---------------------------------------------------------
for c in "$tmp/c1/consumer" "$tmp/c2"; do
  rc=0
  LD_LIBRARY_PATH=$libdir "$c" "$tmp/nobody.sock" 2>"$tmp/err" >/dev/null || rc=$?
  [ "$rc" = 3 ] || { cat "$tmp/err"; fail "$c without a daemon exited $rc, want 3"; }
  grep -q "^consumer: connect: Unavailable: " "$tmp/err" || { cat "$tmp/err"; fail "$c: no clean Unavailable"; }
done
echo "no daemon: $(cat "$tmp/err")"
echo

# --- against the installed tierd ----------------------------------------------------------------
if [ -x "$prefix/$sbindir_rel/tierd" ]; then
  mkdir -p "$tmp/d/state"
  "$prefix/$sbindir_rel/tierd" --socket "$tmp/d/tierd.sock" --state-dir "$tmp/d/state" --ram 64M \
    --foreground --remove-arenas-on-exit >"$tmp/d/log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 500); do [ -S "$tmp/d/tierd.sock" ] && break; sleep 0.02; done
  [ -S "$tmp/d/tierd.sock" ] || { cat "$tmp/d/log"; fail "installed tierd did not start"; }
  for c in "$tmp/c1/consumer" "$tmp/c2"; do
    out=$(LD_LIBRARY_PATH=$libdir "$c" "$tmp/d/tierd.sock") || fail "$c against tierd"
    [ "$out" = "ok 4096" ] || fail "$c printed '$out'"
  done
  if [ -x "$prefix/bin/tierctl" ]; then
    # No LD_LIBRARY_PATH: the installed tierctl finds the installed libtier by its RUNPATH.
    loads_installed_libtier "$prefix/bin/tierctl" || fail "installed tierctl does not load the installed libtier"
    "$prefix/bin/tierctl" --socket "$tmp/d/tierd.sock" status >/dev/null || fail "installed tierctl status"
  fi
  # The installed Python module (when built) loads the installed libtier and talks to tierd.
  pymod=$(ls "$prefix"/lib/python3/dist-packages/tierd/_native*.so 2>/dev/null | head -1 || true)
  if [ -n "$pymod" ] && [ -x /usr/bin/python3 ]; then
    loads_installed_libtier "$pymod" || fail "installed Python module does not load the installed libtier"
    PYTHONPATH=$(dirname "$(dirname "$pymod")") /usr/bin/python3 -c '
import sys, tierd, tierd._native
assert tierd._native.__file__ == sys.argv[1], tierd._native.__file__
assert callable(tierd.adamw_step)
c = tierd.connect(sys.argv[2])
c.create_pool("pkg-py")
assert "pkg-py" in [p.name for p in c.list_pools()]
c.drop_pool("pkg-py")
' "$pymod" "$tmp/d/tierd.sock" || fail "installed Python module"
    echo "installed Python module ok"
  fi
  kill "$daemon_pid"; wait "$daemon_pid" || true; daemon_pid=
  echo "installed tierd: consumers round-trip a tensor"
else
  echo "tierd not built: skipped the run against the installed daemon"
fi
echo PASS
