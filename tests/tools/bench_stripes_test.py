"""tools/bench-stripes end to end on this build's tier-bench, small enough for CI: two capped loop
devices, one round, one size. It must print a spill and a fetch figure for one and for two
directories, whose efficiency is the ratio over the directory count; report that every device's
I/O went through the cap; and leave no mount, loop device, backing file or cgroup behind. Bad
options are refused with exit code 2. No timing is asserted.

Usage: bench_stripes_test.py BUILD_DIR. Exits 77 (skipped) where the tool cannot run: not root, no
loop device can be attached, no block cgroup can be made, or tier-bench not built."""
import glob
import json
import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench-stripes")


def skip(why):
    print("skipped: " + why)
    sys.exit(77)


def leftovers():
    """What a run of the tool could leave behind: its backing files, loop devices, cgroups, dirs."""
    images = glob.glob("/dev/shm/bench-stripes*")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    cgroups = glob.glob("/sys/fs/cgroup/bench-stripes*") + glob.glob("/sys/fs/cgroup/blkio/bench-stripes*")
    return images + [l for l in loops.splitlines() if "bench-stripes." in l] + cgroups + glob.glob("/tmp/bench-stripes.*")


def run(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=600)


def refusals(build):
    for args, word in ((["--devices", "0"], "--devices"), (["--cap", "fast"], "--cap"), (["--bogus"], "--bogus"),
                       (["--devices", "17"], "at most 16"), (["--build", "/nonexistent"], "not built")):
        r = run(*args, "--build", build) if "--build" not in args else run(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert word in r.stderr, (args, r.stderr)
    h = run("--help")
    assert h.returncode == 0 and "Usage: tools/bench-stripes" in h.stdout, h


def can_attach_loop():
    """Whether this machine lets us attach a loop device (a container may have /dev/loop-control
    and still refuse)."""
    img = "/dev/shm/bench-stripes-probe.%d.img" % os.getpid()
    try:
        with open(img, "wb") as f:
            f.truncate(1 << 20)
        r = subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True)
        if r.returncode != 0:
            return False
        subprocess.run(["losetup", "-d", r.stdout.strip()], check=False)
        return True
    finally:
        os.unlink(img)


def can_make_cgroup(parent):
    """Whether a child cgroup can be made under `parent` (a container may mount it read-only)."""
    probe = os.path.join(parent, "bench-stripes-probe.%d" % os.getpid())
    try:
        os.mkdir(probe)
    except OSError:
        return False
    os.rmdir(probe)
    return True


def main():
    build = sys.argv[1]
    refusals(build)
    if os.geteuid() != 0:
        skip("needs root (loop devices, mounts, cgroups)")
    if not os.path.exists("/dev/loop-control") or not can_attach_loop():
        skip("loop devices cannot be attached here")
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers") and \
        "io" in open("/sys/fs/cgroup/cgroup.controllers").read().split()
    parent = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/blkio"
    if not (v2 or os.access("/sys/fs/cgroup/blkio/cgroup.procs", os.W_OK)) or not can_make_cgroup(parent):
        skip("no block cgroup controller (v2 io or v1 blkio) to make a cgroup in")
    if not os.access(os.path.join(build, "bin", "tier-bench"), os.X_OK):
        skip("tier-bench is not built")
    before = leftovers()

    r = run("--build", build, "--devices", "2", "--size", "2", "--cap", "2000", "--rounds", "1",
            "--sizes", "16M", "--samples", "1")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    figs = {(j["name"], j["dirs"]): j for j in map(json.loads, r.stdout.splitlines())}
    assert set(figs) == {(n, d) for n in ("stripes.spill", "stripes.fetch") for d in (1, 2)}, figs
    for (name, d), j in figs.items():
        assert j["bytes"] == 16 << 20 and j["unit"] == "GB/s" and j["cap_mbps"] == 2000 and j["rounds"] == 1, j
        assert j["value"] > 0 and j["ratio"] > 0, j
        assert abs(j["efficiency"] - j["ratio"] / d) < 1e-3, j
    # Both devices' I/O went through the cgroup, and the table names both directory counts.
    assert r.stderr.count("read and written under the cap") == 2, r.stderr
    for d in (1, 2):
        assert ("\n| %d | " % d) in r.stderr, r.stderr
    assert leftovers() == before, (before, leftovers())
    print("ok: 4 figures; spill at 2 directories %.2f x one device's ceiling" % figs[("stripes.spill", 2)]["ratio"])


if __name__ == "__main__":
    main()
