#!/usr/bin/env python3
"""Extracts from `llama-bench -v` logs (a tar.gz of `*-trace.log`, as scripts/llama/seed.py keeps
them) the numbers profiles/tests/mainline.rs checks the `llama` profile against, one JSON object
per run, in a file small enough to keep beside the traces:

    python3 scripts/llama/mainline_logs.py data/h100-2026-11-25-mainline-traces/logs.tar.gz \
        profiles/tests/data/h100-2026-11-25-mainline/logs.json

Per run (keyed by the log's name without `-trace.log`): llama-bench's parameters (`n_prompt`,
`n_gen`, `n_batch`, `n_ubatch`) and repetitions (`reps`), the context llama.cpp built (`n_ctx`), its CUDA0 compute buffer as
printed at reservation (`sched_reserve`, 2 decimals of MiB) and at teardown (`~llama_context`,
4 decimals), the reserved graph's node count, and the peak reserve of cupool's pool from the
shim's closing stats line.
"""
import json
import re
import sys
import tarfile

PATTERNS = {
    "n_ctx": (r"^llama_context: n_ctx\s+= (\d+)$", int),
    "graph_nodes": (r"^sched_reserve: graph: nodes = (\d+),", int),
    "compute_mib_reserve": (r"^sched_reserve:\s+CUDA0 compute buffer size =\s+([\d.]+) MiB$", str),
    "compute_mib": (r"^~llama_context:\s+CUDA0 compute buffer size is\s+([\d.]+) MiB", str),
    "pool_peak_reserved_bytes": (r'"reserved_bytes\.all\.peak":(\d+)', int),
}
# llama-bench's own parameters, from the JSON it prints at the top of a -v run.
PARAMS = {"n_prompt": r'^\s*"n_prompt": (\d+),', "n_gen": r'^\s*"n_gen": (\d+),',
          "n_batch": r'^\s*"n_batch": (\d+),', "n_ubatch": r'^\s*"n_ubatch": (\d+),'}


def first(pattern, text, conv, what, name):
    m = re.search(pattern, text, re.M)
    if not m:
        sys.exit(f"{name}: no {what} line in the log")
    return conv(m.group(1))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    runs = {}
    with tarfile.open(sys.argv[1]) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if not member.name.endswith("-trace.log"):
                continue
            name = member.name.rsplit("/", 1)[-1][: -len("-trace.log")]
            text = tar.extractfile(member).read().decode()
            run = {k: first(p, text, int, k, name) for k, p in PARAMS.items()}
            # the repetitions llama-bench measured: one sample each
            run["reps"] = len(first(r'^\s*"samples_ns": \[([^\]]*)\]', text, str, "samples_ns", name).split(","))
            for key, (pattern, conv) in PATTERNS.items():
                run[key] = first(pattern, text, conv, key, name)
            runs[name] = run
    if not runs:
        sys.exit(f"{sys.argv[1]}: no *-trace.log inside")
    with open(sys.argv[2], "w") as f:
        json.dump(runs, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
