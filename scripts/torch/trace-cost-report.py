#!/usr/bin/env python3
"""Tables of trace_cost.py's rounds: what each allocator costs the prefill's thread.

    python3 scripts/torch/trace-cost-report.py DATA_DIR [DATA_DIR ...]

Reads every ``cost.jsonl`` under the folders. Per shape and process (one PyTorch allocator
against libcupool, alternating), each allocator's median time in allocation, free and launch
calls per replayed prefill, and libcupool's paired difference to the PyTorch allocator (round r
against round r of the same process, so a slow stretch of the machine weighs on both). The last
column turns that difference into prefill speed: a prefill that took ``T`` seconds (the
``--prefill-s`` the replay was paced by, `expandable`'s fastest prefill measured on that kind
of machine, for every peer) takes ``T + d`` with libcupool, assuming the thread's other work is
the same and never hidden behind the GPU (so the speed is a lower bound where d > 0), which is
what the replay cannot see: it replays the allocator's calls and the launches beside them,
not the model's other work. The median difference's 95% interval (a bootstrap over the pairs)
says whether the speed is resolved against a goal.
"""
import collections
import glob
import json
import os
import random
import statistics
import sys


def load(dirs):
    rows = []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "cost.jsonl"), recursive=True)):
            with open(path) as f:
                for line in f:
                    if line.startswith("{"):
                        r = json.loads(line)
                        # A process: its file and pid (one process per shape and peer a file
                        # before the pid was written).
                        r["process"] = (path, r.get("pid"))
                        rows.append(r)
    return rows


def ms(ns):
    return ns / 1e6


def spent(row):
    """The round's time in the allocator's calls and in the launches beside them, in ms."""
    return ms(row["alloc_ns"] + row["free_ns"] + row["launch_ns"])


def fmt_range(xs, digits=1):
    med = statistics.median(xs)
    if len(xs) == 1:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} [{min(xs):,.{digits}f}, {max(xs):,.{digits}f}]"


def interval(groups, draws=4000):
    """The 95% interval of the median of the paired differences in ``groups`` (one list per
    process): a bootstrap that draws processes, then rounds within each drawn process, since
    processes differ more than rounds of one process (seeded: the same data print the same
    table). With one process it is an interval over its rounds alone, which says nothing of
    the spread between processes."""
    rng = random.Random(0)
    meds = []
    for _ in range(draws):
        pooled = []
        for g in rng.choices(groups, k=len(groups)):
            pooled += rng.choices(g, k=len(g))
        meds.append(statistics.median(pooled))
    meds.sort()
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def timed(r):
    """Whether a round counts: with the cache kept, a first round made without the untimed
    warm-up (an older trace_cost.py) mapped what the later ones reuse, and is left out."""
    return not (r["label"].endswith("(cache kept)") and not r.get("warmed") and r["round"] == 0)


def tables(rows):
    """Markdown lines: one table per shape, a row per allocator and process."""
    by_shape = collections.defaultdict(list)
    for r in rows:
        if timed(r):
            by_shape[r["label"]].append(r)
    out = []
    for shape, rs in sorted(by_shape.items()):
        first = rs[0]
        out += [f"{shape}: {first['events']:,} allocations and frees a prefill "
                f"({first['trace']}), paced over {first['pace_ns'] * first['events'] / 1e9:.2f} s "
                f"(`expandable`'s fastest prefill, the T of the speed columns) with "
                f"{first['launches']:,} launches; {first['gpu']}, PyTorch {first['torch']}",
                "",
                "| allocator | compared with | processes | rounds | allocations (ms) | frees (ms) | launches (ms) "
                "| all calls (ms) | against the peer, paired (ms) | each process's median (ms) "
                "| prefill speed against the peer | the median's 95% interval "
                "| libcupool's driver calls (ms) | synchronizes |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        # A process is one PyTorch allocator against libcupool; rounds pair by their number.
        peers = sorted({r["allocator"] for r in rs if not r["allocator"].startswith("cupool")})
        builds = sorted({r["allocator"] for r in rs if r["allocator"].startswith("cupool")})
        for peer, build in [(p, b) for p in peers for b in builds]:
            mine = [r for r in rs if r["peer"] == peer]
            key = lambda r: (r["process"], r["round"])  # noqa: E731
            ours = {key(r): r for r in mine if r["allocator"] == build}
            # The peer's rounds of the processes that ran this build.
            theirs = {key(r): r for r in mine if r["allocator"] == peer
                      and (r["process"], r["round"]) in ours}
            paired = sorted(set(theirs) & set(ours))
            processes = len({k[0] for k in paired})
            if not paired:
                continue
            prefill_s = first_pace(theirs.values())
            diff = [spent(ours[k]) - spent(theirs[k]) for k in paired]
            speed = [prefill_s / (prefill_s + d / 1e3) for d in diff]
            groups = collections.defaultdict(list)
            for k, d in zip(paired, diff):
                groups[k[0]].append(d)
            lo, hi = interval(list(groups.values()))
            per_process = ", ".join(f"{statistics.median(g):+.1f}" for g in groups.values())
            at = f"{prefill_s / (prefill_s + hi / 1e3):.3f}–{prefill_s / (prefill_s + lo / 1e3):.3f}"
            for who, side in ((peer, theirs), (build, ours)):
                rr = [side[k] for k in paired]
                row = [who, peer if who == build else "–", str(processes), str(len(rr)),
                       fmt_range([ms(r["alloc_ns"]) for r in rr]),
                       fmt_range([ms(r["free_ns"]) for r in rr]),
                       fmt_range([ms(r["launch_ns"]) for r in rr]),
                       fmt_range([spent(r) for r in rr])]
                if who == build:
                    row += [fmt_range(diff), per_process, fmt_range(speed, 3), at,
                            fmt_range([ms(r["cupool.driver_ns"]) for r in rr]),
                            fmt_range([r["cupool.driver_calls.synchronize"] for r in rr], 0)]
                else:
                    row += ["–", "–", "–", "–", "–", "–"]
                out.append("| " + " | ".join(row) + " |")
        out.append("")
    return out


def first_pace(rows):
    r = next(iter(rows))
    return r["pace_ns"] * r["events"] / 1e9


def main(dirs):
    rows = load(dirs)
    if not rows:
        sys.exit("no cost.jsonl under " + " ".join(dirs))
    print("\n".join(tables(rows)))


if __name__ == "__main__":
    main(sys.argv[1:])
