#!/usr/bin/env bash
# Builds libcupool and runs the C and Python (ctypes) smoke tests against the real shared
# library. Run from the repository root.
set -euo pipefail
cargo build --release -p cupool-capi
dir="${CARGO_TARGET_DIR:-target}/release"
tmp=$(mktemp -d)
cc -std=c99 -Wall -Werror -Icapi/include capi/tests/smoke.c -L"$dir" -lcupool -o "$tmp/smoke"
LD_LIBRARY_PATH="$dir" "$tmp/smoke"
python3 capi/tests/smoke.py "$dir/libcupool.so"
