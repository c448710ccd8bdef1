"""Builds the extension tierd._native for `pip install ./python` (metadata: pyproject.toml).

The extension is the project's CMake target tierd_python. With TIER_BUILD_DIR set to a
configured and built tree (e.g. build/, after tools/test), its build/python/tierd/_native*.so
is taken as it is; otherwise CMake configures the repository (this file's parent directory)
into the setuptools build directory and builds that one target. Either way the module links
libtier by the RUNPATH CMake gives it.
"""
import glob
import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        built = self._prebuilt() or self._cmake_build()
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(built, dest)

    def _prebuilt(self):
        tree = os.environ.get("TIER_BUILD_DIR")
        if not tree:
            return None
        found = glob.glob(os.path.join(tree, "python", "tierd", "_native*.so"))
        if not found:
            raise RuntimeError(f"TIER_BUILD_DIR={tree} holds no python/tierd/_native*.so; build the target "
                               "tierd_python there first (cmake --build {tree} --target tierd_python)")
        return found[0]

    def _cmake_build(self):
        tree = os.path.join(os.path.abspath(self.build_temp), "cmake")
        cfg = ["cmake", "-S", REPO, "-B", tree, "-DCMAKE_BUILD_TYPE=Release", "-DTIER_BUILD_TESTS=OFF",
               "-DTIER_WITH_CUDA=OFF"]
        subprocess.check_call(cfg)
        subprocess.check_call(["cmake", "--build", tree, "--target", "tierd_python", "-j", str(os.cpu_count() or 2)])
        return glob.glob(os.path.join(tree, "python", "tierd", "_native*.so"))[0]


setup(ext_modules=[CMakeExtension("tierd._native")], cmdclass={"build_ext": CMakeBuild})
