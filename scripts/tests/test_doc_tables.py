"""docs/pytorch.md's measured tables are what scripts/torch/report.py makes of the raw runs kept
under data/: a table edited by hand, or data changed without its table, fails here."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = "data/h100-2026-11-22-pytorch"


def blocks(*args):
    """The report's output as blocks of consecutive non-empty lines."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "torch", "report.py"), *args],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [b.strip("\n") for b in out.split("\n\n") if b.strip()]


def check(*args):
    docs = open(os.path.join(ROOT, "docs", "pytorch.md")).read()
    got = blocks(*args)
    assert got, f"report.py {' '.join(args)} printed nothing"
    for b in got:
        assert b in docs, (f"docs/pytorch.md lacks this block of python3 scripts/torch/report.py "
                           f"{' '.join(args)}:\n{b}")


def test_the_five_allocators_tables_are_their_runs():
    check(f"{DATA}/prefill-llama3.jsonl", f"{DATA}/prefill-phi3.jsonl")


def test_the_final_settings_tables_are_their_runs():
    check(f"{DATA}/prefill-final.jsonl")


def test_the_micro_benchmark_table_is_its_run():
    check("--micro", f"{DATA}/micro.jsonl")


def test_the_sleep_and_wake_table_is_its_run():
    check("--sleep", "data/h100-2026-11-25-sleep/sleep.jsonl")


def test_the_threads_tables_are_their_runs():
    check("--threads", "data/h100-2026-11-27-threads-3")


def test_the_page_recycling_tables_are_their_run():
    check("data/h100-2026-11-25-recycle/prefill.jsonl")


def test_the_recycling_pages_tables_are_their_runs():
    check("data/h100-2026-11-25-recycle-pages/prefill.jsonl")


def test_the_recycling_on_and_off_table_is_its_runs():
    check("data/h100-2026-11-25-recycle-off/prefill.jsonl")


def test_the_driver_time_tables_are_their_runs():
    check("data/h100-2026-11-27-prefill-driver-time/prefill-phi3.jsonl")
    check("data/h100-2026-11-27-prefill-driver-time/prefill-llama3-moe.jsonl")
    check("data/h100-2026-11-27-recycle-page-timed/prefill-phi3.jsonl",
          "data/h100-2026-11-27-recycle-page-timed/prefill-llama3.jsonl")


def test_the_repeated_prefill_tables_are_their_runs():
    check("data/h100-2026-11-27-prefill-repeated/prefill.jsonl")
    check("data/h100-2026-11-27-prefill-repeated-free2/prefill.jsonl")
    check("data/h100-2026-11-27-defer/prefill.jsonl")


def test_the_backing_aware_placement_tables_are_their_runs():
    check("data/h100-2026-11-26-recycle-placement-phi3/prefill.jsonl")
    check("data/h100-2026-11-26-recycle-placement-llama3-moe/prefill.jsonl")
    check("data/h100-2026-11-26-recycle-onoff/prefill.jsonl")


# Two GPUs (scripts/torch/two-gpu.sh): docs/pytorch.md's section between the dist-tables markers
# is scripts/torch/dist-report.py's output on the run's folder, once that folder is there.
DIST_DATA = "data/h100x2-2026-11-26-distributed"
DIST_RECYCLE_DATA = "data/h100x2-2026-11-26-distributed-recycle"
BEGIN, END = "<!-- dist-tables -->", "<!-- /dist-tables -->"


def dist_report(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "torch", "dist-report.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout


def between_markers(text, begin=BEGIN, end=END):
    assert begin in text and end in text, f"the lines {begin} and {end} are missing"
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, DIST_DATA, "distributed.jsonl")),
                    reason=f"{DIST_DATA} is not there yet (the two-GPU run, scripts/torch/two-gpu.sh)")
