#!/usr/bin/env bash
# Runs the PyTorch benchmarks on the GPU machine, every allocator in its own process with the
# same script and inputs, one after another. Results: $OUT/prefill.jsonl, $OUT/micro.jsonl;
# cupool's traces: $OUT/trace-MODEL.jsonl.gz; stderr: $OUT/bench.log.
#   scripts/torch/run.sh prefill "phi3 llama3" "native expandable async cupool cupool-mempool"
#   scripts/torch/run.sh micro "" "native async cupool"
# REPS=2 runs every allocator twice, the second time in reverse order (a GPU warming up or a
# neighbour's load then favours none); RECORD=1 records cupool's trace (its own run).
# A short warm-up run comes first and is discarded.
# Two labels run cupool in a variant, relabelled in the results: cupool-norecycle (page
# recycling off: CUPOOL_VMM_RECYCLE=off) and cupool-base (the libcupool at $BASE_LIB, such as
# the previous commit's, to compare two builds in one call); cupool-freeN sets
# CUPOOL_VMM_RECYCLE_FREE=N (the percent of free memory kept before pages move); cupool-timed
# (cupool-timed-norecycle, cupool-timed-pageN with CUPOOL_VMM_RECYCLE_PAGE=N MiB) time
# libcupool's driver calls (CUPOOL_TIME_DRIVER=on; cupool-timed-freeN with
# CUPOOL_VMM_RECYCLE_FREE=N), and the report adds what the prefill spent in them.
# PREFILL_ARGS="--speed-reps N" times N more prefills in each process (see prefill.py).
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
        case $a in
          cupool-norecycle) run=cupool; env=(CUPOOL_VMM_RECYCLE=off) ;;
          cupool-timed) run=cupool; env=(CUPOOL_TIME_DRIVER=on) ;;
          cupool-timed-norecycle) run=cupool; env=(CUPOOL_TIME_DRIVER=on CUPOOL_VMM_RECYCLE=off) ;;
          cupool-timed-free*) run=cupool; env=(CUPOOL_TIME_DRIVER=on CUPOOL_VMM_RECYCLE_FREE="${a#cupool-timed-free}") ;;
          cupool-timed-page*) run=cupool; env=(CUPOOL_TIME_DRIVER=on CUPOOL_VMM_RECYCLE_PAGE="${a#cupool-timed-page}") ;;
          cupool-base) run=cupool; env=(CUPOOL_LIB="${BASE_LIB:?cupool-base needs BASE_LIB}") ;;
          cupool-free*) run=cupool; env=(CUPOOL_VMM_RECYCLE_FREE="${a#cupool-free}") ;;
          *) run=$a; env=() ;;
        esac
        err=$(mktemp)
        env "${env[@]}" timeout 400 python3 scripts/torch/prefill.py --allocator "$run" --model "$m" ${PREFILL_ARGS:-} \
          2>"$err" | sed "s/\"allocator\": \"$run\"/\"allocator\": \"$a\"/" >>"$out/prefill.jsonl"
        rc=${PIPESTATUS[0]}
        cat "$err" >>"$out/bench.log"
        # A failed run says why: its last line of stderr (an out-of-memory, a library that
        # would not load, ...), which the report prints.
        why=$(tail -n 1 "$err" | tr -d '"\\|' | cut -c1-200); rm -f "$err"
        [ "$rc" = 0 ] || echo "{\"allocator\":\"$a\",\"model\":\"$m\",\"failed\":$rc,\"error\":\"$why\"}" >>"$out/prefill.jsonl"
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
