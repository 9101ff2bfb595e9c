#!/usr/bin/env python3
"""The tables of docs/llama-cpp.md's ik_llama.cpp section, from the runs kept under data/
(scripts/llama/seed.py's and purge-cost.sh's JSON lines, the logs, replay.txt, compare.txt):

    python3 scripts/llama/ik-report.py [DATA]            # DATA: the data folder (default: data)
    python3 scripts/llama/ik-report.py [DATA] --facts    # the figures the section's prose quotes

prints, between the markers the docs use, the 12 GiB card's runs, the per-ubatch peak pool
reserve, what `auto` costs, the two-GPU run and the replays of the recorded traces. --facts prints
one phrase a line, each as the prose says it: ggml/tests checks that every one is in the doc, so a
figure in the prose that the data no longer gives fails there too. Reads files only.
"""
import gzip
import json
import re
import statistics
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

MiB = 1 << 20
LLAMA = "h200-2026-11-22-llama"        # the first build of the day (graphs dropped; auto returned at every boundary)
EAGER = "h200-2026-11-22-purge/eager"  # the next build: graphs recaptured, auto still returning at every boundary
LAZY = "h200-2026-11-22-purge/lazy"    # the final build (auto returns only when the card is short)
# The per-ubatch table's columns: prefill ubatches by index (KV length = 512 x index).
COLUMNS = [0, 9, 17, 19, 24, 29, 34, 39]


def load(data: Path, rel: str) -> list:
    return [json.loads(x) for x in open(data / rel) if x.strip()]


def run(data: Path, rel: str, name: str) -> dict:
    for r in load(data, rel):
        if r["name"] == name:
            return r
    raise SystemExit(f"ik-report: no run {name} in {rel}")


def num(x: float, places: int = 0) -> str:
    """Thousands separators, rounded half up (13,838.5 -> 13,839)."""
    q = Decimal(1).scaleb(-places)
    return f"{Decimal(repr(round(x, places + 3))).quantize(q, rounding=ROUND_HALF_UP):,}"


def mib(b: int, places: int = 1) -> str:
    return num(b / MiB, places)


def ubatches(r: dict, device: int = 0) -> list:
    return [u for u in r["ubatches"] if u["device"] == device]


def stats(r: dict, device: int = 0) -> dict:
    return r["stats"][str(device)]


def peak_reserved(r: dict, device: int = 0) -> int:
    """The run's peak pool reserve: the largest per-ubatch peak, or what the statistics at exit hold
    (a run that failed inside a ubatch has its peak there)."""
    return max([u["peak_reserved"] for u in ubatches(r, device)] + [stats(r, device)["reserved_bytes.all.peak"]])


def peak_live(r: dict, device: int = 0) -> int:
    return max(u["peak_live"] for u in ubatches(r, device))


def returned_at_boundaries(r: dict, device: int = 0) -> int:
    return sum(u["released"] for u in ubatches(r, device))


def tok_s(r: dict) -> float:
    return r["prefill_tok_s"]


# --- On a 12 GiB card -------------------------------------------------------------------------

def pool_label(r: dict) -> str:
    if r["pool"] == "ggml":
        return "ggml's own VMM pool (`GGML_POOL` unset)"
    s = f"cupool `{r['pool']}`, `{r['purge']}`"
    s += {("legacy", "never"): " (ggml's legacy policy)", ("vmm", "always"): " (trim)"}.get((r["pool"], r["purge"]), "")
    for k, v in sorted(r.get("env", {}).items()):
        s += f", `{k}={v}`"
    return s


