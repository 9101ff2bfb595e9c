#!/usr/bin/env python3
"""Make one process's several requests out of a recorded PyTorch prefill trace.

A trace recorded by prefill.py holds one request: the model's weights (allocated before the
first phase) and one chunked prefill. A server, a notebook or a benchmark that does not call
torch.cuda.empty_cache() between requests runs the prefill again on a pool that kept the first
one's memory. This writes such a process: the weights once, then each request in turn, every
allocation of a request freed at its end (what the request left live, such as its KV cache,
goes with it).

Each request is the recorded prefill, or its first chunks only: `--requests full,half,full`
runs the whole prompt, then the first half of its chunks, then the whole again.

    scripts/torch/repeat-trace.py TRACE.jsonl.gz OUT.jsonl --requests full,full
    repro-prefill replay OUT.jsonl --pool vmm --round-large 2097152 --size-classes 1048576 \
        --recycle on --format json
"""
import argparse
import gzip
import json


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip() and not line.startswith("#")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a recorded trace (JSON lines, plain or .gz)")
    ap.add_argument("out", help="the trace to write (JSON lines)")
    ap.add_argument(
        "--requests",
        default="full,full",
        help="the requests in order, comma-separated: full (the recorded prefill) or half "
        "(its first half of chunks); default full,full",
    )
    a = ap.parse_args()
    events = read(a.trace)
    first = next(i for i, e in enumerate(events) if e["op"] == "phase_begin")
    weights, body = events[:first], events[first:]
    chunks = [i for i, e in enumerate(body) if e["op"] == "phase_begin"]
    stride = max(e.get("id", 0) for e in events) + 1
    with open(a.out, "w") as out:
        out.write("# " + ", ".join(a.requests.split(",")) + " requests of " + a.trace.split("/")[-1] + "\n")
        for e in weights:
            out.write(json.dumps(e) + "\n")
        for r, kind in enumerate(a.requests.split(",")):
            if kind == "full":
                part = body
            elif kind == "half":
                part = body[: chunks[len(chunks) // 2]]
            else:
                raise SystemExit(f"--requests: {kind!r} is not a request; accepted: full, half")
            live = set()
            for e in part:
                e = dict(e)
                if e["op"] == "alloc":
                    e["id"] += r * stride
                    live.add(e["id"])
                elif e["op"] == "free":
                    e["id"] += r * stride
                    if e["id"] not in live:
                        continue
                    live.discard(e["id"])
                out.write(json.dumps(e) + "\n")
            for i in sorted(live):
                out.write(json.dumps({"op": "free", "id": i}) + "\n")


if __name__ == "__main__":
    main()