def test_the_two_gpu_tables_are_their_runs():
    docs = open(os.path.join(ROOT, "docs", "pytorch.md")).read()
    assert between_markers(docs) == dist_report(DIST_DATA).strip(), (
        f"docs/pytorch.md's two-GPU tables are not dist-report.py's output: python3 scripts/torch/dist-report.py "
        f"{DIST_DATA} --docs docs/pytorch.md rewrites them")


def test_the_two_gpu_recycling_tables_are_their_run():
    """The second run (page recycling on and off) has tables of its own."""
    docs = open(os.path.join(ROOT, "docs", "pytorch.md")).read()
    marked = between_markers(docs, "<!-- dist-recycle-tables -->", "<!-- /dist-recycle-tables -->")
    assert marked == dist_report(DIST_RECYCLE_DATA).strip(), (
        f"docs/pytorch.md's recycling tables are not dist-report.py's output: python3 scripts/torch/dist-report.py "
        f"{DIST_RECYCLE_DATA} --docs docs/pytorch.md --marker dist-recycle-tables rewrites them")


def test_the_two_gpu_report_reads_the_scripts_rows_and_fills_the_markers(tmp_path):
    """On rows shaped as distributed.py and nccl_bw.py write them: a run whose results match
    native's says so, one out of tolerance says no, and --docs replaces the marked section."""
    def run(allocator, rank, out_sum):
        ck = {"out_sum": out_sum, "out_sum_hex": out_sum.hex(), "out_abs_sum": 1e9, "token_sum": 7,
              "last_out_sum": 1.0, "last_out_abs_sum": 1e6}
        return {"allocator": allocator, "workload": "tp-mlp", "rank": rank, "world": 2, "steps": 200, "gpu": "GPU",
                "torch": "2.11", "nccl": "2.27.7", "s_per_step": 0.005, "reserved_peak_mib": 3000.0,
                "allocated_peak_mib": 2900.0, "driver_peak_mib": 3100.0, "checksum": ck}
    lines = [run("native", 0, 1.5), run("native", 1, 2.5), run("cupool", 1, 2.5), run("cupool", 0, 1.5),
             run("cupool-mempool", 0, 1.5), run("cupool-mempool", 1, 2.5 + 1e5),
             {"allocator": "async", "workload": "tp-mlp", "rep": 1, "failed": 124}]
    (tmp_path / "distributed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    bw = [{"kind": "bw", "mode": m, "size_mib": 8, "rank": r, "busbw_gbps": 100.0 + r, "correct": True,
           "nccl_log": {"ipc_registered": int(m.endswith("registered"))}}
          for m in ("native", "cupool-nccl", "cupool-nccl-registered") for r in (0, 1)]
    (tmp_path / "nccl_bw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bw))
    out = dist_report(str(tmp_path))
    assert "| cupool | 1 | 5.00 | 3,000 / 3,000 | 3,100 / 3,100 | yes (identical) |" in out, out
    assert "| cupool-mempool | 1 |" in out and out.split("| cupool-mempool |")[1].split("\n")[0].endswith("**no** |")
    assert "| async | 1 | failed (exit 124) | | | |" in out, out
    assert "| 8 MiB | 100.0 | 100.0 | 100.0 | yes (2 / 0) |" in out, out
    docs = tmp_path / "docs.md"
    docs.write_text(f"# x\n\n{BEGIN}\n\nold\n\n{END}\n\nafter\n")
    dist_report(str(tmp_path), "--docs", str(docs))
    text = docs.read_text()
    assert between_markers(text) == out.strip() and text.endswith(f"{END}\n\nafter\n"), text


# llama.cpp across two GPUs (scripts/llama/two-gpu.sh): docs/llama-cpp.md's "Two GPUs: each
# device's pool" tables are scripts/llama/two-gpu-report.py's output on each engine's run, with
# the peak reserve the profile tests replayed (the fixtures' predicted.jsonl, which
# profiles/tests/mainline_two_gpus.rs and ik_two_gpus.rs check) and the modelled two-GPU terms
# and plans again of scripts/llama/two-gpu-replan.py (the folder's replan.json).
TWO_GPU_RUNS = [
    ("data/h100x2-2026-11-26-mainline-two-gpus", "profiles/tests/data/h100x2-2026-11-26-mainline"),
    ("data/h100x2-2026-11-26-ik-two-gpus", "profiles/tests/data/h100x2-2026-11-26-ik"),
]


@pytest.mark.parametrize("data,fixtures", TWO_GPU_RUNS)
def test_the_llama_two_gpu_tables_are_their_runs(data, fixtures):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "two-gpu-report.py"), data,
                          "--predicted", f"{fixtures}/predicted.jsonl"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    got = [b.strip("\n") for b in out.split("\n\n") if b.strip()]
    docs = open(os.path.join(ROOT, "docs", "llama-cpp.md")).read()
    # the per-run table, the out-of-memory case, the per-device two-GPU terms (the compute
    # buffers against the pipeline model, NCCL's set-up against its term), the room terms and
    # the plans again
    assert sum("<!-- two-gpus-" in b for b in got) == 5, out
    assert any("<!-- two-gpus-devices-" in b for b in got), out
    for b in got:
        assert b in docs, (f"docs/llama-cpp.md lacks this block of python3 scripts/llama/two-gpu-report.py {data} "
                           f"--predicted {fixtures}/predicted.jsonl:\n{b}")


