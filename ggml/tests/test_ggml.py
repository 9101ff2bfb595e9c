"""The llama.cpp integration without a GPU: the patch is current and applies to the shipped
engine source, the shim calls only functions libcupool's header declares, the scripts that
run on the GPU machine parse what libcupool prints, and the model generator writes GGUF files
gguf-py reads back.

Run: CUPOOL_LIB=target/release python3 -m pytest -c python/pytest.ini ggml/tests
The patches are checked against the engine files they touch, kept in ggml/upstream/; where an
engine's whole tarball is at hand (CUPOOL_ENGINE_TARBALL, CUPOOL_MAINLINE_TARBALL, or
../shared/third_party/ beside the checkout), those files are checked against it too; docs/llama-cpp.md
says how to make the tarballs. Tests that need
numpy skip with the reason when it is missing.
"""
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))


def tarball(pattern="ik_llama.cpp-*.tar.gz", env="CUPOOL_ENGINE_TARBALL"):
    path = os.environ.get(env) or next(
        iter(sorted(glob.glob(os.path.join(ROOT, "..", "shared", "third_party", pattern)))), None)
    if not path or not os.path.exists(path):
        pytest.skip(f"no {pattern} here: set {env} to the engine's source tarball"
                    " (docs/llama-cpp.md, \"The engines' sources\", says how to make it)")
    return path


def module(rel):
    spec = importlib.util.spec_from_file_location(os.path.basename(rel)[:-3], os.path.join(ROOT, rel))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


ENGINES = [
    # the engine's files the patch touches (kept in ggml/upstream/), the whole tree's tarball,
    # make-patch's flags, the patch
    ("ik_llama.cpp-8337e4cd.tar.gz", "CUPOOL_ENGINE_TARBALL", [], "ik_llama.cpp.patch"),
    ("llama.cpp-0c1e5709.tar.gz", "CUPOOL_MAINLINE_TARBALL", ["--mainline"], "llama.cpp.patch"),
]


