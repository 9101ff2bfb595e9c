#!/usr/bin/env python3
"""The one-device plan of a two-GPU out-of-memory case again, with the terms a second GPU adds
as the models compute them, against what the run's logs measure (after scripts/llama/two-gpu.sh;
no GPU needed):

    python3 scripts/llama/two-gpu-replan.py DATA_DIR [--repro target/release/repro-prefill]
                                            [--fixtures DEST]

For the device that ran out in DATA_DIR's `-oom-...-never` run, two-gpu.sh planned its layers
alone: `repro-prefill plan --gguf HEADER --free F`, HEADER a GGUF of that many layers (the output
matrix included) and F the free memory the ballast left. This plans the same device three ways,
each for `legacy`/`never` and `legacy`/`auto`:

1. as two-gpu.sh did (the stored plans must come out the same, else it stops);
2. with F less the modelled terms the one-device plan lacks (two_gpu_terms.py, the Rust models'
   formulas): mainline's compute buffer of that pipeline stage (the scheduler's 4 copies of the
   device's inputs) beyond the plan's, and ik_llama.cpp's NCCL communicators — both known from
   the model, the settings and the device's place before the engine starts;
3. with F less every measured term (two-gpu-report.py's room table): the room the run had.

Beside the case, replan.json holds for every run and device the compute buffer the engine logged
against the pipeline model's (mainline) and what NCCL's set-up took against the NCCL term (both
engines). --fixtures DEST also writes them to DEST/buffers.json, which
profiles/tests/mainline_two_gpus.rs and ik_two_gpus.rs hold to the Rust models.

The header is written here without numpy or gguf: gen_model.py's tensors of that many layers,
its metadata, and the tensor data left a hole (the file is truncated to its length; the plan
reads only the header). Writes DATA_DIR/replan.json, which two-gpu-report.py turns into a table.
"""
import argparse
import importlib.util
import json
import struct
import subprocess
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import two_gpu_terms as tt  # noqa: E402


def load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gen_model():
    """gen_model.py's tables (PRESETS, tensors()); numpy and gguf stand-ins where they are not
    installed (the tables use neither)."""
    for name in ("numpy", "gguf"):
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            if name == "gguf":
                stub.GGMLQuantizationType = types.SimpleNamespace(F16=1, Q8_0=8)
            sys.modules[name] = stub
    return load("gen_model", "gen_model.py")


GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
ALIGN = 32


def _str(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, value) -> bytes:
    """A metadata pair: u32 for ints, f32 for floats, a string, or an array of strings."""
    if isinstance(value, str):
        return _str(key) + struct.pack("<I", 8) + _str(value)
    if isinstance(value, float):
        return _str(key) + struct.pack("<If", 6, value)
    if isinstance(value, list):
        return _str(key) + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(map(_str, value))
    return _str(key) + struct.pack("<II", 4, value)


def write_header(g, preset: str, weights: str, n_layer: int, path: Path) -> None:
    """gen_model.py's file for `preset` with `n_layer` layers, the tensor data a hole."""
    arch, _, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx = g.PRESETS[preset]
    if preset in g.MOE:
        sys.exit(f"two-gpu-replan: {preset}: the mixture-of-experts presets are not written here")
    qtype = {"f16": GGML_F16, "q8_0": GGML_Q8_0}[weights]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += ["<|endoftext|>"] + [f"t{i}" for i in range(n_vocab - len(tokens) - 1)]
    kvs = [("general.architecture", arch), ("general.name", f"random {preset} ({weights})"),
           (f"{arch}.context_length", n_ctx), (f"{arch}.embedding_length", n_embd),
           (f"{arch}.feed_forward_length", n_ff), (f"{arch}.block_count", n_layer),
           (f"{arch}.attention.head_count", n_head), (f"{arch}.attention.head_count_kv", n_head_kv),
           (f"{arch}.attention.layer_norm_rms_epsilon", 1e-5), (f"{arch}.rope.dimension_count", n_embd // n_head),
           (f"{arch}.rope.freq_base", 10000.0 if arch == "phi3" else 500000.0),
           ("general.file_type", 1 if weights == "f16" else 7),
           ("tokenizer.ggml.model", "llama"), ("tokenizer.ggml.tokens", tokens)]
    if arch == "phi3":
        kvs.append((f"{arch}.attention.sliding_window", n_ctx * 2))
    infos, offset = [], 0
    for name, shape, matrix in g.tensors(preset, n_layer):
        t = qtype if matrix else GGML_F32
        n = 1
        for d in shape:
            n *= d
        infos.append(_str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
                     + struct.pack("<IQ", t, offset))
        offset += n * 4 if t == GGML_F32 else n * 2 if t == GGML_F16 else n // 32 * 34
        offset = -(-offset // ALIGN) * ALIGN
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kvs)) + b"".join(_kv(k, v) for k, v in kvs)
    head += b"".join(infos)
    head += b"\0" * (-len(head) % ALIGN)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + offset)


