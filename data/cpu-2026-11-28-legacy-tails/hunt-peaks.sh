#!/bin/bash
# BEFORE and AFTER: the two repro-prefill binaries
n=0
for e in llama-b8833 ik-llama; do for m in phi3-mini llama3-8b; do for ub in 256 512; do for c in $(seq 2304 256 20480); do
 a="--device sim --engine $e --model $m --free 200 --pool legacy --purge never --ctx $c --ubatch $ub"
 o1=$("$BEFORE" plan $a 2>/dev/null | grep -i "pool reserve"); o2=$("$AFTER" plan $a 2>/dev/null | grep -i "pool reserve")
 [ "$o1" != "$o2" ] && echo "DIFF $a | $o1 | $o2"
 n=$((n+1))
done; done; done; done
echo cases $n