def make_patch(flags, src, *more):
    return subprocess.run([sys.executable, os.path.join(ROOT, "ggml", "make-patch.py"), *flags, *more, src],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("name,env,flags,patch", ENGINES)
def test_the_patch_is_current_and_applies(tmp_path, name, env, flags, patch):
    src = os.path.join(ROOT, "ggml", "upstream", name)
    out = make_patch(flags, src)
    with open(os.path.join(ROOT, "ggml", patch)) as f:
        assert out == f.read(), f"ggml/{patch} is stale: python3 ggml/make-patch.py {' '.join(flags)} {src} > ggml/{patch}"
    if shutil.which("patch") is None:
        pytest.fail("the patch program is needed to check that the patches apply (apt-get install patch)")
    with tarfile.open(src) as t:
        t.extractall(tmp_path, filter="data")
    with open(os.path.join(ROOT, "ggml", patch)) as f:
        subprocess.run(["patch", "-p1", "--dry-run", "-s"], cwd=tmp_path, stdin=f, check=True)


@pytest.mark.parametrize("name,env,flags,patch", ENGINES)
def test_the_kept_files_are_the_engine_s(tmp_path, name, env, flags, patch):
    """Where the engine's whole tarball is at hand, the files kept in ggml/upstream/ are its own."""
    whole = tarball(name, env)
    kept = tmp_path / "kept.tar.gz"
    make_patch(flags, whole, "--excerpt", str(kept))
    with tarfile.open(kept) as a, tarfile.open(os.path.join(ROOT, "ggml", "upstream", name)) as b:
        ours = {m.name: a.extractfile(m).read() for m in a.getmembers()}
        kept_here = {m.name: b.extractfile(m).read() for m in b.getmembers()}
    assert ours == kept_here, f"ggml/upstream/{name} differs from the engine's tree: regenerate it with --excerpt"


def test_the_shim_calls_only_what_the_header_declares():
    shim = open(os.path.join(ROOT, "ggml", "ggml-cupool.cu")).read()
    header = open(os.path.join(ROOT, "capi", "include", "cupool.h")).read()
    used = set(re.findall(r"decltype\(&(cupool_\w+)\)", shim))
    assert {"cupool_init", "cupool_alloc_named", "cupool_free", "cupool_ubatch_end", "cupool_releases"} <= used
    for name in used:
        assert re.search(rf"\b{name}\(", header), f"{name} is not in cupool.h"
        assert f'"{name}"' in shim, f"{name} is never resolved"


def test_seed_runs_parse_and_read_libcupool_s_ubatch_log(tmp_path):
    seed = module("scripts/llama/seed.py")
    assert seed.parse_run("a-trace:legacy:never@12#2") == {
        "name": "a-trace", "pool": "legacy", "purge": "never", "card_gib": 12.0, "devices": 2}
    assert seed.parse_run("ref:ggml")["purge"] is None
    with pytest.raises(SystemExit):
        seed.parse_run("no spaces allowed:legacy")
    # What libcupool logs at a boundary is what seed.py reads.
    code = ("import ctypes, cupool; from cupool import _lib\n"
            "cupool.init(pool='legacy', device='sim', sim_gib=1)\n"
            "lib = _lib.load(); p = lib.cupool_alloc(0, 0, 1 << 20, None)\n"
            "_lib.check(lib.cupool_free(0, 0, p, 1 << 20)); cupool.ubatch_end(); cupool.shutdown()\n")
    env = dict(os.environ, CUPOOL_LOG="info", PYTHONPATH=os.path.join(ROOT, "python"))
    err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stderr
    m = seed.UBATCH.search(err)
    assert m, err
    ubatch, device, peak_reserved = map(int, m.groups()[:3])
    assert (ubatch, device) == (1, 0) and peak_reserved >= 1 << 20, err
    assert m.group(6) in ("true", "false"), err


def test_seed_reads_llama_bench_s_json_and_environment_pairs():
    seed = module("scripts/llama/seed.py")
    # llama-bench -o json prints its array after log lines that may hold brackets of their own.
    out = ("ggml_cuda_init: found 1 CUDA devices [sm_90]\n[\n  {\n    \"n_prompt\": 16384,\n"
           "    \"n_gen\": 0,\n    \"avg_ts\": 12000.5,\n    \"samples_ts\": [ 11900.25, 12100.75 ]\n  }\n]\n")
    assert seed.bench_result(out, 16384) == {
        "prompt": 16384, "samples_tok_s": [11900.2, 12100.8], "prefill_tok_s": 12000.5}
    # A crash before the array (an OOM) reads as no result, not as an error of the script.
    assert seed.bench_result("CUDA error: out of memory\n", 16384)["prefill_tok_s"] is None
    assert seed.env_pair("GGML_CUDA_DISABLE_GRAPHS=1") == ("GGML_CUDA_DISABLE_GRAPHS", "1")
    with pytest.raises(Exception, match="NAME=VALUE"):
        seed.env_pair("GGML_CUDA_DISABLE_GRAPHS")
    # -pg P,G: the prompt-and-generation test, whose tokens/s are over both
    assert seed.prompt_gen("4064,64") == (4064, 64)
    for bad in ("4064", "0,64", "4064,0", "a,b"):
        with pytest.raises(Exception, match="P,G"):
            seed.prompt_gen(bad)
    pg = "[\n  {\n    \"n_prompt\": 4064,\n    \"n_gen\": 64,\n    \"avg_ts\": 5711.0,\n    \"samples_ts\": [ 5711.0 ]\n  }\n]\n"
    assert seed.bench_result(pg, 4064, 64) == {"prompt": 4064, "gen": 64, "samples_tok_s": [5711.0], "tok_s": 5711.0}
    assert seed.bench_result(pg, 4064)["prefill_tok_s"] is None


def test_seed_counts_the_ubatches_before_the_first_failure():
    """Mainline marks the end of the ubatch that failed too: the ubatches done are those whose
    end cupool logged before the first out-of-memory report, and the kept runs say so."""
    seed = module("scripts/llama/seed.py")
    line = "cupool  INFO ubatch end ubatch={} device=0 peak_reserved=1 peak_live=1 released=0 synchronized=false\n"
    out = line.format(1) + line.format(2) + "cupool: device 0, stream 0: allocating 81788928 bytes failed:\n" + line.format(3)
    assert seed.ubatches_before_oom(out, 1) == 2
    assert seed.ubatches_before_oom(out, 0) is None
    assert seed.ubatches_before_oom(line.format(1), 1) is None
    folder = os.path.join(ROOT, "data", "h100-2026-11-25-mainline-oom-bytes")
    checked = 0
    with tarfile.open(os.path.join(folder, "logs.tar.gz")) as logs:
        for path in sorted(glob.glob(os.path.join(folder, "*", "runs.jsonl"))):
            case = os.path.basename(os.path.dirname(path))
            for r in map(json.loads, open(path)):
                log = logs.extractfile(f"{case}/{r['name']}.log").read().decode(errors="replace")
                assert seed.ubatches_before_oom(log, r["rc"]) == r["ubatches_before_oom"], r["name"]
                checked += r["rc"] != 0
    assert checked == 8


def test_compare_traces_reports_what_only_one_side_takes(tmp_path):
    def write(path, phases):
        with open(path, "w") as f:
            i = 0
            for name, allocs in phases:
                f.write(json.dumps({"op": "phase_begin", "name": name}) + "\n")
                for n, s in allocs:
                    f.write(json.dumps({"op": "alloc", "id": i, "size": s, "stream": 0, "name": n}) + "\n")
                    i += 1
    layer_rt = [("K_f16", 100), ("V_f16", 100)]
    layer_real = [("MUL_MAT", 7), ("K_f16", 100), ("V_f16", 100), ("dst_tmp_meta", 50)]
    write(tmp_path / "rt.jsonl", [("ubatch 0", layer_rt * 3)])
    write(tmp_path / "real.jsonl", [("start-up", [("MUL_MAT", 1)] + layer_real * 3)])
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "compare_traces.py"),
                          str(tmp_path / "real.jsonl"), str(tmp_path / "rt.jsonl")],
                         capture_output=True, text=True, check=True).stdout
    assert "1 runtime ubatches matched" in out, out
    assert "only the engine takes: dst_tmp_meta 50 B" in out, out
    assert "only the engine takes: MUL_MAT 7 B" in out, out
    assert "only the runtime takes" not in out, out


