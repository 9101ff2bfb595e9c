#!/usr/bin/env python3
"""Serves a load through llama-server, once per pool configuration, and records every request and
each server's device memory every second.

    python3 scripts/llama/server-load.py --bin BUILD/build/bin --model M.gguf --out DIR CONFIG [CONFIG ...]

A CONFIG is NAME:POOL[:PURGE]: POOL is ggml (ggml's own pools, GGML_POOL unset) or a cupool kind
(vmm, legacy, ...); PURGE is CUPOOL_PURGE (auto when omitted). Every configuration's server runs
at the same time on the same GPU, each with its own client, so that all of them see the same
machine for the same minutes: tokens/s are per server while sharing the GPU, memory is each
server process's own (NVML's per-process figure, from nvidia-smi); the device's used memory (what
cuMemGetInfo reports as total less free) is sampled beside it. Every client draws the same
requests (the same seed), so the configurations serve the same mix. Each server gets --threads CPU
threads (default: the cores shared out), since every server's CPU threads spinning on all cores
starve the others.

The client keeps between --min-conc and --max-conc requests in flight (a new level every 15 s),
each a prompt of random token ids (log-uniform length in [--prompt-min, --prompt-max]) and a
generation of a uniform length in [--gen-min, --gen-max] with top-k sampling and the end of text
ignored, so every request produces the tokens it asked for.

Writes DIR/NAME.log (the server's output), DIR/requests.jsonl (one object per request),
DIR/samples.jsonl (each second: each server's process memory, cupool's latest pool reserve from
its log, requests answered so far) and DIR/summary.json (per configuration: requests answered and
failed, tokens/s, memory after warm-up and its drift).
"""
import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

MEMORY = re.compile(rb"cupool: memory device=\d+ stage=[\w-]+ free_mib=[\d.]+ total_mib=[\d.]+ "
                    rb"pool_reserved_mib=([\d.]+) buffers_mib=([\d.]+)")


def parse_config(spec: str) -> dict:
    m = re.fullmatch(r"([\w.-]+):(\w+)(?::(\w+))?", spec)
    if not m:
        sys.exit(f"server-load: configuration {spec!r} is not NAME:POOL[:PURGE]")
    name, pool, purge = m.groups()
    return {"name": name, "pool": pool, "purge": purge or ("auto" if pool != "ggml" else None)}


