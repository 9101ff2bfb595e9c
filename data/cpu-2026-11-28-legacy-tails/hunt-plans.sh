#!/bin/bash
# BEFORE and AFTER: the two repro-prefill binaries
# random plans, legacy never/auto, before vs after; print differing ones
i=0
for e in llama-b8833 ik-llama llama cupool; do for m in phi3-mini llama3-8b qwen3-30b-a3b; do for purge in never auto; do for free in 9 10.5 12 14 17 23; do for c in 4352 9472 20736 33024 65792; do
 extra=""; [ $m = qwen3-30b-a3b ] && extra="--weight-type q8_0"
 a="--device sim --engine $e --model $m $extra --free $free --pool legacy --purge $purge --ctx $c --format json"
 o1=$("$BEFORE" plan $a 2>/dev/null | md5sum); o2=$("$AFTER" plan $a 2>/dev/null | md5sum)
 [ "$o1" != "$o2" ] && echo "DIFF $a"
 i=$((i+1))
done; done; done; done; done
echo "cases $i"
