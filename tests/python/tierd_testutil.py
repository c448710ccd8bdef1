"""Test support for the tierd Python binding: a real tierd on a temporary socket.

Environment (set by tests/python/CMakeLists.txt): TIER_BIN_DIR (build/bin) and PYTHONPATH
(build/python). Exit code 77 tells ctest the test was skipped (SKIP_RETURN_CODE).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77
BIN_DIR = os.environ.get("TIER_BIN_DIR", "")


def skip(reason):
    print(f"SKIPPED: {reason}", flush=True)
    sys.exit(SKIP)


def import_tierd():
    try:
        import tierd  # noqa: F401
    except ImportError as e:
        skip(f"the tierd module is not importable with {sys.executable} ({e})")
    return sys.modules["tierd"]


def bin_path(name):
    return os.path.join(BIN_DIR, name)


class Daemon:
    """tierd --socket DIR/tierd.sock --state-dir DIR/state --ram RAM --foreground.

    Stopped with SIGTERM (SIGKILL after 10 s) and its directory removed by stop()."""

    def __init__(self, ram="256M", extra=(), env=None):
        exe = bin_path("tierd")
        if not os.access(exe, os.X_OK):
            skip(f"{exe} is not built")
        self.dir = tempfile.mkdtemp(prefix="tierd-py.")
        self.socket = os.path.join(self.dir, "tierd.sock")
        self.state_dir = os.path.join(self.dir, "state")
        os.makedirs(self.state_dir)
        self.log_path = os.path.join(self.dir, "tierd.log")
        self._env = dict(os.environ, **(env or {}))
        self._spawn([exe, "--socket", self.socket, "--state-dir", self.state_dir, "--ram", ram,
                     "--foreground", "--remove-arenas-on-exit", *extra])
        try:
            self.wait_ready()
        except RuntimeError:
            self.stop()
            raise

    def _spawn(self, args):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, env=self._env)

    def wait_ready(self, timeout=10):
        """Returns once tierd accepts connections on its socket; RuntimeError with its log when
        it exits first or does not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tierd exited with {self.proc.returncode}:\n{self.log()}")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.01)
            finally:
                s.close()
        raise RuntimeError(f"tierd did not become ready in {timeout} s:\n{self.log()}")

    def kill_and_restart(self):
        """kill -9, then a new tierd with the same arguments, socket and state directory (its
        arenas are named shared memory: the new one re-attaches them)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._spawn(list(self.proc.args))
        self.wait_ready()

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


class ModuleDaemon:
    """One tierd for every test of a module. At module level:

        daemon = tu.ModuleDaemon()
        setUpModule, tearDownModule = daemon.start, daemon.stop

    Between the two, `daemon.socket` (and every other Daemon attribute) is the running tierd's."""

    def __init__(self, **daemon_args):
        self._args = daemon_args
        self._daemon = None

    def start(self):
        self._daemon = Daemon(**self._args)

    def stop(self):
        if self._daemon is not None:
            self._daemon.stop()
            self._daemon = None

    def __getattr__(self, name):
        if self._daemon is None:
            raise AttributeError(f"the module's tierd is not running (no {name})")
        return getattr(self._daemon, name)
