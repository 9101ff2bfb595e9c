"""Markdown tables from the two-GPU runs (scripts/torch/two-gpu.sh): per workload, each
allocator's time per step, per-rank peaks and whether its results are the native run's; then
the all_reduce bus bandwidth from native buffers, a cupool nccl MemPool, and that pool
registered with NCCL, and what the registration and the pin check found.

    python3 scripts/torch/dist-report.py DATA_DIR                  # DATA_DIR/distributed.jsonl, nccl_bw.jsonl
    python3 scripts/torch/dist-report.py DATA_DIR --docs docs/pytorch.md

Medians over the runs, [min, max] in brackets where runs differ. With --docs the output replaces
what stands between the lines <!-- dist-tables --> and <!-- /dist-tables --> of that file.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ORDER = ["native", "expandable", "async", "cupool", "cupool-norecycle", "cupool-mempool"]
WORKLOAD_TEXT = {
    "tp-mlp": "tensor-parallel MLP inference (bf16, 8 layers, all_reduce / all_gather / broadcast)",
    "ddp": "DistributedDataParallel training (fp32 MLP, AdamW)",
}


def _distributed():
    """scripts/torch/distributed.py (compare() and its tolerances), imported without torch."""
    spec = importlib.util.spec_from_file_location("cupool_scripts_distributed", os.path.join(HERE, "distributed.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(path):
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def cell(values, fmt="{:,.0f}"):
    v = [x for x in values if x is not None]
    if not v:
        return "–"
    m = fmt.format(statistics.median(v))
    return m if min(v) == max(v) else f"{m} [{fmt.format(min(v))}, {fmt.format(max(v))}]"


def runs_of(lines):
    """Runs per (workload, allocator): each run the list of its ranks' rows (in the file's
    order, a run's ranks next to each other: a new run starts when a rank repeats), or a
    failure line alone."""
    runs = defaultdict(list)
    open_runs = {}
    for r in lines:
        key = (r["workload"], r["allocator"])
        if "failed" in r:
            runs[key].append([r])
            open_runs.pop(key, None)
            continue
        cur = open_runs.get(key)
        if cur is None or any(x["rank"] == r["rank"] for x in cur) or len(cur) >= r.get("world", 2):
            cur = []
            runs[key].append(cur)
            open_runs[key] = cur
        cur.append(r)
    for key in runs:
        for run in runs[key]:
            run.sort(key=lambda x: x.get("rank", 0))
    return runs


def per_rank(ok_runs, key, world):
    """'r0 / r1' of the medians over runs of ``key`` for each rank."""
    return " / ".join(cell([run[i].get(key) for run in ok_runs if i < len(run)]) for i in range(world))


def workload_tables(lines):
    dist = _distributed()
    runs = runs_of(lines)
    out = []
    for workload in [w for w in dist.WORKLOADS if any(k[0] == w for k in runs)]:
        ok_native = [run for run in runs.get((workload, "native"), []) if "failed" not in run[0]]
        any_ok = next((run for a in ORDER for run in runs.get((workload, a), []) if "failed" not in run[0]), None)
        head = any_ok[0] if any_ok else {}
        world = head.get("world", 2)
        text = f"{workload}: {WORKLOAD_TEXT.get(workload, workload)}, "
        text += (f"{head['steps']} steps, {world} ranks; {head['gpu']}, PyTorch {head['torch']}, NCCL {head['nccl']}"
                 if head else "every run failed")
        if ok_native:
            text += (f"; PyTorch's peak allocated (native runs) "
                     f"{per_rank(ok_native, 'allocated_peak_mib', world)} MiB, rank 0 / rank 1")
        out.append(text)
        table = ["| allocator | runs | time per step (ms) | reserved peak (MiB), rank 0 / 1 "
                 "| driver peak (MiB), rank 0 / 1 | results equal to native's |",
                 "|---|---|---|---|---|---|"]
        ref = ok_native[0] if ok_native else None
        for a in ORDER:
            rs = runs.get((workload, a), [])
            if not rs:
                continue
            ok = [run for run in rs if "failed" not in run[0]]
            failed = [run[0]["failed"] for run in rs if "failed" in run[0]]
            if not ok:
                table.append(f"| {a} | {len(rs)} | failed (exit {', '.join(map(str, failed))}) | | | |")
                continue
            verdicts = []
            if ref is not None:
                for run in ok:
                    for r, n in zip(run, ref):
                        verdicts.append(dist.compare(workload, r["checksum"], n["checksum"]))
            if not verdicts:
                equal = "no native run"
            elif all(v == "identical" for v in verdicts):
                equal = "yes (identical)"
            elif all(v in ("identical", "close") for v in verdicts):
                equal = "yes (within tolerance)"
            else:
                equal = "**no**"
            times = [1000 * max(r["s_per_step"] for r in run) for run in ok]
            runs_cell = f"{len(ok)}" + (f" (+{len(failed)} failed)" if failed else "")
            table.append(f"| {a} | {runs_cell} | {cell(times, '{:.2f}')} | {per_rank(ok, 'reserved_peak_mib', world)} "
                         f"| {per_rank(ok, 'driver_peak_mib', world)} | {equal} |")
        out.append("\n".join(table))
    return out


def bandwidth_tables(lines):
    out = []
    probes = next((r for r in lines if r.get("kind") == "probes"), {})
    bw = [r for r in lines if r.get("kind") == "bw" and "busbw_gbps" in r]
    if not bw:
        return out
    label = {"native": "native buffers", "cupool-nccl": "cupool nccl MemPool",
             "cupool-nccl-registered": "the same, registered with NCCL"}
    what = {"all_reduce": "all_reduce bus bandwidth (GB/s; float32, in place as torch.distributed does it)",
            "all_gather": "all_gather_into_tensor bus bandwidth (GB/s; float32, out of place; size = the gathered output)"}
    for collective in dict.fromkeys(r.get("collective", "all_reduce") for r in bw):
        rs_c = [r for r in bw if r.get("collective", "all_reduce") == collective]
        modes = list(dict.fromkeys(r["mode"] for r in rs_c))
        sizes = sorted({r["size_mib"] for r in rs_c})
        by = defaultdict(list)
        for r in rs_c:
            by[(r["mode"], r["size_mib"])].append(r)
        reg_mode = next((m for m in modes if m.endswith("-registered")), None)
        text = what.get(collective, collective) + ", the slower rank's median of its trials"
        if probes:
            text += f"; PyTorch {probes.get('torch')}, NCCL {probes.get('nccl')}"
        out.append(text)
        table = ["| size | " + " | ".join(label.get(m, m) for m in modes)
                 + (" | NCCL used the registration (IPC registrations / reuses, both ranks) |" if reg_mode else " |"),
                 "|---|" + "---|" * (len(modes) + (1 if reg_mode else 0))]
        for s in sizes:
            cells = []
            for m in modes:
                rs = by.get((m, s), [])
                if not rs:
                    cells.append("–")
                    continue
                v = f"{min(r['busbw_gbps'] for r in rs):,.1f}"
                cells.append(v if all(r["correct"] for r in rs) else f"{v} (**wrong result**)")
            if reg_mode:
                logs = [r.get("nccl_log", {}) for r in by.get((reg_mode, s), [])]
                n_reg = sum(lg.get("ipc_registered", 0) for lg in logs)
                n_reuse = sum(lg.get("ipc_reused", lg.get("reuse_registered", 0)) for lg in logs)
                cells.append(f"yes ({n_reg} / {n_reuse})" if n_reg or n_reuse else "no")
            table.append(f"| {s:,} MiB | " + " | ".join(cells) + " |")
        out.append("\n".join(table))
    notes = []
    regs = sorted((r for r in lines if r.get("kind") == "register"), key=lambda r: r["rank"])
    for r in regs:
        if "error" in r:
            notes.append(f"- rank {r['rank']}: register_mem_pool failed: `{r['error']}`")
        else:
            segs = r.get("pool_segments", [])
            notes.append(f"- rank {r['rank']}: register_mem_pool pinned {r['pinned_bytes'] / 2**20:,.0f} MiB in "
                         f"{len(segs)} segments; NCCL logged {r['nccl_log'].get('register_calls', 0)} "
                         f"ncclCommRegister calls")
    checks = sorted((r for r in lines if r.get("kind") == "pin_check"), key=lambda r: r["rank"])
    late = {r["rank"]: r for r in lines if r.get("kind") == "pin_check_pool_deleted"}
    for c in checks:
        where = c.get("dropped_at") or ("deleting the MemPool" if late.get(c["rank"], {}).get("ok") else "never")
        notes.append(
            f"- rank {c['rank']}: pin check {'passed' if c['ok'] else '**failed**'}: tensors freed and "
            f"empty_cache(): PyTorch released {c['pytorch_released_segments']} of {c['pool_segments_before']} "
            f"segments, registered bytes {c['registered_before'] / 2**20:,.0f} -> "
            f"{c['registered_after_empty_cache'] / 2**20:,.0f} MiB, libcupool's reserve "
            f"{c['reserved_before'] / 2**20:,.0f} -> {c['reserved_after_empty_cache'] / 2**20:,.0f} MiB; "
            f"after deregister_mem_pool registered {c['registered_after_deregister'] / 2**20:,.0f} MiB, "
            f"the reserve dropped at: {where}"
            + ("" if c["ok"] else f" ({'; '.join(c['failures'])})"))
    if notes:
        out.append("\n".join(notes))
    return out


def report(folder):
    blocks = workload_tables(rows(os.path.join(folder, "distributed.jsonl")))
    blocks += bandwidth_tables(rows(os.path.join(folder, "nccl_bw.jsonl")))
    return "\n\n".join(blocks)


def markers(name="dist-tables"):
    """The lines that enclose a run's tables in the docs: ``<!-- NAME -->`` and ``<!-- /NAME -->``."""
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def fill(docs, text, name="dist-tables"):
    """``docs`` with what stands between the ``name`` markers replaced by ``text``."""
    begin, end = markers(name)
    head, sep, rest = docs.partition(begin)
    if not sep or end not in rest:
        raise SystemExit(f"the docs lack the lines {begin} and {end}")
    return f"{head}{begin}\n\n{text}\n\n{end}{rest.partition(end)[2]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="the folder holding distributed.jsonl and nccl_bw.jsonl")
    ap.add_argument("--docs", help="write the tables between the markers of this Markdown file")
    ap.add_argument("--marker", default="dist-tables",
                    help="the markers' name: <!-- NAME --> and <!-- /NAME --> (default dist-tables)")
    a = ap.parse_args()
    text = report(a.folder)
    if not text:
        sys.exit(f"no results in {a.folder} (distributed.jsonl, nccl_bw.jsonl)")
    if a.docs:
        with open(a.docs) as f:
            docs = f.read()
        with open(a.docs, "w") as f:
            f.write(fill(docs, text, a.marker))
    else:
        print(text)


if __name__ == "__main__":
    main()