# (preset, type, tensor: (type, shape)): llama's separate Q/K/V in q8_0 (fast to write), phi3's
# fused QKV and doubled FFN-up in f16.
MODELS = [
    ("llama3-8b", "q8_0", {"token_embd.weight": ["Q8_0", [4096, 128256]], "blk.0.attn_k.weight": ["Q8_0", [4096, 1024]],
                           "blk.0.ffn_down.weight": ["Q8_0", [14336, 4096]], "blk.0.attn_norm.weight": ["F32", [4096]]}, 12),
    ("phi3-mini", "f16", {"token_embd.weight": ["F16", [3072, 32064]], "blk.0.attn_qkv.weight": ["F16", [3072, 9216]],
                          "blk.0.ffn_up.weight": ["F16", [3072, 16384]], "output_norm.weight": ["F32", [3072]]}, 9),
]


@pytest.mark.parametrize("preset,qtype,want,count", MODELS)
def test_generated_models_read_back(tmp_path, preset, qtype, want, count):
    pytest.importorskip("numpy")
    env = gguf_env(tmp_path)
    out = tmp_path / f"{preset}-{qtype}.gguf"
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "gen_model.py"), "--preset", preset,
                    "--type", qtype, "--layers", "1", "--out", str(out)], env=env, check=True, capture_output=True)
    code = ("import gguf, sys, json\nr = gguf.GGUFReader(sys.argv[1])\n"
            "print(json.dumps({t.name: [t.tensor_type.name, [int(x) for x in t.shape]] for t in r.tensors}))")
    tensors = json.loads(subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True,
                                        text=True, check=True).stdout)
    for name, t in want.items():
        assert tensors[name] == t, name
    assert len(tensors) == count


def test_the_mainline_tables_in_the_docs_are_their_data_s():
    """docs/llama-cpp.md's mainline tables are what scripts/llama/hold-report.py makes of the runs
    kept in data/: a table edited by hand, or data changed without the table, fails here."""
    folder = "data/h100-2026-11-24-mainline-hold"
    report = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "hold-report.py"), folder],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    docs = open(os.path.join(ROOT, "docs", "llama-cpp.md")).read()
    blocks = re.findall(r"<!-- (hold-[\w-]+): begin.*?<!-- \1: end -->", report, re.S)
    assert blocks == ["hold-outcomes", "hold-taken", "hold-speed"]
    for m in re.finditer(r"<!-- (hold-[\w-]+): begin.*?<!-- \1: end -->", report, re.S):
        assert m.group(0) in docs, f"docs/llama-cpp.md's {m.group(1)} table differs from {folder}: " \
                                   f"python3 scripts/llama/hold-report.py {folder}"


IK_BLOCKS = ["ik-card12", "ik-ubatch-peaks", "ik-auto-cost", "ik-two-gpus", "ik-replay"]


def test_the_ik_llama_tables_in_the_docs_are_their_data_s():
    """docs/llama-cpp.md's ik_llama.cpp tables are what scripts/llama/ik-report.py makes of the runs
    kept in data/ (h200-2026-11-22-llama, -purge): a table edited by hand, or data changed without
    the table, fails here; so does a table of that section outside the generated blocks."""
    report = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "ik-report.py")],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    docs = open(os.path.join(ROOT, "docs", "llama-cpp.md")).read()
    found = re.findall(r"<!-- (ik-[\w-]+): begin.*?<!-- \1: end -->", report, re.S)
    assert found == IK_BLOCKS
    for m in re.finditer(r"<!-- (ik-[\w-]+): begin.*?<!-- \1: end -->", report, re.S):
        assert m.group(0) in docs, f"docs/llama-cpp.md's {m.group(1)} table differs from data/: " \
                                   "python3 scripts/llama/ik-report.py"
    section = docs[docs.index("### The 12 GiB-card scenario in the real engine"):docs.index("### Known gaps")]
    outside = re.sub(r"<!-- (ik-[\w-]+): begin.*?<!-- \1: end -->", "", section, flags=re.S)
    assert not re.search(r"^\|", outside, re.M), "a table of measured figures outside the generated blocks"


