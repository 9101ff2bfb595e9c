#!/usr/bin/env python3
"""The tables of docs/llama-cpp.md's "Two GPUs" section from what scripts/llama/two-gpu.sh wrote
(its $OUT: runs.jsonl, gpu.txt, results.tar.gz), and the fixtures profiles/tests/mainline_two_gpus.rs
and profiles/tests/ik_two_gpus.rs read:

    python3 scripts/llama/two-gpu-report.py DATA_DIR [--predicted FILE] [--fixtures DEST]

DATA_DIR holds results.tar.gz (or the folder two-gpu-ENGINE it packs, unpacked) and runs.jsonl.
Prints, in markdown:

- per run and device: the layers the device held, the pool requests its trace holds (and whether
  that is the device's own count in the shim's closing statistics: trace stream d is device d),
  the peak pool reserve the device's pool reported, and the profile's (from --predicted: the
  JSON lines `CUPOOL_TWO_GPUS_SUMMARY=FILE cargo test -p cupool-profiles --test
  mainline_two_gpus` writes once the fixtures are in place, `CUPOOL_IK_TWO_GPUS_SUMMARY` and
  `--test ik_two_gpus` for ik_llama.cpp; the fixtures keep them as predicted.jsonl), and the
  run's outcome;
- the out-of-memory case: the device the ballast shrank, the token where `legacy`/`never` died
  there against the plan's for that device's layers (`repro-prefill plan` over a GGUF header of
  them, the output matrix included), the room each gives the pool, and whether `legacy`/`auto`
  completes, planned and real;
- that device's room term by term, as the plan counted it and as the logs measure it (the CUDA
  context, NCCL's communicators, weights, KV cache, compute buffer, what the first computes took
  outside them);
- where DATA_DIR/replan.json is (scripts/llama/two-gpu-replan.py), the plan again with `--free`
  less the measured terms, against the run.

A token is counted as the plan counts it: the tokens processed before the ubatch whose
allocation failed (that device's ubatch-end lines before cupool's failure report), within the
pass that died (mainline's llama-bench warm-up runs the whole prompt first).

--fixtures DEST copies the runs' traces into DEST and writes DEST/runs.json (for
profiles/tests/mainline_two_gpus.rs or, of an ik_llama.cpp folder, profiles/tests/ik_two_gpus.rs):
per run the model, weights, layers, llama-bench's parameters, split mode and tensor split, the
placement the engine logged (mainline: `load_tensors: layer N assigned to device`, ik_llama.cpp:
`Setting default device in layer N to D`), the failed allocation, and each device's allocation
count and peak reserve from the closing statistics. A run whose log places no layers (mainline's
`-sm row`, which fails at load) is left out.
"""
import argparse
import gzip
import json
import math
import re
import sys
import tarfile
from types import SimpleNamespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed import MEMORY, STATS, UBATCH  # noqa: E402  (the shim's log lines, parsed as seed.py does)
import two_gpu_room  # noqa: E402

OOM_AT = re.compile(r"cupool: device (\d+), stream (\d+): allocating (\d+) bytes failed")
OOM_RESERVED = re.compile(r"pool live ([\d.]+) MiB, reserved ([\d.]+) MiB")
MAINLINE_LAYER = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+?),")
IK_LAYER = re.compile(r"Setting default device in layer\s+(\d+) to (\d+)")
LOAD_ERROR = re.compile(r"error loading model: (.+)")
AVG_TS = re.compile(r'"avg_ts":\s*([\d.]+)')
TRACE_ALLOC = re.compile(r'"op":"alloc".*"stream":(\d+)')
USING = re.compile(r"using device CUDA(\d+)\b.* - (\d+) MiB free")
WEIGHTS = re.compile(r"load_tensors:\s+CUDA(\d+) (?:model )?buffer size =\s+([\d.]+) MiB")
KV = re.compile(r"CUDA(\d+) KV buffer size =\s+([\d.]+) MiB")
COMPUTE = re.compile(r"CUDA(\d+) compute buffer size =\s+([\d.]+) MiB")
COMPUTE_EXACT = re.compile(r"CUDA(\d+) compute buffer size is\s+([\d.]+) MiB")
MIB = 2**20


