#!/usr/bin/env bash
# What each allocator costs a prefill's thread, on the GPU machine: per model, one profiled
# prefill.py run with `expandable` (the prefill's time and its launches, measured in this call),
# then trace_cost.py replays the model's recorded request stream paced at that time, PyTorch's
# allocator and libcupool alternating in one process, one process per PyTorch allocator.
#   TRACES=data/h200-2026-11-28-bins/call1 bash scripts/torch/trace-cost.sh "phi3 llama3 qwen3moe" "expandable async"
# Results: $OUT/cost.jsonl (trace-cost-report.py), $OUT/prefill.jsonl, $OUT/profile-MODEL.txt;
# stderr: $OUT/bench.log. ROUNDS (default 8) rounds per process; PIN as in run.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/out}"; mkdir -p "$out"
models=${1:-phi3}; peers=${2:-expandable}
traces=${TRACES:?TRACES: the folder that holds trace-MODEL.jsonl.gz}
export CUPOOL_LIB="${CUPOOL_LIB:-$PWD/.bundle/libcupool.so}"
for m in $models; do
  echo "== prefill $m expandable" >>"$out/bench.log"
  timeout 300 ${PIN:-} python3 scripts/torch/prefill.py --allocator expandable --model "$m" \
    --warmup 512 --decode 4 --speed-reps "${SPEED_REPS:-2}" --profile "$out/profile-$m.txt" \
    >>"$out/prefill.jsonl" 2>>"$out/bench.log" || { echo "prefill $m failed" >&2; continue; }
  for p in $peers; do
    echo "== trace cost $m $p" >>"$out/bench.log"
    timeout 300 ${PIN:-} python3 scripts/torch/trace_cost.py --trace "$traces/trace-$m.jsonl.gz" \
      --torch "$p" --label "$m" --prefill-from "$out/prefill.jsonl" \
      --launches-from "$out/profile-$m.txt" --rounds "${ROUNDS:-8}" \
      >>"$out/cost.jsonl" 2>>"$out/bench.log" || echo "trace cost $m $p failed" >&2
  done
done