class Server:
    def __init__(self, a, cfg: dict, port: int):
        self.cfg, self.port = cfg, port
        self.name = cfg["name"]
        self.log_path = Path(a.out) / f"{self.name}.log"
        env = dict(os.environ)
        env.pop("GGML_POOL", None)
        if cfg["pool"] != "ggml":
            env.update(GGML_POOL=cfg["pool"], CUPOOL_PURGE=cfg["purge"], CUPOOL_LOG="info")
        cmd = [str(Path(a.bin) / "llama-server"), "-m", a.model, "--host", "127.0.0.1", "--port", str(port),
               "-np", str(a.parallel), "-c", str(a.ctx), "--kv-unified", "-b", "2048", "-ub", "512", "-fa", "on",
               "-ctk", a.kv, "-ctv", a.kv, "-ngl", "99", "--metrics", "--no-webui",
               "-t", str(a.threads), "-tb", str(a.threads)]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.lock = threading.Lock()
        self.done = self.failed = self.prompt_tokens = self.gen_tokens = 0
        self.log_offset = 0
        self.pool_mib = self.buffers_mib = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, timeout: float) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=5) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        return False

    def latest_pool(self):
        """cupool's latest memory line in the server's log since the last look."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                chunk = f.read()
        except OSError:
            return
        cut = chunk.rfind(b"\n") + 1
        self.log_offset += cut
        found = MEMORY.findall(chunk[:cut])
        if found:
            self.pool_mib, self.buffers_mib = (float(x) for x in found[-1])


def request(srv: Server, rng: random.Random, a, out, out_lock) -> None:
    n_prompt = int(round(math.exp(rng.uniform(math.log(a.prompt_min), math.log(a.prompt_max)))))
    n_gen = rng.randint(a.gen_min, a.gen_max)
    body = {"prompt": [rng.randrange(a.token_min, a.vocab) for _ in range(n_prompt)], "n_predict": n_gen,
            "top_k": 40, "temperature": 0.8, "seed": rng.randrange(1 << 31), "ignore_eos": True,
            "cache_prompt": False, "stream": False}
    req = urllib.request.Request(srv.url("/completion"), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    rec = {"config": srv.name, "t0": round(t0, 3), "n_prompt": n_prompt, "n_gen": n_gen}
    try:
        with urllib.request.urlopen(req, timeout=a.request_timeout) as r:
            res = json.loads(r.read())
        rec.update(ok=True, prompt_tokens=res.get("tokens_evaluated"), gen_tokens=res.get("tokens_predicted"))
    except urllib.error.HTTPError as e:
        rec.update(ok=False, error=f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        rec.update(ok=False, error=f"{type(e).__name__}: {e}")
    rec["seconds"] = round(time.time() - t0, 3)
    with srv.lock:
        if rec["ok"]:
            srv.done += 1
            srv.prompt_tokens += rec.get("prompt_tokens") or 0
            srv.gen_tokens += rec.get("gen_tokens") or 0
        else:
            srv.failed += 1
    with out_lock:
        out.write(json.dumps(rec) + "\n")
        out.flush()


def client(srv: Server, a, deadline: float, out, out_lock, seed: int) -> None:
    """--max-conc workers, of which the first `level` send requests; the level changes every 15 s."""
    level = [a.max_conc]
    rng = random.Random(seed)

    def worker(i: int) -> None:
        wr = random.Random(seed * 1000 + i)
        while time.time() < deadline and srv.proc.poll() is None:
            if i >= level[0]:
                time.sleep(0.2)
                continue
            request(srv, wr, a, out, out_lock)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.max_conc)]
    for t in threads:
        t.start()
    while time.time() < deadline:
        level[0] = rng.randint(a.min_conc, a.max_conc)
        time.sleep(min(15, max(0, deadline - time.time())))
    for t in threads:
        t.join(timeout=a.request_timeout)


def nvidia_smi(query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def device_used() -> int | None:
    """The first GPU's used memory (MiB): its total less what cuMemGetInfo would call free."""
    first = nvidia_smi("--query-gpu=memory.used").strip().splitlines()[:1]
    return int(first[0]) if first and first[0].strip().isdigit() else None


def process_memory() -> dict:
    """Each GPU process's memory (MiB), by pid, as NVML reports it."""
    out = nvidia_smi("--query-compute-apps=pid,used_memory")
    mem = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            mem[int(parts[0])] = int(parts[1])
    return mem


def sampler(servers, t_start: float, deadline: float, path: Path) -> None:
    with open(path, "w") as f:
        while time.time() < deadline:
            t = time.time()
            mem, used = process_memory(), device_used()
            for s in servers:
                s.latest_pool()
                with s.lock:
                    row = {"t": round(t - t_start, 1), "config": s.name, "process_mib": mem.get(s.proc.pid),
                           "pool_reserved_mib": s.pool_mib, "buffers_mib": s.buffers_mib, "answered": s.done,
                           "failed": s.failed, "gen_tokens": s.gen_tokens, "prompt_tokens": s.prompt_tokens,
                           "alive": s.proc.poll() is None, "device_used_mib": used}
                f.write(json.dumps(row) + "\n")
            f.flush()
            time.sleep(max(0.0, 1.0 - (time.time() - t)))


