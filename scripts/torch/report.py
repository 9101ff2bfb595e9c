"""Markdown tables from the benchmarks' JSON lines: median over the repetitions, [min, max] in
brackets. Usage: python3 scripts/torch/report.py prefill-*.jsonl, or
python3 scripts/torch/report.py --micro micro.jsonl for the micro-benchmark's table, or
python3 scripts/torch/report.py --sleep sleep.jsonl for sleep and wake (scripts/torch/sleep.py), or
python3 scripts/torch/report.py --threads DIR for threads sharing one stream (DIR/threads.jsonl from
scripts/torch/threads.py, DIR/hot_path_shared.txt from benches/hot_path.rs)."""
import json
import statistics
import sys
from collections import defaultdict

MICRO = len(sys.argv) == 3 and sys.argv[1] == "--micro"
SLEEP = len(sys.argv) == 3 and sys.argv[1] == "--sleep"
THREADS = len(sys.argv) == 3 and sys.argv[1] == "--threads"
ORDER = ["native", "expandable", "async", "cupool", "cupool-before", "cupool-base", "cupool-norecycle", "cupool-mempool"]
runs = defaultdict(list)
for path in ([] if MICRO or SLEEP or THREADS else sys.argv[1:]):
    for line in open(path):
        r = json.loads(line)
        runs[(r["model"], r["allocator"])].append(r)


def cell(rs, key, fmt="{:,.0f}"):
    v = [r[key] for r in rs if r.get(key) is not None]
    if not v:
        return "–"
    m = fmt.format(statistics.median(v))
    return m if min(v) == max(v) else f"{m} [{fmt.format(min(v))}, {fmt.format(max(v))}]"


