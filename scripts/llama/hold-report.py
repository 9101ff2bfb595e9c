#!/usr/bin/env python3
"""The tables of docs/llama-cpp.md's mainline section, from the runs kept in a data folder
(scripts/llama/hold-check.sh's and seed.py's JSON lines, the logs in logs.tar.gz):

    python3 scripts/llama/hold-report.py data/h100-2026-11-24-mainline-hold

prints, between the markers the docs use, where each prompt size ended with ggml's own pool, with
cupool without the start-up hold and with it; what the computes took outside ggml's buffers; and
the prefill speed of each pool. A run's end is read again from its log (seed.py's
failure_phase), so the table follows the classifier, not what it said when the run was made.
"""
import importlib.util
import json
import re
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("seed", HERE / "seed.py")
seed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seed)

MODELS = {"phi3": "Phi-3-mini shape, f16 weights", "llama3": "Llama-3-8B shape, q8_0 weights"}


def runs(folder: Path, model: str) -> list:
    logs = tarfile.open(folder / "logs.tar.gz")
    out = []
    for line in open(folder / f"{model}.jsonl"):
        r = json.loads(line)
        log = logs.extractfile(f"logs/{r['name']}.log").read().decode(errors="replace")
        r["failed_at"] = seed.failure_phase(log, r["rc"])
        out.append(r)
    return out


def config(r: dict) -> str:
    if r["pool"] == "ggml":
        return "ggml"
    return "off" if r["env"].get("CUPOOL_HOLD") == "off" else "hold"


def cell(r: dict) -> str:
    if r is None:
        return ""
    if r["rc"] == 0:
        return f"completes, {r['prefill_tok_s']:,.0f} tok/s"
    if r["failed_at"] == "compute":
        return "**dies at the first compute**"
    if r["failed_at"] == "start-up":
        fits = f" (report: -c {r['fits_ctx']} fits)" if r.get("fits_ctx") and config(r) == "hold" else ""
        return "fails at start-up" + fits
    return f"exit {r['rc']}"


def outcome_table(folder: Path) -> list:
    lines = ["| model | `-p` | ggml's own pool | cupool `vmm`, `CUPOOL_HOLD=off` | cupool `vmm`, hold 176 MiB |",
             "|---|---:|---|---|---|"]
    for model, label in MODELS.items():
        by = {}
        for r in runs(folder, model):
            by.setdefault(r["prompt"], {})[config(r)] = r
        for p in sorted(by):
            row = by[p]
            if len(row) < 2:  # a measurement run of one configuration, not a comparison
                continue
            lines.append(f"| {label} | {p:,} | {cell(row.get('ggml'))} | {cell(row.get('off'))} | "
                         f"{cell(row.get('hold'))} |")
    return lines


def taken_table(folder: Path) -> list:
    lines = ["| model | taken outside ggml's buffers and pools by the computes (MiB) | runs |", "|---|---:|---:|"]
    for model, label in MODELS.items():
        taken = [r["hold_taken_mib"] for r in runs(folder, model) if r.get("hold_taken_mib") is not None]
        if taken:
            lines.append(f"| {label} | {min(taken):.1f}–{max(taken):.1f} | {len(taken)} |"
                         if min(taken) != max(taken) else f"| {label} | {taken[0]:.1f} | {len(taken)} |")
    return lines


def speed_table(folder: Path) -> list:
    lines = ["| pool | prefill tok/s (3 repetitions each) | mean |", "|---|---|---:|"]
    for line in open(folder / "speed.jsonl"):
        r = json.loads(line)
        name = "ggml's own" if r["pool"] == "ggml" else f"cupool `{r['pool']}`, purge `{r['purge']}`"
        samples = ", ".join(f"{s:,.0f}" for s in r["samples_tok_s"])
        lines.append(f"| {name} | {samples} | {r['prefill_tok_s']:,.0f} |")
    return lines


def report(folder: Path) -> str:
    parts = []
    for name, table in (("hold-outcomes", outcome_table), ("hold-taken", taken_table), ("hold-speed", speed_table)):
        parts.append(f"<!-- {name}: begin (scripts/llama/hold-report.py {folder.as_posix()}) -->")
        parts.extend(table(folder))
        parts.append(f"<!-- {name}: end -->")
    return "\n".join(parts) + "\n"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.stdout.write(report(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
