"""all_reduce (and all_gather) bus bandwidth on two GPUs from three kinds of buffers, whether
NCCL used cupool's memory registered, and whether cupool kept it in place.

    torchrun --standalone --nproc-per-node 2 scripts/torch/nccl_bw.py --out OUT/nccl_bw.jsonl \
        --log-dir OUT/nccl-logs

Modes, one after another in one job, every collective and size (MiB, --sizes; default 8 32 128
512 1024) in each:

- native: buffers from PyTorch's caching allocator (cudaMalloc), not registered;
- cupool-nccl: buffers from a cupool ``nccl`` MemPool (``cupool.torch.mempool(pool="nccl")``:
  every segment its own VMM allocation made as ncclMemAlloc makes it), not registered;
- cupool-nccl-registered: the same buffers after ``cupool.torch.register_mem_pool(pool)``
  (``ProcessGroupNCCL.register_mem_pool`` and ``cupool.register`` of every segment).

Collectives (--collectives): all_reduce, in place as torch.distributed does it, float32 of the
size; and all_gather_into_tensor, out of place, the size being the gathered output. NCCL 2.28
uses a registered buffer for a ring all_reduce only out of place (src/register/coll_reg.cc:
an in-place ring or tree all_reduce leaves registration out), and PyTorch's all_reduce is in
place: all_gather shows what registration does.

Each (collective, size): a check of the result, 5 warm-up calls, then 5 trials of N calls (N
from 400 at 8 MiB down to 20 from 512 MiB up) timed by CUDA events on the current stream. Bus
bandwidth as nccl-tests defines it, in GB/s (1e9 bytes): size x 2(n-1)/n / time for all_reduce,
size x (n-1)/n / time for all_gather (x1 and x0.5 with two ranks). One JSON line per (mode,
collective, size, rank).

NCCL logs at INFO for the INIT and REG subsystems into LOG_DIR/nccl-rankR.log (line
buffered); what it wrote during each (collective, size) of each mode is counted and stored with
the row: ``register comm ... buffer`` (a buffer handed to ncclCommRegister), ``IPC register
buffer`` (a collective registered a buffer with its peer), ``IPC reuse buffer`` (it used one
registered before), ``failed to ... register``; so each row says whether NCCL used a
registration.

Then the pin check, on each rank: the tensors are freed and torch.cuda.empty_cache() called;
cupool.registered_bytes() must not change and libcupool's reserved bytes must not fall below
it; after deregister_mem_pool, registered bytes must be 0 and the reserve must drop by the
registered bytes (after empty_cache, or once the MemPool is deleted). One "pin_check" line per
rank. Exit status 1 when a result or a check was wrong.
"""
import argparse
import gc
import inspect
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import distributed as common  # noqa: E402 (this folder's distributed.py: environment, sampler)

MIB = 1 << 20
COLLECTIVES = ("all_reduce", "all_gather")

#: What NCCL's log lines say (NCCL 2.28's wording; "registered" for older ones), counted per phase.
PATTERNS = {
    "register_calls": re.compile(r"register comm \S+ buffer", re.I),
    "ipc_registered": re.compile(r"IPC register(ed)? buffer", re.I),
    "ipc_reused": re.compile(r"IPC reuse buffer|reuse registered", re.I),
    "failed": re.compile(r"failed to \w* ?register", re.I),
    "skipped": re.compile(r"Skipping (graph )?registration", re.I),
    "deregistered": re.compile(r"deregistered", re.I),
    "any_registration": re.compile(r"regist", re.I),
    "warnings": re.compile(r"NCCL WARN", re.I),
}


class NcclLog:
    """What NCCL wrote to its debug file since the last ``take``."""

    def __init__(self, path):
        self.path, self.pos = path, 0

    def take(self, keep=4):
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.pos)
                text = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return {"missing": self.path}
        lines = text.splitlines()
        out = {k: sum(1 for line in lines if p.search(line)) for k, p in PATTERNS.items()}
        out["examples"] = [line.split("NCCL INFO", 1)[-1].strip() for line in lines
                           if PATTERNS["any_registration"].search(line)][:keep]
        return out


