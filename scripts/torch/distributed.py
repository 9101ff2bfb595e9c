"""Two GPUs, one allocator, one workload: each rank of a torchrun job appends one JSON line of
measurements and a checksum of its results, so that allocators can be compared on time, memory
and results.

    torchrun --standalone --nproc-per-node 2 scripts/torch/distributed.py \\
        --allocator cupool --workload tp-mlp --out OUT.jsonl

Allocators: native (PyTorch's caching allocator), expandable (expandable_segments:True), async
(backend:cudaMallocAsync), cupool (cupool.torch.install(), pool vmm), cupool-mempool (a
torch.cuda.MemPool over cupool, pool direct, entered with torch.cuda.use_mem_pool for the whole
workload: PyTorch routes only this thread's allocations to it, so backward's, which autograd
makes on its own thread, go to PyTorch's allocator).

Workloads (fixed seeds; the same results for every allocator up to the kernels' own
determinism):

- tp-mlp: inference through a tensor-parallel MLP stack in bf16, Megatron's split: 8 layers of
  column-parallel up-projection, GELU, row-parallel down-projection and all_reduce, then a
  column-parallel head whose logits are all_gather'ed; rank 0 makes each step's input and
  broadcasts it; the number of tokens changes from step to step (256 to 4096), so every
  allocator sees tensors of changing sizes. 200 steps.
- ddp: training of a 4-block MLP (fp32, LayerNorm, GELU, residuals) with
  DistributedDataParallel and AdamW on per-rank data labelled by a fixed teacher. 100 steps.

Memory: the allocator's own peaks (torch.cuda.max_memory_reserved / max_memory_allocated for
the native family and the MemPool, cupool.torch's for cupool), and the driver's view, sampled
every 20 ms in a thread from NVML (libnvidia-ml through ctypes): the device's used memory above
what was used before the workload began, and this process's own use where NVML shows this
process (not inside some containers); torch.cuda.mem_get_info where NVML cannot be loaded.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1, forced before torch is imported): on the shared machines it can take
the GPUs down.
"""
import argparse
import ctypes
import json
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20

#: Forced for every process of these scripts: NVLink multicast (NVLS, symmetric memory) off.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ALLOCATORS = ["native", "expandable", "async", "cupool", "cupool-norecycle", "cupool-mempool"]
#: Each workload's default number of steps.
WORKLOADS = {"tp-mlp": 200, "ddp": 100}
_CONF = {"expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}


def safe_env():
    """Sets the multicast guards before torch or NCCL can read them; returns the values it
    replaced (empty when the environment had them right)."""
    replaced = {k: os.environ[k] for k, v in SAFE_ENV.items() if os.environ.get(k, v) != v}
    os.environ.update(SAFE_ENV)
    return replaced


def select(allocator, pool=None):
    """PyTorch with ``allocator`` in place on this rank's GPU (``LOCAL_RANK``), before any CUDA
    allocation: PYTORCH_CUDA_ALLOC_CONF is set (or cleared) before torch is imported, and cupool
    installed before the process group makes its first tensor. Returns (torch, local_rank)."""
    if allocator in _CONF:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = _CONF[allocator]
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    # Deterministic cuBLAS (one workspace configuration for every allocator).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import torch
    import cupool.torch
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Before set_device: in PyTorch 2.11 selecting a device initialises the allocator, after
    # which it can no longer be swapped.
    if allocator == "cupool":
        cupool.torch.install(pool=pool or "vmm")
    elif allocator == "cupool-norecycle":  # the VMM pool without page recycling (CUPOOL_VMM_RECYCLE=off)
        cupool.torch.install(pool=pool or "vmm", vmm_recycle="off")
    torch.cuda.set_device(local_rank)
    return torch, local_rank


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _NvmlProcess(ctypes.Structure):  # nvmlProcessInfo_t (v2 and v3 of the query)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Nvml:
    """The few NVML queries the samplers need, through ctypes (no pynvml needed)."""

    NOT_AVAILABLE = (1 << 64) - 1

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        rc = self.lib.nvmlInit_v2()
        if rc != 0:
            raise OSError(f"nvmlInit_v2 returned {rc}")
        self.procs = None
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
            if hasattr(self.lib, name):
                self.procs = getattr(self.lib, name)
                break

    def handle(self, uuid):
        h = ctypes.c_void_p()
        rc = self.lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(h))
        if rc != 0:
            raise OSError(f"nvmlDeviceGetHandleByUUID({uuid}) returned {rc}")
        return h

    def used(self, h):
        m = _NvmlMemory()
        rc = self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
        if rc != 0:
            raise OSError(f"nvmlDeviceGetMemoryInfo returned {rc}")
        return m.used

    def processes(self, h):
        """{pid: bytes used on the device, or None where NVML does not say}."""
        if self.procs is None:
            return {}
        n = ctypes.c_uint(64)
        buf = (_NvmlProcess * 64)()
        if self.procs(h, ctypes.byref(n), buf) != 0:
            return {}
        return {buf[i].pid: (None if buf[i].usedGpuMemory == self.NOT_AVAILABLE else buf[i].usedGpuMemory)
                for i in range(n.value)}


