#!/usr/bin/env bash
# The Python package as pip installs it: builds a wheel from python/ (its build step builds
# libcupool and bundles it), installs the wheel into a fresh virtual environment, and runs the
# package's CPU tests there on simulated cards, from a copy outside the checkout and with no
# CUPOOL_LIB, so that they import the installed package and load its bundled library. Needs
# cupool-cli built (a test replays a trace with repro-prefill). Run from the repository root.
set -euo pipefail
root=$(pwd)
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 -m pip wheel --quiet --no-deps --disable-pip-version-check -w "$tmp/dist" ./python
wheel=$(ls "$tmp"/dist/cupool-*.whl)
echo "wheel: $(basename "$wheel")"
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" 'pytest>=7'

cp -r python/tests "$tmp/tests"
cp python/pytest.ini "$tmp/pytest.ini"
cd "$tmp"
env -u CUPOOL_LIB CUPOOL_EXPECT_BUNDLED=1 CARGO_TARGET_DIR="$target" \
  "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider -c pytest.ini tests/test_sim.py tests/test_install.py