def card12_row(r: dict) -> str:
    rows = r["rows"]
    if r["rc"] == 0:
        outcome = "completes"
    elif r["oom"]:
        outcome = f"**CUDA OOM** in the ubatch after N_KV = {r['last_n_kv']}"
    else:
        outcome = f"exit {r['rc']}"
    if not r["stats"]:
        peak, drivers = "not instrumented", "—"
    else:
        s = stats(r)
        peak = f"{mib(peak_reserved(r))} MiB" + (" at the failure" if r["rc"] != 0 else "")
        if r["pool"] == "vmm":
            drivers = f"{s['cupool.driver_allocations']} maps, {s['cupool.driver_releases']} unmaps"
        else:
            drivers = f"{s['cupool.driver_allocations']}"
            if r["purge"] != "never" and s["num_ooms"]:
                drivers += f" ({s['num_ooms']} out-of-memory retries)"
    used = f"{num(rows[-1]['vram_delta_mib'])} MiB" if rows else "—"
    speed = num(tok_s(r)) if r["rc"] == 0 else f"({len(rows)} ubatches done)"
    return f"| {pool_label(r)} | {outcome} | {peak} | {drivers} | {used} | {speed} |"


def card12_table(data: Path) -> list:
    runs = [run(data, f"{LAZY}/seed12.jsonl", "legacy-never"),
            run(data, f"{LAZY}/seed12.jsonl", "legacy-auto-trace"),
            run(data, f"{LAZY}/seed12-headroom-inf.jsonl", "legacy-autoinf"),
            run(data, f"{LAZY}/seed12.jsonl", "vmm-always"),
            run(data, f"{LLAMA}/runs.jsonl", "ref")]
    return ["| pool | outcome | peak pool reserve | driver allocations | device memory used at the end | prefill tok/s |",
            "|---|---|---|---|---|---|"] + [card12_row(r) for r in runs]


# --- Per-ubatch peak pool reserve --------------------------------------------------------------

