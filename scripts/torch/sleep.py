"""Sleep and wake timings through cupool installed as PyTorch's allocator: for each size (GiB),
tensors of 1 GiB filled under one tag, then put to sleep and woken without and with offload
(page-locked host copies, restored and checked bit for bit), twice each (the second offload
reuses the host buffers the first page-locked), timed, with the bytes cudaMemGetInfo sees
freed. The baseline in the same run is what a user does without sleep: copy the tensors into
page-locked CPU tensors, free them (and trim), allocate anew and copy back (new addresses).
Offload rows are skipped where the host lacks 1.1x the size of free memory.
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


def checksums(ts):
    return [float(t[:: 1 << 20].float().sum()) for t in ts]


def one_size(gib):
    tag = f"bench{gib}"
    with cupool.torch.tag(tag):
        ts = [torch.empty(GIB // 2, dtype=torch.float16, device="cuda") for _ in range(gib)]
    for i, t in enumerate(ts):
        t.fill_(i % 1000)
    sums = checksums(ts)
    offload = host_free() > 1.1 * gib * GIB
    cases = [(False, 1), (False, 2)] + ([(True, 1), (True, 2)] if offload else [])
    for off, cycle in cases:
        free0 = torch.cuda.mem_get_info()[0]
        released, sleep_s = timed(lambda: cupool.torch.sleep(tag, offload=[tag] if off else ()))
        freed = torch.cuda.mem_get_info()[0] - free0
        _, wake_s = timed(lambda: cupool.torch.wake(tag))
        ok = checksums(ts) == sums if off else None
        emit(gib=gib, case="cupool sleep/wake" + (" + offload" if off else ""), cycle=cycle,
             sleep_s=round(sleep_s, 4), wake_s=round(wake_s, 4), released_bytes=released,
             freed_bytes=freed, freed_share=round(freed / (gib * GIB), 5), restored=ok)
        if not off:
            for i, t in enumerate(ts):  # without offload the memory comes back unfilled
                t.fill_(i % 1000)
    del t  # the loops' last tensor: a live block at the top of the range would keep the rest
    cupool.trim(0)  # gives back the host buffers kept for the next offload, too
    if not offload:
        emit(gib=gib, case="offload skipped", why="the host has not 1.1x the size free")
        return
    # Baseline: the user's own offload, without sleep (new addresses after it), twice: PyTorch
    # keeps page-locked memory cached too, so its second round pays no page-locking either.
    for cycle in (1, 2):
        def out_copy():
            host = [torch.empty(x.shape, dtype=x.dtype, pin_memory=True) for x in ts]
            for h, x in zip(host, ts):
                h.copy_(x)
            return host
        host, out_s = timed(out_copy)
        free0 = torch.cuda.mem_get_info()[0]
        ts.clear()
        cupool.trim(0)
        freed = torch.cuda.mem_get_info()[0] - free0

        def back():
            with cupool.torch.tag(tag):
                return [h.to("cuda") for h in host]
        back_ts, in_s = timed(back)
        ts.extend(back_ts)
        del back_ts
        emit(gib=gib, case="baseline: copy to pinned, free, allocate, copy back", cycle=cycle,
             sleep_s=round(out_s, 4), wake_s=round(in_s, 4), freed_bytes=freed,
             freed_share=round(freed / (gib * GIB), 5), restored=checksums(ts) == sums)
        del host
    ts.clear()
    if hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()


for gib in sizes:
    if gib * GIB > torch.cuda.mem_get_info()[0] - 2 * GIB:
        emit(gib=gib, case="skipped", why="the device has not that much free")
        continue
    one_size(gib)
    cupool.trim(0)
