"""The Python package with real PyTorch and CuPy on a GPU. Each case runs in its own process
(an allocator is installed once per process). Skipped without a GPU.

Run on the GPU machine: CUPOOL_LIB=... python3 -m pytest -m gpu python/tests/test_gpu.py
"""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def has_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:
        return False


# CUPOOL_REQUIRE_GPU=1 (scripts/gpu-run.sh sets it) makes a missing GPU fail instead of skip.
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_gpu() and not os.environ.get("CUPOOL_REQUIRE_GPU"),
                                                  reason="needs a CUDA GPU")]


def run(script, *args, pool="vmm"):
    env = dict(os.environ, POOL=pool)
    p = subprocess.run([sys.executable, os.path.join(HERE, "gpu", script), *args], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{script} failed:\n{p.stdout}\n{p.stderr}"
    # Nothing may unwind or print a backtrace at thread or process exit.
    assert "panicked" not in p.stderr and "stack backtrace" not in p.stderr, p.stderr
    return p


@pytest.mark.parametrize("pool", ["vmm", "legacy"])
def test_torch_installed(tmp_path, pool):
    p = run("torch_installed.py", str(tmp_path / "trace.jsonl"), pool=pool)
    assert "ok" in p.stdout
    assert (tmp_path / "trace.jsonl").stat().st_size > 0


@pytest.mark.parametrize("pool", ["vmm", "legacy"])
def test_torch_installed_oom_raises_torchs_error(pool):
    p = run("torch_installed_oom.py", pool=pool)
    assert "installed-route out-of-memory: ok" in p.stdout, p.stdout


def test_torch_compile_runs_and_its_cuda_graphs_are_refused_with_the_reason():
    p = run("torch_compile.py")
    assert "torch.compile (default mode): ok" in p.stdout, p.stdout
    assert "reduce-overhead refused" in p.stdout, p.stdout


def test_torch_sleep_and_wake():
    p = run("torch_sleep.py")
    assert "sleep and wake through torch: ok" in p.stdout, p.stdout


@pytest.mark.parametrize("pool", ["direct", "vmm"])
def test_torch_graph_capture_through_a_mempool(pool):
    p = run("torch_graphs.py", pool=pool)
    assert "graph replayed through a cupool MemPool" in p.stdout, p.stdout


def test_torch_install_after_cuda_work_is_refused():
    p = run("torch_install_too_late.py")
    assert "refused" in p.stdout


@pytest.mark.parametrize("pool", ["direct", "vmm"])
def test_torch_mempool_and_oom(pool):
    p = run("torch_mempool.py", pool=pool)
    assert "torch.OutOfMemoryError" in p.stdout
    # cupool's own report reaches the log: what was asked, and what the device had.
    assert "out of memory" in p.stderr.lower() or "could not serve" in p.stderr, p.stderr


def test_cupy_hook():
    pytest.importorskip("cupy")
    p = run("cupy_hook.py")
    assert "cupy OutOfMemoryError" in p.stdout


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    except OSError:
        return 0
    return sum(1 for l in out.splitlines() if l.startswith("GPU "))


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs")
def test_torch_two_devices():
    p = run("torch_two_devices.py")
    assert "two devices: ok" in p.stdout
