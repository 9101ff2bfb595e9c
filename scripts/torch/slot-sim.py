#!/usr/bin/env python3
"""A model of one placement the VMM pool does not have, run over the recorded PyTorch prefill
traces: every block above 1 MiB gets an address-space slot of its own (address space is cheap:
a slot can grow in place as far as any block needs), a new block goes to the free slot whose
mapped pages cover most of it (ties: the least mapped beyond it, then the oldest slot), and a
slot that is too short maps more pages at its end. Pages are 2 MiB and stay mapped where they
are when a block is freed. With --free SHARE, a slot that needs pages takes them from the
slots with the most pages not under a block (free slots, and busy slots beyond their block)
while such pages are more than SHARE of all mapped, as the pool's recycling moves them;
without it no page ever moves.

It answers one question: would the growing KV cache (each layer's K and V replaced every chunk
by one 3 MiB larger, `torch.cat`) land on its predecessor's pages if each had room to grow? It
models no driver, no stream order and no rounding but the 2 MiB page; blocks of 1 MiB and less
count as live and mapped as they are.

    python3 scripts/torch/slot-sim.py [--free 0.06] [--grow PAGES] TRACE.jsonl.gz ...

Prints, per trace: the live peak, the mapped peak and their ratio, pages created (in how many
growths), pages moved, slots made.
"""
import argparse
import gzip
import json

PAGE = 2 << 20
SMALL = 1 << 20


def simulate(path, free_share, grow):
    mapped = []  # per slot: pages mapped from its start
    busy = {}  # slot -> pages of the block in it
    where = {}
    live = small = peak_live = total = peak_total = 0
    creates = growths = moves = 0
    for line in gzip.open(path, "rt"):
        if line.startswith("#"):
            continue
        ev = json.loads(line)
        if ev["op"] == "alloc":
            size = ev["size"]
            if size <= SMALL:
                where[ev["id"]] = (None, size)
                small += size
            else:
                n = -(-size // PAGE)
                best = None
                for i, m in enumerate(mapped):
                    if i in busy or m == 0:
                        continue
                    key = (-min(m, n), max(m - n, 0), i)
                    best = key if best is None or key < best else best
                if best is None:
                    mapped.append(0)
                    i = len(mapped) - 1
                else:
                    i = best[2]
                m = mapped[i]
                need = max(n - m, 0)
                if need:
                    growths += 1
                    need = -(-need // grow) * grow
                busy[i] = n
                # Pages mapped and under no block, the new one's included.
                spare = lambda j: mapped[j] - busy.get(j, 0) if mapped[j] > busy.get(j, 0) else 0
                for _ in range(need):
                    unused = total - live - min(m, n)
                    donors = [j for j in range(len(mapped)) if j != i and spare(j) > 0]
                    if free_share is not None and donors and unused > free_share * total:
                        mapped[max(donors, key=spare)] -= 1
                        moves += 1
                    else:
                        total += 1
                        creates += 1
                mapped[i] = m + need
                where[ev["id"]] = (i, n)
                live += n
            peak_live = max(peak_live, live * PAGE + small)
            peak_total = max(peak_total, total * PAGE + small)
        elif ev["op"] == "free":
            i, n = where.pop(ev["id"])
            if i is None:
                small -= n
            else:
                del busy[i]
                live -= n
    mib = 1 << 20
    return (f"live peak {peak_live / mib:,.0f} MiB, mapped peak {peak_total / mib:,.0f} MiB, "
            f"ratio {peak_total / peak_live:.4f}, pages created {creates:,} in {growths:,} growths, "
            f"pages moved {moves:,}, slots {len(mapped)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--free", type=float, default=None,
                    help="move pages while more than this share of the mapped pages is under no block")
    ap.add_argument("--grow", type=int, default=1, help="a growing slot maps a multiple of this many pages")
    a = ap.parse_args()
    for t in a.traces:
        print(f"{t} (free {a.free}, grow {a.grow}): {simulate(t, a.free, a.grow)}", flush=True)


if __name__ == "__main__":
    main()
