#!/usr/bin/env bash
# Builds the release test executables that need a GPU and copies them into .bundle/, the one
# folder carried to the GPU machine. Run here; then run scripts/gpu-run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .bundle && mkdir -p .bundle
{ cargo test --release --workspace --no-run --message-format=json 2>/dev/null
  cargo bench --workspace --no-run --message-format=json 2>/dev/null; } \
  | python3 -c '
import json, os, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] in (["test"], ["lib"], ["bench"]):
        kind = m["target"]["kind"][0]
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
strip --strip-debug .bundle/* 2>/dev/null || true
du -sh .bundle
