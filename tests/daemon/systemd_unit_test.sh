#!/bin/sh
# Runs `systemd-analyze verify` on daemon/tierd.service with ExecStart pointed at the built
# binary (verify insists the binary exists). Skips visibly when systemd-analyze is absent.
set -eu
src="$1"; bin="$2"
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "WARN: systemd-analyze not installed; tierd.service not verified (SKIPPED)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|^ExecStart=/usr/sbin/tierd|ExecStart=$bin|" "$src/daemon/tierd.service" > "$tmp/tierd.service"
grep -q "^ExecStart=$bin " "$tmp/tierd.service"
grep -q '^Type=notify' "$tmp/tierd.service"
if grep -Eq '^(PrivateIPC|RemoveIPC)=yes' "$tmp/tierd.service"; then
  echo "tierd.service must leave /dev/shm shared (no PrivateIPC/RemoveIPC)"; exit 1
fi
out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$tmp/tierd.service" 2>&1) || {
  echo "$out"; exit 1; }
# verify warns about problems without failing on some of them; treat any line naming our unit as an error.
if echo "$out" | grep -q "tierd.service"; then echo "$out"; exit 1; fi
echo "systemd-analyze verify: ok"
