#!/usr/bin/env python3
"""Models of placements over the recorded PyTorch prefill traces: what the VMM pool's mapped
peak would be, and how many pages it would create or move, if blocks were placed another way.
Not the pool: no driver, no stream order, no rounding but the 2 MiB page; blocks of 1 MiB and
less count as live and mapped as they are.

Models (--model):
- `pool`: one address range, each block above 1 MiB at the lowest address it fits; a freed
  block's pages stay mapped where they are; a block on unmapped pages gets pages moved from
  free ranges while more than --free of the mapped pages lie under no block, else new ones.
  Roughly the pool's placement and recycling (compare its replays in
  data/cpu-2026-11-27-recycle-sweep).
- `pool` with --kv-slots: the same, but a block freed while one of the last four blocks
  allocated is a little larger (by at most --grow-mib) is a tensor replaced by a grown copy
  (PyTorch's KV cache, `torch.cat` every chunk): a slot opens, an address range of its own with
  room to grow, and the next block whose size is at most --grow-mib above a free slot's mapped
  pages goes there, mapping only what it grew by.
- `slots`: every block above 1 MiB in a slot of its own; a new block goes to the free slot whose
  mapped pages cover most of it (ties: the least mapped beyond it).

    python3 scripts/torch/slot-sim.py --model pool [--kv-slots] [--free 0.06] TRACE.jsonl.gz ...

Prints, per trace: the live and mapped peaks and their ratio, pages created and moved, slots.
"""
import argparse
import bisect
import gzip
import json

import numpy as np

PAGE = 2 << 20
SMALL = 1 << 20
VA = 1 << 16  # pages of address space modelled (128 GiB)
SLOT_BASE = 1 << 15  # slots start here, SLOT_PAGES apart
SLOT_PAGES = 256


def events(path):
    for line in gzip.open(path, "rt"):
        if not line.startswith("#"):
            ev = json.loads(line)
            if ev["op"] in ("alloc", "free"):
                yield ev


def replay(path, place, release):
    """Runs a trace: blocks of 1 MiB and less count as live and mapped as they are; a larger one
    of `n` pages goes where `place(id, size, n, st)` puts it, and what that returned goes to
    `release(id, placed, size, st)` at its free. `st` holds the figures the models update."""
    st = dict(live=0, small=0, peak_live=0, total=0, peak=0, created=0, moved=0)
    where = {}
    for ev in events(path):
        placed, size = where.pop(ev["id"]) if ev["op"] == "free" else (None, ev["size"])
        n = -(-size // PAGE)
        if ev["op"] == "alloc":
            if size <= SMALL:
                where[ev["id"]] = (None, size)
                st["small"] += size
            else:
                where[ev["id"]] = (place(ev["id"], size, n, st), size)
                st["live"] += n
        elif size <= SMALL:
            st["small"] -= size
        else:
            release(ev["id"], placed, size, st)
            st["live"] -= n
        st["peak_live"] = max(st["peak_live"], st["live"] * PAGE + st["small"])
        st["peak"] = max(st["peak"], st["total"] * PAGE + st["small"])
    return st


def pool_model(path, free_share, kv_slots, grow):
    mapped = np.zeros(VA, dtype=np.int8)
    under = np.zeros(VA, dtype=np.int8)
    blocks, recent, free_slots, placed = [], [], [], {}
    slots = [0]

    def back(p, n, st):
        for h in np.where(mapped[p:p + n] == 0)[0]:
            if st["total"] - int(under.sum()) > free_share * st["total"]:
                donors = np.where((mapped == 1) & (under == 0))[0]
                donors = donors[(donors < p) | (donors >= p + n)]
                if len(donors):
                    mapped[donors[-1]] = 0
                    mapped[p + h] = 1
                    st["moved"] += 1
                    continue
            mapped[p + h] = 1
            st["total"] += 1
            st["created"] += 1

    def place(bid, size, n, st):
        nonlocal recent
        p = None
        fits = []
        for k in free_slots:
            at = SLOT_BASE + k * SLOT_PAGES
            m = int(mapped[at:at + SLOT_PAGES].sum())
            if m <= n and (n - m) * PAGE <= grow and n <= SLOT_PAGES:
                fits.append((m, k))
        if fits:
            k = max(fits)[1]
            free_slots.remove(k)
            p = SLOT_BASE + k * SLOT_PAGES
        if p is None:
            prev = 0
            for s, e, _ in blocks:
                if s >= SLOT_BASE or s - prev >= n:
                    break
                prev = max(prev, e)
            p = prev
        back(p, n, st)
        under[p:p + n] = 1
        bisect.insort(blocks, (p, p + n, bid))
        recent = (recent + [size])[-4:]
        return p

    def release(bid, p, size, st):
        n = -(-size // PAGE)
        under[p:p + n] = 0
        blocks.pop(bisect.bisect_left(blocks, (p, p + n, bid)))
        if p >= SLOT_BASE:
            free_slots.append((p - SLOT_BASE) // SLOT_PAGES)
        elif kv_slots and any(size < r <= size + grow for r in recent):
            free_slots.append(slots[0])
            slots[0] += 1

    st = replay(path, place, release)
    return st, slots[0]


def slots_model(path):
    mapped, busy = [], {}

    def place(bid, size, n, st):
        free = [(-min(m, n), max(m - n, 0), i) for i, m in enumerate(mapped) if i not in busy and m]
        if free:
            i = min(free)[2]
        else:
            mapped.append(0)
            i = len(mapped) - 1
        need = max(n - mapped[i], 0)
        mapped[i] += need
        st["total"] += need
        st["created"] += need
        busy[i] = n
        return i

    def release(bid, i, size, st):
        del busy[i]

    st = replay(path, place, release)
    return st, len(mapped)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--model", choices=["pool", "slots"], default="pool")
    ap.add_argument("--kv-slots", action="store_true", help="slots for blocks replaced by a grown copy")
    ap.add_argument("--free", type=float, default=0.06, help="pool: move pages while more than this share lies unused")
    ap.add_argument("--grow-mib", type=int, default=16, help="the most a replaced block grows by")
    a = ap.parse_args()
    mib = 1 << 20
    for t in a.traces:
        if a.model == "slots":
            st, slots = slots_model(t)
            label = "slots"
        else:
            st, slots = pool_model(t, a.free, a.kv_slots, a.grow_mib << 20)
            label = f"pool, free {a.free}" + (", kv slots" if a.kv_slots else "")
        print(f"{t} ({label}): live peak {st['peak_live'] / mib:,.0f} MiB, mapped peak {st['peak'] / mib:,.0f} MiB, "
              f"ratio {st['peak'] / st['peak_live']:.4f}, pages created {st['created']:,}, moved {st['moved']:,}, "
              f"slots {slots}", flush=True)


if __name__ == "__main__":
    main()
