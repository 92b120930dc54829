"""pip install . : the kvfabric Python package (python/kvfabric, docs/python.md).

Builds the native module with the project's CMake build (target
kvfabric_python; no network: every dependency is a Debian package that
tools/setup.sh installs) and puts it into the package. KVF_CMAKE_BUILD_DIR
reuses a configured build directory (CI passes build/ci); otherwise
build/python is configured (Release, no tests) for the running interpreter.
KVF_PREBUILT_MODULE names a module already built (tools/test.sh passes
Bazel's bazel-bin/python/kvfabric/_kvfabric.so) and skips CMake.

    bash tools/setup.sh
    python3 -m venv --system-site-packages .venv     # sees Debian's torch
    .venv/bin/pip install --no-build-isolation .
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildNativeModule(build_py):
    """build_py, then the CMake target kvfabric_python into the package."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "kvfabric")
        os.makedirs(target, exist_ok=True)
        prebuilt = os.environ.get("KVF_PREBUILT_MODULE")
        if prebuilt:
            shutil.copyfile(prebuilt, os.path.join(target, "_kvfabric.so"))
            return
        build = os.environ.get("KVF_CMAKE_BUILD_DIR") or os.path.join(ROOT, "build", "python")
        build = os.path.abspath(build)
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, *generator,
                                   "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_TESTING=OFF",
                                   f"-DPython3_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build, "--target", "kvfabric_python",
                               "--parallel", str(os.cpu_count() or 2)])
        module = os.path.join(build, "python", "kvfabric", "_kvfabric.so")
        if not os.path.exists(module):
            sys.exit(f"{module} was not built: the CMake configure step says why "
                     "(python3-dev and pybind11-dev are needed: tools/setup.sh)")
        shutil.copy2(module, os.path.join(target, "_kvfabric.so"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # the wheel carries a native module: platform-specific


def version():
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.read().strip()


setup(
    name="kvfabric",
    version=version(),
    description="kvfabric: a distributed KV-cache service for LLM serving (client and vLLM "
                "connector)",
    package_dir={"": "python"},
    packages=["kvfabric", "kvfabric.integrations"],
    python_requires=">=3.9",
    cmdclass={"build_py": BuildNativeModule},
    distclass=BinaryDistribution,
    zip_safe=False,
)