def device_uuid(torch, dev):
    return "GPU-" + str(torch.cuda.get_device_properties(dev).uuid)


class DriverSampler:
    """This rank's GPU memory as the driver sees it, sampled every ``interval_s`` in a thread:
    the device's used bytes (NVML, else torch.cuda.mem_get_info) and this process's own bytes
    where NVML lists this process."""

    def __init__(self, torch, dev, interval_s=0.02):
        self.torch, self.dev, self.interval = torch, dev, interval_s
        self.error = None
        try:
            self.nvml = Nvml()
            self.h = self.nvml.handle(device_uuid(torch, dev))
            self.source = "nvml"
        except (OSError, AttributeError) as e:
            self.nvml, self.source, self.error = None, "torch.cuda.mem_get_info", str(e)
        self.pid = os.getpid()
        self.used_peak = self.proc_peak = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread = None

    def read(self):
        """(device used bytes, this process's bytes or None)."""
        if self.nvml is not None:
            return self.nvml.used(self.h), self.nvml.processes(self.h).get(self.pid)
        free, total = self.torch.cuda.mem_get_info(self.dev)
        return total - free, None

    def _run(self):
        if self.nvml is None:
            self.torch.cuda.set_device(self.dev)
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def _sample(self):
        used, proc = self.read()
        self.samples += 1
        self.used_peak = used if self.used_peak is None else max(self.used_peak, used)
        if proc is not None:
            self.proc_peak = proc if self.proc_peak is None else max(self.proc_peak, proc)

    def start(self):
        self.baseline, self.proc_baseline = self.read()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        self._sample()
        return {
            "driver_source": self.source, "driver_error": self.error, "driver_samples": self.samples,
            "baseline_used_mib": self.baseline / MIB, "peak_used_mib": self.used_peak / MIB,
            "driver_peak_mib": (self.used_peak - self.baseline) / MIB,
            "proc_baseline_mib": None if self.proc_baseline is None else self.proc_baseline / MIB,
            "proc_peak_mib": None if self.proc_peak is None else self.proc_peak / MIB,
        }


def gpu_processes(torch):
    """Every visible GPU's compute processes as NVML lists them ({"GPU-uuid": {pid: MiB}}), or
    the reason it cannot say."""
    try:
        nvml = Nvml()
        out = {}
        for d in range(torch.cuda.device_count()):
            u = device_uuid(torch, d)
            out[f"{d} {u}"] = {pid: (None if b is None else round(b / MIB)) for pid, b in
                               nvml.processes(nvml.handle(u)).items()}
        return out
    except (OSError, AttributeError) as e:
        return str(e)


def nccl_version(torch):
    """NCCL's version as PyTorch reports it ("2.27.5"), or None."""
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 (a build without NCCL)
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def probes(torch, dist):
    """What the first runs on a new PyTorch must confirm, as a dict (printed by rank 0)."""
    p = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl_version(torch),
         "allocator_backend": torch.cuda.get_allocator_backend(),
         "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
         "multicast_guards": {k: os.environ.get(k) for k in SAFE_ENV}}
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
        p["nccl_backend"] = type(backend).__name__
        p["backend_register_mem_pool"] = hasattr(backend, "register_mem_pool")
    except Exception as e:  # noqa: BLE001 (a probe: the reason is the answer)
        p["nccl_backend"] = f"error: {e}"
    p["mempool_snapshot"] = hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda.MemPool, "snapshot")
    return p


