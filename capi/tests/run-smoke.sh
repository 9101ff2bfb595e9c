#!/usr/bin/env bash
# Builds libcupool and repro-prefill, then runs the C smoke test and the Python package's tests
# against the real shared library on simulated cards. Run from the repository root.
set -euo pipefail
cargo build --release -p cupool-capi -p cupool-cli
dir="${CARGO_TARGET_DIR:-target}/release"
tmp=$(mktemp -d)
cc -std=c99 -Wall -Werror -Icapi/include capi/tests/smoke.c -L"$dir" -lcupool -o "$tmp/smoke"
LD_LIBRARY_PATH="$dir" "$tmp/smoke"
CUPOOL_LIB="$dir" python3 -m pytest -q -p no:cacheprovider -c python/pytest.ini python/tests/test_sim.py
