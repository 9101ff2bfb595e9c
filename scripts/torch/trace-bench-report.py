#!/usr/bin/env python3
"""Tables of libcupool's `torch_trace` bench (capi/benches/torch_trace.rs) from a run folder.

The folder holds one file per (build, trace, memory touched between calls) and process,
named BUILD-MODEL-thrashKIB-N.jsonl, each the bench's output (one JSON line per round).
Rounds after the first of every process are pooled; each cell is the median over them, in
nanoseconds per call, with [min, max]:

    python3 scripts/torch/trace-bench-report.py data/cpu-2026-11-29-vacant-runs

With --reserve, the table of the reserve's peak instead: the first round's (the recorded
process) and the later rounds' (the same request again on the pool the first left), in MiB,
the median and [min, max] over those rounds of every process (the files of every memory-touch
setting: the memory touched between calls moves no block). Where the processes agree, a
spread among the later rounds is the pool's growth from one request to the next:

    python3 scripts/torch/trace-bench-report.py --reserve data/cpu-2026-11-29-one-range
"""
import glob, json, os, re, statistics, sys

MODELS = {"phi3": "Phi-3", "llama3": "Llama-3", "qwen3moe": "MoE"}


def rounds(path, first=False):
    """The rounds after the first, or only the first."""
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                r = json.loads(line)
                if (r["round"] == 0) == first:
                    out.append(r)
    return out


def span(values):
    lo, hi = min(values), max(values)
    return f"{lo:,.0f}" if lo == hi else f"{statistics.median(values):,.0f} [{lo:,.0f}, {hi:,.0f}]"


def cell(values):
    return f"{statistics.median(values):.0f} [{min(values):.0f}, {max(values):.0f}]"


def files(folder):
    """(build, model, KiB touched, path) of every run file."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        m = re.fullmatch(r"(\w+)-(\w+)-thrash(\d+)-\d+\.jsonl", os.path.basename(path))
        if m:
            out.append((m.group(1), m.group(2), int(m.group(3)), path))
    if not out:
        sys.exit(f"{folder}: no BUILD-MODEL-thrashKIB-N.jsonl files")
    return out


def reserve(folder):
    peaks = {}
    for build, model, _, path in files(folder):
        first = [r["reserved_peak_mib"] for r in rounds(path, first=True)]
        later = [r["reserved_peak_mib"] for r in rounds(path)]
        p = peaks.setdefault((model, build), ([], []))
        p[0].extend(first)
        p[1].extend(later)
    print("| trace | build | bench processes | reserve peak, first round (MiB) | later rounds (MiB) |")
    print("|---|---|---|---|---|")
    for (model, build) in sorted(peaks, key=lambda k: (list(MODELS).index(k[0]), k[1])):
        first, later = peaks[(model, build)]
        print(f"| {MODELS.get(model, model)} | {build} | {len(first)} | {span(first)} | {span(later)} |")


def main(folder):
    runs = {}
    for build, model, thrash, path in files(folder):
        runs.setdefault((model, thrash), {}).setdefault(build, []).extend(rounds(path))
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
    if len(sys.argv) == 3 and sys.argv[1] == "--reserve":
        reserve(sys.argv[2])
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
