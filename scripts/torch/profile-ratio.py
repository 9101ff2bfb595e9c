#!/usr/bin/env python3
"""The allocator's share of the Python thread, from prefill.py --profile tables.

    python3 scripts/torch/profile-ratio.py DIR [DIR ...]

Identical prefills on the GPU machine ran 0.85 to 1.46 s, and the same 39,413 kernel launches
took 227 to 330 ms of the thread's own CPU time between processes: the machine's speed varies
more than an allocator's cost. Within one profiled prefill both the allocating ops and the
launches run at that prefill's speed, so their ratio compares allocators across processes.
Prints a markdown table: per profile the self CPU time (ms) of the ops whose own time is the
allocator's call (aten::empty, aten::empty_strided, aten::resize_), of cudaLaunchKernel, and
their ratio; then per allocator the mean ratio and what the difference to the first allocator
costs a prefill at its median launch time. Frees run outside any op and are not counted.
"""
import collections
import glob
import os
import re
import statistics
import sys

ALLOC_OPS = ("aten::empty", "aten::empty_strided", "aten::resize_")
UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def self_cpu_ms(text, name):
    """The Self CPU column (ms) of the row named ``name`` in the first table of a profile."""
    for line in text.splitlines():
        cols = line.split()
        if cols and cols[0] == name:
            m = re.fullmatch(r"([0-9.]+)(us|ms|s)", cols[2])
            if m:
                return float(m.group(1)) * UNIT[m.group(2)]
    return 0.0


def main(dirs):
    rows = collections.defaultdict(list)
    print("| profile | allocating ops (ms) | cudaLaunchKernel (ms) | ratio |")
    print("|---|---|---|---|")
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "profile-*.txt"))):
            text = open(path).read().split("Self CPU time total")[0]
            alloc = sum(self_cpu_ms(text, op) for op in ALLOC_OPS)
            launch = self_cpu_ms(text, "cudaLaunchKernel")
            if launch <= 0:
                continue
            allocator = os.path.basename(path).split("-", 2)[2].rsplit("-", 1)[0]
            rows[allocator].append((alloc, launch))
            print(f"| {os.path.basename(path)} | {alloc:.1f} | {launch:.1f} | {alloc / launch:.3f} |")
    if not rows:
        sys.exit("no profile-*.txt with a cudaLaunchKernel row in " + " ".join(dirs))
    first = next(iter(sorted(rows, key=lambda a: a != "expandable")))
    base = statistics.mean(a / l for a, l in rows[first])
    print(f"\n| allocator | profiles | mean ratio | against {first}: ms per prefill at its median launch time |")
    print("|---|---|---|---|")
    for allocator, rs in sorted(rows.items()):
        ratio = statistics.mean(a / l for a, l in rs)
        extra = (ratio - base) * statistics.median(l for _, l in rs)
        print(f"| {allocator} | {len(rs)} | {ratio:.3f} | {extra:+.1f} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["."])
