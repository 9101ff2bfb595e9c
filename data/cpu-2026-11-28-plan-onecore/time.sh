#!/usr/bin/env bash
# Times `repro-prefill plan` of the MoE near two million positions (140 GiB free, -c 4000000,
# -ub 64) on one core (`taskset -c 0`), three pool/purge settings, before and after alternately,
# ROUNDS rounds (default 5). Writes one line per run to OUT/times.txt (wall, user and system
# time, exit status: 3 is `plan`'s "does not fit"), the load average before each round to
# OUT/load.txt, whether the outputs are identical to OUT/identical.txt, and each median to
# OUT/medians.txt.
# Usage: bash time.sh BEFORE AFTER OUT [ROUNDS]
set -u
old=$1 new=$2 out=$3 rounds=${4:-5}
mkdir -p "$out"
: > "$out/times.txt"; : > "$out/load.txt"; : > "$out/identical.txt"
tmp=$(mktemp -d)
for round in $(seq "$rounds"); do
  echo "round $round: $(cat /proc/loadavg)" >> "$out/load.txt"
  for s in "legacy auto" "legacy never" "vmm never"; do
    set -- $s
    args="plan --device sim --model qwen3-30b-a3b --weight-type q8_0 --free 140 -c 4000000 --engine llama-b8833 -ub 64 -b 2048 --pool $1 --purge $2"
    for which in before after; do
      bin=$old; [ $which = after ] && bin=$new
      /usr/bin/time -f "$1 $2 $which round $round: %e s wall, %U s user, %S s sys, exit %x" -o "$tmp/time" \
        taskset -c 0 "$bin" $args > "$tmp/$which" 2>/dev/null
      grep -v '^Command exited' "$tmp/time" >> "$out/times.txt"
    done
    if cmp -s "$tmp/before" "$tmp/after"; then r=identical; else r=DIFFER; fi
    echo "$1 $2 round $round: outputs $r" >> "$out/identical.txt"
  done
done
echo "end: $(cat /proc/loadavg)" >> "$out/load.txt"
for s in "legacy auto" "legacy never" "vmm never"; do
  for which in before after; do
    grep "^$s $which " "$out/times.txt" | sed 's/.*: \([0-9.]*\) s wall.*/\1/' | sort -n |
      awk -v k="$s $which" '{a[NR]=$1} END{print k ": median " a[int((NR+1)/2)] " s wall of " NR}'
  done
done > "$out/medians.txt"
rm -r "$tmp"
