"""`pip install ./python` into a fresh virtual environment, then the example trains from it.

The venv sees Debian's numpy and torch (--system-site-packages); the build needs no registry
(--no-build-isolation --no-index: Debian's setuptools and wheel). TIER_BUILD_DIR points the
build at this build tree's extension, so the test takes seconds; python/ is copied first so
that pip's in-tree build leaves the checkout as it was.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tierd_testutil as tu  # noqa: E402

tierd = tu.import_tierd()
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", "..", "python"))
BUILD = os.path.abspath(os.path.join(tu.BIN_DIR, ".."))


class PipInstall(unittest.TestCase):
    def test_pip_install_into_a_venv_then_train(self):
        for mod in ("venv", "ensurepip"):
            if subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True).returncode:
                self.skipTest(f"python3 -m {mod} is not available (apt-get install python3-venv)")
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("torch is not importable (apt-get install python3-torch)")
        tmp = tempfile.mkdtemp(prefix="tierd-pip.")
        daemon = tu.Daemon()
        try:
            venv = os.path.join(tmp, "venv")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
            src = shutil.copytree(SRC, os.path.join(tmp, "python"))
            py = os.path.join(venv, "bin", "python")
            env = dict(os.environ, TIER_BUILD_DIR=BUILD)
            env.pop("PYTHONPATH", None)  # the venv must find its own copy, not the build tree's
            r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
                                src], env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([py, "-c", "import tierd, tierd.torch, importlib.metadata as m; "
                                "print(tierd.__file__); print(tierd.__version__, m.version('tierd'))"],
                               env=env, capture_output=True, text=True, cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            where, versions = r.stdout.splitlines()
            self.assertTrue(where.startswith(venv), where)
            ext_version, dist_version = versions.split()
            self.assertEqual(ext_version, dist_version)  # pyproject.toml and CMake agree
            for name in ("py.typed", "_native.pyi", "torch/__init__.py"):
                self.assertTrue(os.path.exists(os.path.join(os.path.dirname(where), name)), name)
            r = subprocess.run([py, os.path.join(src, "examples", "train_gpt.py"), "--pool", "pip", "--socket",
                                daemon.socket, "--steps", "3", "--layers", "1", "--dim", "32", "--heads", "2",
                                "--seq", "16", "--batch", "2"], env=dict(env, OMP_NUM_THREADS="1"),
                               capture_output=True, text=True, cwd=tmp, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            steps = [json.loads(x) for x in r.stdout.splitlines() if '"step"' in x]
            self.assertEqual([s["step"] for s in steps], [1, 2, 3])
        finally:
            daemon.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