def ubatch_table(data: Path) -> list:
    rows = [("`legacy`, `never`, 16 GiB", run(data, f"{LLAMA}/runs.jsonl", "never16-trace")),
            ("`legacy`, the first build's `auto` (returns at every boundary: today's `CUPOOL_AUTO_HEADROOM=inf`), 16 GiB",
             run(data, f"{LLAMA}/runs.jsonl", "auto16")),
            ("`legacy`, `auto`, 12 GiB", run(data, f"{LAZY}/seed12.jsonl", "legacy-auto-trace")),
            ("`vmm`, `always`, 12 GiB", run(data, f"{LAZY}/seed12.jsonl", "vmm-always"))]
    kv = {i: rows[0][1]["rows"][i]["n_kv"] for i in COLUMNS}
    lines = ["| ubatch (KV length) | " + " | ".join(f"{i} ({kv[i]})" for i in COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    for label, r in rows:
        ub = ubatches(r)
        assert all(r["rows"][i]["n_kv"] == kv[i] for i in COLUMNS), r["name"]
        lines.append(f"| {label} | " + " | ".join(mib(ub[i]["peak_reserved"]) for i in COLUMNS) + " |")
    return lines


# --- What auto costs ---------------------------------------------------------------------------

def medians(runs: list) -> tuple:
    never = [tok_s(r) for r in runs if r["purge"] == "never"]
    auto = [tok_s(r) for r in runs if r["purge"] == "auto"]
    return statistics.median(never), statistics.median(auto), min(len(never), len(auto))


def percent(x: float) -> str:
    s = f"{abs(x):.2f}" if abs(x) < 0.1 else f"{abs(x):.1f}"
    return ("+" if x >= 0 else "−") + s + "%"


def benchmark(runs: list, pairs: int) -> str:
    r = runs[0]
    if r.get("prompt"):
        what = f"`llama-bench -p {r['prompt']} -n 0 -r {len(r['samples_tok_s'])}`"
    else:
        what = "sweep"
    for k, v in sorted(r.get("env", {}).items()):
        what += f", `{k}={v}`"
    return f"{what}, {pairs} pairs"


def cost_table(data: Path) -> list:
    builds = [
        (EAGER, "graphs recaptured, `auto` returning at every boundary (today's `CUPOOL_AUTO_HEADROOM=inf`)"),
        (LAZY, "final: `auto` returns only when the card is short (default headroom)"),
    ]
    lines = ["| build | benchmark | `never` | `auto` | `auto` against `never` |", "|---|---|---|---|---|"]
    for folder, label in builds:
        for i, f in enumerate(("sweep.jsonl", "sweep-nographs.jsonl", "bench.jsonl")):
            runs = load(data, f"{folder}/{f}")
            never, auto, pairs = medians(runs)
            change = (auto / never - 1) * 100
            cell = percent(change)
            if change < -0.5:  # over the goal of at most 0.5%
                cell = f"**{cell}**"
            lines.append(f"| {label if i == 0 else 'same'} | {benchmark(runs, pairs)} | {num(never)} | {num(auto)} | {cell} |")
    return lines


# --- Two GPUs ----------------------------------------------------------------------------------

def two_table(data: Path) -> list:
    r = run(data, f"{LLAMA}/runs.jsonl", "two")
    lines = ["| device | peak pool reserve (MiB) | at the end (MiB) | driver allocations | driver releases | "
             "boundaries that returned memory | returned (MiB) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for d in sorted(int(k) for k in r["stats"]):
        s = stats(r, d)
        lines.append(f"| {d} | {mib(peak_reserved(r, d))} | {mib(s['reserved_bytes.all.current'])} | "
                     f"{s['cupool.driver_allocations']} | {s['cupool.driver_releases']} | "
                     f"{sum(1 for u in ubatches(r, d) if u['released'])} | {mib(returned_at_boundaries(r, d))} |")
    lines += ["", f"Prefill over the sweep: {num(tok_s(r))} tok/s."]
    return lines


# --- The recorded traces' replays --------------------------------------------------------------

def replays(data: Path) -> list:
    """replay.txt: each command line (`$ ...`) and the JSON object printed after it."""
    lines = (data / LLAMA / "replay.txt").read_text().splitlines()
    out = []
    for cmd, printed in zip(lines, lines[1:]):
        if cmd.startswith("$ "):
            m = re.search(r"repro-prefill replay (\S+)\.trace\.jsonl (.*?) --format json", cmd)
            out.append({"trace": m.group(1), "flags": m.group(2), **json.loads(printed)})
    return out


def traffic(pool: str, a: int, b: int) -> str:
    names = ("maps", "unmaps") if pool == "vmm" else ("mallocs", "frees")
    return ", ".join(f"{n} {w}" for n, w in zip((a, b), names) if n)


def reserve(peak: int, end: int) -> str:
    return f"{peak:,} B" + (f", end {end:,} B" if 0 < end < peak else "")


def own(runs: list) -> tuple:
    """What the runs' own statistics say (they must all say the same): peak, end, driver traffic."""
    got = {(peak_reserved(r), stats(r)["reserved_bytes.all.current"], stats(r)["cupool.driver_allocations"],
            stats(r)["cupool.driver_releases"]) for r in runs}
    assert len(got) == 1, f"the runs {[r['name'] for r in runs]} disagree: {got}"
    return got.pop()


def replay_rows(data: Path) -> list:
    first = load(data, f"{LLAMA}/runs.jsonl") + load(data, f"{LLAMA}/runs-throughput.jsonl")
    rows = []
    for x in replays(data):
        if x["pool"] == "legacy" and x["purge"] == "never":
            runs = [r for r in first if r["name"] == x["trace"]]
            run_label, who = f"`legacy`, `never`, {num(runs[0]['card_gib'])} GiB", ""
        elif x["pool"] == "legacy" and x["purge"] == "auto":
            trace_run = next(r for r in first if r["name"] == x["trace"])
            run_label = f"`legacy`, `auto`, {num(trace_run['card_gib'])} GiB"
            runs = [r for r in first if r["pool"] == "legacy" and r["purge"] == "auto" and r["card_gib"] == 16
                    and r["devices"] == 1]
            who = "the 16 GiB `auto` runs: "
        elif x["pool"] == "vmm":
            runs = [r for r in first if r["pool"] == "vmm" and r["purge"] == x["purge"]]
            run_label, who = None, f"the `vmm`/`{x['purge']}` run: "
        else:
            raise SystemExit(f"ik-report: no run to compare with the replay {x}")
        peak, end, a, b = own(runs)
        traffic_pair = ("driver_maps", "driver_unmaps") if x["pool"] == "vmm" else ("driver_mallocs", "driver_frees")
        same = (peak, end, a, b) == (x["peak_reserved_bytes"], x["end_reserved_bytes"], *(x[k] for k in traffic_pair))
        rows.append({"replay": x, "runs": runs, "same": same, "label": run_label, "who": who,
                     "own": (peak, end, a, b)})
    return rows


def replay_table(data: Path) -> list:
    lines = ["| trace (run) | replay | peak reserve | driver traffic | the run's own statistics |",
             "|---|---|---|---|---|"]
    for row in replay_rows(data):
        x, (peak, end, a, b) = row["replay"], row["own"]
        trace = f"`{x['trace']}`" + (f" ({row['label']})" if row["label"] else "")
        if x["pool"] == "vmm":
            rt, ours = traffic("vmm", x["driver_maps"], x["driver_unmaps"]), f"{a} and {b}"
        else:
            rt = traffic("legacy", x["driver_mallocs"], x["driver_frees"])
            ours = f"{a}" if not b else f"{a} and {b}"
        lines.append(f"| {trace} | `{x['flags']}` | {reserve(x['peak_reserved_bytes'], x['end_reserved_bytes'])} | {rt} | "
                     f"{row['who']}{reserve(peak, end)}, {ours} |")
    return lines


# --- The prose's figures -----------------------------------------------------------------------

def facts(data: Path) -> list:
    out = []
    never16 = run(data, f"{LLAMA}/runs.jsonl", "never16-trace")
    auto16 = run(data, f"{LLAMA}/runs.jsonl", "auto16")
    ref = run(data, f"{LLAMA}/runs.jsonl", "ref")
    seed12 = {r["name"]: r for r in load(data, f"{LAZY}/seed12.jsonl")}
    never12, auto12, vmm12 = seed12["legacy-never"], seed12["legacy-auto-trace"], seed12["vmm-always"]

    # the setup
    steps = re.findall(r"^\[(\d+)/(\d+)\]", (data / LLAMA / "build.log").read_text(), re.M)
    out.append(f"`scripts/llama/build.sh`, {steps[-1][1]} steps")
    size = re.search(r"model size\s*=\s*([\d.]+) GiB", (data / LLAMA / "ref.log").read_text()).group(1)
    out.append(f"32 heads of 96, {float(size):.2f} GiB")
    kvs = [x["n_kv"] for x in ref["rows"]]
    out.append(f"runs {len(kvs)} prefill ubatches of 512 tokens at KV lengths {kvs[0]} to {num(kvs[-1])}")

    # the 12 GiB card
    out.append(f"ends {num(ref['rows'][-1]['vram_delta_mib'] - vmm12['rows'][-1]['vram_delta_mib'])} MiB below "
               "ggml's own VMM pool")
    if returned_at_boundaries(auto12) == 0 and stats(auto12)["num_ooms"] > 0:
        out.append("`auto` completes through its out-of-memory retries, not its boundaries")

    # per-ubatch: without purging, at every boundary, the 16 GiB default
    live = peak_live(never16)
    out.append(f"ends at {mib(stats(never16)['reserved_bytes.all.current'], 0)} MiB for at most {mib(live, 0)} MiB live "
               f"({stats(never16)['reserved_bytes.all.current'] / live:.1f}×)")
    s = stats(auto16)
    out.append(f"ends at {mib(s['reserved_bytes.all.current'], 0)} MiB (peak {mib(peak_reserved(auto16), 0)} MiB, "
               f"{s['cupool.purges']} purges returning {mib(s['cupool.purged_bytes'], 0)} MiB")
    if s["cupool.driver_allocations"] <= stats(never16)["cupool.driver_allocations"]:
        out.append("and no more driver allocations than `never`")
    lazy16 = load(data, f"{LAZY}/sweep.jsonl") + load(data, f"{LAZY}/sweep-nographs.jsonl")
    if all(stats(r)["cupool.purges"] == 0 and stats(r)["num_ooms"] == 0 for r in lazy16):
        free = min(r["card_gib"] * 1024 - max(x["vram_delta_mib"] for x in r["rows"]) for r in lazy16)
        out.append(f"a 16 GiB card is never short in this sweep ({int(free // 1024)} GiB or more stay free)")
        if all([u["peak_reserved"] for u in ubatches(r)] == [u["peak_reserved"] for u in ubatches(never16)]
               for r in lazy16 if r["purge"] == "auto" and not r["env"]):
            out.append("so `auto` keeps its cache and its row is `never`'s")

    # what auto costs: the first build, the noise, llama-bench's repetitions, 12 GiB
    first = load(data, f"{LLAMA}/runs-throughput.jsonl")
    n, a, _ = medians(first)
    k = sum(1 for r in first if r["purge"] == "never"), sum(1 for r in first if r["purge"] == "auto")
    out.append(f"cost {(1 - a / n) * 100:.0f}% of prefill throughput ({k[0]}+{k[1]} interleaved sweeps, "
               f"{num(first[0]['card_gib'])} GiB: `never` median {num(n)} tok/s, `auto` {num(a)}")
    out.append(f"which cost {(1 - a / n) * 100:.0f}% of prefill throughput (below)")
    # where the cost began: the first boundary that returned memory, and no ubatch after it as fast
    nev = [r for r in first if r["purge"] == "never"]
    aut = [r for r in first if r["purge"] == "auto"]
    at = {next(i for i, u in enumerate(ubatches(r)) if u["released"]) for r in aut}
    if len(at) == 1:
        at = at.pop()
        speed = [(statistics.median(r["rows"][i]["speed_pp"] for r in nev),
                  statistics.median(r["rows"][i]["speed_pp"] for r in aut)) for i in range(len(nev[0]["rows"]))]
        if all(sa < sn for sn, sa in speed[at:]):
            out.append(f"the cost appeared at the first purge (ubatch {at} of {len(speed)}, KV length "
                       f"{num(nev[0]['rows'][at]['n_kv'])}) and stayed")
    spreads = []
    for folder in (EAGER, LAZY):
        for f in ("sweep.jsonl", "sweep-nographs.jsonl"):
            runs = load(data, f"{folder}/{f}")
            for p in ("never", "auto"):
                v = [tok_s(r) for r in runs if r["purge"] == p]
                spreads.append((max(v) / min(v) - 1) * 100)
    out.append(f"single sweeps of one configuration spread {min(spreads):.1f}–{max(spreads):.1f}% from the slowest "
               "to the fastest")
    bench = load(data, f"{EAGER}/bench.jsonl")
    per = len(ubatches(bench[0])) // len(bench[0]["samples_tok_s"])
    syncs = {sum(u["synchronized"] for u in ubatches(r)[i * per:(i + 1) * per])
             for r in bench if r["purge"] == "auto" for i in range(len(r["samples_tok_s"]))}
    assert len(syncs) == 1, syncs
    out.append(f"every prompt synchronized the device {syncs.pop()} times")
    later = {p: statistics.median(x for r in bench if r["purge"] == p for x in r["samples_tok_s"][1:])
             for p in ("never", "auto")}
    out.append(f"repetitions 2 and 3 ran at {num(later['auto'])} tok/s against `never`'s {num(later['never'])} "
               "(medians over the runs)")
    b12 = {r["purge"]: r for r in load(data, f"{LAZY}/bench12.jsonl")}
    bn, ba = b12["never"], b12["auto"]
    if bn["oom"] and len(ubatches(bn)) < bn["prompt"] // 512:
        out.append(f"dies with `never` (CUDA OOM in the first {num(bn['prompt'])}-token prompt)")
    s = stats(ba)
    out.append(f"completes with `auto` at {num(tok_s(ba))} tok/s, {s['cupool.purges']} purges returning "
               f"{mib(s['cupool.purged_bytes'], 0)} MiB, peak {mib(peak_reserved(ba), 0)} MiB")

    # the replays
    trace = data / LAZY / "legacy-auto-trace.trace.jsonl.gz"
    keeps = [json.loads(x) for x in gzip.decompress(trace.read_bytes()).decode().splitlines()
             if x.startswith('{"op":"keep"')]
    first_all = next(i for i, x in enumerate(keeps) if not x.get("all"))
    out.append(f"the first {first_all} boundaries")
    s = stats(auto12)
    out.append(f"the run's own {s['num_ooms']} trims on 12 GiB")
    out.append(f"the 12 GiB run's {s['cupool.driver_allocations']} allocations")

    # the runtime against the engine
    sim = (data / LLAMA / "sim-predict.txt").read_text()
    m = re.search(r"out of memory in ubatch (\d+) after (\d+) tokens", sim)
    u, t = int(m.group(1)), int(m.group(2))
    out.append(f"in ubatch {u} (tokens {t}–{t + 511})")
    done = len(never12["rows"])
    words = {1: "one", 2: "two", 3: "three", 4: "four"}
    out.append(f"the engine failed {words.get(done - u, done - u)} ubatches later (tokens {done * 512}–{done * 512 + 511})")
    report = re.search(r"cached ([\d.]+) MiB \(([\d.]+) MiB of it stranded",
                       (data / LLAMA / "legacy-never.log").read_text()).group(2)
    runtime = re.search(r"reserved ([\d.]+) MiB, cached", sim).group(1)
    out.append(f"({report} MiB at the failure against the runtime's {runtime} MiB of outgrown K/V buffers)")
    compare = (data / LLAMA / "compare.txt").read_text()
    matched = re.search(r"^(\d+) runtime ubatches matched", compare, re.M).group(1)
    out.append(f"each of the {matched} prefill ubatches of the runtime matches")
    outside = int(re.search(r"^\s*(\d+)\s+allocations outside", compare, re.M).group(1))
    out.append(f"(about {round(outside / int(matched), -1):.0f} allocations a step)")
    # what the engine alone takes in every layer of every ubatch (a line counted once per layer and
    # ubatch), or in all but one layer of each (counted one ubatch's worth less)
    takes = [(int(c), int(size) * int(times)) for c, size, times in re.findall(
        r"^\s*(\d+)\s+only the engine takes: \S+ (\d+) B .*? x(\d+) per layer", compare, re.M)]
    every = max(c for c, _ in takes)
    per_layer = sum(b for c, b in takes if c >= every - int(matched))
    out.append(f"{per_layer / MiB:.0f} MiB per layer beside 2× the K/V size")
    return out


def report(data: Path) -> str:
    parts = []
    for name, table in (("ik-card12", card12_table), ("ik-ubatch-peaks", ubatch_table), ("ik-auto-cost", cost_table),
                        ("ik-two-gpus", two_table), ("ik-replay", replay_table)):
        parts.append(f"<!-- {name}: begin (python3 scripts/llama/ik-report.py) -->")
        parts.extend(table(data))
        parts.append(f"<!-- {name}: end -->")
    return "\n".join(parts) + "\n"


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--facts"]
    if len(args) > 1 or any(a.startswith("-") for a in args):
        sys.exit(__doc__)
    data = Path(args[0] if args else "data")
    if "--facts" in sys.argv[1:]:
        sys.stdout.write("".join(f + "\n" for f in facts(data)))
    else:
        sys.stdout.write(report(data))


if __name__ == "__main__":
    main()
