"""torch.empty + del through one allocator, at several sizes, from 1 and 8 threads. Prints one
JSON line: median nanoseconds per allocate-and-free pair for each size and thread count.

    python3 scripts/torch/micro.py --allocator cupool
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--allocator", required=True, choices=["native", "async", "expandable", "cupool"])
p.add_argument("--iters", type=int, default=20000)
p.add_argument("--pool", default="vmm")
a = p.parse_args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocators  # noqa: E402

torch = allocators.select(a.allocator, a.pool)
SIZES = [512, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def loop(size, iters, out, stream=None):
    ctx = torch.cuda.stream(stream) if stream is not None else None
    if ctx:
        ctx.__enter__()
    for _ in range(100):  # warm the cache
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
        del x
    reps = []
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(iters // 5):
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            del x
        reps.append((time.perf_counter_ns() - t) / (iters // 5))
    out.append(statistics.median(reps))
    if ctx:
        ctx.__exit__(None, None, None)


result = {"allocator": a.allocator, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
          "ns_per_pair": {}}
for size in SIZES:
    one = []
    loop(size, a.iters, one)
    eight = []
    streams = [torch.cuda.Stream() for _ in range(8)]
    threads = [threading.Thread(target=loop, args=(size, a.iters // 4, eight, streams[t])) for t in range(8)]
    t0 = time.perf_counter_ns()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter_ns() - t0
    result["ns_per_pair"][str(size)] = {"1_thread": one[0], "8_threads_median_per_thread": statistics.median(eight),
                                        "8_threads_wall_per_pair": wall / (8 * (a.iters // 4 + 100))}
print(json.dumps(result))
