#!/usr/bin/env python3
"""The llama-server load test's table and memory plot for docs/llama-cpp.md, from a run that
scripts/llama/server-load.py wrote (summary.json, samples.jsonl[.gz]) and that is kept in data/:

    python3 scripts/llama/server-report.py data/h100-2026-11-25-mainline-server [--svg docs/img/x.svg]

prints the table between the markers the docs use; --svg also draws each server's process memory
and cupool's pool reserve over the run (plain SVG, no plotting library needed).
"""
import argparse
import gzip
import json
from pathlib import Path

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
DASHES = ["", "6 3", "2 2", "8 3 2 3", "1 3"]


def samples(folder: Path) -> list:
    plain, packed = folder / "samples.jsonl", folder / "samples.jsonl.gz"
    text = plain.read_text() if plain.exists() else gzip.decompress(packed.read_bytes()).decode()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def label(name: str, x: dict) -> str:
    if x["pool"] == "ggml":
        return "ggml's own pools"
    return f"cupool `{x['pool']}`, purge `{x['purge']}`"


def span(pair) -> str:
    if not pair:
        return "–"
    lo, hi = pair
    return f"{lo:,.0f}" if lo == hi else f"{lo:,.0f}–{hi:,.0f}"


def table(summary: dict) -> list:
    run = summary.get("_run", {})
    lines = [
        "<!-- server-load: begin (python3 scripts/llama/server-report.py DATA) -->",
        f"{run.get('duration', 0) / 60:.0f} minutes per configuration, all at once on one GPU, "
        f"`-np {run.get('parallel')} -c {run.get('ctx')}`, {run.get('min_conc')}–{run.get('max_conc')} requests "
        f"in flight, prompts {run.get('prompt_min')}–{run.get('prompt_max'):,} tokens, "
        f"{run.get('gen_min')}–{run.get('gen_max')} generated; memory after a {run.get('warm_up', 0):.0f} s warm-up.",
        "",
        "| configuration | answered | failed | tokens/s (prompt + generated) | generated tokens/s | process memory after "
        "warm-up (MiB) | drift (MiB) | cupool's pool reserve (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, x in summary.items():
        if name.startswith("_"):
            continue
        drift = "–" if x["drift_mib"] is None else f"{x['drift_mib']:+.1f}"
        lines.append(f"| {label(name, x)} | {x['answered']} | {x['failed']} | {x['tokens_per_s']:,.1f} | "
                     f"{x['gen_tokens_per_s']:,.1f} | {span(x['process_mib_after_warm_up'])} | {drift} | "
                     f"{span(x['pool_reserved_mib_after_warm_up'])} |")
    lines.append("<!-- server-load: end -->")
    return lines


def panel(out: list, rows: list, names: list, key: str, top: float, title: str, w=760, h=190) -> None:
    left, plot_w, plot_h = 80, w - 240, h - 50
    series = {n: [(r["t"], r[key]) for r in rows if r["config"] == n and r.get(key) is not None] for n in names}
    values = [v for s in series.values() for _, v in s]
    t_max = max((t for s in series.values() for t, _ in s), default=1.0) or 1.0
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    pad = max((hi - lo) * 0.1, 1.0)
    lo, hi = lo - pad, hi + pad
    y = lambda v: top + 20 + plot_h * (1 - (v - lo) / (hi - lo))  # noqa: E731
    x = lambda t: left + plot_w * t / t_max  # noqa: E731
    out.append(f'<text x="{left}" y="{top + 12}" font-size="13" font-weight="bold">{title}</text>')
    out.append(f'<rect x="{left}" y="{top + 20}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>')
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">{v:,.0f}</text>')
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>')
    for i in range(6):
        t = t_max * i / 5
        out.append(f'<text x="{x(t):.1f}" y="{top + 20 + plot_h + 14}" font-size="11" '
                   f'text-anchor="middle">{t:.0f} s</text>')
    for i, n in enumerate(names):
        pts = series[n]
        if not pts:
            continue
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        dash = f' stroke-dasharray="{DASHES[i % len(DASHES)]}"' if DASHES[i % len(DASHES)] else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{COLOURS[i % len(COLOURS)]}" '
                   f'stroke-width="1.6"{dash}/>')
        ly = top + 34 + 16 * i
        out.append(f'<line x1="{left + plot_w + 12}" x2="{left + plot_w + 36}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{COLOURS[i % len(COLOURS)]}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{left + plot_w + 40}" y="{ly}" font-size="11">{n}: {pts[-1][1]:,.0f}</text>')


def svg(folder: Path, summary: dict) -> str:
    rows = samples(folder)
    names = [n for n in summary if not n.startswith("_")]
    cupool = [n for n in names if summary[n]["pool"] != "ggml"]
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="760" height="420" font-family="sans-serif">',
           '<rect width="760" height="420" fill="white"/>']
    panel(out, rows, names, "process_mib", 10, "each llama-server process's device memory (MiB, NVML)")
    panel(out, rows, cupool, "pool_reserved_mib", 215, "cupool's pool reserve (MiB, the server's own log)")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--svg", help="also write the memory plot here")
    a = ap.parse_args()
    folder = Path(a.folder)
    summary = json.loads((folder / "summary.json").read_text())
    print("\n".join(table(summary)))
    if a.svg:
        Path(a.svg).write_text(svg(folder, summary))


if __name__ == "__main__":
    main()
