"""The build step of ``pip install ./python``: builds libcupool (``cargo build --release -p
cupool-capi`` in the workspace this folder sits in) and copies it into the package, where
``cupool._lib`` looks for it after ``CUPOOL_LIB``. The wheel is tagged for this platform (it
carries a native library) but for any Python 3 (the library is loaded with ctypes, not as an
extension module)."""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
WORKSPACE = os.path.dirname(HERE)
LIB_NAME = {"darwin": "libcupool.dylib", "win32": "cupool.dll"}.get(sys.platform, "libcupool.so")


def build_libcupool():
    """Builds libcupool and returns its path."""
    if not os.path.exists(os.path.join(WORKSPACE, "capi", "Cargo.toml")):
        raise RuntimeError(f"{WORKSPACE} is not the cupool workspace (no capi/Cargo.toml): build "
                           "the package from the repository's python/ folder, in place")
    cargo = os.environ.get("CARGO", "cargo")
    try:
        subprocess.run([cargo, "build", "--release", "-p", "cupool-capi"], cwd=WORKSPACE, check=True)
    except FileNotFoundError as e:
        raise RuntimeError(f"building libcupool needs cargo ({cargo!r} was not found): install "
                           "Rust (rustup), or set CARGO to its path") from e
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(WORKSPACE, "target"))
    path = os.path.join(target if os.path.isabs(target) else os.path.join(WORKSPACE, target),
                        "release", LIB_NAME)
    if not os.path.exists(path):
        raise RuntimeError(f"cargo built cupool-capi but {path} is missing")
    return path


class BuildPyWithLibcupool(build_py):
    """Copies the freshly built libcupool beside the package's modules."""

    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "cupool", LIB_NAME)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(build_libcupool(), dest)


class NativeDistribution(Distribution):
    """Marks the wheel as platform-specific: it carries a native library."""

    def has_ext_modules(self):
        return True


commands = {"build_py": BuildPyWithLibcupool}
try:
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel

    class AnyPythonWheel(bdist_wheel):
        """py3-none-<platform>: the library does not depend on the Python version."""

        def get_tag(self):
            _, _, platform = super().get_tag()
            return "py3", "none", platform

    commands["bdist_wheel"] = AnyPythonWheel
except ImportError:
    pass

setup(cmdclass=commands, distclass=NativeDistribution)
