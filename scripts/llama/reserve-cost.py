#!/usr/bin/env python3
"""What mainline llama.cpp's up-front reservation costs: the device memory a llama-server holds
idle, while serving short requests and after one long request, per context size and per
placement of flash attention's f16 K/V copies.

    python3 scripts/llama/reserve-cost.py run --bin BUILD/build/bin --model M.gguf --out DIR \\
        --ctx 32768 131072 262144 CONFIG [CONFIG ...]
    python3 scripts/llama/reserve-cost.py report DIR

A CONFIG is NAME:POOL[:PURGE][/FA]: POOL is ggml (ggml's own pools, GGML_POOL unset) or a cupool
kind; PURGE is CUPOOL_PURGE (auto when omitted); FA is CUPOOL_FA_KV, buffer (upstream since PR
#23907: the copies live in the compute buffer, reserved at start-up for the whole context) or
pool (from cupool's pool per call, sized by the KV length in use).

For each context and configuration, one after another on the same GPU, one llama-server
(-np 1, flash attention, q8_0 cache) is started and, with its process memory (NVML, every 0.25 s)
sampled: left idle, sent --requests short requests (prompts log-uniform in 16..8000 tokens,
16..64 generated, one at a time; the same seeded requests for every configuration), left idle,
sent one long request (--long tokens), left idle, stopped. One JSON line per run goes to
DIR/reserve.jsonl, each server's output to DIR/NAME-cCTX.log. `report` prints the table
docs/llama-cpp.md keeps.
"""
import argparse
import importlib.util
import json
import os
import random
import re
import signal
import statistics
import sys
import tarfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("server_load", HERE / "server-load.py")
load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(load)

# cupool's memory line after the context's buffers (weights, KV cache, compute buffer) exist
BUFFERS = re.compile(r"stage=context-created free_mib=[\d.]+ total_mib=[\d.]+ pool_reserved_mib=[\d.]+ "
                     r"buffers_mib=([\d.]+)")


def parse_config(s: str) -> dict:
    m = re.fullmatch(r"([\w.-]+):(\w+)(?::(\w+))?(?:/(buffer|pool))?", s)
    if not m:
        sys.exit(f"reserve-cost: configuration {s!r} is not NAME:POOL[:PURGE][/buffer|/pool]")
    name, pool, purge, fa = m.groups()
    if pool == "ggml" and fa == "pool":
        sys.exit(f"reserve-cost: {s}: CUPOOL_FA_KV=pool needs a cupool pool (GGML_POOL)")
    return {"name": name, "pool": pool, "purge": purge or ("auto" if pool != "ggml" else None),
            "fa_kv": fa or "buffer"}


