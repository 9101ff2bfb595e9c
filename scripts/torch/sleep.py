"""Sleep and wake timings through cupool installed as PyTorch's allocator: for each size (GiB),
tensors of 1 GiB filled under one tag, then put to sleep and woken without and with offload
(page-locked host copies, restored and checked bit for bit), timed, with the bytes
cudaMemGetInfo sees freed. The baseline in the same run is what a user does without sleep:
copy the tensors into page-locked CPU tensors, free them (and trim), allocate anew and copy back
(new addresses). Offload rows are skipped where the host lacks 1.25x the size of free memory.
Writes one JSON line per case. Usage: python3 scripts/torch/sleep.py OUT.jsonl [GIB ...]"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import cupool  # noqa: E402
import cupool.torch  # noqa: E402
import torch  # noqa: E402

GIB = 1 << 30
cupool.torch.install(pool="vmm")
out = open(sys.argv[1], "a")
sizes = [int(s) for s in sys.argv[2:]] or [8, 32, 64]


def host_free():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def timed(f):
    torch.cuda.synchronize()
    t = time.perf_counter()
    r = f()
    torch.cuda.synchronize()
    return r, time.perf_counter() - t


def emit(**row):
    row.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__)
    print(json.dumps(row), flush=True)
    out.write(json.dumps(row) + "\n")
    out.flush()


for gib in sizes:
    if gib * GIB > torch.cuda.mem_get_info()[0] - 2 * GIB:
        emit(gib=gib, case="skipped", why="the device has not that much free")
        continue
    tag = f"bench{gib}"
    with cupool.torch.tag(tag):
        ts = [torch.empty(GIB // 2, dtype=torch.float16, device="cuda") for _ in range(gib)]
    for i, t in enumerate(ts):
        t.fill_(i % 1000)
    sums = [float(t[:: 1 << 20].float().sum()) for t in ts]
    offloads = [False] + ([True] if host_free() > 1.25 * gib * GIB else [])
    for offload in offloads:
        free0 = torch.cuda.mem_get_info()[0]
        released, sleep_s = timed(lambda: cupool.torch.sleep(tag, offload=[tag] if offload else ()))
        freed = torch.cuda.mem_get_info()[0] - free0
        _, wake_s = timed(lambda: cupool.torch.wake(tag))
        ok = None
        if offload:
            ok = [float(t[:: 1 << 20].float().sum()) for t in ts] == sums
        emit(gib=gib, case="cupool sleep/wake" + (" + offload" if offload else ""), sleep_s=round(sleep_s, 4),
             wake_s=round(wake_s, 4), released_bytes=released, freed_bytes=freed,
             freed_share=round(freed / (gib * GIB), 5), restored=ok)
        if not offload:
            for i, t in enumerate(ts):  # the memory came back unfilled
                t.fill_(i % 1000)
    if offloads[-1]:
        # Baseline: the user's own offload, without sleep.
        def out_copy():
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in ts]
            for h, t in zip(host, ts):
                h.copy_(t)
            return host
        host, out_s = timed(out_copy)
        free0 = torch.cuda.mem_get_info()[0]
        ts.clear()
        cupool.trim(0)
        freed = torch.cuda.mem_get_info()[0] - free0

        def back():
            with cupool.torch.tag(tag):
                return [h.to("cuda") for h in host]
        ts, in_s = timed(back)
        ok = [float(t[:: 1 << 20].float().sum()) for t in ts] == sums
        emit(gib=gib, case="baseline: copy to pinned, free, allocate, copy back", sleep_s=round(out_s, 4),
             wake_s=round(in_s, 4), freed_bytes=freed, freed_share=round(freed / (gib * GIB), 5), restored=ok)
        del host
    del ts
    cupool.trim(0)
