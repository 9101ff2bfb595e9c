#!/usr/bin/env bash
# Runs every benchmark suite on the GPU machine, from the repository root, with the bundle made
# by scripts/gpu-bundle.sh. Writes its outputs under $OUT; scripts/bench-report.py turns them
# into docs/benchmarks.md here.
#   1. here:  ./scripts/gpu-bundle.sh
#   2. there: ./scripts/bench-gpu.sh            (carry .bundle)
#   3. here:  python3 scripts/bench-report.py DIR_WITH_THE_OUTPUTS
set -uo pipefail
out="${OUT:-/tmp/out}"; mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi | grep -o "CUDA Version: [0-9.]*"
  date -u +%Y-%m-%dT%H:%MZ
  nproc
} > "$out/machine.txt"
b=.bundle
log="$out/bench.log"   # every suite's stderr, in one file (few files come back from the machine)
"$b/bench-cupool-hot_path" --bench --output-format bencher --warm-up-time 0.3 --measurement-time 1 > "$out/hot_path.txt" 2>> "$log"
"$b/bench-cupool-growth" --bench --output-format bencher --warm-up-time 0.5 --measurement-time 2 > "$out/growth.txt" 2>> "$log"
CUPOOL_PREFILL_LAYERS="${CUPOOL_PREFILL_LAYERS:-2}" "$b/bench-cupool-prefill" > "$out/prefill.jsonl" 2>> "$log"
{ "$b/bench-cupool-fattn"; python3 scripts/sdpa_bench.py; } > "$out/fattn.jsonl" 2>> "$log"
tail -n 5 "$log"
