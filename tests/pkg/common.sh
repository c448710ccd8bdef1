# Sourced by the tests/pkg scripts: $tmp, a temporary directory removed at exit together with
# the tierd whose pid the script puts in $daemon_pid, and fail().
tmp=$(mktemp -d "/tmp/tier-${tmp_tag:-pkg}.XXXXXX")
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
