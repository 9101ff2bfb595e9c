#!/usr/bin/env bash
# Runs the PyTorch benchmarks on the GPU machine, every allocator in its own process with the
# same script and inputs, one after another. Results: $OUT/prefill.jsonl, $OUT/micro.jsonl;
# cupool's traces: $OUT/trace-MODEL.jsonl.gz; stderr: $OUT/bench.log.
#   scripts/torch/run.sh prefill "phi3 llama3" "native expandable async cupool cupool-mempool"
#   scripts/torch/run.sh micro "" "native async cupool"
# REPS=2 runs every allocator twice, the second time in reverse order (a GPU warming up or a
# neighbour's load then favours none); RECORD=1 records cupool's trace (its own run).
# A short warm-up run comes first and is discarded.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/out}"; mkdir -p "$out"
what=$1; models=${2:-phi3}; allocators=${3:-native expandable async cupool cupool-mempool}
export CUPOOL_LIB="${CUPOOL_LIB:-$PWD/.bundle/libcupool.so}"
reversed() { local r=""; for x in $1; do r="$x $r"; done; echo "$r"; }
if [ "$what" = prefill ]; then
  python3 scripts/torch/prefill.py --allocator native --prompt 4096 --decode 4 >/dev/null 2>>"$out/bench.log"
  for m in $models; do
    order=$allocators
    for rep in $(seq 1 "${REPS:-1}"); do
      for a in $order; do
        echo "== prefill $m $a rep $rep" >>"$out/bench.log"
        timeout 400 python3 scripts/torch/prefill.py --allocator "$a" --model "$m" ${PREFILL_ARGS:-} \
          >>"$out/prefill.jsonl" 2>>"$out/bench.log" || echo "{\"allocator\":\"$a\",\"model\":\"$m\",\"failed\":$?}" >>"$out/prefill.jsonl"
      done
      order=$(reversed "$order")
    done
    if [ -n "${RECORD:-}" ]; then
      python3 scripts/torch/prefill.py --allocator cupool --model "$m" --decode 4 --record "/tmp/trace-$m.jsonl" >/dev/null 2>>"$out/bench.log" \
        && gzip -c "/tmp/trace-$m.jsonl" >"$out/trace-$m.jsonl.gz" && rm "/tmp/trace-$m.jsonl"
    fi
  done
else
  for a in $allocators; do
    echo "== micro $a" >>"$out/bench.log"
    timeout 300 python3 scripts/torch/micro.py --allocator "$a" >>"$out/micro.jsonl" 2>>"$out/bench.log" \
      || echo "{\"allocator\":\"$a\",\"failed\":$?}" >>"$out/micro.jsonl"
  done
fi