def test_the_ik_llama_prose_figures_are_their_data_s():
    """The figures the ik_llama.cpp section's prose quotes (ik-report.py --facts, one phrase a line)
    are all in the doc as the data gives them, and each replay in the doc gives its run's statistics."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "ik-report.py"), "--facts"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    facts = out.splitlines()
    # a claim whose condition the data no longer meets is left out by --facts: the count catches it
    assert len(facts) == 27, facts
    docs = " ".join(open(os.path.join(ROOT, "docs", "llama-cpp.md")).read().split())
    for fact in facts:
        assert " ".join(fact.split()) in docs, f"docs/llama-cpp.md does not say what the data says: {fact!r}"
    ik = module("scripts/llama/ik-report.py")
    rows = ik.replay_rows(ik.Path(os.path.join(ROOT, "data")))
    assert len(rows) == 3
    for row in rows:
        assert row["same"], f"the replay of {row['replay']['trace']} ({row['replay']['flags']}) is not its run's"


def test_seed_classifies_where_a_mainline_run_ended():
    seed = module("scripts/llama/seed.py")
    assert seed.failure_phase("anything", 0) is None
    assert seed.failure_phase("cupool: start-up: device 0 cannot allocate a ggml buffer of 324.6 MiB", 1) == "start-up"
    assert seed.failure_phase("llama_bench: error: failed to create context with model 'm'", 1) == "start-up"
    died = "ggml-cuda.cu:109: CUDA error\n...(_ZN13llama_context13graph_computeEP11ggml_cgraphb+0xa1)"
    assert seed.failure_phase(died, -6) == "compute"
    assert seed.failure_phase("CUDA error: out of memory\n  in function cublas_handle", -6) == "compute"
    assert seed.failure_phase("Segmentation fault", -11) == "other"
    line = ("cupool: device 0: this context's computes took 164.0 MiB outside ggml's buffers and pools"
            " (held for them at start-up: 176.0 MiB)")
    assert seed.HOLD.search(line).groups() == ("164.0", "176.0")
    assert seed.FITS.search("...; about -c 20992 fits (its buffers").group(1) == "20992"
    m = seed.MEMORY.search("cupool: memory device=0 stage=model-loaded free_mib=4661.4 total_mib=81079.0 "
                           "pool_reserved_mib=0.0 buffers_mib=7100.6\n")
    assert m.groups() == ("0", "model-loaded", "4661.4", "81079.0", "0.0", "7100.6")


def shim_formats():
    """The shim's fprintf formats, their adjacent C string literals joined."""
    shim = open(os.path.join(ROOT, "ggml", "ggml-cupool.cu")).read()
    out = []
    for m in re.finditer(r'fprintf\(stderr,\s*((?:"(?:[^"\\]|\\.)*"\s*)+)', shim):
        out.append("".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))).replace("\\n", "\n"))
    return out


def sample(fmt):
    """What a format prints, with stand-in values of each conversion's kind."""
    return re.sub(r"%(?:\.1f|d|u|s|zu|llu|p)", lambda m: {"%s": "start-up"}.get(m.group(0), "42.5" if "f" in m.group(0) else "42"), fmt)


def test_seed_reads_the_lines_the_shim_prints():
    seed = module("scripts/llama/seed.py")
    printed = "".join(sample(f) for f in shim_formats())
    assert seed.MEMORY.search(printed), "the shim's memory line no longer matches seed.MEMORY"
    assert seed.HOLD.search(printed), "the shim's hold line no longer matches seed.HOLD"
    assert seed.FITS.search(printed), "the shim's start-up report no longer matches seed.FITS"
    assert seed.START_FAILED.search(printed)


def _shim_functions(src):
    """Each function the shim defines at the top level (or in a namespace): name -> body."""
    out = {}
    for m in re.finditer(r"^[A-Za-z_][\w:<>,&* \[\]]*?\b(\w+)\(([^;{}]*)\)\s*(?:const\s*)?(?:override\s*)?\{", src, re.M):
        depth, i = 0, m.end() - 1
        while i < len(src):
            depth += {"{": 1, "}": -1}.get(src[i], 0)
            if depth == 0:
                break
            i += 1
        out.setdefault(m.group(1), "")
        out[m.group(1)] += src[m.end():i]
    return out


def test_start_up_never_asks_ggml_for_its_devices():
    # The shim's start-up runs inside ggml_cuda_info()'s first call (the patch puts it at the end
    # of ggml_cuda_init). Anything it calls that asks for ggml_cuda_info() again, directly or
    # through ggml_cuda_set_device, waits on that first call forever: a hang before the model loads.
    shim = open(os.path.join(ROOT, "ggml", "ggml-cupool.cu")).read()
    funcs = _shim_functions(shim)
    assert {"ggml_cupool_startup", "memory_line", "memory_lines"} <= funcs.keys()
    seen, todo = set(), ["ggml_cupool_startup"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        body = funcs[name]
        for banned in ("ggml_cuda_info(", "ggml_cuda_set_device("):
            assert banned not in body, f"{name}, reached from start-up, calls {banned[:-1]}"
        todo += [c for c in re.findall(r"\b(\w+)\s*\(", body) if c in funcs and c != name]
    assert "startup_memory_lines" in seen
    # The test would catch the old way: the lines printed for every stage use ggml's devices.
    assert "ggml_cuda_info(" in funcs["memory_lines"] + funcs["memory_line"]


def test_the_server_load_table_and_plot_in_the_docs_are_their_data_s(tmp_path):
    """docs/llama-cpp.md's llama-server table and its plot are what scripts/llama/server-report.py
    makes of the run kept in data/."""
    folder = "data/h100-2026-11-25-mainline-server-500"
    plot = tmp_path / "plot.svg"
    report = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "server-report.py"), folder,
                             "--svg", str(plot)], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    block = re.search(r"<!-- server-load: begin.*?<!-- server-load: end -->", report, re.S).group(0)
    assert block in open(os.path.join(ROOT, "docs", "llama-cpp.md")).read(), \
        f"docs/llama-cpp.md's server-load table differs from {folder}: python3 scripts/llama/server-report.py {folder}"
    kept = open(os.path.join(ROOT, "docs", "img", "llama-server-load-h100.svg")).read()
    assert plot.read_text() == kept, f"docs/img/llama-server-load-h100.svg differs: rerun with --svg"
    summary = json.load(open(os.path.join(ROOT, folder, "summary.json")))
    for name, x in summary.items():
        if not name.startswith("_"):
            assert f"| {x['answered']} | {x['failed']} |" in block, name
            assert x["answered"] >= 500 and x["failed"] == 0 and x["seconds"] >= 600, name


