#!/usr/bin/env bash
# Times `repro-prefill plan` of the MoE near two million positions with two binaries, before and
# after alternately, three rounds; prints wall and CPU time and whether the outputs are identical.
# Usage: bash extreme.sh BEFORE AFTER
set -u
old=$1 new=$2
for round in 1 2 3; do
  for s in "legacy never 64" "legacy auto 64" "legacy always 64" "vmm never 64" "vmm always 64" "vmm auto 64" "vmm never 128" "legacy auto 512"; do
    set -- $s
    args="plan --device sim --model qwen3-30b-a3b --weight-type q8_0 --free 140 -c 4000000 --engine llama-b8833 --pool $1 --purge $2 -ub $3 -b 2048"
    for which in before after; do
      bin=$old; [ $which = after ] && bin=$new
      /usr/bin/time -f "$1 $2 -ub $3 $which: %e s wall, %U s user" -o /tmp/extreme.time $bin $args > /tmp/extreme.$which 2>/dev/null
      cat /tmp/extreme.time
    done
    cmp -s /tmp/extreme.before /tmp/extreme.after && echo "  outputs identical" || echo "  OUTPUTS DIFFER"
  done
done
