#!/usr/bin/env bash
# Runs on the GPU machine from the repository root: every GPU test (the ignored ones) in the
# bundle, logging under $OUT. Extra steps can be appended by the caller.
set -uo pipefail
out="${OUT:-/tmp/out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
status=0
for t in .bundle/test-*; do
  echo "== $t" | tee -a "$out/gpu-tests.log"
  "$t" --ignored --test-threads=1 2>&1 | tee -a "$out/gpu-tests.log" | grep -E "^test |test result|panicked|mismatches" || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
exit $status
