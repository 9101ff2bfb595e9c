"""The Python package with real PyTorch and CuPy on a GPU. Each case runs in its own process
(an allocator is installed once per process). Skipped without a GPU.

Run on the GPU machine: CUPOOL_LIB=... python3 -m pytest -m gpu python/tests/test_gpu.py
"""
import json
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


def test_torch_installed_through_the_pluggable_interface(tmp_path, monkeypatch):
    # The route install() falls back to where cupool's own allocator class does not build.
    monkeypatch.setenv("CUPOOL_TORCH_DIRECT", "off")
    p = run("torch_installed.py", str(tmp_path / "trace.jsonl"))
    assert "ok" in p.stdout


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


@pytest.mark.parametrize("pool", ["vmm", "legacy"])
def test_torch_memory_snapshot_opens_in_pytorchs_viewer(tmp_path, pool):
    p = run("torch_memory_viz.py", str(tmp_path), pool=pool)
    assert "memory snapshot through torch: ok" in p.stdout, p.stdout
    for html in ("trace_plot.html", "segment_plot.html"):
        assert (tmp_path / html).stat().st_size > 0


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


# Two GPUs through torch.distributed (torchrun, NCCL): scripts/torch/distributed.py under cupool,
# installed and as a MemPool, against PyTorch's own allocator on the same workload, steps and
# seed; scripts/torch/nccl_bw.py for NCCL's registration of a cupool MemPool.
REPO = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(REPO, "scripts", "torch")
#: Shorter than the benchmark's runs (200 and 100 steps): each case's reference run takes as many.
DIST_STEPS = {"tp-mlp": 60, "ddp": 40}
#: NVLink multicast off: on the shared machines it can take the GPUs down.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
two_gpus = pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs")


def distributed_module():
    """scripts/torch/distributed.py as a module (its compare() and tolerances); no torch import."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("cupool_scripts_distributed", os.path.join(SCRIPTS, "distributed.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torchrun(script, *args, timeout=300):
    """Runs ``script`` on two GPUs; on a timeout torchrun gets SIGTERM first, so that it stops its
    workers (they run in sessions of their own, which a SIGKILL of torchrun would orphan)."""
    env = dict(os.environ, **NO_MULTICAST)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             os.path.join(SCRIPTS, script), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"{script} {' '.join(args)} ran past {timeout}s:\n{stdout[-4000:]}\n{stderr[-8000:]}")
    p = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert p.returncode == 0, f"{script} {' '.join(args)} failed:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    for bad in ("panicked", "stack backtrace", "Traceback"):
        assert bad not in p.stderr, f"{bad!r} in the stderr of {script}:\n{p.stderr[-8000:]}"
    return p


def dist_rows(folder, allocator, workload):
    """Both ranks' result lines of one run, rank 0 first."""
    out = os.path.join(str(folder), f"{allocator}-{workload}.jsonl")
    torchrun("distributed.py", "--allocator", allocator, "--workload", workload,
             "--steps", str(DIST_STEPS[workload]), "--out", out)
    rows = sorted((json.loads(line) for line in open(out)), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1], rows
    return rows


@pytest.fixture(scope="module")
def native_dist(tmp_path_factory):
    """The native allocator's rows per workload, run once per module."""
    cache = {}

    def get(workload):
        if workload not in cache:
            cache[workload] = dist_rows(tmp_path_factory.mktemp("native"), "native", workload)
        return cache[workload]
    return get


@two_gpus
@pytest.mark.parametrize("workload", ["tp-mlp", "ddp"])
@pytest.mark.parametrize("allocator", ["cupool", "cupool-mempool"])
def test_torch_distributed_results_equal_native(tmp_path, native_dist, allocator, workload):
    """torchrun on two GPUs exits cleanly under cupool, and every rank's results are the native
    run's: identical expected, within distributed.TOLERANCE accepted (its comment says why)."""
    ref = native_dist(workload)
    rows = dist_rows(tmp_path, allocator, workload)
    compare = distributed_module().compare
    for got, want in zip(rows, ref):
        verdict = compare(workload, got["checksum"], want["checksum"])
        print(f"{allocator} {workload} rank {got['rank']}: {verdict}")
        assert verdict in ("identical", "close"), (verdict, got["checksum"], want["checksum"])
        assert got["allocator"] == allocator and got["steps"] == DIST_STEPS[workload]
        if allocator == "cupool" and os.environ.get("CUPOOL_TORCH_DIRECT") != "off":
            # Every rank through cupool's own allocator class (the default route).
            assert got["cupool_route"] == "direct", got.get("cupool_direct_error")


@two_gpus
def test_nccl_registration_keeps_a_cupool_mempool_in_place(tmp_path):
    """A cupool nccl MemPool registered with NCCL (cupool.torch.register_mem_pool): all_reduce and
    all_gather results right in every mode, the registered bytes survive freeing the tensors and
    torch.cuda.empty_cache(), and go at deregister_mem_pool (scripts/torch/nccl_bw.py's checks)."""
    out = tmp_path / "nccl_bw.jsonl"
    p = torchrun("nccl_bw.py", "--out", str(out), "--log-dir", str(tmp_path / "logs"), "--sizes", "8,32",
                 "--trials", "1")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    checks = [r for r in rows if r.get("kind") == "pin_check"]
    assert len(checks) == 2 and all(c["ok"] for c in checks), checks
    modes = {r["mode"] for r in rows if r.get("kind") == "bw" and r.get("correct")}
    assert modes == {"native", "cupool-nccl", "cupool-nccl-registered"}, (modes, p.stdout[-4000:])