model_prompt = {m: rs[0].get("prompt", 0) for (m, _), rs in runs.items()}
for model in sorted({m for m, _ in runs}):
    # PyTorch's own count of live bytes, from its native allocator's runs (else any of its).
    src = next((a for a in ["native", "expandable", "async"] if runs.get((model, a))), None)
    if src:
        alloc = statistics.median(r["peak_allocated_mib"] for r in runs[(model, src)] if "failed" not in r)
        print(f"\n{model}: PyTorch's peak allocated ({src} runs) {alloc:,.0f} MiB\n")
    else:
        # Only cupool ran: its own count of live bytes.
        own = [r["cupool_peak_allocated_mib"] for (m, _), rs in runs.items() if m == model
               for r in rs if "failed" not in r]
        alloc = statistics.median(own) if own else float("nan")
        print(f"\n{model}: cupool's peak allocated {alloc:,.0f} MiB\n")
    print("| allocator | runs | reserved peak (MiB) | driver peak (MiB) | driver / allocated | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|---|---|---|")
    # Variants not in ORDER (cupool-freeN, ...) follow it, by name.
    for a in ORDER + sorted({x for m, x in runs if m == model and x not in ORDER}):
        rs = runs.get((model, a), [])
        ok = [r for r in rs if "failed" not in r]
        if not rs:
            continue
        if not ok:
            # Runs recorded before failures said why were out-of-memory failures.
            why = next((r["error"] for r in rs if r.get("error")), "out of memory")
            print(f"| {a} | {len(rs)} | {'out of memory' if 'OutOfMemory' in why else why} | | | | |")
            continue
        for r in ok:
            r["reserved"] = r.get("cupool_peak_reserved_mib") if a.startswith("cupool") else r.get("peak_reserved_mib")
            r["ratio"] = r["driver_peak_mib"] / alloc
        print(f"| {a} | {len(ok)} | {cell(ok, 'reserved')} | {cell(ok, 'driver_peak_mib')} | {cell(ok, 'ratio', '{:.3f}')} "
              f"| {cell(ok, 'prefill_tok_s')} | {cell(ok, 'decode_tok_s', '{:.1f}')} |")
    speed = {a: [(t, u) for r in rs if "failed" not in r
                 for t, u in zip(r.get("speed_prefill_s", []), r.get("speed_gpu_busy_pct", []))]
             for (m, a), rs in runs.items() if m == model}
    speed = {a: v for a, v in speed.items() if v}
    if speed:
        # Repeated prefills (prefill.py --speed-reps), each from an empty cache with the
        # allocator's free memory given back first: the median over every process's prefills,
        # against the fastest of PyTorch's allocators by that median.
        def med(a):
            return statistics.median(t for t, _ in speed[a])
        peers = [a for a in ("native", "expandable", "async") if a in speed]
        best = min(peers, key=med) if peers else None
        # The Python thread's CPU time per prefill (prefill.py records it since 2026-11-28):
        # what the launches and allocator calls cost it, without the waits.
        cpu = {a: [x for r in runs[(model, a)] if "failed" not in r for x in r.get("speed_thread_cpu_s", [])]
               for a in speed}
        has_cpu = best is not None and bool(cpu.get(best))
        print(f"\n| allocator | processes | prefills | prefill (s) | prefill tok/s | against {best or 'the fastest peer'} "
              "| GPU busy | in libcupool's driver calls (ms) |"
              + (f" Python thread CPU (s) | against {best} |" if has_cpu else ""))
        print("|---|---|---|---|---|---|---|---|" + ("---|---|" if has_cpu else ""))
        for a in ORDER + sorted(x for x in speed if x not in ORDER):
            if a not in speed:
                continue
            ts = [t for t, _ in speed[a]]
            us = [u for _, u in speed[a] if u is not None]
            procs = sum(1 for r in runs[(model, a)] if r.get("speed_prefill_s"))
            rel = f"{med(best) / med(a):.3f}" if best else "–"
            busy = f"{statistics.median(us):.0f}%" if us else "–"
            dms = [x for r in runs[(model, a)] for x in r.get("speed_driver_ms", [])]
            dcell = f"{statistics.median(dms):.1f} [{min(dms):.1f}, {max(dms):.1f}]" if dms else "–"
            ccell = ""
            if has_cpu:
                cs = cpu.get(a)
                ccell = (f" {statistics.median(cs):.2f} [{min(cs):.2f}, {max(cs):.2f}] | "
                         f"{statistics.median(cpu[best]) / statistics.median(cs):.3f} |") if cs else " – | – |"
            print(f"| {a} | {procs} | {len(ts)} | {statistics.median(ts):.2f} [{min(ts):.2f}, {max(ts):.2f}] "
                  f"| {model_prompt[model] / statistics.median(ts):,.0f} | {rel} | {busy} | {dcell} |{ccell}")
    kept = [(a, r) for (m, a), rs in sorted(runs.items()) if m == model for r in rs if r.get("keep_cache")]
    if kept:
        # prefill.py --keep-cache: the requests after the first on the pool it left (no
        # empty_cache between), each process's in order.
        print("\n| allocator | first prefill (s) | the next ones, kept cache (s) | driver peak: first, "
              "then each next one (MiB) | cupool's reserve peak so far, the same (MiB) "
              "| in libcupool's driver calls, next ones (ms) |")
        print("|---|---|---|---|---|---|")
        for a, r in kept:
            nxt = ", ".join(f"{t:.2f}" for t in r["speed_prefill_s"])
            peaks = ", ".join(f"{p:,.0f}" for p in [r["driver_peak_mib"]] + r["speed_driver_peak_mib"])
            dms = ", ".join(f"{x:.1f}" for x in r.get("speed_driver_ms", [])) or "–"
            pool = r.get("speed_cupool_reserved_peak_mib")
            pool = ", ".join(f"{p:,.0f}" for p in [r["cupool_peak_reserved_mib"]] + pool) if pool else "–"
            print(f"| {a} | {r['prefill_s']:.2f} | {nxt} | {peaks} | {pool} | {dms} |")
    timed = [(a, [r for r in rs if r.get("cupool_driver_ms") is not None]) for (m, a), rs in sorted(runs.items())
             if m == model]
    timed = [(a, rs) for a, rs in timed if rs]
    if timed:
        # What libcupool's driver calls took of the timed prefill (CUPOOL_TIME_DRIVER=on).
        calls = sorted({c for _, rs in timed for r in rs for c in r["cupool_driver_calls"]})
        print(f"\n| allocator | runs | prefill (s) | in libcupool's driver calls (ms) | share of the prefill | "
              + " | ".join(f"{c}: calls, ms" for c in calls) + " |")
        print("|---|---|---|---|---|" + "---|" * len(calls))
        for a, rs in timed:
            for r in rs:
                r["share"] = 100 * r["cupool_driver_ms"] / 1e3 / r["prefill_s"]
                for c in calls:
                    r[f"n_{c}"] = r["cupool_driver_calls"].get(c, 0)
                    r[f"ms_{c}"] = r["cupool_driver_call_ms"].get(c, 0.0)
            print(f"| {a} | {len(rs)} | {cell(rs, 'prefill_s', '{:.2f}')} | {cell(rs, 'cupool_driver_ms', '{:.1f}')} | "
                  f"{cell(rs, 'share', '{:.1f}%')} | "
                  + " | ".join(f"{cell(rs, f'n_{c}')}, {cell(rs, f'ms_{c}', '{:.1f}')}" for c in calls) + " |")


