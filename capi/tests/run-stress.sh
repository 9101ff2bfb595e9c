#!/usr/bin/env bash
# Builds libcupool and runs the C stress test (threads, exit and shutdown) against it twice:
# compiled with AddressSanitizer, then, where valgrind is installed, under valgrind's memcheck
# (fewer rounds: it runs one thread at a time). A panic caught at the C boundary still prints:
# its text in the output fails the run. Run from the repository root.
set -euo pipefail
cargo build --release -p cupool-capi
dir="${CARGO_TARGET_DIR:-target}/release"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=capi/tests/stress.c
flags=(-std=c99 -Wall -Werror -O1 -g -pthread -Icapi/include)

check_output() {
  if grep -E "panicked|Thread Local Storage|internal error" "$1"; then
    echo "stress: a panic was printed (above)"; exit 1
  fi
}

cc "${flags[@]}" -fsanitize=address -fno-omit-frame-pointer "$src" -L"$dir" -lcupool -o "$tmp/stress-asan"
LD_LIBRARY_PATH="$dir" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$tmp/stress-asan" 2>&1 | tee "$tmp/asan.log"
check_output "$tmp/asan.log"
grep -q "stress: ok" "$tmp/asan.log"

if command -v valgrind >/dev/null; then
  cc "${flags[@]}" "$src" -L"$dir" -lcupool -o "$tmp/stress"
  LD_LIBRARY_PATH="$dir" STRESS_ROUNDS=20 valgrind -q --error-exitcode=1 --exit-on-first-error=yes \
    "$tmp/stress" 2>&1 | tee "$tmp/valgrind.log"
  check_output "$tmp/valgrind.log"
  grep -q "stress: ok" "$tmp/valgrind.log"
else
  echo "stress: valgrind is not installed; the AddressSanitizer run above stands alone"
fi