class Sampler(threading.Thread):
    """The server process's memory every 0.25 s, each sample tagged with the phase it fell in."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.phase, self.samples, self.stop = pid, "start", [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            mib = load.process_memory().get(self.pid)
            if mib is not None:
                self.samples.append((self.phase, mib))
            time.sleep(0.25)

    def of(self, *phases) -> list:
        return [m for p, m in self.samples if p in phases]


def one(a, cfg: dict, ctx: int, port: int) -> dict:
    os.environ["CUPOOL_FA_KV"] = cfg["fa_kv"]
    name = f"{cfg['name']}-c{ctx}"
    ns = argparse.Namespace(out=a.out, bin=a.bin, model=a.model, parallel=1, ctx=ctx, kv=a.kv, threads=a.threads,
                            prompt_min=16, prompt_max=8000, gen_min=16, gen_max=64, vocab=a.vocab,
                            token_min=100, request_timeout=600)
    srv = load.Server(ns, dict(cfg, name=name), port)
    rec = {**cfg, "ctx": ctx, "name": name}
    t0 = time.time()
    if not srv.wait_ready(a.ready_timeout):
        srv.proc.kill()
        srv.proc.wait()
        return {**rec, "started": False, "log_tail": srv.log_path.read_text(errors="replace")[-600:]}
    rec.update(started=True, start_seconds=round(time.time() - t0, 1))
    smp = Sampler(srv.proc.pid)
    smp.start()
    out_lock, out = threading.Lock(), open(Path(a.out) / "requests.jsonl", "a")

    def phase(p: str, seconds: float) -> None:
        smp.phase = p
        time.sleep(seconds)

    phase("idle", 3)
    smp.phase = "short"
    rng = random.Random(a.seed)
    t_short = time.time()
    for _ in range(a.requests):
        load.request(srv, rng, ns, out, out_lock)
    short_s = time.time() - t_short
    short = (srv.done, srv.failed, srv.prompt_tokens, srv.gen_tokens)
    phase("after-short", 3)
    smp.phase = "long"
    long_prompt = min(a.long, ctx - 64)
    t_long = time.time()
    load.request(srv, random.Random(a.seed + 1), ns, out, out_lock, oversized=long_prompt)
    long_s = time.time() - t_long
    phase("after-long", 3)
    smp.stop.set()
    smp.join()
    out.close()
    srv.latest_pool()
    srv.proc.send_signal(signal.SIGTERM)
    try:
        srv.proc.wait(timeout=60)
    except Exception:
        srv.proc.kill()
        srv.proc.wait()
    log = srv.log_path.read_text(errors="replace")
    buffers = BUFFERS.findall(log)
    long_rec = srv.oversized[0] if srv.oversized else {}
    rec.update({
        "buffers_mib": float(buffers[-1]) if buffers else None,
        "idle_mib": statistics.median(smp.of("idle")) if smp.of("idle") else None,
        "short_peak_mib": max(smp.of("short"), default=None),
        "after_short_mib": min(smp.of("after-short"), default=None),
        "long_peak_mib": max(smp.of("long"), default=None),
        "after_long_mib": min(smp.of("after-long"), default=None),
        "short_answered": short[0], "short_failed": short[1],
        "short_prompt_tokens": short[2], "short_gen_tokens": short[3], "short_seconds": round(short_s, 2),
        "long_prompt": long_prompt, "long_ok": bool(long_rec.get("ok")), "long_error": long_rec.get("error"),
        "long_seconds": round(long_s, 2), "pool_reserved_mib_last": srv.pool_mib,
        "samples": len(smp.samples), "exit": srv.proc.returncode,
    })
    return rec


def run(a) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfgs = [parse_config(c) for c in a.configs]
    with open(out / "reserve.jsonl", "a") as f:
        for ctx in a.ctx:
            for i, cfg in enumerate(cfgs):
                rec = one(a, cfg, ctx, a.port + i)
                print(f"reserve-cost: {rec['name']}: " + ", ".join(
                    f"{k}={rec.get(k)}" for k in ("started", "buffers_mib", "idle_mib", "short_peak_mib",
                                                  "long_peak_mib", "after_long_mib", "short_failed", "long_ok")),
                      flush=True)
                f.write(json.dumps(rec) + "\n")
                f.flush()


def fmt(x) -> str:
    return "–" if x is None else f"{x:,.0f}"


def logged_buffers(d: Path, r: dict):
    """The buffers line of a run that predates the buffers_mib field, from the kept logs."""
    logs = d / "logs.tar.gz"
    if r.get("buffers_mib") is not None or r["pool"] == "ggml" or not logs.exists():
        return r.get("buffers_mib")
    with tarfile.open(logs) as tar:
        for m in tar.getmembers():
            if m.name.endswith(f"{r.get('run', '')}/{r['name']}.log"):
                found = BUFFERS.findall(tar.extractfile(m).read().decode(errors="replace"))
                return float(found[-1]) if found else None
    return None


def report(a) -> None:
    d = Path(a.dir)
    rows = [json.loads(x) for x in (d / "reserve.jsonl").read_text().splitlines() if x.strip()]
    order = {"ggml": 0, "buffer": 1, "pool": 2}
    rows.sort(key=lambda r: (r["ctx"], order["ggml" if r["pool"] == "ggml" else r["fa_kv"]], r["pool"]))
    longs = {r["long_prompt"] for r in rows if r.get("started")}
    long_name = f"one request of {longs.pop():,} tokens" if len(longs) == 1 else "one long request"
    print("| `-c` | configuration | ggml's buffers (MiB) | idle (MiB) | serving short requests, peak | "
          f"after them | {long_name}, peak | after it | short requests answered | GPU shared |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        label = "ggml's pools" if r["pool"] == "ggml" else f"cupool `{r['pool']}`, K/V copies in the {r['fa_kv']}"
        if not r.get("started"):
            print(f"| {r['ctx']:,} | {label} | did not start | | | | | | | |")
            continue
        long_ = fmt(r["long_peak_mib"]) + ("" if r["long_ok"] else " (failed)")
        shared = "with the load test" if r.get("run") == "first" else "no"
        print(f"| {r['ctx']:,} | {label} | {fmt(logged_buffers(d, r))} | {fmt(r['idle_mib'])} | "
              f"{fmt(r['short_peak_mib'])} | {fmt(r['after_short_mib'])} | {long_} | {fmt(r['after_long_mib'])} | "
              f"{r['short_answered']}/{r['short_answered'] + r['short_failed']} | {shared} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bin", required=True)
    r.add_argument("--model", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--ctx", type=int, nargs="+", default=[32768, 131072, 262144])
    r.add_argument("--kv", default="q8_0")
    r.add_argument("--vocab", type=int, default=128256, help="the model's vocabulary (prompts draw ids below it)")
    r.add_argument("--requests", type=int, default=24, help="short requests per run")
    r.add_argument("--long", type=int, default=30000, help="the long request's prompt tokens (capped by -c)")
    r.add_argument("--threads", type=int, default=8)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--port", type=int, default=18280)
    r.add_argument("--ready-timeout", type=float, default=300)
    r.add_argument("configs", nargs="+")
    p = sub.add_parser("report")
    p.add_argument("dir")
    a = ap.parse_args()
    run(a) if a.cmd == "run" else report(a)


if __name__ == "__main__":
    main()
