#!/usr/bin/env bash
# Replays this folder's recorded prefills through libcupool (the torch_trace bench, simulated
# device) with two builds of the bench, BEFORE and AFTER, alternating, three rounds each:
# the reserve's peak of the recorded process (round 0) and the calls' times.
#   bash data/h200-2026-11-28-bins/run.sh BEFORE_BENCH AFTER_BENCH > bench.txt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for i in 1 2; do
  for v in "$1" "$2"; do
    for m in qwen3moe phi3 llama3; do
      echo "== $(basename "$v") $m round-set $i"
      BENCH_ROUNDS=3 BENCH_TRACE="$here/call1/trace-$m.jsonl.gz" "$v" --bench | grep '"round"'
    done
  done
done
