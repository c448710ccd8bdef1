"""The GPU bundle's Python path, here: tools/gpu/pack-python packs this build's sources and
libtier, the packed DIR/python/build builds the tierd package with this interpreter (as the GPU
machine's python3 does with its own), the package imports from there (not from build/python),
and DIR's offload_adamw_gpu.py (the bundle's python-adamw step) runs against a real tierd:
without a CUDA device its CPU comparison (OffloadAdamW against torch.optim.AdamW) must be
within its bound and it must say the CUDA runs were skipped; with one, every comparison.

Run by ctest as python:bundle_build with the PyTorch 2.11 environment's interpreter (label
python). Skipped (77) when that interpreter lacks Python.h, pybind11's CMake config or a C++23
compiler (the build script says which), or tierd is not built.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tierd_testutil as tu  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.path.normpath(os.path.join(tu.BIN_DIR, "..")) if tu.BIN_DIR else ""

try:
    import torch  # noqa: F401
except ImportError as e:
    tu.skip(f"torch is not importable with {sys.executable} ({e})")
if not BUILD or not os.path.exists(os.path.join(BUILD, "lib", "libtier.so.0")):
    tu.skip("TIER_BIN_DIR names no build with lib/libtier.so.0")


class BundlePython(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="bundle-python.")
        cls.dir = os.path.join(cls.tmp.name, "bundle")
        subprocess.run([os.path.join(REPO, "tools", "gpu", "pack-python"), BUILD, cls.dir], check=True)
        out = os.path.join(cls.tmp.name, "out")
        r = subprocess.run([os.path.join(cls.dir, "python", "build"), "--python", sys.executable, out],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode == tu.SKIP:
            cls.tmp.cleanup()
            tu.skip("the bundle's Python build lacks a prerequisite here: " + r.stderr.strip().splitlines()[-1])
        if r.returncode != 0:
            raise AssertionError(f"DIR/python/build failed ({r.returncode}):\n{r.stderr[-4000:]}")
        last = r.stdout.strip().splitlines()[-1]
        assert last.startswith("PYTHONPATH="), last
        cls.site = last.split("=", 1)[1]
        cls.env = dict(os.environ, PYTHONPATH=cls.site)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_package_imports_from_its_own_build(self):
        r = subprocess.run([sys.executable, "-c", "import tierd, tierd.torch; print(tierd.__file__, tierd.__version__)"],
                           env=self.env, stdout=subprocess.PIPE, text=True, check=True)
        path, version = r.stdout.split()
        self.assertTrue(path.startswith(self.site), path)
        self.assertNotEqual(version, "unknown")

    def test_offload_adamw_comparison_runs(self):
        d = tu.Daemon(ram="256M")
        try:
            r = subprocess.run([sys.executable, os.path.join(REPO, "tools", "gpu", "offload_adamw_gpu.py"),
                                "--socket", d.socket, "--steps", "4", "--params", "0.25"],
                               env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        finally:
            d.stop()
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        rows = {row["name"]: row for row in map(json.loads, r.stdout.splitlines())}
        for name in ("offload_adamw_cpu_params", "torch_adamw_cpu"):
            self.assertGreater(rows[name]["step_ms"], 0.0)
            self.assertEqual(rows[name]["steps"], 4)
        cmp = rows["offload_cpu_params_vs_torch_cpu"]
        self.assertTrue(cmp["ok"], cmp)
        if torch.cuda.is_available():
            for name in ("offload_cuda_params_vs_torch_fused", "offload_cuda_params_vs_offload_cpu_params"):
                self.assertTrue(rows[name]["ok"], rows[name])
        else:
            self.assertIn("no CUDA device", r.stderr)


if __name__ == "__main__":
    unittest.main()
