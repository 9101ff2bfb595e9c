#!/usr/bin/env python3
"""The plan's peak device memory against what the engines' runs took, from the recorded runs of
the prediction checks (scripts/llama/predict-check.py):

    python3 scripts/llama/peak-device.py --repro repro-prefill DATA [DATA ...]

For each run that filled the plan's largest context and completed (`-fits-`), today's plan of
that case (`repro-prefill plan` on a header-only GGUF of the preset the run's model was written
from, its layers as the recorded plan's; the engine, pool and purge as recorded; `-c` the run's
prompt) against the run: the free memory its ballast left before the engine started
(`run.txt`) less the lowest free memory of its memory lines (cupool's shim logs one at each
stage and ubatch end). The lines are samples, so the run's figure is a lower bound of its peak;
none is taken while the shim holds its start-up reserve, so where the plan's peak is the
start-up's (the table says which) the run's lines cannot show it.
Writing the GGUF headers needs the `gguf` module (PyPI's, or a llama.cpp tree's gguf-py on
PYTHONPATH) and numpy. Prints a Markdown table between markers, in the order of the folders and
cases given; docs/repro-prefill.md keeps it.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PRESETS = {"phi3-f16": ("phi3-mini", "f16"), "llama3-q8": ("llama3-8b", "q8_0"), "qwen3-q8": ("qwen3-30b-a3b", "q8_0")}
MIB = 2**20


def ballast_free(folder: Path) -> dict:
    """Each run's free memory before the engine started (MiB), from the ballast's line before
    the run's own in run.txt."""
    free, out = None, {}
    for line in (folder / "run.txt").read_text().splitlines():
        m = re.match(r"ballast: device 0 holds \d+ MiB, (\d+) MiB free", line)
        if m:
            free = int(m.group(1))
        m = re.match(r"seed: (\S+): ", line)
        if m and free is not None:
            out[m.group(1)] = free
    return out


def header(tmp: Path, preset: str, wtype: str, layers: int) -> Path:
    out = tmp / f"{preset}-{wtype}-{layers}.gguf"
    if not out.exists():
        cmd = [sys.executable, str(HERE / "gen_model.py"), "--preset", preset, "--type", wtype, "--layers", str(layers),
               "--header-only", "--out", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"peak-device: {' '.join(cmd)} failed:\n{done.stderr}")
    return out


def rows(repro: str, folders: list, tmp: Path):
    for folder in map(Path, folders):
        if not (folder / "run.txt").exists():
            sys.exit(f"peak-device: {folder}/run.txt missing: the ballast's lines give each run's free memory")
        free = ballast_free(folder)
        for pj in sorted(folder.glob("*.plan.json")):
            if pj.name.endswith(".ctx.plan.json"):
                continue
            case = pj.name[: -len(".plan.json")]
            shape, level = case.rsplit("-", 1)
            runs = folder / case / "runs.jsonl"
            if shape not in PRESETS or not runs.exists():
                continue
            want = json.loads(pj.read_text())
            for r in map(json.loads, runs.read_text().splitlines()):
                mem = [m for m in r.get("memory", []) if m.get("device") == 0]
                if "-fits-" not in r["name"] or r["rc"] != 0 or not mem or r["name"] not in free:
                    continue
                gguf = header(tmp, *PRESETS[shape], want["scenario"]["n_layer"])
                engine = {"ik_llama": "ik-llama"}.get(want["engine"], want["engine"])
                cmd = [repro, "plan", "--device", "sim", "--gguf", str(gguf), "--free", level, "--engine", engine,
                       "-b", "2048", "-ub", "512", "-c", str(r["prompt"]), "--kv-type", "q8_0", "--pool", want["pool"],
                       "--purge", want["purge"], "--format", "json", "--quiet"]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode not in (0, 3):
                    sys.exit(f"peak-device: {' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr}")
                p = json.loads(out.stdout)
                real = free[r["name"]] - min(m["free_mib"] for m in mem)
                yield {"folder": folder.name, "run": r["name"], "engine": engine, "pool": want["pool"],
                       "purge": want["purge"], "free_mib": free[r["name"]], "fits": p["fits"],
                       "plan_mib": p["peak_device_bytes"] / MIB, "pages_mib": p["page_rounding_bytes"] / MIB,
                       # the peak is the start-up's where it exceeds everything from the first
                       # compute on: the shim's hold, which no memory line sees
                       "at": "start-up" if p["peak_device_bytes"] > p["total_bytes"] else "prefill",
                       "real_mib": real}


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--repro", required=True, help="the repro-prefill executable")
    a.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    a.add_argument("folders", nargs="+")
    args = a.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        found = list(rows(args.repro, args.folders, Path(tmp)))
    if args.json:
        for row in found:
            print(json.dumps(row))
        return
    lines = ["<!-- peak-device: begin (python3 scripts/llama/peak-device.py --repro repro-prefill DATA) -->",
             "| run | engine, pool, purge | free before start (MiB) | plan: peak device (MiB) | of it, whole pages beyond sizes | "
             "plan: peak at | run: free before start less the lowest free seen (MiB) | plan − run |",
             "|---|---|---:|---:|---:|---|---:|---:|"]
    for w in found:
        plan = f"{w['plan_mib']:,.1f}" if w["fits"] else f"{w['plan_mib']:,.1f} (does not fit)"
        lines.append(f"| {w['folder']}/{w['run']} | {w['engine']}, `{w['pool']}`, `{w['purge']}` | {w['free_mib']:,} | "
                     f"{plan} | {w['pages_mib']:,.1f} | {w['at']} | {w['real_mib']:,.1f} | {w['plan_mib'] - w['real_mib']:+,.1f} |")
    lines.append("<!-- peak-device: end -->")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