def test_the_out_of_memory_run_in_the_docs_is_its_data_s():
    """The oversized request failed alone: docs/llama-cpp.md's server-oom block is the kept run's,
    and in that run every other request was answered and each oversized one got cupool's error."""
    folder = "data/h100-2026-11-25-mainline-server-oom"
    report = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "server-report.py"), folder,
                             "--marker", "server-oom"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    block = re.search(r"<!-- server-oom: begin.*?<!-- server-oom: end -->", report, re.S).group(0)
    assert block in open(os.path.join(ROOT, "docs", "llama-cpp.md")).read(), \
        f"docs/llama-cpp.md's server-oom block differs from {folder}"
    summary = json.load(open(os.path.join(ROOT, folder, "summary.json")))
    for name, x in summary.items():
        if not name.startswith("_"):
            assert x["failed"] == 0 and x["answered"] > 0 and x["alive_at_end"], name
            assert [r["ok"] for r in x["oversized"]] == [False], name
            assert "out of device memory" in x["oversized"][0]["error"], name


def test_the_prediction_check_in_the_docs_is_its_data_s():
    """docs/llama-cpp.md's table of the plan's largest context against the engine is what
    scripts/llama/predict-check.py makes of the kept run."""
    folder = "data/h100-2026-11-25-mainline-predict"
    report = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "predict-check.py"), "report",
                             folder], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    block = re.search(r"<!-- predict-check: begin.*?<!-- predict-check: end -->", report, re.S).group(0)
    assert block in open(os.path.join(ROOT, "docs", "llama-cpp.md")).read(), \
        f"docs/llama-cpp.md's predict-check table differs from {folder}: python3 scripts/llama/predict-check.py report {folder}"
    assert block.count("\n| ") == 7, "a header and six cases"


def test_the_plan_still_gives_the_recorded_predictions():
    """The prediction check's data holds the plan of each case as it was when the engine ran it;
    today's plan of the same case (the presets the GGUF files were made from, on the simulated
    device) must give the same largest context and buffers, or the check must be run again."""
    lib = os.environ.get("CUPOOL_LIB") or os.path.join(ROOT, "target", "release")
    repro = os.path.join(lib if os.path.isdir(lib) else os.path.dirname(lib), "repro-prefill")
    if not os.path.exists(repro):
        pytest.skip(f"no {repro}: cargo build --release -p cupool-cli")
    folder = os.path.join(ROOT, "data", "h100-2026-11-25-mainline-predict")
    presets = {"phi3-f16": ("phi3-mini", "f16"), "llama3-q8": ("llama3-8b", "q8_0")}
    checked = 0
    for path in sorted(glob.glob(os.path.join(folder, "*.plan.json"))):
        name = os.path.basename(path)[: -len(".plan.json")]
        shape, free = name.rsplit("-", 1)
        if shape not in presets:
            continue  # the 4-layer MoE file has no preset
        want = json.load(open(path))
        model, wtype = presets[shape]
        got = json.loads(subprocess.run(
            [repro, "plan", "--device", "sim", "--model", model, "--weight-type", wtype, "--free", free, "--engine",
             "llama", "-b", "2048", "-ub", "512", "-c", str(want["max_ctx_that_fits"]), "--kv-type", "q8_0",
             "--format", "json", "--quiet"], capture_output=True, text=True, check=True).stdout)
        # Since the compute buffer is ggml-alloc's placement replayed (profiles/src/llama/galloc.rs)
        # rather than its largest stage, one case's buffer is 8 MiB larger than the plan that
        # ran: the same largest context, which the engine completed.
        # The peak device memory now counts each device allocation in the driver's whole pages
        # (`page_rounding_bytes`): the recorded peak plus those pages.
        grown = {"llama3-q8-12": 8 << 20}.get(name, 0)
        for key in ("max_ctx_that_fits", "weights_bytes", "kv_bytes", "compute_bytes", "peak_device_bytes"):
            extra = grown if key in ("compute_bytes", "peak_device_bytes") else 0
            extra += got["page_rounding_bytes"] if key == "peak_device_bytes" else 0
            assert got[key] == want[key] + extra, f"{name}: {key} {got[key]} != recorded {want[key]} + {extra}"
        checked += 1
    assert checked == 4


OOM_FOLDERS = ["data/h100-2026-11-25-mainline-oom", "data/h100-2026-11-26-mainline-oom-moe"]


def gguf_env(tmp_path):
    """The environment in which gen_model.py imports gguf: PyPI's (pip install './python[tools]'),
    else the engine tarball's gguf-py."""
    # Asked of a fresh interpreter, as gen_model.py runs: another test may have put a path on
    # this process's sys.path that the subprocess does not see.
    if subprocess.run([sys.executable, "-c", "import gguf"], capture_output=True).returncode == 0:
        return dict(os.environ)
    with tarfile.open(tarball()) as t:
        members = [m for m in t.getmembers() if m.name.lstrip("./").startswith("gguf-py/")]
        t.extractall(tmp_path, members=members, filter="data")
    return dict(os.environ, PYTHONPATH=str(tmp_path / "gguf-py"))


