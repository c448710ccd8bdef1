#!/usr/bin/env bash
# systemd_nspawn.sh BUILD: the tierd .deb under a real systemd. Boots a Debian bookworm root
# (debootstrap, cached in $TIERD_TEST_ROOT_CACHE, default /var/cache/tierd-test-root, and
# reused) with systemd-nspawn --boot, systemd as PID 1, writes going to a tmpfs overlay
# (--volatile=overlay: the cached root is never modified); installs the
# built libtier0 and tierd packages and checks, with an NVMe directory and the metrics listener
# configured: READY and STATUS=, tierctl as a member of the admin group, the generator's
# ReadWritePaths=, the NVMe tier and metrics working, a watchdog restart of a SIGSTOPped tierd
# with its arenas re-attached, a clean systemctl stop, and what purge removes.
# Skips (77) with the reason when not root, without systemd-nspawn/debootstrap/nsenter, or when
# the root cannot be bootstrapped (no Debian mirror).
set -euo pipefail
build=$1
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root (systemd-nspawn)"
for c in systemd-nspawn debootstrap nsenter; do
  command -v $c >/dev/null || skip "$c not installed (apt-get install systemd-container debootstrap)"
done
cache=${TIERD_TEST_ROOT_CACHE:-/var/cache/tierd-test-root}
root=$cache/bookworm
# What tierd's Depends need, installed in the cached root so the test needs no mirror once cached.
pkgs=(systemd systemd-sysv dbus libnuma1 libhwloc15 liburing2 libfmt9 libtomlplusplus3 libxxhash0
      libsystemd0 libcpp-httplib0.11 adduser procps init-system-helpers)
if [ ! -x "$root/lib/systemd/systemd" ]; then
  mkdir -p "$cache"
  rm -rf "$root.tmp"
  debootstrap --variant=minbase --include="$(IFS=,; echo "${pkgs[*]}")" \
    bookworm "$root.tmp" "${TIERD_TEST_MIRROR:-http://deb.debian.org/debian}" >"$cache/debootstrap.log" 2>&1 \
    || { rm -rf "$root.tmp"; skip "debootstrap failed (no Debian mirror?), see $cache/debootstrap.log"; }
  mv "$root.tmp" "$root"
fi
# A root cached by an older version of this list: add what is missing (needs the mirror once).
missing=()
for p in "${pkgs[@]}"; do
  chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  { chroot "$root" apt-get update -qq && DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq \
      --no-install-recommends "${missing[@]}"; } >"$cache/apt.log" 2>&1 \
    || skip "cannot install ${missing[*]} into the cached root (no Debian mirror?), see $cache/apt.log"
fi

