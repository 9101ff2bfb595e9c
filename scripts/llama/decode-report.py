#!/usr/bin/env python3
"""The table docs/llama-cpp.md keeps of mainline llama.cpp's pool traffic while it generates, from
a folder of `llama-bench -pg P,G` runs recorded by seed.py (`--pg`, a `-trace` run name,
GGML_CUDA_DISABLE_GRAPHS=1):

    python3 scripts/llama/decode-report.py data/h100-2026-11-25-mainline-decode

Per run: where flash attention's f16 copies of the cache live (the profile that models it), the
prompt and the tokens generated, the trace's phases, and of the last phase (the measured run's
generated tokens, which mark no ubatch end) the requests per generated token, the ops that
named them and the largest; then the pool's peak reserve from cupool's statistics.
"""
import gzip
import json
import sys
from pathlib import Path


def last_phase(trace: Path):
    """The trace's phases and the allocations (size, name) of its last one."""
    phases, last = 0, []
    with gzip.open(trace, "rt") as f:
        for line in f:
            if line.startswith("#"):
                continue
            o = json.loads(line)
            if o["op"] == "phase_begin":
                phases, last = phases + 1, []
            elif o["op"] == "alloc":
                last.append((o["size"], o.get("name") or "(fused, no name)"))
    return phases, last


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = Path(sys.argv[1])
    lines = ["<!-- mainline-decode: begin (python3 scripts/llama/decode-report.py DATA) -->",
             "| run | K/V f16 copies (profile) | prompt, generated | phases | requests per generated token "
             "| named by | largest (B) | pool's peak reserve (B) |",
             "|---|---|---|---:|---:|---|---:|---:|"]
    runs = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines() if x.strip()]
    if not runs:
        sys.exit(f"{folder}/runs.jsonl: no runs")
    for r in runs:
        if r["rc"] != 0 or not r.get("gen"):
            sys.exit(f"{r['name']}: not a completed -pg run (rc {r['rc']}, gen {r.get('gen')})")
        phases, last = last_phase(folder / f"{r['name']}.trace.jsonl.gz")
        if len(last) % r["gen"]:
            sys.exit(f"{r['name']}: {len(last)} requests in the last phase for {r['gen']} tokens")
        names = ", ".join(sorted({n for _, n in last}, key=lambda n: (n.startswith("("), n)))
        where = "pool (`llama-b8833`)" if r["env"].get("CUPOOL_FA_KV") == "pool" else "compute buffer (`llama`)"
        name = r["name"][: -len("-trace")] if r["name"].endswith("-trace") else r["name"]
        lines.append(f"| {name} | {where} | {r['prompt']:,}, {r['gen']} | {phases} | {len(last) // r['gen']} | "
                     f"{names} | {max((s for s, _ in last), default=0):,} | "
                     f"{r['stats']['0']['reserved_bytes.all.peak']:,} |")
    lines.append("<!-- mainline-decode: end -->")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
