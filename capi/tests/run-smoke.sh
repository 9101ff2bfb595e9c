#!/usr/bin/env bash
# Builds libcupool and repro-prefill, then runs the C smoke test, the Python package's tests
# against the real shared library on simulated cards, and the llama.cpp integration's checks
# (ggml/tests: the patch, the shim's use of the header, the GPU scripts). Run from the
# repository root.
set -euo pipefail
cargo build --release -p cupool-capi -p cupool-cli
dir="${CARGO_TARGET_DIR:-target}/release"
tmp=$(mktemp -d)
cc -std=c99 -Wall -Werror -Icapi/include capi/tests/smoke.c -L"$dir" -lcupool -o "$tmp/smoke"
LD_LIBRARY_PATH="$dir" "$tmp/smoke"
CUPOOL_LIB="$dir" python3 -m pytest -q -p no:cacheprovider -c python/pytest.ini python/tests/test_sim.py python/tests/test_install.py ggml/tests
