#!/usr/bin/env python3
"""What an allocator costs the thread that runs a prefill: a recorded request stream replayed
through PyTorch's allocator and through libcupool in one process, round after round.

    python3 scripts/torch/trace_cost.py --trace data/.../trace-phi3.jsonl.gz --prefill-s 1.3 \\
        --launches 57000 --rounds 6 [--torch expandable|native|async] > cost.jsonl

One prefill of a model in a process takes 0.9 to 2.0 s on the GPU machine for the same work: the
Python thread's speed varies between runs and processes by far more than an allocator's share
of it, so prefill times of two allocators, one process each, cannot resolve a goal of 2%. Here
the part of that thread's work that depends on the allocator runs alone, in one process:

- the trace's events before its first ``phase_begin`` (the model's weights) are allocated once
  per allocator and stay live;
- each round replays the prefill's events (the first ``phase_begin`` to the last ``phase_end``),
  event i no earlier than i x (prefill seconds / events) after the round's start: spread evenly
  over the prefill's time (the trace has no times of its own), with ``--launches`` empty kernel
  launches spread between them (a real prefill launches about one kernel per allocation; a
  worker thread's driver calls can slow launches down, and this counts it);
- then what the round left live is freed, the device synchronized, and the allocator's free
  memory given back to the driver (``torch.cuda.empty_cache()`` or ``cupool.trim``), as
  ``prefill.py --speed-reps`` does between its prefills (with ``--keep-cache``, kept);
- the two allocators alternate, PyTorch's first in rounds 0, 2, 4, ... and libcupool's in the
  others (``--rounds`` must be even);
- with ``--keep-cache``, one untimed round of each first, so every timed round runs on the
  memory an earlier one left.

Each round prints a JSON line: the time of every allocation, free and launch call summed, and
the round's wall time. ``trace-cost-report.py`` turns them into a table. libcupool runs as
``cupool.torch.install()`` opens it (the vmm pool, lanes' growth made on a worker thread),
called through its PyTorch entry points; PyTorch's allocator through ``raw_alloc_with_stream``
and ``raw_delete``, its tensors' malloc and free. Both on device 0 (the replay passes libcupool
device 0; run it with that GPU current) and the legacy default stream.
"""
import argparse
import ctypes
import gzip
import json
import os
import sys
import time

TORCH_CONF = {"native": "", "expandable": "expandable_segments:True",
              "async": "backend:cudaMallocAsync"}