def gen_model(tmp_path, env, *args):
    out = tmp_path / ("-".join(a.lstrip("-") for a in args) + ".gguf")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "gen_model.py"), *args, "--out", str(out)],
                   env=env, check=True, capture_output=True)
    return out


@pytest.mark.parametrize("preset,qtype", [("phi3-mini", "f16"), ("qwen3-30b-a3b", "q8_0")])
def test_a_header_only_model_is_the_whole_file_s_header(tmp_path, preset, qtype):
    """gen_model.py --header-only writes the bytes the whole file starts with, up to its tensor
    data, and the whole file's length (the data a hole): `plan --gguf` reads it as the model."""
    pytest.importorskip("numpy")
    env = gguf_env(tmp_path)
    args = ["--preset", preset, "--type", qtype, "--layers", "1"]
    whole = gen_model(tmp_path, env, *args).read_bytes()
    head = gen_model(tmp_path, env, *args, "--header-only").read_bytes()
    assert len(head) == len(whole)
    # the data section: after the last non-zero byte of the header (random weights are not all zero)
    data = len(head.rstrip(b"\0"))
    assert 0 < data < len(whole) // 100 and head[:data] == whole[:data] and not head[data:].strip(b"\0")


def test_the_plan_still_gives_the_recorded_oom_tokens(tmp_path):
    """As above for the out-of-memory checks of data/h100-2026-11-25-mainline-oom and
    data/h100-2026-11-26-mainline-oom-moe: today's plan of each case (legacy pool never purged,
    `--engine llama-b8833`) gives the token, pool reserve and largest context recorded beside the
    engine's runs, or the check must be run again (a plan that counts the driver's 2 MiB pages,
    say, changes them). The dense models are their presets; the MoE, Qwen3-30B-A3B's shape with 12
    of its 48 layers, is no preset (an engine profile refuses `--n-layer` beside one), so it is
    planned from its GGUF header as the run was (`--gguf`), written by gen_model.py --header-only."""
    lib = os.environ.get("CUPOOL_LIB") or os.path.join(ROOT, "target", "release")
    repro = os.path.join(lib if os.path.isdir(lib) else os.path.dirname(lib), "repro-prefill")
    if not os.path.exists(repro):
        pytest.skip(f"no {repro}: cargo build --release -p cupool-cli")
    presets = {"phi3-f16": ("phi3-mini", "f16"), "llama3-q8": ("llama3-8b", "q8_0")}
    files = {}
    checked = 0
    for path in sorted(p for f in OOM_FOLDERS for p in glob.glob(os.path.join(ROOT, f, "*.plan.json"))):
        want = json.load(open(path))
        shape, free = os.path.basename(path).split(".")[0].rsplit("-", 1)
        if shape in presets:
            model, wtype = presets[shape]
            what = ["--model", model, "--weight-type", wtype]
        else:
            assert shape == "qwen3-q8" and want["scenario"]["n_layer"] == 12, shape
            if shape not in files:
                pytest.importorskip("numpy")
                files[shape] = gen_model(tmp_path, gguf_env(tmp_path), "--preset", "qwen3-30b-a3b", "--type", "q8_0",
                                         "--layers", "12", "--header-only")
            what = ["--gguf", str(files[shape])]
        out = subprocess.run(
            [repro, "plan", "--device", "sim", *what, "--free", free, "--engine", "llama-b8833", "-b", "2048",
             "-ub", "512", "-c", str(want["scenario"]["ctx"]), "--kv-type", "q8_0", "--pool", want["pool"],
             "--purge", want["purge"], "--format", "json", "--quiet"],
            capture_output=True, text=True)
        assert out.returncode == (0 if want["fits"] else 3), out.stderr
        got = json.loads(out.stdout)
        name = os.path.basename(path)
        for key in ("fits", "oom_at_token", "max_ctx_that_fits", "weights_bytes", "kv_bytes",
                    "pool_peak_reserved_bytes", "pool_driver_mallocs"):
            assert got[key] == want[key], f"{name}: {key} {got[key]} != recorded {want[key]}"
        # The compute buffer: the recorded plans counted `llama-b8833`'s as the logits' closed form
        # (4 to 8 MiB off); it is now ggml-alloc's placement replayed, checked against the engine's
        # own KV cache and compute buffer (cupool's "context-created" line less "model-loaded",
        # both printed to 0.1 MiB) in the run at the plan's context; the peak moves by as much.
        run = "-ctx-p" if ".ctx." in name else "-fits-p"
        logged = next(r for r in map(json.loads, open(os.path.join(os.path.dirname(path), shape + "-" + free,
                                                                    "runs.jsonl")))
                      if run + str(want["scenario"]["ctx"]) in r["name"])
        stage = {m["stage"]: m["buffers_mib"] for m in logged["memory"] if m["stage"] != "ubatch"}
        engine_mib = stage["context-created"] - stage["model-loaded"]
        planned_mib = (got["kv_bytes"] + got["compute_bytes"]) / 2**20
        # Exact, or above where the runtime's own compute layout is the larger (the plan counts
        # the larger of the two: Phi-3's logits at 13,056 positions, 74.7 MiB against 76.0).
        assert abs(planned_mib - engine_mib) <= 0.1 or 0 < planned_mib - engine_mib <= 1.5, (name, engine_mib)
        # The device's peak: up by the compute buffer's growth, and by the driver's whole pages
        # it now counts each device allocation in (recorded before it did).
        grew = got["compute_bytes"] - want["compute_bytes"] + got["page_rounding_bytes"]
        assert got["peak_device_bytes"] - want["peak_device_bytes"] == grew, name
        checked += 1
    assert checked == 12 and len(files) == 1

