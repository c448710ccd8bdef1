#!/usr/bin/env bash
# completion.sh BUILD SRC: the bash completion of tierctl against a real tierd: commands,
# options, pool names (tierctl --json pools) and tensor names (tierctl --json tensors POOL) on
# the socket the command line names, and nothing (no error) when the daemon is unreachable.
set -euo pipefail
build=$1 src=$2
tmp_tag=compl
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mkdir "$tmp/state"
"$build/bin/tierd" --socket "$tmp/sock" --state-dir "$tmp/state" --ram 64M --foreground \
  --remove-arenas-on-exit >"$tmp/log" 2>&1 &
daemon_pid=$!
for _ in $(seq 500); do [ -S "$tmp/sock" ] && break; sleep 0.02; done
[ -S "$tmp/sock" ] || { cat "$tmp/log"; fail "tierd did not start"; }
export PATH=$build/bin:$PATH
echo data >"$tmp/f"
for t in "alpha:w0" "alpha:w1" "beta:x"; do
  tierctl --socket "$tmp/sock" put "${t%%:*}" "${t#*:}" "$tmp/f" >/dev/null
done

# shellcheck source=/dev/null
source "$src/packaging/bash-completion/tierctl"
# complete WORDS...: COMPREPLY for the command line WORDS (the last word is being completed),
# sorted, on one line.
complete_line() {
  COMP_WORDS=("$@")
  COMP_CWORD=$(($# - 1))
  COMPREPLY=()
  _tierctl
  printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' ' | sed 's/ $//'
}
expect() {
  local want=$1; shift
  local got; got=$(complete_line "$@")
  [ "$got" = "$want" ] || fail "'$*': got '$got', want '$want'"
  echo "ok: '$*' -> '$got'"
}
expect "tensors top topo" tierctl t
expect "--connect-timeout --help --json --socket --version" tierctl --
expect "pools prefetch put" tierctl --socket "$tmp/sock" p
expect "alpha beta" tierctl --socket "$tmp/sock" tensors ""
expect "alpha" tierctl --socket "$tmp/sock" get a
expect "w0 w1" tierctl --socket "$tmp/sock" rm alpha ""
expect "x" tierctl --json --socket "$tmp/sock" evict beta ""
expect "--help --interval --json --once --pools" tierctl top --
expect "--help --yes" tierctl drop --
# Unreachable daemon: no names and no error on the terminal.
expect "" tierctl --socket "$tmp/nobody.sock" tensors ""
echo PASS
