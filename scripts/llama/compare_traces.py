#!/usr/bin/env python3
"""Compares, buffer by buffer, the pool traffic of a real engine's prefill (a trace recorded by
libcupool under llama.cpp: CUPOOL_TRACE) with cupool's own runtime running the same shape
(`repro-prefill run --trace`), and prints every difference: buffers one side takes and the
other does not, sizes that differ, and the order within a layer.

    python3 scripts/llama/compare_traces.py REAL.jsonl[.gz] RUNTIME.jsonl[.gz]

Each runtime ubatch is matched with the real phase whose flash-attention K_f16 has the same
size (the same KV length); in the real phase, the allocations from the first of those K_f16
calls' layer on are the prefill ubatch (what comes before is the decode that sweep-bench runs
between prefill steps). A layer is what one K_f16 allocation and the allocations up to the
next one take.
"""
import collections
import gzip
import json
import sys


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    phases, cur = [], None
    with opener(path, "rt") as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            e = json.loads(line)
            if e["op"] == "phase_begin":
                cur = []
                phases.append((e["name"], cur))
            elif e["op"] == "alloc" and cur is not None:
                cur.append((e.get("name") or "?", e["size"]))
    return phases


def layers(allocs, k_size):
    """The prefill's layers in `allocs`, split at each K_f16 of `k_size`. The temporaries of
    the QKV projection come just before a layer's K_f16: the MUL_MAT allocations (two at
    most) that end the gap between two K_f16 calls open the next layer."""
    starts = [i for i, (n, s) in enumerate(allocs) if n == "K_f16" and s == k_size]
    if not starts:
        return []
    lead = 0
    if len(starts) > 1:
        for n, _ in reversed(allocs[starts[0] + 1 : starts[1]]):
            if n != "MUL_MAT" or lead == 2:
                break
            lead += 1
    bounds = [max(i - lead, 0) for i in starts]
    # The last layer ends where the one before it would: the same length.
    length = bounds[1] - bounds[0] if len(bounds) > 1 else len(allocs) - bounds[0]
    bounds.append(min(bounds[-1] + length, len(allocs)))
    return [allocs[a:b] for a, b in zip(bounds, bounds[1:])]


def mib(b):
    return f"{b / 2**20:.2f} MiB"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    real, rt = read(sys.argv[1]), read(sys.argv[2])
    diffs = collections.Counter()
    rows = []
    for name, allocs in rt:
        ks = [s for n, s in allocs if n == "K_f16"]
        if not ks:
            continue
        k = ks[0]
        match = next(((pn, pa) for pn, pa in real if any(n == "K_f16" and s == k for n, s in pa)), None)
        if match is None:
            diffs[f"no real phase has K_f16 of {k} B (runtime {name})"] += 1
            continue
        real_layers = layers(match[1], k)
        rt_layers = layers(allocs, k)
        real_bytes = sum(s for l in real_layers for _, s in l)
        rt_bytes = sum(s for l in rt_layers for _, s in l)
        rows.append((name, match[0], k, len(rt_layers), len(real_layers), rt_bytes, real_bytes))
        for rl, tl in zip(real_layers, rt_layers):
            rc = collections.Counter(rl)
            tc = collections.Counter(tl)
            for (n, s), c in (rc - tc).items():
                kind = "K/V of another size" if n in ("K_f16", "V_f16") else "only the engine takes"
                diffs[f"{kind}: {n} {s} B ({mib(s)}) x{c} per layer"] += 1
            for (n, s), c in (tc - rc).items():
                diffs[f"only the runtime takes: {n} {s} B ({mib(s)}) x{c} per layer"] += 1
            rn = [n for n, _ in rl if n in dict(tl)]
            tn = [n for n, _ in tl]
            if rn != tn:
                diffs[f"order within a layer: engine {rn}, runtime {tn}"] += 1
        decode = len(match[1]) - sum(len(l) for l in real_layers)
        if decode:
            diffs["allocations outside the prefill ubatch's layers (sweep-bench's decode between prefill steps, the output layer)"] += decode
    print("runtime ubatch -> engine phase: K_f16 bytes, layers (runtime / engine), bytes taken per ubatch (runtime / engine)")
    for name, phase, k, tl, rl, tb, rb in rows:
        print(f"  {name:>10} -> {phase:>10}: K_f16 {k:>10}, layers {tl}/{rl}, {mib(tb):>12} / {mib(rb):>12}")
    matched = len(rows)
    print(f"\n{matched} runtime ubatches matched an engine phase of the same KV length")
    print("differences (count: ubatch-layers or allocations where seen):")
    for d, c in sorted(diffs.items(), key=lambda x: -x[1]):
        print(f"  {c:>6}  {d}")


if __name__ == "__main__":
    main()