def plan(repro: str, header: Path, engine: str, purge: str, free_gib: float, args: dict) -> tuple:
    cmd = [repro, "plan", "--gguf", str(header), "--engine", engine, "--pool", "legacy", "--purge", purge,
           "-c", str(args["n_prompt"]), "-b", "2048", "-ub", str(args["n_ubatch"]), "--kv-type", "q8_0",
           "--free", f"{free_gib:.6f}", "--format", "json", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode not in (0, 3):
        sys.exit(f"two-gpu-replan: {' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    p = json.loads(r.stdout)
    keep = ("fits", "oom_at_token", "pool_peak_reserved_bytes", "compute_bytes", "weights_bytes", "kv_bytes")
    return ["repro-prefill"] + cmd[1:], {k: p[k] for k in keep}


def device_terms(rep, g, data, runs: list, engine: str) -> dict:
    """Per run and device: the compute buffer the engine logged (its teardown line, 4 decimals of
    MiB) and the pipeline model's (mainline), and what NCCL's set-up took against the model's."""
    out = {}
    for r in runs:
        log = data.text(r["log"])
        p = rep.parse_log(engine, log, r["n_layer"])
        if any(x is None for x in p["placement"]):
            continue  # placed nothing (mainline's -sm row fails at load)
        devices = sorted({d for d in p["placement"] if d >= 0})
        logged = {int(d): x for d, x in rep.COMPUTE_EXACT.findall(log)}
        nccl = tt.nccl_measured(log)
        m = tt.shape(g.PRESETS, r["preset"])
        copies = tt.sched_copies(len(devices), r["n_gpu_layers"], r["n_layer"], r["split_mode"])
        ctx = tt.n_ctx(r["n_prompt"], r["n_gen"])
        row = {}
        for d in devices:
            x = {"layers": [l for l in range(r["n_layer"]) if p["placement"][l] == d],
                 "output": p["placement"][r["n_layer"]] == d,
                 "nccl_measured_mib": nccl.get(d), "nccl_model_bytes": tt.nccl_bytes(engine, d, len(devices))}
            if engine == "mainline":
                last = p["placement"][r["n_layer"] - 1] == d
                x.update(compute_logged_mib=logged.get(d), sched_copies=copies, n_ctx=ctx, last_layer=last,
                         compute_model_bytes=tt.device_compute_bytes(
                             m, r["fa_kv"] == "pool", True, ctx, r["n_ubatch"], copies, last, x["output"]))
            row[str(d)] = x
        out[r["name"]] = {"model": r["preset"], "fa_kv": r["fa_kv"], "n_prompt": r["n_prompt"],
                          "n_gen": r["n_gen"], "n_ubatch": r["n_ubatch"], "devices": row}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--repro", default="target/release/repro-prefill", help="the repro-prefill binary")
    ap.add_argument("--fixtures", type=Path, metavar="DEST", help="also write DEST/buffers.json for the Rust tests")
    a = ap.parse_args()
    rep = load("two_gpu_report", "two-gpu-report.py")
    g = gen_model()
    data = rep.Data(a.data)
    runs = [r for r in data.runs() if not r.get("skipped")]
    engine = runs[0]["engine"]
    plan_engine = {"mainline": "llama-b8833", "ik": "ik-llama"}[engine]
    devices = device_terms(rep, g, data, runs, engine)
    cases = {}
    for never in (r for r in runs if "-oom-" in r["name"] and r["name"].endswith("-never")):
        name, base = never["name"], never["name"][: -len("-never")]
        if never.get("fa_kv") == "buffer":
            sys.exit(f"two-gpu-replan: {name}: planned here with the llama-b8833 profile, which is CUPOOL_FA_KV=pool's")
        log = data.text(never["log"])
        p = rep.parse_log(engine, log, never["n_layer"])
        args = json.loads(data.text(f"plan-{name}.device.json"))
        stored = {purge: rep.plan_json(data, name, purge) for purge in ("never", "auto")}
        terms = rep.room_terms(never, p, log, stored["never"], args["device"])
        if not terms:
            sys.exit(f"two-gpu-replan: {name}: the log does not give every term")
        here = devices[name]["devices"][str(args["device"])]
        # The models' terms: the one-device plan's, with the pipeline's compute buffer and NCCL.
        model = dict(terms["plan"], nccl=here["nccl_model_bytes"] / tt.MIB)
        if engine == "mainline":
            model["compute"] = here["compute_model_bytes"] / tt.MIB
        terms["model"] = model
        terms["room_model"] = terms["free_mib"] - sum(model.values())
        diff = {k: terms["real"][k] - terms["plan"][k] for k in terms["plan"]}
        added = {k: model[k] - terms["plan"][k] for k in terms["plan"]}
        free = terms["free_mib"] / 1024
        compute = (f"the pipeline's compute buffer {added['compute'] + 0.0:+.1f}" if engine == "mainline" else
                   "compute buffer +0.0 (no pipeline copies: GGML_SCHED_MAX_COPIES is 1)")
        rows = [(free, "the free memory before start (two-gpu.sh's plan)"),
                (free - sum(added.values()) / 1024, "less the modelled terms the plan lacks "
                 f"({compute}, NCCL {added['nccl'] + 0.0:+.1f} MiB)"),
                (free - sum(diff.values()) / 1024, "less every measured term (the run's room, "
                 f"{terms['room_real']:,.1f} MiB)")]
        n = len(args["layers"])  # the header: the device's layers, and the output matrix
        if not args["output"]:
            sys.exit(f"two-gpu-replan: {name}: the device that ran out holds no output matrix: not modelled here")
        plans = []
        with tempfile.TemporaryDirectory() as tmp:
            header = Path(tmp) / f"header-{args['preset']}-{args['weights']}-{n}.gguf"
            write_header(g, args["preset"], args["weights"], n, header)
            for i, (f, what) in enumerate(rows):
                row = {"free_gib": round(f, 6), "what": what, "commands": []}
                for purge in ("never", "auto"):
                    cmd, got = plan(a.repro, header, plan_engine, purge, f, args)
                    cmd[cmd.index("--gguf") + 1] = f"HEADER({args['preset']} {args['weights']}, {n} layers)"
                    row["commands"].append(" ".join(cmd))
                    row[purge] = got
                    if i == 0 and stored[purge]:
                        same = {k: stored[purge][k] for k in got}
                        if same != got:
                            sys.exit(f"two-gpu-replan: {name}: the plan as two-gpu.sh ran it gave {same}, here {got}: "
                                     "not the same header or repro-prefill")
                plans.append(row)
        terms = {k: ({t: round(x, 4) for t, x in v.items()} if isinstance(v, dict) else round(v, 4))
                 for k, v in terms.items()}
        cases[base] = {"device": args["device"], "layers": args["layers"], "output": args["output"],
                       "terms": terms, "plans": plans}
        for row in plans:
            print(f"{base}: --free {row['free_gib']:.4f}: never "
                  f"{'fits' if row['never']['fits'] else 'dies at %s' % row['never']['oom_at_token']}, auto "
                  f"{'fits' if row['auto']['fits'] else 'dies at %s' % row['auto']['oom_at_token']}", file=sys.stderr)
    out = a.data / "replan.json"
    doc = {"engine": engine, "profile": plan_engine, "cases": cases, "devices": devices}
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"two-gpu-replan: {out}", file=sys.stderr)
    if a.fixtures:
        a.fixtures.mkdir(parents=True, exist_ok=True)
        f = a.fixtures / "buffers.json"
        f.write_text(json.dumps({"engine": engine, "devices": devices}, indent=1, sort_keys=True) + "\n")
        print(f"two-gpu-replan: {f}", file=sys.stderr)


if __name__ == "__main__":
    main()