def summarize(servers, samples: Path, duration: float, warm_up: float) -> dict:
    rows = [json.loads(x) for x in samples.read_text().splitlines() if x.strip()]
    out = {}
    for s in servers:
        mine = [r for r in rows if r["config"] == s.name and r["process_mib"] is not None]
        after = [r for r in mine if r["t"] >= warm_up]
        first = [r["process_mib"] for r in after if r["t"] < warm_up + 60]
        last = [r["process_mib"] for r in after if r["t"] >= duration - 60]
        pool = [r["pool_reserved_mib"] for r in rows if r["config"] == s.name and r["t"] >= warm_up
                and r["pool_reserved_mib"] is not None]
        out[s.name] = {
            **s.cfg, "answered": s.done, "failed": s.failed, "prompt_tokens": s.prompt_tokens,
            "gen_tokens": s.gen_tokens, "seconds": round(duration, 1),
            "tokens_per_s": round((s.prompt_tokens + s.gen_tokens) / duration, 1),
            "gen_tokens_per_s": round(s.gen_tokens / duration, 1),
            "alive_at_end": s.proc.poll() is None,
            "process_mib_peak": max((r["process_mib"] for r in mine), default=None),
            "process_mib_after_warm_up": [min((r["process_mib"] for r in after), default=None),
                                          max((r["process_mib"] for r in after), default=None)],
            "drift_mib": round(sum(last) / len(last) - sum(first) / len(first), 1) if first and last else None,
            "pool_reserved_mib_after_warm_up": [min(pool), max(pool)] if pool else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--duration", type=float, default=660, help="seconds of load per configuration")
    ap.add_argument("--warm-up", type=float, default=60, help="seconds before memory counts as settled")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--kv", default="q8_0")
    ap.add_argument("--vocab", type=int, default=32064, help="the model's vocabulary (prompts draw ids below it)")
    ap.add_argument("--token-min", type=int, default=100, help="the smallest token id drawn (skips control tokens)")
    ap.add_argument("--min-conc", type=int, default=4)
    ap.add_argument("--max-conc", type=int, default=8)
    ap.add_argument("--prompt-min", type=int, default=16)
    ap.add_argument("--prompt-max", type=int, default=8000)
    ap.add_argument("--gen-min", type=int, default=16)
    ap.add_argument("--gen-max", type=int, default=256)
    ap.add_argument("--request-timeout", type=float, default=600)
    ap.add_argument("--port", type=int, default=18080, help="the first server's port; the next ones count up")
    ap.add_argument("--seed", type=int, default=0, help="every client's seed: the servers get the same requests")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads per server (default: cores / servers)")
    ap.add_argument("configs", nargs="+")
    a = ap.parse_args()
    if not (1 <= a.min_conc <= a.max_conc and 1 <= a.prompt_min <= a.prompt_max and 1 <= a.gen_min <= a.gen_max
            and 0 <= a.token_min < a.vocab):
        sys.exit("server-load: need 1 <= --min-conc <= --max-conc, --prompt-min <= --prompt-max, "
                 "--gen-min <= --gen-max and --token-min below --vocab")
    cfgs = [parse_config(c) for c in a.configs]
    if a.threads <= 0:
        a.threads = max(1, (os.cpu_count() or 1) // len(cfgs))
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    servers = [Server(a, c, a.port + i) for i, c in enumerate(cfgs)]
    try:
        for s in servers:
            if not s.wait_ready(600):
                sys.exit(f"server-load: {s.name}'s server did not become ready; see {s.log_path}")
        print(f"server-load: {len(servers)} servers ready", flush=True)
        t_start = time.time()
        deadline = t_start + a.duration
        out_lock = threading.Lock()
        with open(out_dir / "requests.jsonl", "w") as out:
            threads = [threading.Thread(target=client, args=(s, a, deadline, out, out_lock, a.seed))
                       for s in servers]
            samp = threading.Thread(target=sampler, args=(servers, t_start, deadline, out_dir / "samples.jsonl"))
            for t in [*threads, samp]:
                t.start()
            for t in [*threads, samp]:
                t.join()
        summary = summarize(servers, out_dir / "samples.jsonl", a.duration, a.warm_up)
        summary["_run"] = {k: v for k, v in vars(a).items() if k not in ("bin", "out")}
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        for name, x in summary.items():
            if not name.startswith("_"):
                print(f"server-load: {name}: {x['answered']} answered, {x['failed']} failed, "
                      f"{x['tokens_per_s']} tok/s, process {x['process_mib_after_warm_up']} MiB after warm-up, "
                      f"drift {x['drift_mib']} MiB", flush=True)
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGINT)
        for s in servers:
            try:
                s.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                s.proc.kill()
            s.log.close()


if __name__ == "__main__":
    main()
