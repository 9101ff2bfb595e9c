#!/usr/bin/env python3
"""Runs `repro-prefill plan` over a grid of inputs with two binaries and compares them.

    python3 scripts/plan-compare.py OLD_BIN NEW_BIN OUT_DIR [--jobs 2]
    python3 scripts/plan-compare.py --report OUT_DIR

Every case runs once per binary (JSON output, stderr and exit code are kept as digests); the
two must agree byte for byte. Wall time of each run is recorded, so the same folder answers
"did the change keep every answer" and "how long does plan take, before and after".
OUT_DIR gets cases.txt (one argument line per case) and runs.jsonl (one line per case).
"""
import argparse
import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ENGINES = ["cupool", "llama", "llama-b8833", "ik-llama"]
MODELS = ["phi3-mini", "llama3-8b", "qwen3-30b-a3b"]


def cases():
    out = []

    def add(e, m, free, pool, purge, ctx=None, ub=None, prompt=None, extra=""):
        a = f"--device sim --engine {e} --model {m} --free {free} --pool {pool} --purge {purge}"
        if m == "qwen3-30b-a3b":
            a += " --weight-type q8_0"
        if ctx:
            a += f" --ctx {ctx}"
        if ub:
            a += f" --ubatch {ub}"
        if prompt:
            a += f" --prompt {prompt}"
        if extra:
            a += " " + extra
        out.append(a)

    for e, m, f, p, u in itertools.product(
        ENGINES, MODELS, [8, 12, 16, 24, 40, 80], ["vmm", "legacy"], ["never", "auto"]
    ):
        add(e, m, f, p, u)
    for e, m, f, c, ub in itertools.product(
        ENGINES, MODELS, [12, 40, 80], [4096, 65536, 131072], [256, 1024]
    ):
        add(e, m, f, "vmm", "auto", ctx=c, ub=ub)
    for e, m, f, ub in itertools.product(ENGINES, MODELS, [16, 80], [256, 512, 1024]):
        add(e, m, f, "legacy", "never", ctx=32768, ub=ub, prompt=5000)
    for e, m, f in itertools.product(ENGINES, MODELS, [24, 80]):
        add(e, m, f, "vmm", "always")
        add(e, m, f, "vmm", "auto", extra="--batch 512 --ubatch 512")
        add(e, m, f, "legacy", "auto", extra="--batch 1536 --ubatch 512 --kv-type f16")
    for f in [16, 40, 80]:
        add("ik-llama", "deepseek-v3", f, "vmm", "auto", extra="--weight-type q8_0 --n-layer 6")
    for f in [16, 40, 80, 140]:
        for p in ["vmm", "legacy"]:
            add("ik-llama", "deepseek-v3", f, p, "auto", extra="--weight-type q8_0")
    for e, m in itertools.product(ENGINES, MODELS):
        add(e, m, 140, "vmm", "auto")
        add(e, m, 140, "legacy", "never", ctx=262144)
    # Contexts that do not fit even with plenty of memory: the advice searches other settings.
    for e in ENGINES:
        add(e, "llama3-8b", 80, "vmm", "auto", ctx=2000000)
    add("llama-b8833", "qwen3-30b-a3b", 80, "legacy", "never", ctx=3000000)
    add("ik-llama", "phi3-mini", 40, "vmm", "never", ctx=1000000)
    add("cupool", "phi3-mini", 24, "legacy", "auto", ctx=500000, ub=256)
    add("llama", "qwen3-30b-a3b", 80, "vmm", "always", ctx=4000000)
    return out


def run(binary, args):
    # The pool's layering comes from the command line alone, not from a caller's environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPOOL_")}
    start = time.monotonic()
    p = subprocess.run(
        [binary, "plan", *args.split(), "--format", "json", "--quiet"],
        capture_output=True,
        env=env,
    )
    wall = time.monotonic() - start
    digest = hashlib.sha256(p.stdout + b"\0" + p.stderr + f"\0{p.returncode}".encode()).hexdigest()
    return wall, digest[:16], p.returncode


def measure(old, new, out, jobs):
    os.makedirs(out, exist_ok=True)
    grid = cases()
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("\n".join(grid) + "\n")

    def one(args):
        ow, od, orc = run(old, args)
        nw, nd, nrc = run(new, args)
        return {"args": args, "old_s": round(ow, 4), "new_s": round(nw, 4),
                "same": od == nd, "rc": nrc, "old_rc": orc}

    with ThreadPoolExecutor(jobs) as pool:
        rows = list(pool.map(one, grid))
    with open(os.path.join(out, "runs.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return rows


def report(rows):
    differ = [r for r in rows if not r["same"]]
    old = sorted(r["old_s"] for r in rows)
    new = sorted(r["new_s"] for r in rows)
    print(f"cases: {len(rows)}, outputs identical: {len(rows) - len(differ)}")
    for r in differ:
        print(f"  differs: {r['args']}")
    print("| | median | 90th percentile | slowest | total |")
    print("|---|---|---|---|---|")
    for name, t in (("before", old), ("after", new)):
        print(f"| {name} | {t[len(t) // 2]:.2f} s | {t[int(len(t) * 0.9)]:.2f} s | "
              f"{t[-1]:.2f} s | {sum(t):.0f} s |")
    over = [r for r in rows if r["new_s"] >= 1.0]
    print(f"after, cases at or over one second: {len(over)}")
    for r in sorted(over, key=lambda r: -r["new_s"]):
        print(f"  {r['new_s']:.2f} s: {r['args']}")
    return 1 if differ else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", nargs="?")
    ap.add_argument("new", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--report", metavar="DIR")
    a = ap.parse_args()
    if a.report:
        with open(os.path.join(a.report, "runs.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    elif a.old and a.new and a.out:
        rows = measure(a.old, a.new, a.out, a.jobs)
    else:
        ap.error("give OLD_BIN NEW_BIN OUT_DIR, or --report DIR")
    sys.exit(report(rows))


if __name__ == "__main__":
    main()