class Data:
    """The results: read from results.tar.gz, or from the unpacked folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.tar = tarfile.open(folder / "results.tar.gz") if (folder / "results.tar.gz").exists() else None
        if self.tar:
            names = self.tar.getnames()
            tops = sorted({n.split("/")[0] for n in names if "/" in n})
            self.prefix = tops[0] + "/" if tops else ""
        else:
            sub = sorted(folder.glob("two-gpu-*/runs.jsonl"))
            self.dir = sub[0].parent if sub else folder

    def has(self, name: str) -> bool:
        if self.tar:
            try:
                self.tar.getmember(self.prefix + name)
                return True
            except KeyError:
                return False
        return (self.dir / name).exists()

    def bytes(self, name: str) -> bytes:
        if self.tar:
            return self.tar.extractfile(self.prefix + name).read()
        return (self.dir / name).read_bytes()

    def text(self, name: str) -> str:
        return self.bytes(name).decode(errors="replace")

    def runs(self) -> list:
        own = self.folder / "runs.jsonl"
        text = own.read_text() if own.exists() else self.text("runs.jsonl")
        return [json.loads(x) for x in text.splitlines() if x.strip()]


def parse_log(engine: str, log: str, n_layer: int) -> dict:
    """What a run's log says: the closing statistics per device, the failed allocation, each
    device's ubatch-end lines (position in the log), memory lines, the placement, tokens/s."""
    stats = {int(m.group(1)): json.loads(m.group(2)) for m in map(STATS.match, log.splitlines()) if m}
    oom = OOM_AT.search(log)
    ubatches = [(m.start(), int(m.group(1)), int(m.group(2))) for m in UBATCH.finditer(log)]
    memory = [dict(device=int(m.group(1)), stage=m.group(2), free_mib=float(m.group(3)),
                   pool_reserved_mib=float(m.group(5)), buffers_mib=float(m.group(6))) for m in MEMORY.finditer(log)]
    if engine == "mainline":
        where = {int(l): (-1 if d == "CPU" else int(d[4:]) if d.startswith("CUDA") else None)
                 for l, d in MAINLINE_LAYER.findall(log)}
    else:
        where = {int(l): int(d) for l, d in IK_LAYER.findall(log)}
    placement = [where.get(l) for l in range(n_layer + 1)]
    reserved_at_oom = None
    if oom:
        m = OOM_RESERVED.search(log, oom.end())
        reserved_at_oom = float(m.group(2)) if m else None
    ts = AVG_TS.findall(log)
    error = LOAD_ERROR.search(log)
    return {"stats": stats, "oom": oom, "ubatches": ubatches, "memory": memory, "placement": placement,
            "reserved_at_oom_mib": reserved_at_oom, "tok_s": float(ts[-1]) if ts else None,
            "error": error.group(1).strip() if error else None}


def trace_allocations(data: Data, name: str) -> dict:
    counts = {}
    for line in gzip.decompress(data.bytes(name)).decode().splitlines():
        m = TRACE_ALLOC.search(line)
        if m:
            counts[int(m.group(1))] = counts.get(int(m.group(1)), 0) + 1
    return counts


def oom_token(run: dict, p: dict):
    """(token, pass) where the run died: the device's ubatch ends before the failure report."""
    if not p["oom"]:
        return None
    dev = int(p["oom"].group(1))
    done = sum(1 for pos, _, d in p["ubatches"] if d == dev and pos < p["oom"].start())
    n_ub = math.ceil(run["n_prompt"] / run["n_ubatch"])
    return (done % n_ub) * run["n_ubatch"], done // n_ub


def layers_text(placement: list, device: int, n_layer: int) -> str:
    on = [l for l in range(n_layer) if placement[l] == device]
    if all(x is None for x in placement):
        return "none placed"
    if any(x is None for x in placement):
        return "(not logged)"
    spans, start = [], None
    for l in range(n_layer + 1):
        if l < n_layer and l in on and start is None:
            start = l
        if start is not None and (l == n_layer or l not in on):
            spans.append(f"{start}–{l - 1}" if l - 1 > start else f"{start}")
            start = None
    text = ", ".join(spans) or "none"
    return text + (" + output" if placement[n_layer] == device else "")