def micro(path):
    """The micro-benchmark's table: microseconds per torch.empty + del pair, one thread / eight
    threads on their own streams (wall time per pair)."""
    names = {"native": "native", "async": "`cudaMallocAsync`", "cupool": "cupool"}
    rows = [json.loads(line) for line in open(path)]
    sizes = list(rows[0]["ns_per_pair"])
    label = {"512": "512 B", "65536": "64 KiB", "1048576": "1 MiB", "16777216": "16 MiB", "268435456": "256 MiB"}
    print("| allocator | " + " | ".join(label.get(s, s) for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for r in rows:
        cells = [f"{c['1_thread'] / 1000:.2f} / {c['8_threads_wall_per_pair'] / 1000:.1f}"
                 for c in (r["ns_per_pair"][s] for s in sizes)]
        print(f"| {names.get(r['allocator'], r['allocator'])} | " + " | ".join(cells) + " |")


def sleep(path):
    """Sleep and wake: seconds for each size, way and round, and the share of the size that
    cudaMemGetInfo saw freed."""
    rows = [json.loads(line) for line in open(path)]
    print(f"{rows[0]['gpu']}, PyTorch {rows[0]['torch']}\n")
    print("| size | way | round | sleep (s) | wake (s) | freed on the device | bytes back |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "sleep_s" not in r:
            print(f"| {r['gib']} GiB | {r['case']}: {r['why']} | | | | | |")
            continue
        back = {True: "bit for bit", False: "**differ**", None: "not kept"}[r["restored"]]
        print(f"| {r['gib']} GiB | {r['case']} | {r['cycle']} | {r['sleep_s']:.3f} | {r['wake_s']:.3f} "
              f"| {100 * r['freed_share']:.2f}% | {back} |")


def threads(folder):
    """Threads sharing one stream: the C++ harness's table (PyTorch's allocator,
    cudaMallocAsync, libcupool through PyTorch's entry points) and the Rust pool's (alone,
    behind thread caches, and cuMemAllocAsync), each thread's pair time in ns."""
    import os
    import re
    rows = [json.loads(line) for line in open(os.path.join(folder, "threads.jsonl"))]
    counts = sorted({r["threads"] for r in rows})
    names = list(dict.fromkeys(r["allocator"] for r in rows))
    print(f"{rows[0]['gpu']}, {rows[0]['cpus']} CPU cores, PyTorch {rows[0]['torch']}; {rows[0]['size']}-byte pairs\n")
    print("| through the C++ harness | " + " | ".join(f"{n} thread{'s' if n > 1 else ''}" for n in counts) + " |")
    print("|---|" + "---|" * len(counts))
    by = {(r["allocator"], r["threads"]): r["ns_per_pair"] for r in rows}
    label = {"pytorch": "PyTorch's caching allocator"}
    for a in names:
        print(f"| {label.get(a, a)} | " + " | ".join(f"{by[(a, n)]:,.0f}" for n in counts) + " |")
    bench = {}
    for line in open(os.path.join(folder, "hot_path_shared.txt")):
        m = re.match(r"test hot_path_shared/cuda/(\S+)/(\d+) \.\.\. bench:\s+([\d,]+) ns/iter", line)
        if m:
            bench[(m.group(1), int(m.group(2)))] = int(m.group(3).replace(",", ""))
    kinds = list(dict.fromkeys(k for k, _ in bench))
    counts = sorted({n for _, n in bench})
    print()
    print("| the Rust pool (benches/hot_path.rs) | " + " | ".join(f"{n} thread{'s' if n > 1 else ''}" for n in counts) + " |")
    print("|---|" + "---|" * len(counts))
    for k in kinds:
        print(f"| {k} | " + " | ".join(f"{bench[(k, n)]:,}" for n in counts) + " |")


if MICRO:
    micro(sys.argv[2])
elif THREADS:
    threads(sys.argv[2])
elif SLEEP:
    sleep(sys.argv[2])
