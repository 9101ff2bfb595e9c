#!/usr/bin/env python3
"""Tables of libcupool's `torch_trace` bench (capi/benches/torch_trace.rs) from a run folder.

The folder holds one file per (build, trace, memory touched between calls) and process,
named BUILD-MODEL-thrashKIB-N.jsonl, each the bench's output (one JSON line per round).
Rounds after the first of every process are pooled; each cell is the median over them, in
nanoseconds per call, with [min, max]:

    python3 scripts/torch/trace-bench-report.py data/cpu-2026-11-29-vacant-runs
"""
import glob, json, os, re, statistics, sys

MODELS = {"phi3": "Phi-3", "llama3": "Llama-3", "qwen3moe": "MoE"}


def rounds(path):
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                r = json.loads(line)
                if r["round"] > 0:
                    out.append(r)
    return out


def cell(values):
    return f"{statistics.median(values):.0f} [{min(values):.0f}, {max(values):.0f}]"


def main(folder):
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        m = re.fullmatch(r"(\w+)-(\w+)-thrash(\d+)-\d+\.jsonl", os.path.basename(path))
        if not m:
            continue
        build, model, thrash = m.group(1), m.group(2), int(m.group(3))
        runs.setdefault((model, thrash), {}).setdefault(build, []).extend(rounds(path))
    if not runs:
        sys.exit(f"{folder}: no BUILD-MODEL-thrashKIB-N.jsonl files")
    print("| trace | KiB touched between calls | build | rounds | small allocation (ns) "
          "| large allocation (ns) | free (ns) |")
    print("|---|---|---|---|---|---|---|")
    for (model, thrash) in sorted(runs, key=lambda k: (list(MODELS).index(k[0]), k[1])):
        for build, rs in sorted(runs[(model, thrash)].items()):
            print(f"| {MODELS.get(model, model)} | {thrash} | {build} | {len(rs)} | "
                  f"{cell([r['small_alloc_ns'] for r in rs])} | "
                  f"{cell([r['large_alloc_ns'] for r in rs])} | "
                  f"{cell([r['free_ns'] for r in rs])} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
