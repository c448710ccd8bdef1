#!/usr/bin/env bash
# systemd_units.sh BUILD SOURCE CMAKE
# The shipped systemd pieces without a running systemd:
#  - tierd-generator turns sample configurations into the expected ReadWritePaths= drop-in
#    (inline and [[nvme]] tables, comments, spaces, %, state_dir) and writes nothing, exiting 0,
#    for a missing, empty or malformed configuration;
#  - `systemd-analyze verify` accepts the unit installed by `cmake --install` (ExecStart, the
#    User= drop-in, a generated drop-in, man:tierd(8)) with no warning at all, and the source
#    unit daemon/tierd.service is that unit with the .deb's ExecStart=/usr/sbin/tierd;
#  - the cmake --install route of docs/install.md (systemd-sysusers and systemd-tmpfiles on the
#    installed snippets, here in a --root) creates the tierd user and group, /etc/tierd with the
#    example as tierd.toml, and /var/lib/tierd owned by tierd, mode 0700.
# Skips the verify part (exit 77) when systemd-analyze is missing.
set -euo pipefail
build=$1 src=$2 cmake=$3
gen=$build/bin/tierd-generator
tmp=$(mktemp -d /tmp/tier-units.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# gen_case NAME CONFIG_TEXT EXPECTED_LINES: runs the generator on CONFIG_TEXT and compares the
# ReadWritePaths= lines of its drop-in with EXPECTED_LINES (empty: no drop-in at all).
gen_case() {
  local name=$1 text=$2 want=$3 out=$tmp/gen-$1
  mkdir -p "$out"
  printf '%s' "$text" >"$tmp/$name.toml"
  TIERD_GENERATOR_CONFIG=$tmp/$name.toml "$gen" "$out" "$out.early" "$out.late" 2>"$tmp/$name.err" \
    || fail "$name: generator exited $?"
  local f=$out/tierd.service.d/50-tierd-paths.conf got=""
  if [ -e "$f" ]; then
    grep -qx '\[Service\]' "$f" || fail "$name: no [Service] section"
    got=$(grep '^ReadWritePaths=' "$f" || true)
  fi
  [ "$got" = "$want" ] || fail "$name: got
$got
want
$want"
  echo "generator $name ok"
}

gen_case inline 'ram = "1G"   # a comment with "quotes", nvme = [ { path = "/x" } ] and [nvme]
nvme = [
  { path = "/srv/nvme0/tierd", numa_node = 0 },  # first device
  { numa_node = 1, path = "/srv/nvme 1/100%" },
]
' 'ReadWritePaths="-/srv/nvme0/tierd"
ReadWritePaths="-/srv/nvme 1/100%%"'
gen_case tables 'state_dir = "/srv/tierd-state"
[[nvme]]
path = "/mnt/a"
[[nvme]]
path = '"'"'/mnt/b'"'"'
' 'ReadWritePaths="-/mnt/a"
ReadWritePaths="-/mnt/b"
ReadWritePaths="-/srv/tierd-state"'
gen_case default_state 'state_dir = "/var/lib/tierd/"
' ''
gen_case no_nvme 'ram = "80%"
# nvme = [ { path = "/commented/out" } ]
' ''
gen_case unexpressible 'nvme = [ { path = "relative/dir" }, { path = "/ok" }, { path = "/bad\"quote" } ]
' 'ReadWritePaths="-/ok"'
grep -q "skipped the path 'relative/dir'" "$tmp/unexpressible.err" || fail "no message for a relative path"
gen_case malformed 'nvme = [ { path = "/srv/nvme0" '"
" ''
grep -q "no ReadWritePaths= drop-in written" "$tmp/malformed.err" || fail "no message for a syntax error"
gen_case wrong_type 'nvme = "/srv/nvme0"
' ''
# A code point toml++ 3.3.0 has undefined behaviour on outside a string (issue 33): not parsed.
gen_case non_ascii_key "nvme = [ { path = \"/srv/nvme0\" } ]
$(printf '\321\211') = 1
" ''
grep -q "line 2: byte 0xd1 outside a quoted string" "$tmp/non_ascii_key.err" || fail "no message for a non-ASCII key"
gen_case non_ascii_string "# $(printf '\321\211') in a comment
nvme = [ { path = \"/srv/$(printf '\321\211')\" } ]
" "ReadWritePaths=\"-/srv/$(printf '\321\211')\""
TIERD_GENERATOR_CONFIG=$tmp/does-not-exist.toml "$gen" "$tmp/gen-missing" || fail "missing config: exit $?"
[ ! -e "$tmp/gen-missing" ] || fail "missing config: wrote something"
echo "generator missing-config ok"

# --- systemd-analyze verify ------------------------------------------------------------------
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze not installed (apt-get install systemd); the unit was not verified"
  exit 77
fi
prefix=$tmp/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
unitdir=$prefix/lib/systemd/system
[ -x "$prefix/sbin/tierd" ] || fail "tierd was not built and installed"
printf 'nvme = [ { path = "/srv/nvme0/tierd" } ]\nmetrics_listen = "127.0.0.1:9464"\n' >"$tmp/svc.toml"
TIERD_GENERATOR_CONFIG=$tmp/svc.toml "$prefix/lib/systemd/system-generators/tierd-generator" "$unitdir"
[ -e "$unitdir/tierd.service.d/50-tierd-paths.conf" ] || fail "the installed generator wrote no drop-in"
MANPATH=$prefix/share/man systemd-analyze verify "$unitdir/tierd.service" >"$tmp/verify.out" 2>&1 || true
if [ -s "$tmp/verify.out" ]; then cat "$tmp/verify.out"; fail "systemd-analyze verify complained"; fi
echo "systemd-analyze verify: installed unit with both drop-ins ok"
# Every drop-in was read: a broken one must make verify speak (the check above is not vacuous).
printf '[Service]\nNoSuchKey=1\n' >"$unitdir/tierd.service.d/99-probe.conf"
MANPATH=$prefix/share/man systemd-analyze verify "$unitdir/tierd.service" >"$tmp/verify.out" 2>&1 || true
grep -q "NoSuchKey" "$tmp/verify.out" || fail "verify did not read the drop-ins"
rm "$unitdir/tierd.service.d/99-probe.conf"

# The source unit is the installed one with the .deb's path (/usr/sbin/tierd, the prefix /usr).
diff <(sed "s|^ExecStart=$prefix/sbin/tierd |ExecStart=/usr/sbin/tierd |" "$unitdir/tierd.service") \
  "$src/daemon/tierd.service" || fail "daemon/tierd.service differs from the installed unit beyond ExecStart"
grep -q '^ExecStart=/usr/sbin/tierd ' "$src/daemon/tierd.service" || fail "the source unit does not run /usr/sbin/tierd"
grep -q '^Documentation=man:tierd(8)' "$src/daemon/tierd.service" || fail "no man:tierd(8)"
[ -e "$prefix/share/man/man8/tierd.8.gz" ] || fail "man:tierd(8) is not installed"
echo "source unit = installed unit with ExecStart=/usr/sbin/tierd"

# --- the cmake --install route, in a --root ----------------------------------------------
root=$tmp/root
DESTDIR=$root "$cmake" --install "$build" --prefix /usr/local >"$tmp/install2.log" || { cat "$tmp/install2.log"; fail "DESTDIR install"; }
mkdir -p "$root/etc"
systemd-sysusers --root="$root" "$root/usr/local/lib/sysusers.d/tierd.conf" >/dev/null 2>&1 || fail "systemd-sysusers"
systemd-tmpfiles --root="$root" --create "$root/usr/local/lib/tmpfiles.d/tierd.conf" || fail "systemd-tmpfiles"
uid=$(awk -F: '$1 == "tierd" { print $3 }' "$root/etc/passwd")
[ -n "$uid" ] || fail "no tierd user"
grep -q '^tierd:' "$root/etc/group" || fail "no tierd group"
cmp -s "$root/etc/tierd/tierd.toml" "$src/daemon/tierd.toml.example" || fail "/etc/tierd/tierd.toml is not the example"
[ "$(stat -c '%u %a' "$root/var/lib/tierd")" = "$uid 700" ] || fail "/var/lib/tierd: $(stat -c '%u %a' "$root/var/lib/tierd")"
echo "cmake --install route: tierd user, /etc/tierd/tierd.toml, /var/lib/tierd ok"
echo PASS
