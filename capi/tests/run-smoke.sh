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
if ! python3 -c 'import pytest' 2>/dev/null; then
    echo "run-smoke.sh: the C smoke test passed; the Python and llama.cpp checks need pytest:" >&2
    echo "  pip install './python[tools]'   (pytest, numpy, gguf; from the repository root)" >&2
    exit 1
fi
# -rs: pytest lists every skipped check with its reason; the summary below repeats them.
status=0
CUPOOL_LIB="$dir" python3 -m pytest -q -rs -p no:cacheprovider -c python/pytest.ini \
    python/tests/test_sim.py python/tests/test_install.py ggml/tests scripts/tests 2>&1 | tee "$tmp/pytest.log" ||
    status=$?
if grep -q '^SKIPPED' "$tmp/pytest.log"; then
    echo
    skipped=$(awk '/^SKIPPED \[/ { gsub(/[^0-9]/, "", $2); n += $2 } END { print n }' "$tmp/pytest.log")
    echo "run-smoke.sh: $skipped check(s) skipped; how many, where and why:"
    sed -n 's/^SKIPPED \[\([0-9]*\)\] /  \1 × /p' "$tmp/pytest.log"
    if grep -q '^SKIPPED.*TARBALL' "$tmp/pytest.log"; then
        echo "  The engine checks need the engines' source tarballs: set CUPOOL_ENGINE_TARBALL and"
        echo "  CUPOOL_MAINLINE_TARBALL (docs/llama-cpp.md, \"The engines' sources\", says how to make them)."
    fi
else
    echo "run-smoke.sh: no check skipped"
fi
rm -rf "$tmp"
exit "$status"
