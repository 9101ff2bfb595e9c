#!/usr/bin/env python3
"""Which requests make libcupool map memory on the allocating thread, on the simulated device.

    CUPOOL_LIB=target/release/libcupool.so python3 scripts/torch/inline-maps.py MODEL [ROUNDS]

Replays ``data/h200-2026-11-28-bins/call1/trace-MODEL.jsonl.gz`` as trace_cost.py does (the
weights once, then the prefill ROUNDS times, default 3, a ``cupool.trim`` after each) through
libcupool opened as ``cupool.torch.install()`` opens it, on the simulated device, and counts the
driver's map calls each allocation made on the calling thread (a worker thread's maps ahead are
counted apart), by request size. Prints one line per round: the maps, and the sizes that made
them, most first. The driver's statistics are read around every allocation, so its times mean
nothing; the counts are close to the GPU's (the H200's paced replays made 542 maps a Phi-3
round after the first, this 538: the worker's timing differs).
"""
import collections
import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
import cupool  # noqa: E402
import trace_cost  # noqa: E402

MIB = 1 << 20


def main(model, rounds=3):
    path = os.path.join(HERE, "..", "..", "data", "h200-2026-11-28-bins", "call1",
                        f"trace-{model}.jsonl.gz")
    setup, prefill, nslots = trace_cost.split(trace_cost.read_events(path))
    cupool.init(pool="vmm", device="sim", sim_gib=80, vmm_ahead="worker", time_driver="on")
    lib = cupool._lib.load()
    alloc, free = lib.cupool_torch_alloc, lib.cupool_torch_free
    ptr, size = [None] * nslots, [0] * nslots

    def maps():
        return cupool.stats(0).get("cupool.driver_calls.map", 0)

    def run(events, count):
        made = collections.Counter()
        for kind, slot, n in events:
            if kind == 0:
                before = maps() if count else 0
                ptr[slot], size[slot] = alloc(n, 0, None), n
                if not ptr[slot]:
                    sys.exit(f"the allocation of {n} bytes failed: {cupool._lib.last_error()}")
                if count and maps() > before:
                    made["up to 1 MiB" if n <= MIB else f"{n // MIB} MiB"] += maps() - before
            elif ptr[slot]:
                free(ptr[slot], size[slot], 0, None)
                ptr[slot] = None
        return made

    run(setup, False)
    weights = {s for s in range(nslots) if ptr[s]}
    for r in range(rounds):
        before = maps()
        made = run(prefill, True)
        print(f"round {r}: {maps() - before} maps on the allocating thread; by request size: "
              + ", ".join(f"{k} {v}" for k, v in made.most_common()))
        for s in range(nslots):
            if ptr[s] and s not in weights:
                free(ptr[s], size[s], 0, None)
                ptr[s] = None
        cupool.trim(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
