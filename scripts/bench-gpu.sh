#!/usr/bin/env bash
# Runs every benchmark suite on the GPU machine, from the repository root, with the bundle made
# by scripts/gpu-bundle.sh. Writes its outputs under $OUT; scripts/bench-report.py turns them
# into docs/benchmarks.md here.
#   1. here:  ./scripts/gpu-bundle.sh
#   2. there: ./scripts/bench-gpu.sh            (carry .bundle)
#   3. here:  python3 scripts/bench-report.py DIR_WITH_THE_OUTPUTS
# REPS (default 3) sets how many full-depth prefills each implementation runs.
set -uo pipefail
reps="${REPS:-3}"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi | grep -o "CUDA Version: [0-9.]*"
  date -u +%Y-%m-%dT%H:%MZ
  nproc
} > "$out/machine.txt"
# The command that made these outputs, for the run folder's README.
echo "REPS=$reps${CUPOOL_PREFILL_LAYERS:+ CUPOOL_PREFILL_LAYERS=$CUPOOL_PREFILL_LAYERS} scripts/bench-gpu.sh" > "$out/command.txt"
b=.bundle
log="$out/bench.log"   # every suite's stderr, in one file (few files come back from the machine)
"$b/bench-cupool-hot_path" --bench --output-format bencher --warm-up-time 0.3 --measurement-time 1 > "$out/hot_path.txt" 2>> "$log"
"$b/bench-cupool-growth" --bench --output-format bencher --warm-up-time 0.5 --measurement-time 2 > "$out/growth.txt" 2>> "$log"
"$b/bench-cupool-prefill" > "$out/prefill.jsonl" 2>> "$log"
{ "$b/bench-cupool-fattn"; python3 scripts/sdpa_bench.py; } > "$out/fattn.jsonl" 2>> "$log"
{ "$b/bench-cupool-gemm"; python3 scripts/gemm_bench.py; } > "$out/gemm.jsonl" 2>> "$log"
# Full depth against HF transformers (3 runs each), and the README's GPU command, timed whole.
{
  for wt in f16 q8_0; do
    for _ in $(seq "$reps"); do
      "$b/repro-prefill" --device cuda --pool vmm --kv-type f16 --weight-type "$wt" --prompt 20000 --ctx 20480 --format json \
        | python3 -c 'import json,sys; r=json.load(sys.stdin)["runs"][0]; print(json.dumps({"suite":"prefill-full","impl":"cupool","weights":sys.argv[1],"prompt":20000,"seconds":r["seconds"],"tokens_per_s":20000/r["seconds"],"completed":r["completed"]}))' "$wt"
    done
  done
  python3 scripts/hf_prefill.py --prompt 20000 --chunk 512 --reps "$reps"
  t0=$(date +%s.%N)
  "$b/repro-prefill" --device cuda --vram 12 > "$out/readme-command.txt" 2>> "$log"
  t1=$(date +%s.%N)
  python3 -c 'import json,sys; print(json.dumps({"suite":"readme-command","command":"repro-prefill --device cuda --vram 12","seconds":round(float(sys.argv[2])-float(sys.argv[1]),2)}))' "$t0" "$t1"
} > "$out/prefill_full.jsonl" 2>> "$log"
tail -n 5 "$log"
