#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, with the bundle made by scripts/gpu-bundle.sh
# (carry .bundle): every GPU test of the workspace (the ignored ones, with a missing GPU an error,
# not a skip), the pool's GPU test again with the poison feature, the Python package's GPU tests
# over the bundle's libcupool, and the CLI on the real device. Writes under $OUT:
#   pass.log   date, GPU, driver, CUDA, then one line per step: PASS or FAIL, seconds, command
#   tests.log  every step's whole output
# Copy both into data/<gpu>-<date>-gpu-run/ here; docs/reliability.md links the latest.
# STEP_TIMEOUT (seconds, default 600) bounds each step; SKIP="name ..." leaves steps out (each
# gets a SKIP line, so the log says what did not run).
set -uo pipefail
out="${OUT:-/tmp/out}"; mkdir -p "$out"
pass="$out/pass.log"; log="$out/tests.log"
export CUPOOL_REQUIRE_GPU=1 RUST_BACKTRACE=1
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)"
  echo "cuda: $(nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | head -n 1)"
  echo "command:${SKIP:+ SKIP=\"$SKIP\"}${STEP_TIMEOUT:+ STEP_TIMEOUT=$STEP_TIMEOUT} scripts/gpu-run.sh"
} > "$pass"
status=0
step() { # step NAME COMMAND...: runs it, logs it whole, and adds its PASS/FAIL line
  local name=$1; shift
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    printf '%-6s %5s   %s: %s\n' SKIP - "$name" "${*//$PWD\//}" >> "$pass"; return
  fi
  local shown=${*//$PWD\//}   # logged relative to the repository root
  echo "== $name: $shown" >> "$log"
  local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-600}" "$@" >> "$log" 2>&1
  local rc=$?
  local verdict=PASS; [ $rc -eq 0 ] || { verdict="FAIL (exit $rc)"; status=1; }
  printf '%-6s %5ss  %s: %s\n' "${verdict%% *}" "$((SECONDS - t0))" "$name" "$shown" >> "$pass"
  [ $rc -eq 0 ] || echo "       exit $rc" >> "$pass"
}
# Fast steps first, so a run cut short still says most.
# A step whose executable is missing from the bundle runs anyway and fails: nothing drops out.
for t in .bundle/test-pool-gpu .bundle/test-pool-gpu_recycle .bundle/test-pool-gpu_deferred .bundle/test-pool-gpu_peers .bundle/test-pool-gpu-poison .bundle/test-runtime-gpu; do
  step "$(basename "$t")" "$t" --ignored --test-threads=1
done
# The NVRTC compile test is no GPU test: it runs unfiltered.
step test-kernels-compile-all .bundle/test-kernels-compile --test-threads=1
step python-gpu env CUPOOL_LIB="$PWD/.bundle/libcupool.so" python3 -m pytest -q -rs -c python/pytest.ini -m gpu python/tests/test_gpu.py
step cli-plan-cuda .bundle/repro-prefill plan --device cuda --free 12
step test-kernels-gpu .bundle/test-kernels-gpu --ignored --test-threads=1
grep -E "^(PASS|FAIL|SKIP)" "$pass" | awk '{ n[$1]++ } END { printf "%d passed, %d failed, %d skipped\n", n["PASS"], n["FAIL"], n["SKIP"] }' | tee -a "$pass"
exit $status
