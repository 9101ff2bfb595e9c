"""Where the package finds libcupool: the library a wheel bundles, ``CUPOOL_LIB`` over it, and
what ``cupool.torch.install()`` hands PyTorch (a stand-in torch module: no GPU, no torch).

Runs from the source tree (run-smoke.sh, with ``CUPOOL_LIB``) and from an installed wheel
(python/tests/run-wheel.sh, with ``CUPOOL_EXPECT_BUNDLED=1``: there the bundled library must be
found with no ``CUPOOL_LIB``)."""
import os
import shutil
import subprocess
import sys
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import cupool  # noqa: E402
import cupool.torch  # noqa: E402
from cupool import _lib  # noqa: E402

PACKAGE = os.path.dirname(os.path.abspath(cupool.__file__))
BUNDLED = os.path.join(PACKAGE, _lib.LIB_NAME)


def fresh_python(code, tmp_path, **env):
    """Runs ``code`` in a new interpreter that imports this same cupool package, with no
    ``CUPOOL_LIB`` unless given and no checkout build to fall back on; returns its stdout."""
    full = {k: v for k, v in os.environ.items() if k != "CUPOOL_LIB"}
    full.update(PYTHONPATH=os.path.dirname(PACKAGE), CARGO_TARGET_DIR=str(tmp_path / "no-target"))
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, cwd=tmp_path, capture_output=True,
                          text=True, check=True).stdout.strip()


def needs_bundled():
    if not os.path.exists(BUNDLED):
        if os.environ.get("CUPOOL_EXPECT_BUNDLED"):
            pytest.fail(f"the installed package has no bundled library at {BUNDLED}")
        pytest.skip("this cupool is the source tree's: no library bundled (pip install ./python bundles one)")


def test_an_installed_package_loads_its_bundled_library(tmp_path):
    needs_bundled()
    out = fresh_python("import cupool; print(cupool.library_path())", tmp_path)
    assert os.path.samefile(out, BUNDLED), out


def test_cupool_lib_overrides_the_bundled_library(tmp_path):
    needs_bundled()
    other = tmp_path / "elsewhere" / _lib.LIB_NAME
    other.parent.mkdir()
    shutil.copyfile(BUNDLED, other)
    for setting in (str(other), str(other.parent)):
        out = fresh_python("import cupool; print(cupool.library_path())", tmp_path, CUPOOL_LIB=setting)
        assert os.path.samefile(out, other), (setting, out)


def test_a_missing_library_names_every_path_tried(tmp_path):
    # A copy of the package's modules alone: nothing bundled beside them.
    bare = tmp_path / "bare"
    shutil.copytree(PACKAGE, bare / "cupool", ignore=shutil.ignore_patterns("*.so", "*.dylib", "*.dll",
                                                                             "__pycache__"))
    code = ("import cupool\ntry:\n    cupool.stats()\nexcept cupool.LibraryNotFound as e:\n"
            "    print(e)\n")
    out = fresh_python(code, tmp_path, PYTHONPATH=str(bare), CUPOOL_LIB="", CARGO_TARGET_DIR=str(tmp_path / "t"))
    assert f"cupool/{_lib.LIB_NAME}: no such file" in out.replace(os.sep, "/"), out
    assert f"t/release/{_lib.LIB_NAME}: no such file" in out.replace(os.sep, "/"), out
    assert "CUPOOL_LIB" in out, out
    # CUPOOL_LIB is a choice: a wrong one is an error naming it, never a quiet fall back to another.
    out = fresh_python(code, tmp_path, PYTHONPATH=str(bare), CUPOOL_LIB=str(tmp_path / "nowhere.so"))
    assert "nowhere.so: no such file" in out, out
    assert f"cupool/{_lib.LIB_NAME}" not in out.replace(os.sep, "/"), out


def test_a_wrong_cupool_lib_is_refused_even_with_a_bundled_library(tmp_path):
    needs_bundled()
    code = ("import cupool\ntry:\n    cupool.stats()\nexcept cupool.LibraryNotFound as e:\n"
            "    print(e)\n")
    out = fresh_python(code, tmp_path, CUPOOL_LIB=str(tmp_path / "nowhere.so"))
    assert "nowhere.so: no such file" in out, out