@pytest.mark.parametrize("data,fixtures", TWO_GPU_RUNS)
def test_the_two_gpu_terms_in_replan_json_are_the_models_and_the_fixtures(data, fixtures):
    """replan.json's per-device terms are two_gpu_terms.py's formulas (the copy of the Rust
    models that the Rust tests hold to them through the fixtures' buffers.json) and the same
    as buffers.json: rerunning two-gpu-replan.py after a model change updates both."""
    sys.path.insert(0, os.path.join(ROOT, "scripts", "llama"))
    import two_gpu_terms as tt
    replan = json.load(open(os.path.join(ROOT, data, "replan.json")))
    buffers = json.load(open(os.path.join(ROOT, fixtures, "buffers.json")))
    assert replan["devices"] == buffers["devices"] and replan["engine"] == buffers["engine"]
    import importlib.util
    spec = importlib.util.spec_from_file_location("two_gpu_replan", os.path.join(ROOT, "scripts", "llama",
                                                                                 "two-gpu-replan.py"))
    replan_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replan_py)
    presets = replan_py.gen_model().PRESETS  # gen_model.py's shapes, numpy and gguf not needed
    for r in replan["devices"].values():
        m = tt.shape(presets, r["model"])
        for d, x in r["devices"].items():
            assert x["nccl_model_bytes"] == tt.nccl_bytes(replan["engine"], int(d), len(r["devices"]))
            if replan["engine"] == "mainline":
                want = tt.device_compute_bytes(m, r["fa_kv"] == "pool", True, x["n_ctx"], r["n_ubatch"],
                                               x["sched_copies"], x["last_layer"], x["output"])
                assert x["compute_model_bytes"] == want


def test_the_moves_that_do_not_wait_table_is_its_run():
    check("data/h100-2026-11-26-alias-moves/prefill.jsonl")


def test_the_recycling_at_six_percent_tables_are_their_runs():
    for d in ["phi3-moe", "llama3", "phi3-reps"]:
        check(f"data/h100-2026-11-26-recycle-free-{d}/prefill.jsonl")


def test_the_lanes_tables_are_their_runs():
    check("data/h100-2026-11-27-lanes/prefill.jsonl")


def test_the_h200_tables_are_their_runs():
    check("data/h200-2026-11-28-prefill/call1/prefill.jsonl")
    check("data/h200-2026-11-28-prefill/call2/prefill.jsonl")
    check("data/h200-2026-11-28-transient-lanes/prefill.jsonl")
    for call in ("call1", "call2", "call3"):
        check(f"data/h200-2026-11-28-prefill-reps/{call}/prefill.jsonl")


