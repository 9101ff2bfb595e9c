#!/usr/bin/env python3
"""Checks `repro-prefill plan`'s largest context against mainline llama.cpp on a GPU, from what a
user knows: a GGUF file and the free device memory before the engine starts.

    python3 scripts/llama/predict-check.py run --bin BUILD/build/bin --repro repro-prefill --out DIR CASE [CASE ...]
    python3 scripts/llama/predict-check.py report DIR

A CASE is NAME:MODEL.gguf:FREE_GIB. `run` asks the plan (engine llama, -b 2048 -ub 512, q8_0 KV,
GGML_POOL=vmm with purge auto, the libcupool defaults) for the largest context that fits in
FREE_GIB, writes its JSON to DIR/NAME.plan.json, and then runs llama-bench through seed.py with the
ballast leaving FREE_GIB free: a prompt filling that context (it must complete) and one a ubatch
(512 tokens) longer (it must not). `report` prints the table docs/llama-cpp.md keeps, between its
markers: predicted against real, per case.
"""
import argparse
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
UBATCH = 512


def parse_case(spec: str) -> dict:
    m = re.fullmatch(r"([\w.-]+):(.+\.gguf):([\d.]+)", spec)
    if not m:
        sys.exit(f"predict-check: case {spec!r} is not NAME:MODEL.gguf:FREE_GIB")
    return {"name": m.group(1), "gguf": m.group(2), "free": float(m.group(3))}


def plan(repro: str, case: dict, ctx: int) -> dict:
    cmd = [repro, "plan", "--gguf", case["gguf"], "--free", str(case["free"]), "--engine", "llama", "-b", "2048",
           "-ub", str(UBATCH), "-c", str(ctx), "--kv-type", "q8_0", "--format", "json", "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"predict-check: {' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def run(a) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for case in map(parse_case, a.cases):
        fits = plan(a.repro, case, 4096)["max_ctx_that_fits"]
        # the plan of that very context: its peak device memory is the one to compare
        p = plan(a.repro, case, fits)
        (out / f"{case['name']}.plan.json").write_text(json.dumps(p, indent=1) + "\n")
        print(f"predict-check: {case['name']}: plan says -c {fits} fits in {case['free']} GiB", flush=True)
        for label, prompt in (("fits", fits), ("above", fits + UBATCH)):
            subprocess.run([sys.executable, str(HERE / "seed.py"), "--bench", "llama-bench", "--bin", a.bin,
                            "--model", case["gguf"], "--out", str(out / case["name"]), "--prompt", str(prompt),
                            "--reps", "1", "--timeout", str(a.timeout),
                            f"{case['name']}-{label}-p{prompt}:vmm@{case['free']}"], check=False)


def outcome(r: dict) -> str:
    if r["rc"] == 0:
        return "completes"
    return {"start-up": "fails at start-up", "compute": "dies at the first compute"}.get(r["failed_at"],
                                                                                     f"exit {r['rc']}")


START_REPORT = re.compile(r"cannot allocate a ggml buffer of ([\d.]+) MiB.*?allocated ([\d.]+) MiB of buffers before")


def context_buffers_mib(r: dict, log: str):
    """What the context's buffers (KV cache, compute buffer, outputs) took or asked for, in MiB: from
    cupool's memory lines when the context was created, else from its start-up report."""
    stages = {m["stage"]: m["buffers_mib"] for m in r.get("memory", []) if m.get("device") == 0}
    if "context-created" in stages and "model-loaded" in stages:
        return stages["context-created"] - stages["model-loaded"]
    m = START_REPORT.search(log)
    return float(m.group(1)) + float(m.group(2)) if m else None


def mib(x) -> str:
    return "–" if x is None else f"{x:,.0f}"


def report(a) -> None:
    folder = Path(a.folder)
    logs = tarfile.open(folder / "logs.tar.gz") if (folder / "logs.tar.gz").exists() else None

    def log_of(case: str, r: dict) -> str:
        if logs is None:
            return (folder / case / f"{r['name']}.log").read_text(errors="replace")
        return logs.extractfile(f"{case}/{r['name']}.log").read().decode(errors="replace")

    lines = ["<!-- predict-check: begin (python3 scripts/llama/predict-check.py report DATA) -->",
             "| case | free before start | plan: largest `-c` | real at that `-c` | real one ubatch above | "
             "cupool's start-up report: `-c` that fits | plan: KV + compute buffer (MiB) | real (MiB) |",
             "|---|---:|---:|---|---|---:|---:|---:|"]
    for pj in sorted(folder.glob("*.plan.json")):
        name = pj.name[: -len(".plan.json")]
        p = json.loads(pj.read_text())
        runs = [json.loads(x) for x in (folder / name / "runs.jsonl").read_text().splitlines() if x.strip()]
        fits = next(r for r in runs if "-fits-" in r["name"])
        above = next(r for r in runs if "-above-" in r["name"])
        told = next((r["fits_ctx"] for r in (fits, above) if r.get("fits_ctx")), None)
        planned = (p["kv_bytes"] + p["compute_bytes"]) / 2**20
        lines.append(
            f"| {name} | {fits['card_gib']:g} GiB | {p['max_ctx_that_fits']:,} | {outcome(fits)} | {outcome(above)} | "
            f"{'–' if told is None else f'{told:,}'} | {mib(planned)} | {mib(context_buffers_mib(fits, log_of(name, fits)))} |")
    lines.append("<!-- predict-check: end -->")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bin", required=True)
    r.add_argument("--repro", required=True, help="the repro-prefill binary")
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=int, default=240)
    r.add_argument("cases", nargs="+")
    p = sub.add_parser("report")
    p.add_argument("folder")
    a = ap.parse_args()
    run(a) if a.cmd == "run" else report(a)


if __name__ == "__main__":
    main()
