#!/usr/bin/env bash
# Builds the release executables that need a GPU (the GPU tests, the NVRTC compile test, the
# benchmarks, repro-prefill, libcupool) and copies them into .bundle/, the one
# folder carried to the GPU machine. Run here; then run scripts/gpu-run.sh (tests) and
# scripts/bench-gpu.sh (benchmarks) there.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .bundle && mkdir -p .bundle
{ cargo test --release --workspace --no-run --message-format=json 2>/dev/null
  cargo bench --workspace --no-run --message-format=json 2>/dev/null; } \
  | python3 -c '
import json, os, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] in (["test"], ["bench"]):
        kind = m["target"]["kind"][0]
        # Only what needs the GPU machine: its test files (gpu, and the NVRTC compile) and
        # the benchmarks; the rest runs here and in CI, and the carried tree is 64 MiB at most.
        if kind == "test" and m["target"]["name"] not in ("gpu", "gpu_recycle", "gpu_deferred", "gpu_peers", "compile"):
            continue
        prefix = "bench-" if kind == "bench" else "test-"
        crate = os.path.basename(os.path.dirname(m["manifest_path"])) or "cupool"
        crate = "cupool" if crate == os.path.basename(os.getcwd()) else crate
        name = crate + "-" + m["target"]["name"] + ("-lib" if kind == "lib" else "")
        shutil.copy(m["executable"], ".bundle/" + prefix + name)
'
# The pool's GPU test once more with the poison feature (use-after-free detection).
cargo test --release -p cupool-pool --features poison --test gpu --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".bundle/test-pool-gpu-poison")
'
for bin in $(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(" ".join(t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"] if t["kind"]==["bin"]))'); do
  cargo build --release --bin "$bin" 2>/dev/null && cp "target/release/$bin" .bundle/ || true
done
# libcupool for the Python package's GPU tests.
cargo build --release -p cupool-capi 2>/dev/null && cp target/release/libcupool.so .bundle/
strip --strip-debug .bundle/* 2>/dev/null || true
du -sh .bundle