def test_the_pinned_moe_tables_are_their_runs():
    for call in ("call1", "call2"):
        d = f"data/h200-2026-11-28-prefill-pinned/{call}"
        check(f"{d}/prefill.jsonl")
        out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "torch", "profile-ratio.py"),
                              f"{d}/profiles"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        docs = open(os.path.join(ROOT, "docs", "pytorch.md")).read()
        for b in (b.strip("\n") for b in out.split("\n\n") if b.strip()):
            assert b in docs, f"docs/pytorch.md lacks this block of profile-ratio.py {d}/profiles:\n{b}"


def test_the_direct_allocator_tables_are_their_run():
    check("data/h200-2026-11-28-direct/prefill.jsonl")


def test_the_thread_bins_tables_are_their_runs():
    check("data/h200-2026-11-28-bins/call2/prefill.jsonl")
    check("data/h200-2026-11-28-bins/call3/prefill.jsonl")


def test_the_one_range_tables_are_their_runs():
    check("data/h200-2026-11-29-one-range/call1/prefill.jsonl")
    check("data/h200-2026-11-29-one-range/call2/prefill.jsonl")


@pytest.mark.parametrize("args", [("--reserve", "data/cpu-2026-11-29-one-range"),
                                  ("--reserve", "data/cpu-2026-11-29-one-range/bound"),
                                  ("data/cpu-2026-11-29-one-range",)])
def test_the_one_range_bench_tables_are_their_runs(args):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "torch", "trace-bench-report.py"),
                          *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip("\n") in open(os.path.join(ROOT, "docs", "pytorch.md")).read(), out


def test_the_copies_ahead_tables_are_their_runs():
    check("data/h200-2026-11-29-copies-ahead/call1/prefill.jsonl")
    check("data/h200-2026-11-29-copies-ahead/call2/prefill.jsonl")


@pytest.mark.parametrize("data,blocks", [("data/h200-2026-11-29-trace-cost", 12),
                                         ("data/h200-2026-11-29-defer-create", 4),
                                         ("data/h200-2026-11-29-space-lookup", 6),
                                         ("data/h200-2026-11-29-trace-cost-more", 12),
                                         ("data/h200-2026-11-29-trim-lanes", 12),
                                         ("data/h200-2026-11-29-one-range/call5/onerange", 6),
                                         ("data/h200-2026-11-29-one-range/call5/classes", 6)])
def test_the_paired_replay_tables_are_their_runs(data, blocks):
    """The tables of what each allocator costs the prefill's thread (trace-cost-report.py)."""
    paired_tables_in_docs([data], blocks)


def paired_tables_in_docs(paths, blocks):
    """trace-cost-report.py of `paths` gives `blocks` blocks, each in docs/pytorch.md."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "torch", "trace-cost-report.py"),
                          *paths], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    docs = open(os.path.join(ROOT, "docs", "pytorch.md")).read()
    got = [b.strip("\n") for b in out.split("\n\n") if b.strip()]
    assert len(got) == blocks, out
    for b in got:
        assert b in docs, f"docs/pytorch.md lacks this block of trace-cost-report.py {paths}:\n{b}"


@pytest.mark.parametrize("paths", [("call1/before", "call2/before"), ("call1/after", "call2/after"),
                                   ("call3/before", "call4/before"), ("call3/after", "call4/after")])
def test_the_vacant_ranges_tables_are_their_runs(paths):
    """The paired replays of the builds before and after the vacant ranges in one array, each
    build's processes reported on their own."""
    paired_tables_in_docs([os.path.join("data/h200-2026-11-29-vacant-runs", p) for p in paths], 6)


def test_the_trace_bench_table_is_its_run():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "torch", "trace-bench-report.py"),
                          "data/cpu-2026-11-29-vacant-runs"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip("\n") in open(os.path.join(ROOT, "docs", "pytorch.md")).read(), out