def fake_torch(monkeypatch, handed):
    """A stand-in for torch that records what install() hands it (no CUDA, no compiler)."""

    class Pluggable:
        def __init__(self, path, alloc, free):
            handed.update(path=path, alloc=alloc, free=free)

    cuda = types.SimpleNamespace(
        is_initialized=lambda: False,
        memory=types.SimpleNamespace(CUDAPluggableAllocator=Pluggable,
                                     change_current_allocator=lambda a: handed.update(current=a)))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(cupool.torch, "_allocator", None)
    monkeypatch.setattr(cupool.torch, "_raising", None)
    return Pluggable


def test_torch_install_without_a_buildable_shim_warns_and_hands_libcupool_s_entry_points(monkeypatch):
    handed = {}
    fake_torch(monkeypatch, handed)
    with pytest.warns(RuntimeWarning, match="out-of-memory errors cannot be raised"):
        cupool.torch.install(device="sim", sim_gib=1)
    try:
        assert (handed["alloc"], handed["free"]) == ("cupool_torch_alloc", "cupool_torch_free")
    finally:
        cupool.shutdown()


def test_torch_install_falls_back_to_the_pluggable_allocator_and_says_why(monkeypatch):
    # The stand-in torch has no cpp_extension: the direct allocator cannot be built.
    handed = {}
    fake_torch(monkeypatch, handed)
    monkeypatch.setattr(cupool.torch, "_route", None)
    with pytest.warns(RuntimeWarning):
        cupool.torch.install(device="sim", sim_gib=1)
    try:
        assert cupool.torch.route() == "pluggable"
        assert cupool.torch.direct_error, "the reason the direct allocator was not used"
        assert "current" in handed
    finally:
        cupool.shutdown()


def test_torch_install_hands_pytorch_the_library_the_package_loaded(monkeypatch):
    handed = {}
    Pluggable = fake_torch(monkeypatch, handed)
    cupool.torch.install(device="sim", sim_gib=1, raise_oom=False)
    try:
        assert os.path.samefile(handed["path"], cupool.library_path())
        assert (handed["alloc"], handed["free"]) == ("cupool_torch_alloc", "cupool_torch_free")
        assert isinstance(handed["current"], Pluggable)
        if os.environ.get("CUPOOL_EXPECT_BUNDLED"):
            assert os.path.samefile(handed["path"], BUNDLED)
    finally:
        cupool.shutdown()


def test_the_out_of_memory_shim_s_source_ships_with_the_package():
    # install() builds it against the user's PyTorch: a wheel without it could not raise.
    for src in ("torch_oom.cpp", "torch_direct.cpp"):
        assert os.path.exists(os.path.join(os.path.dirname(cupool.__file__), src))


def test_install_s_defaults_apply_unless_told(monkeypatch):
    """install() asks for the worker (``vmm_ahead="worker"``) and one range
    (``size_classes="none"``) only where nothing else decides: a keyword, the variable, a
    configuration string, or a library already open."""
    import cupool.torch as ct
    monkeypatch.delenv("CUPOOL_VMM_AHEAD", raising=False)
    monkeypatch.delenv("CUPOOL_SIZE_CLASSES", raising=False)
    monkeypatch.setattr(cupool, "is_initialized", lambda: False)
    both = {"vmm_ahead": "worker", "size_classes": "none"}
    assert ct.install_options(None, {"sim_gib": 1}) == {"sim_gib": 1, **both}
    assert ct.install_options(None, {"vmm_ahead": "off"}) == {"vmm_ahead": "off", "size_classes": "none"}
    assert ct.install_options(None, {"size_classes": "1048576"}) == {"size_classes": "1048576",
                                                                     "vmm_ahead": "worker"}
    assert ct.install_options("GGML_POOL=vmm", {}) == {}
    monkeypatch.setenv("CUPOOL_VMM_AHEAD", "inline")
    assert ct.install_options(None, {}) == {"size_classes": "none"}
    monkeypatch.setenv("CUPOOL_SIZE_CLASSES", "1048576")
    assert ct.install_options(None, {}) == {}
    monkeypatch.delenv("CUPOOL_VMM_AHEAD")
    monkeypatch.delenv("CUPOOL_SIZE_CLASSES")
    monkeypatch.setattr(cupool, "is_initialized", lambda: True)
    assert ct.install_options(None, {}) == {}
