#!/usr/bin/env python3
"""Checks `repro-prefill plan` against mainline llama.cpp or ik_llama.cpp on a GPU, from what a
user knows: a GGUF file and the free device memory before the engine starts.

    python3 scripts/llama/predict-check.py run --bin BUILD/build/bin --repro repro-prefill --out DIR CASE [CASE ...]
    python3 scripts/llama/predict-check.py report DIR [DIR ...]
    python3 scripts/llama/predict-check.py report-oom DIR [DIR ...]

A CASE is NAME:MODEL.gguf:FREE_GIB[:CTX]. `run` asks the plan (--engine, default llama; -b 2048
-ub 512, q8_0 KV; --pool and --purge, default vmm and auto, the libcupool defaults) for the
largest context that fits in FREE_GIB, writes its JSON to DIR/NAME.plan.json, and then runs
llama-bench through seed.py with the ballast leaving FREE_GIB free: a prompt filling that context
(it must complete) and one a ubatch (512 tokens) longer (it must not). With CTX it also plans
that context (DIR/NAME.ctx.plan.json: whether it fits, the token where the run dies) and runs it
(ik_llama.cpp: llama-sweep-bench -c CTX, whose rows say how far it got; mainline: llama-bench
-p CTX, whose ubatch lines do), and with --fix POOL:PURGE the same context under that fix (it must
complete where the plan says it fits). `report` prints the largest-context table docs/llama-cpp.md
keeps, `report-oom` the table of predicted against real tokens where a run dies (both as the plan
counts them: the tokens processed before the ubatch whose allocation failed) and, from cupool's
memory lines, the pool's room and reserve in the plan and in each run, and what the pool's driver
allocations took from the device beyond the bytes it reserved (docs/repro-prefill.md keeps both).
Given several folders (runs of the same check on other days), the reports hold their cases in one
table, in the order of the cases' names.
`plan`'s exit 3 ("it does not fit") is an answer, not a failure.
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
    m = re.fullmatch(r"([\w.-]+):(.+\.gguf):([\d.]+)(?::(\d+))?", spec)
    if not m:
        sys.exit(f"predict-check: case {spec!r} is not NAME:MODEL.gguf:FREE_GIB[:CTX]")
    return {"name": m.group(1), "gguf": m.group(2), "free": float(m.group(3)),
            "ctx": int(m.group(4)) if m.group(4) else None}


def plan(a, case: dict, ctx: int, pool: str = None, purge: str = None) -> dict:
    cmd = [a.repro, "plan", "--gguf", case["gguf"], "--free", str(case["free"]), "--engine", a.engine, "-b", "2048",
           "-ub", str(UBATCH), "-c", str(ctx), "--kv-type", "q8_0", "--pool", pool or a.pool,
           "--purge", purge or a.purge, "--format", "json", "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    # exit 3 is the plan's answer "it does not fit" (its JSON says where it stops), not a failure
    if out.returncode not in (0, 3):
        sys.exit(f"predict-check: {' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr}")
    p = json.loads(out.stdout)
    if (out.returncode == 3) == bool(p["fits"]):
        sys.exit(f"predict-check: {' '.join(cmd)}: exit {out.returncode} with fits={p['fits']}")
    return p


def predict_sweep(repro: str, gguf: str, free: float, engine: str, ctx: int, pool: str, purge: str) -> dict:
    """What the engine's run at CTX is for ik_llama.cpp: llama-sweep-bench -n 1 over CTX/512 steps,
    each ubatch followed by one generated token (whose decode takes its own pool blocks), not a
    prompt. `repro-prefill predict --sweep` plans that run: where it dies, its pool's peak."""
    cmd = [repro, "predict", "--gguf", gguf, "--free", str(free), "--engine", engine, "--sweep", str(ctx // UBATCH),
           "-c", str(ctx), "-b", "2048", "-ub", str(UBATCH), "--kv-type", "q8_0", "--pool", pool, "--purge", purge,
           "--format", "json", "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 3):
        sys.exit(f"predict-check: {' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr}")
    p = json.loads(out.stdout)
    return {"steps": ctx // UBATCH, "oom_at_token": p.get("oom_at_token"),
            "peak_reserved_bytes": p["peak_reserved_bytes"]}


def seed(a, case: dict, label: str, pool: str, purge: str, *, prompt: int = None, ctx: int = None) -> None:
    """One engine run through seed.py, the ballast leaving the case's free memory: llama-bench
    over `prompt` tokens, or (ctx) ik_llama.cpp's llama-sweep-bench over `ctx`, else llama-bench
    over `ctx` tokens."""
    sweep = ctx is not None and a.engine == "ik-llama"
    n = ctx if ctx is not None else prompt
    cmd = [sys.executable, str(HERE / "seed.py"), "--bin", a.bin, "--model", case["gguf"],
           "--out", str(Path(a.out) / case["name"]), "--timeout", str(a.timeout)]
    cmd += ["--ctx", str(n)] if sweep else ["--bench", "llama-bench", "--prompt", str(n), "--reps", "1"]
    for e in a.env:
        cmd += ["--env", e]
    run_name = f"{case['name']}-{label}-{'c' if sweep else 'p'}{n}"
    subprocess.run(cmd + [f"{run_name}:{pool}:{purge}@{case['free']}"], check=False)


def run(a) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for case in map(parse_case, a.cases):
        fits = plan(a, case, 4096)["max_ctx_that_fits"]
        # the plan of that very context: its peak device memory is the one to compare
        p = plan(a, case, fits)
        (out / f"{case['name']}.plan.json").write_text(json.dumps(p, indent=1) + "\n")
        print(f"predict-check: {case['name']}: plan says -c {fits} fits in {case['free']} GiB", flush=True)
        for label, prompt in (("fits", fits), ("above", fits + UBATCH)):
            seed(a, case, label, a.pool, a.purge, prompt=prompt)
        if case["ctx"] is None:
            continue
        at = plan(a, case, case["ctx"])
        at["check"] = {"pool": a.pool, "purge": a.purge, "ctx": case["ctx"], "engine": a.engine, "env": a.env}
        if a.engine == "ik-llama":
            at["sweep"] = predict_sweep(a.repro, case["gguf"], case["free"], a.engine, case["ctx"], a.pool, a.purge)
        if a.fix:
            pool, purge = a.fix.split(":")
            at["fix"] = {"pool": pool, "purge": purge, "fits": plan(a, case, case["ctx"], pool, purge)["fits"]}
        (out / f"{case['name']}.ctx.plan.json").write_text(json.dumps(at, indent=1) + "\n")
        print(f"predict-check: {case['name']}: plan says -c {case['ctx']} "
              + ("fits" if at["fits"] else f"dies at token {at['oom_at_token']}"), flush=True)
        seed(a, case, "ctx", a.pool, a.purge, ctx=case["ctx"])
        if a.fix:
            seed(a, case, "fix", *a.fix.split(":"), ctx=case["ctx"])


def real_oom_token(r: dict):
    """Where a run that ran out of memory died, as the plan's `oom_at_token` counts it: the tokens
    processed before the ubatch whose allocation failed. A sweep's rows (ik_llama.cpp) say the KV
    length the last completed step started from; a prompt's (mainline's llama-bench) are the
    ubatches whose end cupool logged before the first failure report (seed.py's
    `ubatches_before_oom`: the failing ubatch's own boundary is logged after its report), counted
    within the pass that died (llama-bench's warm-up runs the whole prompt first)."""
    if r["rc"] == 0:
        return None
    if r.get("rows"):
        return r["last_n_kv"] + UBATCH
    n_ub = -(-r["prompt"] // UBATCH) if r.get("prompt") else None
    done = r.get("ubatches_before_oom")
    return (done % n_ub) * UBATCH if n_ub and done is not None else None


def outcome(r: dict) -> str:
    if r["rc"] == 0:
        return "completes"
    tok = real_oom_token(r)
    if r["failed_at"] == "compute" and tok is not None and r.get("ubatches_before_oom") != 0:
        return f"dies at token {tok:,}"
    return {"start-up": "fails at start-up", "compute": "dies at the first compute"}.get(r["failed_at"],
                                                                                     f"exit {r['rc']}")


START_REPORT = re.compile(r"cannot allocate a ggml buffer of ([\d.]+) MiB.*?allocated ([\d.]+) MiB of buffers before")


def context_buffers_mib(r: dict, log: str):
    """What the context's buffers (KV cache, compute buffer, outputs) took or asked for, in MiB: from
    cupool's memory lines when the context was created (the shim's ledger of ggml's buffers; where
    the engine's patch hooks none, ik_llama.cpp's, what left the device between the two lines, in
    whole pages), else from its start-up report."""
    stages = {m["stage"]: m for m in r.get("memory", []) if m.get("device") == 0}
    if "context-created" in stages and "model-loaded" in stages:
        loaded, created = stages["model-loaded"], stages["context-created"]
        ledger = created["buffers_mib"] - loaded["buffers_mib"]
        return ledger if ledger > 0 else loaded["free_mib"] - created["free_mib"]
    m = START_REPORT.search(log)
    return float(m.group(1)) + float(m.group(2)) if m else None


def mib(x) -> str:
    return "–" if x is None else f"{x:,.0f}"


def plans(folders, suffix: str):
    """Every `*SUFFIX` plan of the folders, in the order of the files' names (each case's name is
    its own: the same case run twice would be two rows of one name)."""
    return sorted((pj for f in folders for pj in Path(f).glob(f"*{suffix}")), key=lambda pj: pj.name)


def runs_of(pj: Path, name: str) -> list:
    return [json.loads(x) for x in (pj.parent / name / "runs.jsonl").read_text().splitlines() if x.strip()]


def log_of(folder: Path, case: str, r: dict) -> str:
    if not (folder / "logs.tar.gz").exists():
        return (folder / case / f"{r['name']}.log").read_text(errors="replace")
    with tarfile.open(folder / "logs.tar.gz") as logs:
        return logs.extractfile(f"{case}/{r['name']}.log").read().decode(errors="replace")


def report(a) -> None:
    lines = ["<!-- predict-check: begin (python3 scripts/llama/predict-check.py report DATA) -->",
             "| case | free before start | plan: largest `-c` | real at that `-c` | real one ubatch above | "
             "cupool's start-up report: `-c` that fits | plan: KV + compute buffer (MiB) | real (MiB) |",
             "|---|---:|---:|---|---|---:|---:|---:|"]
    for pj in plans(a.folders, ".plan.json"):
        if pj.name.endswith(".ctx.plan.json"):
            continue  # a CASE's CTX plan: report-oom's
        name = pj.name[: -len(".plan.json")]
        p = json.loads(pj.read_text())
        runs = runs_of(pj, name)
        fits = next(r for r in runs if "-fits-" in r["name"])
        above = next(r for r in runs if "-above-" in r["name"])
        told = next((r["fits_ctx"] for r in (fits, above) if r.get("fits_ctx")), None)
        planned = (p["kv_bytes"] + p["compute_bytes"]) / 2**20
        lines.append(
            f"| {name} | {fits['card_gib']:g} GiB | {p['max_ctx_that_fits']:,} | {outcome(fits)} | {outcome(above)} | "
            f"{'–' if told is None else f'{told:,}'} | {mib(planned)} | {mib(context_buffers_mib(fits, log_of(pj.parent, name, fits)))} |")
    lines.append("<!-- predict-check: end -->")
    print("\n".join(lines))


def report_oom(a) -> None:
    """Predicted against real: where each case's run at its CTX died (or that it completed), and
    the fix."""
    lines = ["<!-- predict-oom: begin (python3 scripts/llama/predict-check.py report-oom DATA) -->",
             "| case | engine, pool, purge | free before start | `-c` | plan | real | the fix | plan | real |",
             "|---|---|---:|---:|---|---|---|---|---|"]
    for pj in plans(a.folders, ".ctx.plan.json"):
        name = pj.name[: -len(".ctx.plan.json")]
        p = json.loads(pj.read_text())
        runs = runs_of(pj, name)
        at = next(r for r in runs if "-ctx-" in r["name"])
        fix = next((r for r in runs if "-fix-" in r["name"]), None)
        said = "completes" if p["fits"] else f"dies at token {p['oom_at_token']:,}"
        sw = p.get("sweep")
        if sw and sw["oom_at_token"] != p.get("oom_at_token"):
            swept = "completes" if sw["oom_at_token"] is None else f"dies at token {sw['oom_at_token']:,}"
            said += f"; as the sweep it ran: {swept}"
        real = outcome(at)
        c = p["check"]
        f = p.get("fix")
        fix_said = ("completes" if f and f["fits"] else "does not fit") if f else "–"
        fix_real = ("completes" if fix["rc"] == 0 else outcome(fix)) if fix else "–"
        fix_name = f"`{f['pool']}`, `{f['purge']}`" if f else "–"
        lines.append(f"| {name} | {c['engine']}, `{c['pool']}`, `{c['purge']}` | {at['card_gib']:g} GiB | {c['ctx']:,} | "
                     f"{said} | {real} | {fix_name} | {fix_said} | {fix_real} |")
    lines.append("<!-- predict-oom: end -->")
    lines += ["", "<!-- predict-oom-room: begin (python3 scripts/llama/predict-check.py report-oom DATA) -->",
              "| run | plan | real | the pool's room (MiB): plan | real | pool reserve at the end (MiB): plan | real | "
              "what the pool's later driver allocations took beyond their sizes (MiB) | later free-memory drops in whole "
              "2 MiB pages |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for pj in plans(a.folders, ".plan.json"):
        ctx = pj.name.endswith(".ctx.plan.json")
        name = pj.name[: -len(".ctx.plan.json" if ctx else ".plan.json")]
        p = json.loads(pj.read_text())
        runs = runs_of(pj, name)
        r = next(r for r in runs if ("-ctx-" if ctx else "-fits-") in r["name"])
        row = room_row(p, r)
        if row:
            lines.append(f"| {r['name']} | {row}")
    lines.append("<!-- predict-oom-room: end -->")
    print("\n".join(lines))


def room_row(p: dict, r: dict):
    """The plan's room for the pool and its reserve against the run's (cupool's memory lines and
    statistics), and what the pool's driver allocations after the first ubatch took from the
    device beyond the bytes the pool reserved; None for a run without memory lines."""
    mem = [m for m in r.get("memory", []) if m.get("device") == 0]
    created = next((m for m in mem if m["stage"] == "context-created"), None)
    ubatches = [m for m in mem if m["stage"] == "ubatch"]
    if created is None or not ubatches or not r.get("stats"):
        return None
    o = p["outside"]
    # the start-up hold goes back at the first compute: it is no part of the pool's room
    room = p["device_bytes"] - p["weights_bytes"] - p["kv_bytes"] - p["compute_bytes"] - sum(o.values()) + o["shim_hold_bytes"]
    first = ubatches[0]
    # the room the first ubatch left: what it took outside the pool is the kernel modules' (and
    # cuBLAS's workspace)
    real_room = first["free_mib"] + first["pool_reserved_mib"] - created["pool_reserved_mib"]
    extra, drops, pages = 0.0, 0, 0
    for prev, cur in zip(ubatches, ubatches[1:]):
        drop = prev["free_mib"] - cur["free_mib"]
        extra += drop - (cur["pool_reserved_mib"] - prev["pool_reserved_mib"])
        if drop > 0.05:
            drops += 1
            pages += abs(drop / 2 - round(drop / 2)) < 0.05
    stats = r["stats"].get("0") or r["stats"].get(0)
    said = "completes" if p["fits"] else f"dies at token {p['oom_at_token']:,}"
    real = outcome(r)
    return (f"{said} | {real} | {room / 2**20:,.1f} | {real_room:,.1f} | {p['pool_peak_reserved_bytes'] / 2**20:,.1f} | "
            f"{stats['reserved_bytes.all.peak'] / 2**20:,.1f} | {extra:,.1f} | {pages} of {drops} |")


def memory(a) -> None:
    """Each run's memory lines where the device's free memory or the pool's reserve moved: the
    stage, the free memory and the pool's reserve after it, and how much free memory fell against
    how much the pool grew since the line before (a fall short of the growth is memory the driver
    gave back)."""
    lines = ["<!-- predict-memory: begin (python3 scripts/llama/predict-check.py memory DATA) -->",
             "| run | stage | free (MiB) | pool reserve (MiB) | free fell by (MiB) | pool grew by (MiB) |",
             "|---|---|---:|---:|---:|---:|"]
    for folder in a.folders:
        for rj in sorted(Path(folder).glob("*/runs.jsonl")):
            for r in map(json.loads, rj.read_text().splitlines()):
                prev = None
                for m in (m for m in r.get("memory", []) if m.get("device") == 0):
                    moved = (abs(prev["free_mib"] - m["free_mib"]) > 0.05
                             or abs(prev["pool_reserved_mib"] - m["pool_reserved_mib"]) > 0.05) if prev else True
                    if m["stage"] != "ubatch" or moved:
                        fell = f"{prev['free_mib'] - m['free_mib']:,.1f}" if prev else "–"
                        grew = f"{m['pool_reserved_mib'] - prev['pool_reserved_mib']:,.1f}" if prev else "–"
                        lines.append(f"| {Path(folder).name}/{r['name']} | {m['stage']} | {m['free_mib']:,.1f} | "
                                     f"{m['pool_reserved_mib']:,.1f} | {fell} | {grew} |")
                    prev = m
    lines.append("<!-- predict-memory: end -->")
    print("\n".join(lines))


def add_sweeps(a) -> None:
    models = dict(g.split(":", 1) for g in a.gguf)
    for pj in sorted(Path(a.folder).glob("*.ctx.plan.json")):
        p = json.loads(pj.read_text())
        c = p["check"]
        if c["engine"] != "ik-llama":
            continue
        name = pj.name[: -len(".ctx.plan.json")]
        shape, free = name.rsplit("-", 1)
        gguf = next(f for n, f in models.items() if shape.startswith(n))
        p["sweep"] = predict_sweep(a.repro, gguf, float(free), c["engine"], c["ctx"], c["pool"], c["purge"])
        pj.write_text(json.dumps(p, indent=1) + "\n")
        print(f"predict-check: {name}: the sweep dies at token {p['sweep']['oom_at_token']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bin", required=True)
    r.add_argument("--repro", required=True, help="the repro-prefill binary")
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=int, default=240)
    r.add_argument("--engine", default="llama", choices=["llama", "llama-b8833", "ik-llama"],
                   help="the engine profile to plan with (llama-b8833 for mainline with CUPOOL_FA_KV=pool)")
    r.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="for every engine run (seed.py)")
    r.add_argument("--pool", default="vmm")
    r.add_argument("--purge", default="auto")
    r.add_argument("--fix", metavar="POOL:PURGE", help="with a CASE's CTX: also run that context under this")
    r.add_argument("cases", nargs="+")
    p = sub.add_parser("report")
    p.add_argument("folders", nargs="+")
    o = sub.add_parser("report-oom")
    o.add_argument("folders", nargs="+")
    m = sub.add_parser("memory", help="each run's memory lines where the free memory or the pool's reserve moved")
    m.add_argument("folders", nargs="+")
    w = sub.add_parser("sweep", help="add `predict --sweep`'s plan of each ik_llama.cpp run at CTX to DIR's "
                                     "NAME.ctx.plan.json (what `run` records itself)")
    w.add_argument("--repro", required=True)
    w.add_argument("--gguf", required=True, action="append", metavar="NAME:FILE",
                   help="the model of the cases whose name starts with NAME (a header-only file does)")
    w.add_argument("folder")
    a = ap.parse_args()
    {"run": run, "report": report, "report-oom": report_oom, "memory": memory, "sweep": add_sweeps}[a.cmd](a)


if __name__ == "__main__":
    main()
