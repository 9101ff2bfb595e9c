"""Replays the recorded PyTorch prefill traces through libcupool's VMM pool settings on the
simulated device, for every page size (CUPOOL_VMM_RECYCLE_PAGE, MiB) and free share
(CUPOOL_VMM_RECYCLE_FREE, percent) asked for, and prints a Markdown table: reserve over live
peak, and the driver calls the recycling makes (pages created, moved, old mappings dropped).

    python3 scripts/torch/recycle-sweep.py --pages 2,4,8,16,32 --frees 2,3,4,6

The replay's counts are the GPU's: libcupool made as many moves in the measured prefills
(data/h100-2026-11-27-prefill-driver-time)."""
import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = {
    "phi3": "data/h100-2026-11-22-pytorch/trace-phi3.jsonl.gz",
    "llama3": "data/h100-2026-11-22-pytorch/trace-llama3.jsonl.gz",
    "qwen3moe": "data/h100-2026-11-26-recycle-free-phi3-moe/trace-qwen3moe.jsonl.gz",
}

p = argparse.ArgumentParser()
p.add_argument("--pages", default="8", help="page sizes in MiB, separated by commas")
p.add_argument("--frees", default="2,6", help="free shares in percent, separated by commas")
p.add_argument("--models", default=",".join(TRACES))
p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "repro-prefill"))
a = p.parse_args()

print("| trace | page (MiB) | free kept (%) | reserve / live peak | pages created | pages moved | old mappings dropped |")
print("|---|---|---|---|---|---|---|")
for m in a.models.split(","):
    for page in a.pages.split(","):
        for free in a.frees.split(","):
            env = dict(os.environ, CUPOOL_VMM_RECYCLE_PAGE=page, CUPOOL_VMM_RECYCLE_FREE=free)
            out = subprocess.run([a.bin, "replay", os.path.join(ROOT, TRACES[m]), "--pool", "vmm",
                                  "--round-large", "2097152", "--size-classes", "1048576",
                                  "--recycle", "on", "--quiet", "--format", "json"],
                                 env=env, capture_output=True, text=True, check=True).stdout
            r = json.loads(out)
            ratio = r["peak_reserved_bytes"] / r["peak_live_bytes"]
            print(f"| {m} | {page} | {free} | {ratio:.3f} | {r['driver_maps']:,} | {r['driver_remaps']:,} "
                  f"| {r['driver_unmaps']:,} |")
