"""Alloc + free pairs from 1 to 16 threads on one shared stream: PyTorch's caching allocator,
cudaMallocAsync and libcupool's PyTorch entry points (vmm), in one process, the same C++ loop
for each (scripts/torch/threads.cpp, built against the installed PyTorch). Each number is a
thread's pair time while all threads run at once (wall time over pairs per thread), the
median of REPS runs, each of at least ITERS pairs per thread and MIN_MS milliseconds (as many
pairs as a first run of ITERS says that takes). Writes one JSON line per allocator and thread
count.
Usage: CUPOOL_LIB=... [REPS=5] [ITERS=20000] [MIN_MS=50] python3 scripts/torch/threads.py OUT.jsonl"""
import ctypes
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import cupool  # noqa: E402
from cupool import _lib  # noqa: E402
import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
build = os.path.join("/tmp", "cupool-threads-bench")
os.makedirs(build, exist_ok=True)
cpp_extension.load(name="cupool_threads_bench", sources=[os.path.join(HERE, "threads.cpp")], build_directory=build,
                   is_python_module=False, with_cuda=True, verbose=False)
bench = ctypes.CDLL(os.path.join(build, "cupool_threads_bench.so")).cupool_bench_pairs
bench.restype = ctypes.c_double
bench.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
cupool.init(pool="vmm", device="cuda")
lib = _lib.load()
alloc, free = (ctypes.cast(f, ctypes.c_void_p) for f in (lib.cupool_torch_alloc, lib.cupool_torch_free))
torch.cuda.init()
out = open(sys.argv[1], "a")
REPS, SIZE, ITERS = int(os.environ.get("REPS", "5")), 4096, int(os.environ.get("ITERS", "20000"))
# Each timed run lasts at least this long: a run of 20,000 pairs at 150 ns is 3 ms, in which
# starting and joining the threads weigh a few percent.
MIN_MS = float(os.environ.get("MIN_MS", "50"))
for threads in (1, 2, 4, 8, 16):
    for which, name in ((0, "pytorch"), (1, "cudaMallocAsync"), (2, "cupool (libcupool, vmm)")):
        first = bench(which, threads, ITERS, SIZE, alloc, free)
        iters = max(ITERS, int(MIN_MS * 1e6 / max(first, 1.0)))
        ns = [bench(which, threads, iters, SIZE, alloc, free) for _ in range(REPS)]
        row = dict(allocator=name, threads=threads, size=SIZE, iters=iters, ns_per_pair=round(statistics.median(ns), 1),
                   ns_runs=[round(v, 1) for v in ns], gpu=torch.cuda.get_device_name(0), torch=torch.__version__,
                   cpus=os.cpu_count())
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
