#!/usr/bin/env python3
"""Replays the recorded PyTorch prefills as processes serving several requests, and tabulates.

    scripts/torch/repeat-replays.py run BIN DIR     # every case through repro-prefill BIN
    scripts/torch/repeat-replays.py table DIR [DIR2] # markdown table (DIR2: a second build's)

Each case is a recorded trace (Phi-3, Llama-3, the Qwen3 MoE), a sequence of requests
(repeat-trace.py: `full` the recorded prefill, `half` its first half of chunks) and
CUPOOL_VMM_AHEAD (off, libcupool's default; inline, the worker's choices made at once, as
cupool.torch.install() makes them on a worker), replayed with libcupool's VMM setting. One JSON
file per case: the replay's report plus the CPU seconds it took.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TRACES = {
    "phi3": "data/h100-2026-11-22-pytorch/trace-phi3.jsonl.gz",
    "llama3": "data/h100-2026-11-22-pytorch/trace-llama3.jsonl.gz",
    "qwen3moe": "data/h100-2026-11-26-recycle-free-phi3-moe/trace-qwen3moe.jsonl.gz",
}
REQUESTS = ["full", "full,full", "full,full,full,full,full", "half,full", "full,half,full"]
AHEAD = ["off", "inline"]


def run(binary, out):
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, "trace.tmp.jsonl")
    for name, trace in TRACES.items():
        for req in REQUESTS:
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts/torch/repeat-trace.py"),
                            os.path.join(ROOT, trace), tmp, "--requests", req], check=True)
            for ahead in AHEAD:
                env = dict(os.environ, CUPOOL_VMM_AHEAD=ahead, RUST_LOG="off")
                before = os.times()
                r = subprocess.run([binary, "replay", tmp, "--pool", "vmm", "--round-large", "2097152",
                                    "--size-classes", "1048576", "--recycle", "on", "--quiet",
                                    "--format", "json"], env=env, capture_output=True, text=True,
                                   check=True)
                after = os.times()
                v = json.loads(r.stdout)
                v.update(trace=name, requests=req, ahead=ahead,
                         cpu_s=round(after.children_user + after.children_system
                                     - before.children_user - before.children_system, 2))
                with open(os.path.join(out, f"{name}-{req.replace(',', '+')}-{ahead}.json"), "w") as f:
                    json.dump(v, f, indent=1, sort_keys=True)
    os.remove(tmp)


def load(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".json"):
            v = json.load(open(os.path.join(d, f)))
            out[(v["trace"], v["requests"], v["ahead"])] = v
    return out


def cell(v):
    ratio = v["peak_reserved_bytes"] / v["peak_live_bytes"]
    return (f"{v['driver_maps']:,} / {v['driver_remaps']:,} / {v['driver_unmaps']:,} / "
            f"{v['driver_syncs']:,} | {ratio:.3f} | {v['cpu_s']:.2f}")


def table(dirs):
    runs = [load(d) for d in dirs]
    head = "| trace | requests | ahead |"
    for d in dirs:
        name = os.path.basename(os.path.normpath(d))
        head += f" {name}: maps / moves / unmaps / syncs | reserve / live | CPU s |"
    print(head)
    print("|---|---|---|" + "---|---|---|" * len(dirs))
    for key in sorted(runs[-1], key=lambda k: (list(TRACES).index(k[0]), REQUESTS.index(k[1]),
                                                 AHEAD.index(k[2]))):
        row = f"| {key[0]} | {key[1]} | {key[2]} |"
        for r in runs:
            row += f" {cell(r[key])} |" if key in r else " – | – | – |"
        print(row)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3])
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "table":
        table(sys.argv[2:])
    else:
        sys.exit(__doc__)