# ---------------------------------------------------------------------------------------------
# Workloads. Each returns (steps_s, warm_s_per_step, checksum dict); `state` gets what the
# caller must free before it measures the end state.

def _sync(torch, device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timed_steps(torch, steps, step, device):
    """Runs step(i) for every i; returns (all steps' seconds, seconds per step after the tenth)."""
    _sync(torch, device)
    t0 = time.perf_counter()
    tw = None
    for i in range(steps):
        if i == min(10, steps - 1):
            _sync(torch, device)
            tw = time.perf_counter()
        step(i)
    _sync(torch, device)
    t1 = time.perf_counter()
    return t1 - t0, (t1 - tw) / max(1, steps - min(10, steps - 1))


#: tp-mlp's shape: hidden, MLP width, vocabulary (all ranks together), layers; and its token counts.
TP_DIMS = (4096, 16384, 32768, 8)
TP_TOKENS = (256, 512, 1024, 1536, 2048, 3072, 4096)
#: ddp's shape: input, hidden, classes, blocks, batch per rank.
DDP_DIMS = (1024, 4096, 1000, 4, 512)


def tp_mlp(torch, dist, rank, world, steps, seed, device="cuda", dims=TP_DIMS, tokens_choice=TP_TOKENS):
    H, F, V, L = dims
    fs, vs = F // world, V // world
    dt = torch.bfloat16
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    layers = []
    with torch.inference_mode():
        for _ in range(L):
            # Full matrices from one generator on every rank, each rank keeping its shard.
            w1 = torch.randn(F, H, generator=g, device=device) * H ** -0.5
            w2 = torch.randn(H, F, generator=g, device=device) * F ** -0.5
            layers.append((w1[rank * fs:(rank + 1) * fs].to(dt).contiguous(),
                           w2[:, rank * fs:(rank + 1) * fs].to(dt).contiguous()))
            del w1, w2
        head = torch.randn(V, H, generator=g, device=device) * H ** -0.5
        head = head[rank * vs:(rank + 1) * vs].to(dt).contiguous()
    gin = torch.Generator(device=device)
    gin.manual_seed(seed + 1)
    sizes = [random.Random(seed + i).choice(tokens_choice) for i in range(steps)]
    acc = torch.zeros((), dtype=torch.float64, device=device)
    acc_abs = torch.zeros((), dtype=torch.float64, device=device)
    tokens = torch.zeros((), dtype=torch.int64, device=device)
    last = {}

    def rms(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def step(i):
        with torch.inference_mode():
            t = sizes[i]
            if rank == 0:
                x = torch.randn(t, H, generator=gin, device=device, dtype=dt)
            else:
                x = torch.empty(t, H, device=device, dtype=dt)
            dist.broadcast(x, src=0)
            for w1, w2 in layers:
                h = torch.nn.functional.gelu(rms(x) @ w1.t())
                y = h @ w2.t()
                del h
                dist.all_reduce(y)
                x = x + y
                del y
            part = rms(x) @ head.t()
            gathered = torch.empty(world * t, vs, device=device, dtype=dt)
            dist.all_gather_into_tensor(gathered, part)
            logits = gathered.view(world, t, vs).permute(1, 0, 2).reshape(t, V)
            acc.add_(torch.sum(logits, dtype=torch.float64))
            acc_abs.add_(torch.sum(logits.abs(), dtype=torch.float64))
            tokens.add_(logits.argmax(-1).sum())
            if i == steps - 1:
                last["out_sum"] = float(torch.sum(logits, dtype=torch.float64))
                last["out_abs_sum"] = float(torch.sum(logits.abs(), dtype=torch.float64))

    steps_s, warm = _timed_steps(torch, steps, step, device)
    total = float(acc)
    return steps_s, warm, {"out_sum": total, "out_sum_hex": total.hex(), "out_abs_sum": float(acc_abs),
                           "token_sum": int(tokens), "last_out_sum": last["out_sum"],
                           "last_out_abs_sum": last["out_abs_sum"], "tokens_seen": sum(sizes)}


def ddp(torch, dist, rank, world, steps, seed, local_rank, device="cuda", dims=DDP_DIMS):
    nn = torch.nn
    D, H, C, L, B = dims

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.lin = nn.LayerNorm(H), nn.Linear(H, H)

        def forward(self, x):
            return x + nn.functional.gelu(self.lin(self.norm(x)))

    torch.manual_seed(seed)  # the same initial weights on every rank and for every allocator
    model = nn.Sequential(nn.Linear(D, H), *[Block() for _ in range(L)], nn.LayerNorm(H), nn.Linear(H, C))
    model = model.to(device)
    cuda = torch.device(device).type == "cuda"
    net = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    g = torch.Generator(device=device)
    g.manual_seed(seed + 1)
    teacher = torch.randn(D, C, generator=g, device=device)
    gdata = torch.Generator(device=device)
    gdata.manual_seed(seed * 1000 + 17 * (rank + 1))
    losses = {}

    def step(i):
        x = torch.randn(B, D, generator=gdata, device=device)
        y = (x @ teacher).argmax(-1)
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % 10 == 0 or i == steps - 1:
            losses[i] = float(loss.detach())

    steps_s, warm = _timed_steps(torch, steps, step, device)
    with torch.no_grad():
        psum = float(sum(torch.sum(p, dtype=torch.float64) for p in model.parameters()))
        pabs = float(sum(torch.sum(p.abs(), dtype=torch.float64) for p in model.parameters()))
    return steps_s, warm, {"loss_first": losses[0], "loss_last": losses[steps - 1], "param_sum": psum,
                           "param_sum_hex": psum.hex(), "param_abs_sum": pabs,
                           "losses": [losses[k] for k in sorted(losses)]}


#: How close a run's results must be to the native run's (same workload, rank, steps and seed).
#: Expected: identical. With fixed seeds, the same shapes and the same kernels, nothing an
#: allocator decides enters the arithmetic, and an all_reduce over two ranks adds one pair of
#: numbers per element (commutative, so exact in any order). What may legitimately differ is a
#: cuBLAS kernel chosen by the operands' address alignment (every allocator here aligns to at
#: least 512 bytes, so none is expected): bf16 rounding differences of random sign, whose sum
#: over the ~1e10 logits stays near 1e-7 of their summed magnitude. An allocator that hands
#: out memory still in use corrupts whole tensors (megabytes), which moves these sums by far
#: more than the tolerances below, taken relative to the summed magnitudes (a sum of logits is
#: near zero, so its own size is no scale):
TOLERANCE = {
    # tp-mlp: |d out_sum| <= 1e-5 * out_abs_sum, the same for the last step, and argmax token
    # ids (up to 32767 each) summing within 1e-3 (a few hundred near-ties flipped).
    "tp-mlp": (("out_sum", "out_abs_sum", 1e-5), ("last_out_sum", "last_out_abs_sum", 1e-5),
               ("token_sum", "token_sum", 1e-3)),
    # ddp: 100 AdamW steps amplify a rounding difference, so the loss gets 1e-3 of itself; the
    # weights' sum 1e-5 of their summed magnitude.
    "ddp": (("param_sum", "param_abs_sum", 1e-5), ("loss_last", "loss_last", 1e-3)),
}
#: The keys that must all be equal for "identical".
EXACT = {"tp-mlp": ("out_sum_hex", "token_sum", "last_out_sum"), "ddp": ("param_sum_hex", "loss_last")}


def compare(workload, got, ref):
    """How ``got``'s checksum relates to ``ref``'s (both a row's "checksum"): "identical",
    "close" (within ``TOLERANCE``) or "differs: ..." naming the first key out of tolerance."""
    if all(got.get(k) == ref.get(k) for k in EXACT[workload]):
        return "identical"
    for key, scale, tol in TOLERANCE[workload]:
        a, b = got.get(key), ref.get(key)
        if a is None or b is None:
            return f"differs: {key} missing"
        if abs(a - b) > tol * abs(ref[scale]):
            return f"differs: {key} {a!r} against {b!r} (tolerance {tol:g} x {abs(ref[scale]):.6g})"
    return "close"


def append_line(path, row):
    """One write of one line with O_APPEND: the ranks' lines do not interleave."""
    data = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocator", required=True, choices=ALLOCATORS)
    ap.add_argument("--workload", required=True, choices=list(WORKLOADS))
    ap.add_argument("--out", required=True, help="JSON lines file every rank appends its line to")
    ap.add_argument("--steps", type=int, help="default: 200 for tp-mlp, 100 for ddp")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--pool", help="cupool's pool kind (default: vmm installed, direct as a MemPool)")
    ap.add_argument("--sample-ms", type=int, default=20)
    a = ap.parse_args()
    steps = a.steps or WORKLOADS[a.workload]

    replaced = safe_env()
    torch, local_rank = select(a.allocator, a.pool)
    import torch.distributed as dist
    import cupool
    import cupool.torch
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    # Warn about any nondeterministic kernel (none is expected), without NaN-filling every
    # torch.empty (the same work for every allocator, but not what is measured).
    torch.use_deterministic_algorithms(True, warn_only=True)
    if hasattr(torch.utils, "deterministic"):
        torch.utils.deterministic.fill_uninitialized_memory = False
    if rank == 0:
        p = probes(torch, dist)
        p["gpu_processes_at_start"] = gpu_processes(torch)
        if replaced:
            p["multicast_guards_replaced"] = replaced
        for k, v in p.items():
            print(f"probe: {k} = {v}", flush=True)

    mempool = ctx = None
    if a.allocator == "cupool-mempool":
        mempool = cupool.torch.mempool(pool=a.pool or "direct")
        ctx = torch.cuda.use_mem_pool(mempool)
        ctx.__enter__()
    # NCCL's own buffers exist from here (eager init, one collective): they are in the baseline.
    warm = torch.ones(1, device="cuda")
    dist.all_reduce(warm)
    torch.cuda.synchronize()
    del warm
    sampler = DriverSampler(torch, local_rank, a.sample_ms / 1000).start()
    if a.workload == "tp-mlp":
        steps_s, warm_step, checksum = tp_mlp(torch, dist, rank, world, steps, a.seed)
    else:
        steps_s, warm_step, checksum = ddp(torch, dist, rank, world, steps, a.seed, local_rank)
    torch.cuda.synchronize()
    driver = sampler.stop()

    row = {"allocator": a.allocator, "workload": a.workload, "rank": rank, "world": world, "steps": steps,
           "seed": a.seed, "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "nccl": nccl_version(torch),
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
           "allocator_backend": torch.cuda.get_allocator_backend(),
           "steps_s": steps_s, "s_per_step": warm_step, **driver, "checksum": checksum}
    if a.allocator in ("cupool", "cupool-norecycle"):
        row.update(reserved_peak_mib=cupool.torch.max_memory_reserved(local_rank) / MIB,
                   allocated_peak_mib=cupool.torch.max_memory_allocated(local_rank) / MIB,
                   cupool_pool=a.pool or "vmm",
                   # Which class install() put in place, and why not the direct one if not.
                   cupool_route=cupool.torch.route(), cupool_direct_error=cupool.torch.direct_error)
    else:
        row.update(reserved_peak_mib=torch.cuda.max_memory_reserved(dev) / MIB,
                   allocated_peak_mib=torch.cuda.max_memory_allocated(dev) / MIB,
                   num_alloc_retries=torch.cuda.memory_stats(dev).get("num_alloc_retries"))
    if mempool is not None:
        segs = mempool.snapshot()
        row.update(cupool_pool=a.pool or "direct",
                   cupool_reserved_peak_mib=cupool.torch.max_memory_reserved(local_rank) / MIB,
                   mempool_segments_mib=sum(s["total_size"] for s in segs) / MIB,
                   mempool_segments=len(segs))
    append_line(a.out, row)
    print(json.dumps(row), flush=True)

    if ctx is not None:
        ctx.__exit__(None, None, None)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
