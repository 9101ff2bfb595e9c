#!/usr/bin/env bash
# The recorded PyTorch allocation streams replayed through libcupool's PyTorch entry points
# (capi/benches/torch_trace.rs, simulated device), with two builds of the bench alternately,
# three times each: prints one JSON line per round (the first round is the recorded process,
# the later ones the same requests again on the pool it left).
# Usage: bash run.sh BEFORE_BENCH AFTER_BENCH > results.jsonl
set -u
before=$1 after=$2
cd "$(dirname "$0")/../.."
for t in data/h100-2026-11-26-recycle-free-phi3-moe/trace-qwen3moe.jsonl.gz \
         data/h100-2026-11-22-pytorch/trace-phi3.jsonl.gz data/h100-2026-11-22-pytorch/trace-llama3.jsonl.gz; do
  for pass in 1 2 3; do
    for which in before after; do
      bin=$before; [ $which = after ] && bin=$after
      BENCH_TRACE=$PWD/$t BENCH_ROUNDS=3 "$bin" --bench 2>/dev/null | grep '^{' |
        sed "s|^{|{\"build\":\"$which\",\"trace\":\"$(basename "$t" .jsonl.gz)\",\"pass\":$pass,|"
    done
  done
done
