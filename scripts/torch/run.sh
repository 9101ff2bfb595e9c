#!/usr/bin/env bash
# Runs the PyTorch benchmarks on the GPU machine, every allocator in its own process with the
# same script and inputs, one after another. Results: $OUT/prefill.jsonl, $OUT/micro.jsonl;
# cupool's traces: $OUT/trace-MODEL.jsonl.gz; stderr: $OUT/bench.log.
#   scripts/torch/run.sh prefill "phi3 llama3" "native expandable async cupool cupool-mempool"
#   scripts/torch/run.sh micro "" "native async cupool"
# REPS=2 runs every allocator twice, the second time in reverse order (a GPU warming up or a
# neighbour's load then favours none); RECORD=1 records cupool's trace (its own run).
# A short warm-up run comes first and is discarded.
# Labels cupool-WORD-WORD... run cupool in a variant, relabelled in the results, one setting
# per word: norecycle (page recycling off: CUPOOL_VMM_RECYCLE=off), nolanes (no address space
# of its own for a block replaced by a grown copy: CUPOOL_VMM_LANES=off), base (the libcupool at
# $BASE_LIB, such as the previous commit's, to compare two builds in one call), freeN
# (CUPOOL_VMM_RECYCLE_FREE=N, the percent of free memory kept before pages move), pageN
# (CUPOOL_VMM_RECYCLE_PAGE=N MiB), defer (CUPOOL_VMM_DEFER=on: page moves on a worker thread),
# ahead and noahead (CUPOOL_VMM_AHEAD=worker, or off, the default: lanes' growth mapped ahead on
# a worker thread, or when a copy lands)
# and timed (CUPOOL_TIME_DRIVER=on: the report adds what the prefill spent in driver calls),
# pluggable (CUPOOL_TORCH_DIRECT=off: through CUDAPluggableAllocator, not cupool's own class);
# e.g. cupool-timed-defer-free2.
# PREFILL_ARGS="--speed-reps N" times N more prefills in each process (see prefill.py).
# PIN="taskset -c 2-7" runs every benchmark process on the same CPUs (a process's speed then
# depends less on where the scheduler put it); PROFILE=1 writes each prefill process's
# torch.profiler tables to $OUT/profile-MODEL-ALLOCATOR-REP.txt (one more, untimed prefill).
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
        # cupool-WORD-WORD...: cupool with each word's setting (composable, in any order).
        run=$a; env=()
        if [[ $a == cupool-* && $a != cupool-mempool ]]; then
          run=cupool
          IFS=- read -ra words <<<"${a#cupool-}"
          for w in "${words[@]}"; do
            case $w in
              norecycle) env+=(CUPOOL_VMM_RECYCLE=off) ;;
              nolanes) env+=(CUPOOL_VMM_LANES=off) ;;
              timed) env+=(CUPOOL_TIME_DRIVER=on) ;;
              pluggable) env+=(CUPOOL_TORCH_DIRECT=off) ;;
              defer) env+=(CUPOOL_VMM_DEFER=on) ;;
              noahead) env+=(CUPOOL_VMM_AHEAD=off) ;;
              ahead) env+=(CUPOOL_VMM_AHEAD=worker) ;;
              page*) env+=(CUPOOL_VMM_RECYCLE_PAGE="${w#page}") ;;
              free*) env+=(CUPOOL_VMM_RECYCLE_FREE="${w#free}") ;;
              base) env+=(CUPOOL_LIB="${BASE_LIB:?cupool-base needs BASE_LIB}") ;;
              *) echo "unknown word $w in $a" >&2; exit 2 ;;
            esac
          done
        fi
        err=$(mktemp)
        prof=(); [ -n "${PROFILE:-}" ] && prof=(--profile "$out/profile-$m-$a-$rep.txt")
        env "${env[@]}" timeout 400 ${PIN:-} python3 scripts/torch/prefill.py --allocator "$run" --model "$m" ${PREFILL_ARGS:-} "${prof[@]}" \
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