def iterations(size):
    return max(20, min(400, (4 << 30) // size))


class Buffers:
    """Every buffer of one mode, allocated at once (in the MemPool when one is in use): per size,
    the all_reduce buffer, and the all_gather output and this rank's input."""

    def __init__(self, torch, sizes, world, collectives, device):
        self.bufs = {}
        for s in sizes:
            n = s // 4
            if "all_reduce" in collectives:
                self.bufs[("all_reduce", s)] = (torch.empty(n, dtype=torch.float32, device=device),)
            if "all_gather" in collectives:
                self.bufs[("all_gather", s)] = (torch.empty(n, dtype=torch.float32, device=device),
                                                torch.empty(n // world, dtype=torch.float32, device=device))

    def clear(self):
        self.bufs.clear()


def bench(torch, dist, collective, tensors, world, rank, trials):
    """(correct, [ms per call for each trial], calls per trial) for one collective on ``tensors``."""
    if collective == "all_reduce":
        (buf,) = tensors
        size = buf.numel() * 4
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        want = world * (world + 1) / 2
        correct = bool(buf.min().item() == want and buf.max().item() == want)
        buf.zero_()  # zeros stay zeros: no overflow over the timed calls

        def call():
            dist.all_reduce(buf)
    else:
        out, inp = tensors
        size = out.numel() * 4
        inp.fill_(rank + 1)
        dist.all_gather_into_tensor(out, inp)
        chunks = out.view(world, -1)
        correct = all(bool(chunks[r].min().item() == r + 1 and chunks[r].max().item() == r + 1)
                      for r in range(world))

        def call():
            dist.all_gather_into_tensor(out, inp)
    n = iterations(size)
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / n)
    return correct, times, n


def run_mode(torch, dist, mode, buffers, world, rank, trials, log, out, extra=None):
    failures = []
    for (collective, size), tensors in buffers.bufs.items():
        log.take()  # what came before belongs to no size
        correct, times, n = bench(torch, dist, collective, tensors, world, rank, trials)
        ms = statistics.median(times)
        algbw = size / (ms / 1e3) / 1e9
        factor = 2 * (world - 1) / world if collective == "all_reduce" else (world - 1) / world
        row = {"kind": "bw", "mode": mode, "collective": collective, "size_mib": size // MIB, "rank": rank,
               "world": world, "iters": n, "trials_ms": [round(t, 5) for t in times], "time_us": ms * 1e3,
               "algbw_gbps": algbw, "busbw_gbps": algbw * factor, "correct": correct,
               "addresses": [t.data_ptr() for t in tensors], "nccl_log": log.take(), **(extra or {})}
        common.append_line(out, row)
        lg = row["nccl_log"]
        print(f"rank {rank} {mode} {collective} {size // MIB} MiB: {row['busbw_gbps']:.1f} GB/s"
              f"{'' if correct else ' WRONG RESULT'} (NCCL log: {lg.get('ipc_registered')} IPC register, "
              f"{lg.get('ipc_reused')} reuse, {lg.get('failed')} failed)", flush=True)
        if not correct:
            failures.append(f"{mode} {collective} {size // MIB} MiB: wrong result")
    return failures


def agree(torch, dist, flag):
    """Whether ``flag`` holds on every rank (a mode runs on all ranks or on none: a collective
    that one rank skips would hang the other)."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def probe_rows(torch, dist, cupool):
    """What the first run on this PyTorch must confirm."""
    p = common.probes(torch, dist)
    try:
        p["mempool_init"] = str(inspect.signature(torch.cuda.MemPool.__init__))
    except (TypeError, ValueError) as e:
        p["mempool_init"] = f"no signature: {e}"
    try:
        p["mempool_snapshot_signature"] = str(inspect.signature(torch.cuda.MemPool.snapshot))
    except (AttributeError, TypeError, ValueError) as e:
        p["mempool_snapshot_signature"] = f"none: {e}"
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
        p["register_mem_pool_doc"] = (getattr(backend, "register_mem_pool", None).__doc__ or "").strip()[:300]
        p["deregister_mem_pool_doc"] = (getattr(backend, "deregister_mem_pool", None).__doc__ or "").strip()[:300]
    except Exception as e:  # noqa: BLE001 (a probe: the reason is the answer)
        p["register_mem_pool_doc"] = f"error: {e}"
    p["cupool_register"] = all(hasattr(cupool, n) for n in ("register", "deregister", "registered_bytes"))
    p["cupool_torch_register_mem_pool"] = hasattr(cupool.torch, "register_mem_pool")
    p["nccl_env"] = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    return p


def pin_check(torch, cupool, pool, bufs, dev):
    """Frees the registered buffers and empties PyTorch's cache: the pinned memory must stay;
    deregisters: it must go. Returns the row (``ok`` and ``failures`` in it)."""
    row = {"kind": "pin_check", "failures": []}
    fail = row["failures"].append

    def state(tag):
        torch.cuda.synchronize()
        segs = pool.snapshot() if pool is not None else []
        row[f"registered_{tag}"] = cupool.registered_bytes(dev)
        row[f"reserved_{tag}"] = cupool.stats(dev)["reserved_bytes.all.current"]
        row[f"pool_segments_{tag}"] = len(segs)
        row[f"pool_segment_bytes_{tag}"] = sum(s["total_size"] for s in segs)

    state("before")
    pinned = row["registered_before"]
    if pinned == 0:
        fail("nothing is registered with cupool before the check")
    bufs.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    state("after_empty_cache")
    row["pytorch_released_segments"] = row["pool_segments_before"] - row["pool_segments_after_empty_cache"]
    if row["registered_after_empty_cache"] != pinned:
        fail(f"registered bytes changed at empty_cache: {pinned} -> {row['registered_after_empty_cache']}")
    if row["reserved_after_empty_cache"] < pinned:
        fail(f"libcupool's reserve {row['reserved_after_empty_cache']} fell below the {pinned} registered bytes")
    try:
        row["unpinned"] = cupool.torch.deregister_mem_pool(pool)
    except Exception as e:  # noqa: BLE001 (a failed check, not a crash: the other rank waits)
        fail(f"deregister_mem_pool raised {e!r}")
    state("after_deregister")
    if row["registered_after_deregister"] != 0:
        fail(f"{row['registered_after_deregister']} bytes still registered after deregister_mem_pool")
    target = row["reserved_after_empty_cache"] - pinned
    row["dropped_at"] = None
    if row["reserved_after_deregister"] <= target:
        row["dropped_at"] = "deregister"
    else:
        torch.cuda.empty_cache()
        state("after_second_empty_cache")
        if row["reserved_after_second_empty_cache"] <= target:
            row["dropped_at"] = "empty_cache after deregister"
    row["ok"] = not row["failures"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--log-dir", required=True, help="NCCL's debug logs go here (nccl-rankR.log)")
    ap.add_argument("--sizes", default="8,32,128,512,1024", help="MiB, comma-separated")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--pool", default="nccl", help="cupool's pool kind for the MemPool")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma-separated: all_reduce, all_gather")
    a = ap.parse_args()
    sizes = [int(s) * MIB for s in a.sizes.split(",")]
    collectives = a.collectives.split(",")
    unknown = set(collectives) - set(COLLECTIVES)
    if unknown:
        ap.error(f"unknown collectives {sorted(unknown)}: known are {', '.join(COLLECTIVES)}")

    replaced = common.safe_env()
    rank_env = os.environ.get("RANK", "0")
    os.makedirs(a.log_dir, exist_ok=True)
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,REG")
    log_path = os.path.join(os.path.abspath(a.log_dir), f"nccl-rank{rank_env}.log")
    os.environ["NCCL_DEBUG_FILE"] = log_path
    torch, local_rank = common.select("native")
    import torch.distributed as dist
    import cupool
    import cupool.torch
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    log = NcclLog(log_path)
    failures = []
    if rank == 0:
        p = probe_rows(torch, dist, cupool)
        if replaced:
            p["multicast_guards_replaced"] = replaced
        for k, v in p.items():
            print(f"probe: {k} = {v}", flush=True)
        common.append_line(a.out, {"kind": "probes", **p})
    log.take()

    # 1. PyTorch's own allocator.
    bufs = Buffers(torch, sizes, world, collectives, dev)
    failures += run_mode(torch, dist, "native", bufs, world, rank, a.trials, log, a.out)
    bufs.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    # 2. A cupool nccl MemPool, unregistered.
    pool = None
    try:
        pool = cupool.torch.mempool(pool=a.pool)
        with torch.cuda.use_mem_pool(pool):
            bufs = Buffers(torch, sizes, world, collectives, dev)
    except Exception as e:  # noqa: BLE001 (recorded; the other modes go on)
        common.append_line(a.out, {"kind": "bw", "mode": f"cupool-{a.pool}", "rank": rank, "skipped": repr(e)})
        print(f"rank {rank}: the cupool {a.pool} MemPool failed: {e!r}", flush=True)
        failures.append(f"cupool {a.pool} MemPool: {e!r}")
        pool = bufs = None
    if agree(torch, dist, pool is not None):
        segs = pool.snapshot()
        layout = {"pool_segments": [(s["address"], s["total_size"]) for s in segs]}
        failures += run_mode(torch, dist, f"cupool-{a.pool}", bufs, world, rank, a.trials, log, a.out,
                             {"cupool_pool": a.pool})

        # 3. The same buffers, registered with NCCL and pinned by cupool.
        reg = {"kind": "register", "rank": rank, "cupool_pool": a.pool, **layout}
        registered = False
        log.take()
        try:
            reg["pinned_bytes"] = cupool.torch.register_mem_pool(pool)
            registered = True
        except Exception as e:  # noqa: BLE001 (recorded: the run says what is missing)
            reg["error"] = repr(e)
        reg["nccl_log"] = log.take(keep=16)
        reg["registered_bytes"] = cupool.registered_bytes(local_rank) if hasattr(cupool, "registered_bytes") else None
        if not agree(torch, dist, registered) and registered:
            cupool.torch.deregister_mem_pool(pool)  # the other rank failed: no registered mode
            registered = False
        common.append_line(a.out, reg)
        print(f"rank {rank}: register_mem_pool: {reg.get('pinned_bytes', reg.get('error'))}; NCCL log: "
              f"{reg['nccl_log'].get('register_calls')} register lines", flush=True)
        if registered:
            failures += run_mode(torch, dist, f"cupool-{a.pool}-registered", bufs, world, rank, a.trials,
                                 log, a.out, {"cupool_pool": a.pool})
            dist.barrier()
            check = pin_check(torch, cupool, pool, bufs, local_rank)
            check.update(rank=rank, nccl_log=log.take(keep=16))
            common.append_line(a.out, check)
            print(f"rank {rank}: pin check {'ok' if check['ok'] else 'FAILED'}: {json.dumps(check)}", flush=True)
            failures += check["failures"]
            if check["dropped_at"] is None:
                # PyTorch keeps a MemPool's segments while the pool lives: delete it and look again.
                del pool
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.synchronize()
                after = cupool.stats(local_rank)["reserved_bytes.all.current"]
                target = check["reserved_after_empty_cache"] - check["registered_before"]
                late = {"kind": "pin_check_pool_deleted", "rank": rank, "reserved_after_pool_deleted": after,
                        "target": target, "ok": after <= target}
                common.append_line(a.out, late)
                print(f"rank {rank}: after deleting the MemPool: {json.dumps(late)}", flush=True)
                if not late["ok"]:
                    failures.append(f"the reserve did not drop after deregistration: {after} > {target}")
        else:
            failures.append(f"register_mem_pool: {reg.get('error', 'failed on the other rank')}")
            bufs.clear()

    dist.barrier()
    dist.destroy_process_group()
    if failures:
        print(f"rank {rank}: FAILED: " + "; ".join(failures), flush=True)
        sys.exit(1)
    print(f"rank {rank}: nccl_bw ok", flush=True)


if __name__ == "__main__":
    main()