def test_the_oom_token_report_reads_sweeps_and_prompts(tmp_path):
    """predict-check.py's report-oom: a sweep's last KV length plus a ubatch, or a prompt's ubatch
    lines counted within its pass, is where the run died; the plan's token and the fix beside it."""
    pc = module("scripts/llama/predict-check.py")
    sweep = {"rc": 1, "rows": [{"n_kv": 512}], "last_n_kv": 8704, "ubatches": []}
    assert pc.real_oom_token(sweep) == 9216
    # a 4,096-token prompt (8 ubatches): the warm-up's 8 done, then 3 of the measured pass before
    # the failure (the plan's token: what was processed before the failing ubatch)
    prompt = {"rc": 1, "rows": [], "prompt": 4096, "ubatches": [{}] * 12, "ubatches_before_oom": 11,
              "failed_at": "compute"}
    assert pc.real_oom_token(prompt) == 3 * 512
    assert pc.outcome(prompt) == "dies at token 1,536"
    # the first ubatch of the warm-up: the first compute
    assert pc.outcome(dict(prompt, ubatches_before_oom=0)) == "dies at the first compute"
    assert pc.real_oom_token({"rc": 0}) is None
    case = tmp_path / "phi3-12"
    case.mkdir()
    (tmp_path / "phi3-12.ctx.plan.json").write_text(json.dumps({
        "fits": False, "oom_at_token": 9216,
        "check": {"engine": "ik-llama", "pool": "legacy", "purge": "never", "ctx": 20480},
        "fix": {"pool": "legacy", "purge": "auto", "fits": True}}))
    runs = [dict(sweep, name="phi3-12-ctx-c20480", card_gib=12.0, failed_at="compute"),
            {"name": "phi3-12-fix-c20480", "rc": 0, "card_gib": 12.0, "failed_at": None}]
    (case / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "predict-check.py"), "report-oom",
                          str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert ("| phi3-12 | ik-llama, `legacy`, `never` | 12 GiB | 20,480 | dies at token 9,216 | dies at token 9,216 "
            "| `legacy`, `auto` | completes | completes |") in out, out


def test_the_mainline_oom_tables_in_the_docs_are_their_data_s():
    """docs/repro-prefill.md's tables of where mainline runs die (plan against engine, the room
    behind it, the largest context) are what predict-check.py makes of the kept runs (both days'
    folders in one table), and the prose around them says what the data says: with the driver's
    2 MiB pages counted, every real token is the plan's, every fix completes, every largest
    context completes and one ubatch above it dies, the pool's reserve at the end is the engine's
    to the byte, the room within 8 MiB, each later drop of the free memory whole 2 MiB pages."""
    pc = module("scripts/llama/predict-check.py")
    docs = open(os.path.join(ROOT, "docs", "repro-prefill.md")).read()
    for cmd, markers in (("report-oom", ["predict-oom", "predict-oom-room"]), ("report", ["predict-check"])):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "predict-check.py"), cmd,
                              *OOM_FOLDERS], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        for marker in markers:
            block = re.search(rf"<!-- {marker}: begin.*?<!-- {marker}: end -->", out, re.S).group(0)
            assert block in docs, f"docs/repro-prefill.md's {marker} table differs from the data: " \
                                  f"python3 scripts/llama/predict-check.py {cmd} {' '.join(OOM_FOLDERS)}"
            assert block.count("\n| ") == {"predict-oom-room": 13}.get(marker, 7), f"{marker}: a header and the runs"
    exact, same_reserve, rounding, rooms = 0, 0, [], []
    for path in sorted(p for f in OOM_FOLDERS for p in glob.glob(os.path.join(ROOT, f, "*.plan.json"))):
        ctx = path.endswith(".ctx.plan.json")
        case = os.path.basename(path).split(".")[0]
        plan = json.load(open(path))
        runs = [json.loads(x) for x in open(os.path.join(os.path.dirname(path), case, "runs.jsonl"))]
        run = next(r for r in runs if ("-ctx-" if ctx else "-fits-") in r["name"])
        if ctx:
            exact += pc.real_oom_token(run) == plan["oom_at_token"]
            assert next(r for r in runs if "-fix-" in r["name"])["rc"] == 0 and plan["fix"]["fits"]
        else:
            assert run["rc"] == 0, f"{run['name']}: the largest context completes"
            assert next(r for r in runs if "-above-" in r["name"])["rc"] != 0, f"{case}: one ubatch above dies"
        row = [c.strip() for c in pc.room_row(plan, run).split("|")]
        room, real_room, _, _, extra = (float(c.replace(",", "")) for c in row[2:7])
        pages, _, drops = row[7].split()
        assert pages == drops and int(drops) > 0, run["name"]
        rooms.append(abs(room - real_room))
        rounding.append(extra)
        same_reserve += plan["pool_peak_reserved_bytes"] == run["stats"]["0"]["reserved_bytes.all.peak"]
    assert exact == 6 and same_reserve == 12 and max(rooms) < 8 and 13.5 <= min(rounding) and max(rounding) < 61
    assert f"({min(rooms):.1f}–{max(rooms):.1f} MiB)" in docs and "to the byte (the runs' statistics), in all\ntwelve runs" in docs