def outcome(run: dict, p: dict) -> str:
    if run["rc"] == 0:
        return "completes" + (f", {p['tok_s']:,.0f} tok/s" if p["tok_s"] else "")
    tok = oom_token(run, p)
    if tok:
        where = " (warm-up)" if run["engine"] == "mainline" and tok[1] == 0 else ""
        return f"**dies** on device {p['oom'].group(1)} at token {tok[0]:,}{where}"
    if p.get("error"):
        return f"exit {run['rc']} at model load: `{p['error']}`"
    return f"exit {run['rc']}"


def mib(x, digits=1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def plan_room(p: dict) -> float:
    o = p["outside"]
    return (p["device_bytes"] - p["weights_bytes"] - p["kv_bytes"] - p["compute_bytes"] - sum(o.values())
            + o.get("shim_hold_bytes", 0)) / MIB


def real_room(p: dict, dev: int):
    """The room the pool had on `dev`: free memory plus the pool's reserve at the first ubatch
    end (everything else is allocated by then), less what the pool held when the context was
    created (nothing: the pools allocate only in computes; ik_llama.cpp's shim logs no such line)."""
    mem = [m for m in p["memory"] if m["device"] == dev]
    created = next((m for m in mem if m["stage"] == "context-created"), None)
    first = next((m for m in mem if m["stage"] == "ubatch"), None)
    if not first:
        return None
    return first["free_mib"] + first["pool_reserved_mib"] - (created["pool_reserved_mib"] if created else 0.0)


def logged_mib(pattern: re.Pattern, log: str, dev: int):
    """The first MiB figure a pattern's line gives for device `dev` (group 1 the device)."""
    return next((float(m.group(2)) for m in pattern.finditer(log) if int(m.group(1)) == dev), None)


def room_terms(run: dict, p: dict, log: str, plan: dict, dev: int):
    """What lies between the free memory before start and the pool's room on `dev`, term by
    term, as the plan counted it and as the run's logs measure it (MiB): the CUDA context (the
    shim's cuda-init line), NCCL's communicators (ik_llama.cpp's ggml_cuda_init makes them when
    it sees more than one GPU: the shim's cuda-init free less the engine's `using device` free,
    which it prints in whole MiB, so less than 1 MiB is none), the weights, KV cache and compute
    buffer (the engine's own lines), and what the first computes took outside them (kernel
    modules, cuBLAS's workspace: the rest down to the room at the first ubatch end)."""
    b = re.search(r"(\d+) MiB free", run.get("ballast_line") or "")
    init = next((m for m in p["memory"] if m["device"] == dev and m["stage"] == "cuda-init"), None)
    using = logged_mib(USING, log, dev)
    room = real_room(p, dev)
    weights, kv = logged_mib(WEIGHTS, log, dev), logged_mib(KV, log, dev)
    compute = logged_mib(COMPUTE_EXACT, log, dev) or logged_mib(COMPUTE, log, dev)
    if None in (b, init, using, room, weights, kv, compute):
        return None
    free = float(b.group(1))
    nccl = init["free_mib"] - using if init["free_mib"] - using >= 1 else 0.0
    outside = init["free_mib"] - nccl - weights - kv - compute - room
    o = plan["outside"]
    planned = {"context": o["cuda_context_bytes"] / MIB, "nccl": 0.0, "weights": plan["weights_bytes"] / MIB,
               "kv": plan["kv_bytes"] / MIB, "compute": plan["compute_bytes"] / MIB,
               "outside": (sum(o.values()) - o["cuda_context_bytes"] - o.get("shim_hold_bytes", 0)) / MIB}
    real = {"context": free - init["free_mib"], "nccl": nccl, "weights": weights, "kv": kv, "compute": compute,
            "outside": outside}
    return {"free_mib": free, "plan": planned, "real": real,
            "room_plan": free - sum(planned.values()), "room_real": room}


TERMS = [("context", "CUDA context"), ("nccl", "NCCL communicators"), ("weights", "weights"),
         ("kv", "KV cache"), ("compute", "compute buffer"),
         ("outside", "the rest, taken by the first ubatch's end (kernel modules, cuBLAS's workspace)")]


def report(data: Data, predicted: dict) -> None:
    runs = [r for r in data.runs() if not r.get("skipped")]
    skipped = [r for r in data.runs() if r.get("skipped")]
    engine = runs[0]["engine"] if runs else "?"
    parsed = {r["name"]: parse_log(r["engine"], data.text(r["log"]), r["n_layer"]) for r in runs}

    out = [f"<!-- two-gpus-{engine}: begin (python3 scripts/llama/two-gpu-report.py DATA) -->",
           "| run | split | device | layers | pool requests (trace; = the pool's count) | "
           "peak pool reserve (MiB): recorded | profile (replayed) | outcome |",
           "|---|---|---:|---|---:|---:|---:|---|"]
    for r in runs:
        p = parsed[r["name"]]
        traced = bool(r.get("trace")) and data.has(r["trace"])
        counts = trace_allocations(data, r["trace"]) if traced else {}
        devices = sorted(set(counts) | set(p["stats"])) or [0, 1]
        for d in devices:
            st = p["stats"].get(d, {})
            n, own = counts.get(d, 0 if traced else None), st.get("allocation.all.allocated")
            if n is None:
                req = "–"
            elif own is None:
                req = f"{n:,} (no statistics)"
            else:
                req = f"{n:,}" + (" ✓" if own == n else f" ≠ {own:,}")
            peak = st.get("reserved_bytes.all.peak")
            pred = predicted.get((r["name"], d), {}).get("predicted_peak_reserved_bytes")
            out.append(f"| {r['name']} | `{r['split_mode']}` | {d} | {layers_text(p['placement'], d, r['n_layer'])} | "
                       f"{req} | {mib(peak / MIB if peak is not None else None)} | "
                       f"{mib(pred / MIB if pred is not None else None)} | {outcome(r, p) if d == devices[0] else ''} |")
    out.append(f"<!-- two-gpus-{engine}: end -->")
    for r in skipped:
        out.append(f"\n{r['name']}: not run ({r.get('reason', '')}).")

    out += ["", f"<!-- two-gpus-oom-{engine}: begin (python3 scripts/llama/two-gpu-report.py DATA) -->",
            "| case | device that ran out: layers | free on it before start | `legacy`/`never`: plan | real | "
            "the pool's room (MiB): plan | real | pool reserve at the failure (MiB) | `legacy`/`auto`: plan | real |",
            "|---|---|---:|---|---|---:|---:|---:|---|---|"]
    for never in (r for r in runs if "-oom-" in r["name"] and r["name"].endswith("-never")):
        p = parsed[never["name"]]
        base = never["name"][: -len("-never")]
        fix = next((r for r in runs if r["name"] == base + "-auto"), None)
        dev = int(p["oom"].group(1)) if p["oom"] else never.get("ballast_device")

        def plan(purge, name=never["name"]):
            f = f"plan-{name}-{purge}.json"
            try:
                return json.loads(data.text(f)) if data.has(f) else None
            except json.JSONDecodeError:
                return None

        pn, pa = plan("never"), plan("auto")
        said = "–" if not pn else ("completes" if pn["fits"] else f"dies at token {pn['oom_at_token']:,}")
        said_fix = "–" if not pa else ("completes" if pa["fits"] else f"dies at token {pa['oom_at_token']:,}")
        tok = oom_token(never, p)
        real = (f"dies at token {tok[0]:,}" + (" (warm-up)" if engine == "mainline" and tok[1] == 0 else "")
                if tok else outcome(never, p))
        if fix:
            pf = parsed[fix["name"]]
            st = pf["stats"].get(dev, {})
            extra = [f"{st['cupool.purges']} purges" if "cupool.purges" in st else None,
                     f"{st['num_alloc_retries']} out-of-memory retries" if "num_alloc_retries" in st else None]
            extra = ", ".join(x for x in extra if x)
            fix_real = outcome(fix, pf) + (f" ({extra})" if extra else "")
        else:
            fix_real = "not run"
        b = re.search(r"(\d+) MiB free", never.get("ballast_line") or "")
        free = f"{int(b.group(1)) / 1024:.2f} GiB" if b else f"{never.get('ballast_leave_gib')} GiB"
        out.append(f"| {base} | {dev}: {layers_text(p['placement'], dev, never['n_layer'])} | {free} | {said} | {real} | "
                   f"{mib(plan_room(pn)) if pn else '–'} | {mib(real_room(p, dev))} | {mib(p['reserved_at_oom_mib'])} | "
                   f"{said_fix} | {fix_real} |")
    out.append(f"<!-- two-gpus-oom-{engine}: end -->")
    # the room tables and the plans again (two_gpu_room.py), with this module's helpers
    out += two_gpu_room.room_report(SimpleNamespace(**globals()), data, runs, parsed, engine)
    print("\n".join(out))


def plan_json(data: Data, name: str, purge: str):
    f = f"plan-{name}-{purge}.json"
    try:
        return json.loads(data.text(f)) if data.has(f) else None
    except json.JSONDecodeError:
        return None


def fixtures(data: Data, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    runs = {}
    engines = {r.get("engine") for r in data.runs() if not r.get("skipped")}
    if len(engines) != 1 or not engines <= {"mainline", "ik"}:
        sys.exit(f"{data.folder}: runs of {sorted(map(str, engines))}: accepted are the runs of one engine, mainline or ik")
    engine = engines.pop()
    for r in data.runs():
        if r.get("skipped") or not r.get("trace") or not data.has(r["trace"]):
            continue
        p = parse_log(r["engine"], data.text(r["log"]), r["n_layer"])
        if any(x is None for x in p["placement"]):
            print(f"{r['name']}: the log does not place every layer (run with -v): left out", file=sys.stderr)
            continue
        runs[r["name"]] = {
            "model": r["preset"], "weights": r["weights"], "n_layer": r["n_layer"], "fa_kv": r["fa_kv"],
            "split_mode": r["split_mode"], "tensor_split": r["tensor_split"], "n_gpu_layers": r["n_gpu_layers"],
            "n_prompt": r["n_prompt"], "n_gen": r["n_gen"], "n_batch": r["n_batch"], "n_ubatch": r["n_ubatch"],
            "reps": r["reps"], "pool": r["pool"], "purge": r["purge"], "rc": r["rc"],
            "layer_devices": p["placement"],
            "oom": {"device": int(p["oom"].group(1)), "bytes": int(p["oom"].group(3))} if p["oom"] else None,
            "devices": {str(d): {"allocations": s["allocation.all.allocated"],
                                 "pool_peak_reserved_bytes": s["reserved_bytes.all.peak"]}
                        for d, s in sorted(p["stats"].items())},
            "trace": r["trace"],
        }
        (dest / r["trace"]).write_bytes(data.bytes(r["trace"]))
    if not runs:
        sys.exit(f"{data.folder}: no {engine} run with a trace")
    with open(dest / "runs.json", "w") as f:
        json.dump({"engine": engine, "source": str(data.folder), "runs": runs}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"two-gpu-report: {len(runs)} runs in {dest}/runs.json", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--predicted", type=Path, help="JSON lines from CUPOOL_TWO_GPUS_SUMMARY (the Rust test)")
    ap.add_argument("--fixtures", type=Path, metavar="DEST", help="write the test's fixtures into DEST")
    a = ap.parse_args()
    data = Data(a.data)
    predicted = {}
    if a.predicted:
        for line in a.predicted.read_text().splitlines():
            if line.strip():
                x = json.loads(line)
                predicted[(x["run"], x["device"])] = x
    if a.fixtures:
        fixtures(data, a.fixtures)
    report(data, predicted)


if __name__ == "__main__":
    main()
