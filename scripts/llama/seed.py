#!/usr/bin/env python3
"""Runs the 12 GiB-card scenario in the real engine: llama-sweep-bench with each pool, on a card made
smaller by the ballast, and writes what each run did as JSON lines.

    python3 scripts/llama/seed.py --bin BUILD/build/bin --model M.gguf --out DIR RUN [RUN ...]

A RUN is NAME:POOL[:PURGE][@CARD_GIB][#DEVICES]: POOL is ggml (ggml's own pools, GGML_POOL unset)
or a cupool kind (legacy, vmm, ...); PURGE is CUPOOL_PURGE (auto when omitted); CARD_GIB is the
free memory the ballast leaves on each device used (the whole card when omitted); DEVICES is how
many GPUs the engine may use (1 when omitted; more runs it with -sm layer). A NAME ending in
"-trace" records the pool's trace to DIR/NAME.trace.jsonl. Each run's output is DIR/NAME.log;
DIR/runs.jsonl gets one object per run: exit status, whether it ran out of memory and at which
KV length, the sweep's rows (KV length, prefill seconds and tokens/s, device memory used), prefill
tokens/s over the whole sweep, cupool's per-ubatch peaks and its final statistics.

With --bench llama-bench each run is instead `llama-bench -p PROMPT -n 0 -r REPS` (whole prompts
of PROMPT tokens in ubatches of --ubatch (512), the KV cache emptied between repetitions, so each repetition
grows the flash-attention buffers from scratch): the JSON gets each repetition's prefill tokens/s.
With --pg P,G it is `llama-bench -p 0 -n 0 -pg P,G -r REPS` instead: a prompt of P tokens, then G
tokens generated one at a time (after the warm-up's whole prompt and one generated token); with
GGML_CUDA_DISABLE_GRAPHS=1 every one-token step reaches the pool, so its trace holds them all.
--env NAME=VALUE (repeatable) sets a variable for every run (e.g. GGML_CUDA_DISABLE_GRAPHS=1).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

UBATCH = re.compile(
    r"ubatch end ubatch=(\d+) device=(\d+) peak_reserved=(\d+) peak_live=(\d+) released=(\d+) synchronized=(\w+)"
)
STATS = re.compile(r"^cupool: device (\d+) stats (\{.*\})$")
OOM = re.compile(r"out of memory|out of device memory|allocating \d+ bytes failed", re.I)
# Mainline's start-up hold: what a context's computes took outside buffers and pools, what was
# held for them, and the context cupool's start-up report says fits.
HOLD = re.compile(r"this context's computes took ([\d.]+) MiB outside ggml's buffers and pools \(held for them at start-up: ([\d.]+) MiB\)")
FITS = re.compile(r"(?:about|at most) -c (\d+) fits")
MEMORY = re.compile(r"^cupool: memory device=(\d+) stage=([\w-]+) free_mib=([\d.]+) total_mib=([\d.]+) "
                    r"pool_reserved_mib=([\d.]+) buffers_mib=([\d.]+)$", re.M)
START_FAILED = re.compile(r"cupool: start-up:|failed to create context|failed to initialize")


def failure_phase(out: str, rc) -> str | None:
    """Where a run that did not complete stopped: at start-up (context creation) or in a compute."""
    if rc == 0:
        return None
    if START_FAILED.search(out):
        return "start-up"
    # ggml aborts on a CUDA error inside a compute (an out-of-memory loading a kernel's module
    # shows only as "CUDA error" without -v), after the graph was handed to the backend
    if OOM.search(out) or ("CUDA error" in out and "graph_compute" in out):
        return "compute"
    return "other"


def ubatches_before_oom(out: str, rc) -> int | None:
    """The ubatches whose end cupool logged before the first out-of-memory report of a run that
    failed: the failing ubatch's own end is logged after its report (mainline's llama_decode marks
    the end of a ubatch that failed too)."""
    oom = OOM.search(out) if rc != 0 else None
    return len(UBATCH.findall(out[:oom.start()])) if oom else None


def parse_run(spec: str) -> dict:
    m = re.fullmatch(r"([\w.-]+):(\w+)(?::(\w+))?(?:@([\d.]+))?(?:#(\d+))?", spec)
    if not m:
        sys.exit(f"seed: run {spec!r} is not NAME:POOL[:PURGE][@CARD_GIB][#DEVICES]")
    name, pool, purge, card, devices = m.groups()
    return {
        "name": name,
        "pool": pool,
        "purge": purge or ("auto" if pool != "ggml" else None),
        "card_gib": float(card) if card else None,
        "devices": int(devices or 1),
    }


def start_ballast(bin_dir: Path, card_gib: float, device: int) -> subprocess.Popen:
    p = subprocess.Popen(
        [str(bin_dir / "ballast"), str(card_gib), str(device)],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline().strip()
    if not line.startswith("ballast:"):
        p.kill()
        sys.exit(f"seed: the ballast did not start on device {device}: {line!r}")
    print(line, flush=True)
    return p


def run_one(a, r: dict) -> dict:
    env = dict(os.environ)
    env.pop("GGML_POOL", None)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in range(r["devices"]))
    env.update(a.env)
    if r["pool"] != "ggml":
        env["GGML_POOL"] = r["pool"]
        env["CUPOOL_PURGE"] = r["purge"]
        env["CUPOOL_LOG"] = "info"
        if r["name"].endswith("-trace"):
            env["CUPOOL_TRACE"] = str(Path(a.out) / f"{r['name']}.trace.jsonl")
    common = ["-m", a.model, "-b", "2048", "-ub", str(a.ubatch), "-fa", "1", "-ctk", a.kv, "-ctv", a.kv, "-ngl", "99"]
    if a.bench == "llama-bench" and a.pg:
        cmd = [str(Path(a.bin) / "llama-bench"), *common, "-p", "0", "-n", "0", "-pg", f"{a.pg[0]},{a.pg[1]}",
               "-r", str(a.reps), "-o", "json"]
    elif a.bench == "llama-bench":
        cmd = [str(Path(a.bin) / "llama-bench"), *common, "-p", str(a.prompt), "-n", str(a.gen), "-r", str(a.reps),
               "-o", "json"]
    else:
        cmd = [str(Path(a.bin) / "llama-sweep-bench"), *common, "-c", str(a.ctx), "-n", "1",
               "--output-format", "jsonl", "--sweep-memory"]
    if r["devices"] > 1:
        cmd += ["-sm", "layer"]
    if a.verbose:
        cmd.append("-v")  # the engine's buffer sizes (model, KV, compute) in the log
    ballasts = [start_ballast(Path(a.bin), r["card_gib"], d) for d in range(r["devices"])] if r["card_gib"] else []
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
        stdout, out, rc = p.stdout, p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        stdout = (e.stdout or b"").decode()
        out, rc = stdout + (e.stderr or b"").decode(), "timeout"
    finally:
        for b in ballasts:
            b.terminate()
            try:
                b.wait(timeout=20)
            except subprocess.TimeoutExpired:
                b.kill()
                b.wait()
    (Path(a.out) / f"{r['name']}.log").write_text(out)
    rows = []
    for line in out.splitlines():
        if line.startswith("{") and '"n_kv"' in line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    ubatches = [
        dict(zip(("ubatch", "device", "peak_reserved", "peak_live", "released"), map(int, m.groups()[:5])),
             synchronized=m.group(6) == "true")
        for m in UBATCH.finditer(out)
    ]
    stats = {int(m.group(1)): json.loads(m.group(2)) for m in map(STATS.match, out.splitlines()) if m}
    pp_tokens = sum(x["pp"] for x in rows)
    pp_seconds = sum(x["t_pp"] for x in rows)
    oom = bool(OOM.search(out)) and rc != 0
    holds = [(float(m.group(1)), float(m.group(2))) for m in HOLD.finditer(out)]
    memory = [dict(device=int(m.group(1)), stage=m.group(2), free_mib=float(m.group(3)), total_mib=float(m.group(4)),
                   pool_reserved_mib=float(m.group(5)), buffers_mib=float(m.group(6))) for m in MEMORY.finditer(out)]
    fits = FITS.search(out)
    res = dict(r, rc=rc, seconds=round(time.time() - t0, 1), oom=oom, env=a.env,
               failed_at=failure_phase(out, rc),
               hold_taken_mib=max((h[0] for h in holds), default=None),
               hold_mib=holds[0][1] if holds else None,
               fits_ctx=int(fits.group(1)) if fits else None,
               memory=memory,
               last_n_kv=rows[-1]["n_kv"] if rows else None,
               ubatches_before_oom=ubatches_before_oom(out, rc),
               prefill_tok_s=round(pp_tokens / pp_seconds, 1) if pp_seconds else None,
               rows=[{k: x.get(k) for k in ("n_kv", "t_pp", "speed_pp", "vram_delta_mib")} for x in rows],
               ubatches=ubatches, stats=stats)
    if a.bench == "llama-bench":
        res.update(bench_result(stdout, *(a.pg or (a.prompt, 0))))
    tail = "OOM after n_kv=%s" % res["last_n_kv"] if oom else "rc=%s" % rc
    if res["failed_at"]:
        tail += f", failed at {res['failed_at']}" + (f" (fits: -c {res['fits_ctx']})" if res["fits_ctx"] else "")
    if res["hold_taken_mib"] is not None:
        tail += f", computes took {res['hold_taken_mib']} MiB outside buffers (held {res['hold_mib']})"
    print(f"seed: {r['name']}: {tail}, {res['prefill_tok_s']} tok/s, {len(rows)} rows, {res['seconds']} s", flush=True)
    return res


def bench_result(stdout: str, prompt: int, gen: int = 0) -> dict:
    """llama-bench's JSON (an array of tests): the prompt test's (with `gen`, the prompt and
    generation test's) per-repetition tokens/s."""
    m = re.search(r"^\[$", stdout, re.M)  # the array starts on a line of its own
    try:
        tests = json.loads(stdout[m.start():]) if m else []
    except json.JSONDecodeError:
        tests = []
    pp = [x for x in tests if x.get("n_prompt") == prompt and x.get("n_gen") == gen]
    out = {"prompt": prompt, **({"gen": gen} if gen else {})}
    if not pp:
        return {**out, "samples_tok_s": [], "prefill_tok_s": None}
    # with generated tokens llama-bench's tokens/s are over the prompt and the generation together
    key = "tok_s" if gen else "prefill_tok_s"
    return {**out, "samples_tok_s": [round(v, 1) for v in pp[0].get("samples_ts", [])], key: round(pp[0]["avg_ts"], 1)}


def prompt_gen(s: str) -> tuple:
    """`P,G` (llama-bench's -pg): P prompt tokens, then G generated."""
    m = re.fullmatch(r"(\d+),(\d+)", s)
    if not m or int(m.group(1)) == 0 or int(m.group(2)) == 0:
        raise argparse.ArgumentTypeError(f"{s!r} is not P,G (two positive token counts)")
    return int(m.group(1)), int(m.group(2))


def env_pair(s: str) -> tuple:
    name, eq, value = s.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"{s!r} is not NAME=VALUE")
    return name, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctx", type=int, default=20480)
    ap.add_argument("--kv", default="q8_0")
    ap.add_argument("--ubatch", type=int, default=512, help="the engine's -ub (its -b stays 2048)")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--bench", choices=["sweep", "llama-bench"], default="sweep")
    ap.add_argument("--prompt", type=int, default=16384, help="llama-bench: prompt tokens")
    ap.add_argument("--reps", type=int, default=3, help="llama-bench: repetitions")
    ap.add_argument("--gen", type=int, default=0, help="llama-bench: tokens generated after the prompt test")
    ap.add_argument("--pg", type=prompt_gen, metavar="P,G",
                    help="llama-bench: one test of a P-token prompt then G generated tokens (-p 0 -n 0 -pg P,G)")
    ap.add_argument("--verbose", action="store_true", help="run the engine with -v (its buffer sizes in the log)")
    ap.add_argument("--env", type=env_pair, action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    a.env = dict(a.env)
    if a.pg and a.bench != "llama-bench":
        ap.error("--pg is a llama-bench test: add --bench llama-bench")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / "runs.jsonl", "a") as f:
        for spec in a.runs:
            f.write(json.dumps(run_one(a, parse_run(spec))) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