def test_the_first_mainline_oom_run_s_misses_are_as_the_docs_say():
    """The first run (the plan counting bytes, data/h100-2026-11-25-mainline-oom-bytes) missed
    where the docs say: Llama-3-8B with 10 GiB died at 5,632 where the plan said 6,144, and the
    largest contexts of Phi-3 (13,312) and Llama-3-8B with 10 GiB (16,128) died at 12,800 and
    14,848, the tokens today's plan gives for them."""
    pc = module("scripts/llama/predict-check.py")
    data = os.path.join(ROOT, "data", "h100-2026-11-25-mainline-oom-bytes")
    docs = open(os.path.join(ROOT, "docs", "repro-prefill.md")).read()
    want = {"llama3-q8-10-ctx-p24576": (6144, 5632), "llama3-q8-10-fits-p16128": (None, 14848),
            "phi3-f16-12-fits-p13312": (None, 12800)}
    for case in ("llama3-q8-10", "phi3-f16-12"):
        for r in map(json.loads, open(os.path.join(data, case, "runs.jsonl"))):
            if r["name"] in want:
                plan = json.load(open(os.path.join(data, case + (".ctx" if "-ctx-" in r["name"] else "") + ".plan.json")))
                assert (plan["oom_at_token"], pc.real_oom_token(r)) == want.pop(r["name"]), r["name"]
    assert not want
    for figure in ("6,144", "5,632", "13,312", "16,128", "12,800", "14,848"):
        assert figure in docs, figure


def test_the_mainline_decode_table_in_the_docs_is_its_data_s():
    """docs/llama-cpp.md's table of the generated tokens' pool traffic is what decode-report.py
    makes of the kept runs (the traces profiles/tests/mainline.rs checks the profiles against)."""
    folder = "data/h100-2026-11-25-mainline-decode"
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", "decode-report.py"), folder],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    block = re.search(r"<!-- mainline-decode: begin.*?<!-- mainline-decode: end -->", out, re.S).group(0)
    assert block in open(os.path.join(ROOT, "docs", "llama-cpp.md")).read(), \
        f"docs/llama-cpp.md's mainline-decode table differs from {folder}: python3 scripts/llama/decode-report.py {folder}"
    assert block.count("\n| ") == 7, "a header and six runs"
    # the fixtures the profiles' test reads are these traces
    fixtures = os.path.join(ROOT, "profiles", "tests", "data", "h100-2026-11-25-mainline-decode")
    traces = glob.glob(os.path.join(ROOT, folder, "*-trace.trace.jsonl.gz"))
    assert len(traces) == 6
    for trace in traces:
        kept = os.path.join(fixtures, os.path.basename(trace).replace("-trace.trace", ".trace"))
        assert open(trace, "rb").read() == open(kept, "rb").read(), kept


def test_the_graphs_on_decode_figures_in_the_docs_are_their_data_s():
    """docs/llama-cpp.md's figures of generation with CUDA graphs on are the kept runs': four of
    the 64 measured tokens reach the pool (the last phase's requests four times a token's), the
    pool's peak reserve; the fixtures profiles/tests/mainline.rs checks the profile against are
    these traces."""
    dm = module("scripts/llama/decode-report.py")
    folder = os.path.join(ROOT, "data", "h100-2026-11-26-mainline-graphs")
    fixtures = os.path.join(ROOT, "profiles", "tests", "data", "h100-2026-11-26-mainline-graphs")
    docs = open(os.path.join(ROOT, "docs", "llama-cpp.md")).read()
    runs = {r["name"]: r for r in map(json.loads, open(os.path.join(folder, "runs.jsonl")))}
    per_token = {"phi3-f16": 32, "qwen3-q8": 97}  # a token's requests, as the profile has them
    for shape, n in per_token.items():
        name = f"{shape}-graphs-pg4064-64-ub512-trace"
        trace = os.path.join(folder, name + ".trace.jsonl.gz")
        kept = os.path.join(fixtures, f"{shape}-graphs-pg4064-64-ub512.trace.jsonl.gz")
        assert open(trace, "rb").read() == open(kept, "rb").read(), kept
        phases, last = dm.last_phase(__import__("pathlib").Path(trace))
        r = runs[name]
        assert r["rc"] == 0 and r["gen"] == 64 and "GGML_CUDA_DISABLE_GRAPHS" not in r["env"] and phases == 17
        assert len(last) == 4 * n and f"{len(last)} " in docs and f"(4 × {n})" in docs, shape
        assert f"{r['stats']['0']['reserved_bytes.all.peak']:,}" in docs, shape
    logs = tarfile.open(os.path.join(folder, "logs.tar.gz"))
    for m in logs.getmembers():
        text = logs.extractfile(m).read().decode()
        events = re.findall(r"CUDA graph warmup (complete|reset)", text)
        assert events == ["complete", "reset", "complete"], m.name