# The packages of this tree, never stale ones.
rm -f "$build"/*.deb
(cd "$build" && cpack -G DEB >cpack.log 2>&1) || { cat "$build/cpack.log"; fail "cpack"; }
scratch=$(mktemp -d /tmp/tier-nspawn.XXXXXX)
mkdir "$scratch/debs"
cp "$build"/tierd_*.deb "$build"/libtier0_*.deb "$scratch/debs/"
nspawn_pid=
cleanup() {
  if [ -n "$nspawn_pid" ]; then
    kill "$nspawn_pid" 2>/dev/null || true  # SIGTERM: nspawn powers the container off
    for _ in $(seq 100); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
    wait "$nspawn_pid" 2>/dev/null || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT
systemd-nspawn --register=no --keep-unit --volatile=overlay -q -D "$root" --boot \
  --bind="$scratch:/scratch" >"$scratch/console.log" 2>&1 </dev/null &
nspawn_pid=$!

# The container's PID 1: the descendant of nspawn whose PID in its own namespace is 1.
leader=
for _ in $(seq 100); do
  for p in $(ps -o pid= --ppid "$nspawn_pid" 2>/dev/null) ; do
    for q in $p $(ps -o pid= --ppid "$p" 2>/dev/null); do
      if grep -Eq '^NSpid:.*[[:space:]]1$' "/proc/$q/status" 2>/dev/null; then leader=$q; fi
    done
  done
  [ -n "$leader" ] && break
  sleep 0.2
done
[ -n "$leader" ] || { cat "$scratch/console.log"; fail "the container did not start"; }
ct() { nsenter -t "$leader" -a /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
# Until PID 1 listens, systemctl fails at once: retry, for up to 90 s.
state=
for _ in $(seq 90); do
  state=$(ct timeout 90 systemctl is-system-running --wait 2>/dev/null || true)
  case $state in running|degraded) break ;; esac
  sleep 1
done
case $state in running|degraded) ;; *) cat "$scratch/console.log"; fail "systemd state '$state'";; esac
echo "booted: systemd $state"

ct sh -c 'dpkg -i /scratch/debs/libtier0_*.deb /scratch/debs/tierd_*.deb' >"$scratch/dpkg.log" 2>&1 \
  || { cat "$scratch/dpkg.log"; fail "dpkg -i"; }
ct getent passwd tierd >/dev/null || fail "no tierd user after install"
en=$(ct systemctl is-enabled tierd 2>/dev/null || true)
[ "$en" = disabled ] || fail "tierd is not installed disabled: is-enabled says $en"
# The minimal root has no man(1): check man:tierd(8) by its file instead.
out=$(ct systemd-analyze verify --man=no /usr/lib/systemd/system/tierd.service 2>&1 || true)
[ -z "$out" ] || fail "systemd-analyze verify in the container: $out"
ct test -e /usr/share/man/man8/tierd.8.gz || fail "man:tierd(8) is not installed"

# Configure an NVMe directory, the metrics listener and an admin group; a fast watchdog.
ct sh -ec '
  mkdir -p /srv/nvme0 && chown tierd: /srv/nvme0
  groupadd tierdadm && useradd -m -G tierdadm alice && useradd -m bob
  cat >/etc/tierd/tierd.toml <<EOT
ram = "256M"
nvme = [ { path = "/srv/nvme0" } ]
nvme_capacity = "256M"
metrics_listen = "127.0.0.1:9464"
admin_group = "tierdadm"
status_interval_ms = 500
EOT
  mkdir -p /etc/systemd/system/tierd.service.d
  printf "[Service]\nWatchdogSec=3\n" >/etc/systemd/system/tierd.service.d/90-test.conf
  systemctl daemon-reload'
ct grep -q '^ReadWritePaths="-/srv/nvme0"$' /run/systemd/generator/tierd.service.d/50-tierd-paths.conf \
  || fail "the generator wrote no ReadWritePaths= for /srv/nvme0"

# Type=notify: start returns after READY=1.
ct systemctl start tierd || { ct journalctl -u tierd --no-pager | tail -20; fail "systemctl start tierd"; }
[ "$(ct systemctl is-active tierd)" = active ] || fail "tierd not active"
sleep 1
status=$(ct systemctl show -p StatusText --value tierd)
[ -n "$status" ] || fail "no STATUS="
echo "READY; STATUS=$status"

ct sh -ec 'head -c 1048576 /dev/urandom >/tmp/t1; head -c 65536 /dev/urandom >/tmp/t2
  tierctl put jobroot t1 /tmp/t1 >/dev/null; tierctl put jobroot t2 /tmp/t2 >/dev/null
  tierctl evict jobroot t1 >/dev/null'
ct runuser -u alice -- tierctl pools | grep -q jobroot || fail "tierctl as a member of admin_group does not list the pool"
if ct runuser -u bob -- tierctl pools | grep -q jobroot; then fail "a user outside admin_group lists root's pool"; fi
[ -n "$(ct find /srv/nvme0 -type f)" ] || fail "nothing written to the NVMe directory"
# The listener serves the text the event loop last published (at most 1 s old): poll.
for _ in $(seq 20); do
  metrics=$(ct bash -c 'exec 3<>/dev/tcp/127.0.0.1/9464; printf "GET /metrics HTTP/1.0\r\n\r\n" >&3; cat <&3')
  grep -q '^tierd_pools 1' <<<"$metrics" && break
  sleep 0.25
done
grep -q '^tierd_pools 1' <<<"$metrics" || fail "metrics listener: $(grep -m3 'tierd_pools\|HTTP' <<<"$metrics")"
echo "tierctl (admin group), NVMe tier and metrics ok"

# Watchdog: a stopped tierd misses its pings; systemd kills and restarts it; arenas re-attach.
pid=$(ct systemctl show -p MainPID --value tierd)
ct kill -STOP "$pid"
newpid=$pid
for _ in $(seq 60); do
  sleep 0.5
  newpid=$(ct systemctl show -p MainPID --value tierd)
  [ "$newpid" != "$pid" ] && [ "$newpid" != 0 ] && [ "$(ct systemctl is-active tierd)" = active ] && break
done
[ "$newpid" != "$pid" ] || fail "the watchdog did not restart the stopped tierd"
ct journalctl -u tierd --no-pager | grep -qi watchdog || fail "the journal does not mention the watchdog"
ct sh -ec 'tierctl get jobroot t1 /tmp/o1 >/dev/null && cmp /tmp/t1 /tmp/o1
  tierctl get jobroot t2 /tmp/o2 >/dev/null && cmp /tmp/t2 /tmp/o2' || fail "tensors lost across the watchdog restart"
echo "watchdog restart: pid $pid -> $newpid, tensors intact"

ct systemctl stop tierd
[ "$(ct systemctl show -p Result --value tierd)" = success ] || fail "systemctl stop: Result $(ct systemctl show -p Result --value tierd)"
[ -n "$(ct find /dev/shm -maxdepth 1 -name 'tierd-*' -user tierd)" ] || fail "arenas did not outlive the stop"
echo "clean stop; arenas kept"

ct dpkg --purge tierd >"$scratch/purge.log" 2>&1 || { cat "$scratch/purge.log"; fail "dpkg --purge"; }
for p in /etc/tierd /var/lib/tierd /usr/lib/systemd/system/tierd.service /usr/sbin/tierd; do
  if ct test -e "$p"; then fail "purge left $p"; fi
done
[ -z "$(ct find /dev/shm -maxdepth 1 -name 'tierd-*' -user tierd)" ] || fail "purge left the service's arenas"
ct test -d /srv/nvme0 || fail "purge removed the admin's NVMe directory"
grep -q "kept the tierd user and the NVMe directories" "$scratch/purge.log" || fail "purge does not say what it keeps"
echo "purge: config, state, unit and arenas removed; /srv/nvme0 and the tierd user kept"
echo PASS
