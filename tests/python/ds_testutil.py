"""Support for the deepspeed suite (label deepspeed): runs tests/python/ds_gpt.py jobs, one
process per rank, and reads their per-step losses.

DeepSpeed runs on its CPU accelerator with gloo. Its own aio handle (the peer the suite compares
tierd's with) is JIT-built by DeepSpeed on first use and needs libaio's header (Debian
libaio-dev, installed by tools/install-deps); the build is cached in .torch-extensions/ at the
repository root (git-ignored; TORCH_EXTENSIONS_DIR), so only a fresh clone pays for it.
"""
import importlib.util
import os
import re
import socket
import subprocess
import sys
import time

import tierd_testutil as tu

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GPT = os.path.join(HERE, "ds_gpt.py")
EXT_DIR = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(REPO, ".torch-extensions")


def require_deepspeed(aio=False):
    """Skips (exit 77) without DeepSpeed, the tierd module or, with aio=True, libaio's header."""
    for mod in ("deepspeed", "torch"):
        if importlib.util.find_spec(mod) is None:
            tu.skip(f"{mod} is not importable with {sys.executable} (tools/py-env makes the environment)")
    tu.import_tierd()
    if aio and not os.path.exists("/usr/include/libaio.h"):
        tu.skip("DeepSpeed's aio handle (the peer) needs libaio's header: apt-get install libaio-dev "
                "(tools/install-deps)")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def job_env(rank=0, world=1, port=None):
    env = dict(os.environ)
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=EXT_DIR,
               RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port or free_port()))
    return env


class Job:
    """One ds_gpt.py process per rank, started at once; stdout collected, stderr to a file."""

    def __init__(self, args, world=1, tmp="/tmp"):
        port = free_port()
        self.procs, self.err_paths = [], []
        for rank in range(world):
            err = os.path.join(tmp, f"ds_gpt.{os.getpid()}.{id(self)}.{rank}.err")
            self.err_paths.append(err)
            with open(err, "wb") as e:
                self.procs.append(subprocess.Popen(
                    [sys.executable, GPT, *[str(a) for a in args]], env=job_env(rank, world, port),
                    stdout=subprocess.PIPE, stderr=e, text=True))
        self.outs = None

    def wait(self, timeout=600):
        self.outs = [p.communicate(timeout=timeout)[0] for p in self.procs]
        return self

    def rc(self, rank=0):
        return self.procs[rank].returncode

    def out(self, rank=0):
        return self.outs[rank]

    def err(self, rank=0):
        with open(self.err_paths[rank], errors="replace") as f:
            return f.read()

    def losses(self, rank=0):
        return losses(self.outs[rank])

    def check(self, what):
        for r in range(len(self.procs)):
            if self.rc(r) != 0:
                raise AssertionError(f"{what}: rank {r} exited {self.rc(r)}:\n{self.out(r)[-2000:]}\n"
                                     f"{self.err(r)[-4000:]}")
        return self


def losses(text):
    """[(step, hex of the float)] of `loss STEP HEX` lines."""
    return [(int(m.group(1)), m.group(2)) for m in re.finditer(r"^loss (\d+) (\S+)$", text, re.M)]


def field(text, key):
    m = re.search(rf"\b{key} (\S+)", text)
    return m.group(1) if m else None


def assert_same(a, b, what):
    if a != b:
        diff = [(x, y) for x, y in zip(a, b) if x != y][:3]
        raise AssertionError(f"{what}: losses differ (first differences {diff}; {len(a)} vs {len(b)} steps)")


def nvme_daemon(ram="1G"):
    """A tierd with an NVMe tier directory below its own temporary directory."""
    import tempfile
    nvme = tempfile.mkdtemp(prefix="tierd-ds-nvme.")
    d = tu.Daemon(ram=ram, extra=("--nvme-dir", nvme))
    d.nvme_dir = nvme
    return d


def wait_for_line(proc, pattern, timeout=300):
    """Reads proc.stdout until a line matches `pattern`; returns the lines read."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"no line matching {pattern!r} (read {lines[-5:]})")


def kill_and_restart(d):
    """kill -9 of tierd Daemon `d`, then a new tierd on the same socket and state directory."""
    d.kill_and_restart()