def read_events(path):
    """The trace's allocation, free and phase events, in order."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def split(events):
    """(setup, prefill, nslots): the events before the first phase and those from it to the last
    phase's end, each a list of (kind, slot, size) with kind 0 an allocation and 1 a free. Slots
    are dense per trace. A prefill event that frees a setup block is dropped (the block stays live
    in every round), as is any zero-byte request and its free."""
    begins = [i for i, e in enumerate(events) if e["op"] == "phase_begin"]
    ends = [i for i, e in enumerate(events) if e["op"] == "phase_end"]
    if not begins or not ends:
        raise SystemExit("the trace has no phases: record it with prefill.py --record")
    first, last = begins[0], ends[-1]
    # Every allocation its own slot, also where the trace uses an id again after its free.
    slots, setup, prefill, in_setup, nslots = {}, [], [], set(), 0
    for i, e in enumerate(events[:last + 1]):
        part = setup if i < first else prefill
        if e["op"] == "alloc" and e["size"] > 0:
            slots[e["id"]] = nslots
            nslots += 1
            part.append((0, slots[e["id"]], e["size"]))
            if part is setup:
                in_setup.add(slots[e["id"]])
        elif e["op"] == "free" and e["id"] in slots:
            slot = slots.pop(e["id"])
            if part is setup or slot not in in_setup:
                part.append((1, slot, 0))
    return setup, prefill, nslots


LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaMemsetAsync", "cudaMemcpyAsync")


def launches_in(profile):
    """The launches of a prefill.py --profile table: its calls of the runtime's and the driver's
    launch, memset and copy entry points (the last column, "# of Calls", of their rows)."""
    calls = {}
    for line in profile.split("Self CPU time total")[0].splitlines():
        cols = line.split()
        if cols and cols[0] in LAUNCH_CALLS and cols[-1].isdigit():
            calls.setdefault(cols[0], int(cols[-1]))
    if "cudaLaunchKernel" not in calls:
        raise SystemExit("the profile has no cudaLaunchKernel row: a prefill.py --profile table?")
    return sum(calls.values())


def fastest_prefill(lines, model):
    """The fastest prefill (s) of the last prefill.py result for ``model`` among ``lines``."""
    results = [json.loads(x) for x in lines if x.startswith("{")]
    results = [r for r in results if r.get("model") == model and "prefill_s" in r]
    if not results:
        raise SystemExit(f"no prefill.py result for {model}")
    return min([results[-1]["prefill_s"]] + results[-1].get("speed_prefill_s", []))


def order(rounds):
    """Which allocator runs first in each round: PyTorch's in rounds 0, 2, 4, ..., libcupool's
    in 1, 3, 5, ... (an even number of rounds puts each first as often)."""
    return [("torch", "cupool") if r % 2 == 0 else ("cupool", "torch") for r in range(rounds)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", required=True)
    p.add_argument("--torch", choices=sorted(TORCH_CONF), default="expandable",
                   help="PyTorch's allocator to compare with (PYTORCH_CUDA_ALLOC_CONF)")
    pace = p.add_mutually_exclusive_group(required=True)
    pace.add_argument("--prefill-s", type=float,
                      help="the prefill's time: the replay's events are spread over it")
    pace.add_argument("--prefill-from", metavar="JSONL",
                      help="prefill.py's results: the fastest prefill of the last for --label")
    launch = p.add_mutually_exclusive_group(required=True)
    launch.add_argument("--launches", type=int,
                        help="kernel launches a prefill makes (torch.profiler's launch, memset "
                             "and copy calls)")
    launch.add_argument("--launches-from", metavar="PROFILE",
                        help="a prefill.py --profile table: its launch, memset and copy calls")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--cupool", action="append", default=[], metavar="OPTION=VALUE",
                   help="an option for libcupool beyond install()'s (cupool.init's keywords, "
                        "e.g. vmm_defer=on); the rows then name libcupool cupool-VALUE...")
    p.add_argument("--keep-cache", action="store_true",
                   help="no empty_cache or trim between rounds: each round runs on the memory "
                        "the last left, as a server's next request does (prefill.py --keep-cache)")
    p.add_argument("--label", default="", help="the shape's name (prefill.py's --model), "
                   "written into every line")
    a = p.parse_args()
    if a.rounds < 2 or a.rounds % 2:
        p.error(f"--rounds {a.rounds}: an even number, at least 2, so each allocator goes first "
                "as often")
    if a.prefill_from:
        with open(a.prefill_from) as f:
            a.prefill_s = fastest_prefill(f.readlines(), a.label)
    if a.launches_from:
        with open(a.launches_from) as f:
            a.launches = launches_in(f.read())

    # PyTorch reads its allocator's settings once, at its first CUDA allocation.
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = TORCH_CONF[a.torch]
    import torch
    from torch.utils import cpp_extension
    # The package of this checkout (as prefill.py's allocators.py finds it).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import cupool
    import cupool.torch

    setup, prefill, nslots = split(read_events(a.trace))
    torch.cuda.init()
    torch.empty(1, device="cuda")
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.join(os.path.expanduser("~"), ".cache", "cupool", "trace_cost")
    os.makedirs(build, exist_ok=True)
    ext = cpp_extension.load(name="cupool_trace_cost", sources=[os.path.join(here, "trace_cost.cpp")],
                             build_directory=build, with_cuda=True, verbose=False)
    extra = dict(kv.split("=", 1) for kv in a.cupool)
    cupool.ensure_open(None, "vmm", None,
                       cupool.torch.install_options(None, {"time_driver": "on", **extra}))
    lib = cupool._lib.load()
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    fns = {"torch": (0, 0), "cupool": (addr(lib.cupool_torch_alloc), addr(lib.cupool_torch_free))}

    def replayer(events, who):
        kinds, slots, sizes = zip(*events) if events else ((), (), ())
        return ext.Replayer(list(kinds), list(slots), list(sizes), nslots, *fns[who])

    held = {}
    for who in ("torch", "cupool"):
        held[who] = replayer(setup, who)
        held[who].run(0, 0)
    runs = {who: replayer(prefill, who) for who in ("torch", "cupool")}
    pace = int(a.prefill_s * 1e9 / max(len(prefill), 1))
    names = {"torch": a.torch, "cupool": "-".join(["cupool"] + [f"{k.replace('vmm_', '')}{v}" for k, v in extra.items()])}
    dev = torch.cuda.current_device()
    if a.keep_cache:
        # The first round of each maps what the later ones reuse: not timed.
        for who in ("torch", "cupool"):
            runs[who].run(pace, a.launches)
            torch.cuda.synchronize()
            runs[who].free_all()
            torch.cuda.synchronize()
    for r, first in enumerate(order(a.rounds)):
        for who in first:
            before = cupool.stats(dev) if who == "cupool" else {}
            torch.cuda.synchronize()
            out = runs[who].run(pace, a.launches)
            torch.cuda.synchronize()
            out.update(round=r, allocator=names[who], peer=a.torch, pid=os.getpid(),
                       warmed=a.keep_cache,
                       label=a.label + (" (cache kept)" if a.keep_cache else ""), events=len(prefill),
                       pace_ns=pace, trace=os.path.basename(a.trace),
                       gpu=torch.cuda.get_device_name(dev), torch=torch.__version__)
            if who == "cupool":
                after = cupool.stats(dev)
                # Every driver counter that moved (calls and nanoseconds per kind).
                for k in after:
                    if k.startswith(("cupool.driver_ns", "cupool.driver_calls.")):
                        out[k] = after[k] - before.get(k, 0)
                for k in ("cupool.driver_ns", "cupool.driver_calls.synchronize"):
                    out.setdefault(k, 0)
                out["reserved_peak_mib"] = after["reserved_bytes.all.peak"] / 2**20
            else:
                out["reserved_peak_mib"] = torch.cuda.memory_stats()["reserved_bytes.all.peak"] / 2**20
            print(json.dumps(out), flush=True)
            runs[who].free_all()
            torch.cuda.synchronize()
            if who == "cupool":
                if not a.keep_cache:
                    cupool.trim(dev)
                cupool.reset_peaks()
            else:
                if not a.keep_cache:
                    torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            time.sleep(0.2)
    for who in ("torch", "cupool"):
        held[who].free_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
