"""trace_cost.py's split of a recorded trace and what it reads from prefill.py's output, and
trace-cost-report.py's pairing of rounds: the parts that decide what the GPU replay measures."""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module(name):
    path = os.path.join(ROOT, "scripts", "torch", name)
    spec = importlib.util.spec_from_file_location(name.replace("-", "_")[:-3], path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


cost = module("trace_cost.py")
report = module("trace-cost-report.py")


def ev(op, **kw):
    return {"op": op, **kw}


def test_the_weights_stay_and_the_prefill_repeats():
    events = [ev("alloc", id=7, size=100, stream=0),            # a weight
              ev("alloc", id=8, size=0, stream=0),              # zero bytes: PyTorch's, none here
              ev("alloc", id=9, size=50, stream=0), ev("free", id=9),
              ev("phase_begin", name="prefill 0"),
              ev("alloc", id=10, size=30, stream=0),
              ev("free", id=7),                                 # a weight freed: stays live
              ev("free", id=8),
              ev("alloc", id=11, size=40, stream=0), ev("free", id=10),
              ev("phase_end", name="prefill 0", prefill=False),
              ev("alloc", id=12, size=60, stream=0)]            # decode: not replayed
    setup, prefill, nslots = cost.split(events)
    assert setup == [(0, 0, 100), (0, 1, 50), (1, 1, 0)]
    assert prefill == [(0, 2, 30), (0, 3, 40), (1, 2, 0)]
    assert nslots == 4


def test_an_id_used_again_gets_a_slot_of_its_own():
    events = [ev("phase_begin", name="prefill 0"),
              ev("alloc", id=1, size=10, stream=0), ev("alloc", id=2, size=20, stream=0),
              ev("free", id=1), ev("alloc", id=1, size=30, stream=0),
              ev("phase_end", name="prefill 0", prefill=False)]
    setup, prefill, nslots = cost.split(events)
    assert setup == []
    assert prefill == [(0, 0, 10), (0, 1, 20), (1, 0, 0), (0, 2, 30)]
    assert nslots == 3


def test_a_trace_without_phases_is_refused():
    with pytest.raises(SystemExit, match="no phases"):
        cost.split([ev("alloc", id=1, size=10, stream=0)])


def test_the_rounds_alternate_who_goes_first():
    assert cost.order(4) == [("torch", "cupool"), ("cupool", "torch")] * 2


def test_launches_and_the_fastest_prefill_come_from_prefill_py():
    profile = "\n".join([
        "# profiled prefill: 1.9 s", "----",
        "Name Self CPU % Self CPU CPU total % CPU total CPU time avg Self CUDA Self CUDA % "
        "CUDA total CUDA time avg # of Calls",
        "cudaLaunchKernel 22.97% 327.129ms 22.97% 327.129ms 6.593us 0.000us 0.00% 0.000us 0.000us 49617",
        "aten::mm 10.01% 142.568ms 12.91% 183.829ms 35.626us 201.837ms 18.71% 201.837ms 39.116us 5160",
        "cuLaunchKernelEx 3.32% 47.333ms 3.48% 49.568ms 7.697us 0.000us 0.00% 0.000us 0.000us 6440",
        "cudaMemsetAsync 1.00% 14.244ms 1.00% 14.244ms 10.799us 0.000us 0.00% 0.000us 0.000us 1319",
        "Self CPU time total: 1.4s",
        "cudaLaunchKernel 0% 0 0% 0 0 1.0ms 1% 1.0ms 1us 99999"])   # the CUDA-sorted table
    assert cost.launches_in(profile) == 49617 + 6440 + 1319
    with pytest.raises(SystemExit, match="cudaLaunchKernel"):
        cost.launches_in("aten::mm 1 2 3 4")
    lines = [json.dumps({"model": "phi3", "prefill_s": 2.0, "speed_prefill_s": [1.5, 1.7]}),
             json.dumps({"model": "llama3", "prefill_s": 1.0}),
             json.dumps({"model": "phi3", "prefill_s": 1.9, "speed_prefill_s": [1.4, 1.3]})]
    assert cost.fastest_prefill(lines, "phi3") == 1.3
    assert cost.fastest_prefill(lines, "llama3") == 1.0
    with pytest.raises(SystemExit, match="qwen3moe"):
        cost.fastest_prefill(lines, "qwen3moe")


def row(allocator, rnd, alloc_ms, launch_ms=100.0, peer="expandable", process=1, **kw):
    r = {"process": ("cost.jsonl", process), "label": "phi3", "allocator": allocator, "peer": peer, "round": rnd,
         "alloc_ns": alloc_ms * 1e6, "free_ns": 5e6, "launch_ns": launch_ms * 1e6,
         "events": 1000, "pace_ns": 1_000_000, "launches": 900, "trace": "t.jsonl.gz",
         "gpu": "GPU", "torch": "2.11"}
    if allocator == "cupool":
        r.update({"cupool.driver_ns": 2e6, "cupool.driver_calls.synchronize": 0})
    r.update(kw)
    return r


def test_the_report_pairs_rounds_and_turns_the_difference_into_speed():
    # Round 1 ran slow for both: paired, cupool costs 10 ms more in each round.
    rows = [row("expandable", 0, 20), row("cupool", 0, 30),
            row("expandable", 1, 60), row("cupool", 1, 70),
            row("async", 0, 50, peer="async"), row("cupool", 0, 30, peer="async"),
            # Another process's round 0: pairs with its own cupool round, not the first's.
            row("expandable", 0, 20, process=2)]
    text = "\n".join(report.tables(rows))
    # The prefill was paced over 1.0 s: 1 s + 10 ms is 0.990x the peer's speed.
    assert "| cupool | expandable | 1 | 2 | 50.0 [30.0, 70.0] |" in text
    assert ("| 10.0 [10.0, 10.0] | +10.0 | 0.990 [0.990, 0.990] | 0.990–0.990 | 2.0 [2.0, 2.0] "
            "| 0 [0, 0] |" in text)
    assert ("| cupool | async | 1 | 1 | 30.0 |" in text
            and "| -20.0 | -20.0 | 1.020 | 1.020–1.020 |" in text)
    assert "| expandable | – | 1 | 2 |" in text


def test_the_interval_of_the_median_holds_it_and_is_repeatable():
    diffs = [5.0, 40.0, 10.0, 12.0, -3.0, 20.0, 15.0, 8.0]
    lo, hi = report.interval([diffs])
    assert lo <= 11.0 <= hi and min(diffs) <= lo and hi <= max(diffs)
    assert report.interval([diffs]) == (lo, hi)


def test_processes_that_disagree_widen_the_interval():
    # Two processes, each tight, far apart: the interval spans both, not the pooled rounds'.
    a, b = [10.0, 11.0, 9.0, 10.5] * 4, [40.0, 41.0, 39.0, 40.5] * 4
    lo, hi = report.interval([a, b])
    assert lo <= 11.0 and hi >= 39.0


def test_a_cold_first_round_with_the_cache_kept_is_left_out():
    kept = dict(label="phi3 (cache kept)")
    rows = [row("expandable", 0, 90, **kept), row("cupool", 0, 200, **kept),
            row("expandable", 1, 20, **kept), row("cupool", 1, 25, **kept)]
    text = "\n".join(report.tables(rows))
    assert "| cupool | expandable | 1 | 1 | 25.0 |" in text
    # Recorded after an untimed warm-up: round 0 counts.
    rows = [dict(r, warmed=True) for r in rows]
    assert "| cupool | expandable | 1 | 2 |" in "\n".join(report.tables(rows))
