#!/usr/bin/env bash
# What CUPOOL_PURGE=auto costs against never in the real engine, on a card the ballast makes
# CARD_GIB large (both complete there): runs alternate never and auto so that a GPU warming up
# or a neighbour's load favours neither.
#
#     scripts/llama/purge-cost.sh BIN_DIR MODEL.gguf OUT_DIR [PAIRS] [CARD_GIB]
#
# 1. llama-sweep-bench (the 12 GiB-card scenario: a ubatch of 512 at each KV length up to 20k), PAIRS
#    pairs with CUDA graphs on (ik_llama.cpp's default), then 2 pairs with GGML_CUDA_DISABLE_GRAPHS=1;
# 2. llama-bench -p 16384 -n 0 -r 3 (whole prompts, the KV cache emptied between repetitions, so
#    every repetition regrows the flash-attention buffers), PAIRS pairs.
# Each group appends to OUT_DIR/{sweep,sweep-nographs,bench}/runs.jsonl (scripts/llama/seed.py).
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
bin=$1 model=$2 out=$3 pairs=${4:-5} card=${5:-16}
seed="python3 $(dirname "$0")/seed.py --bin $bin --model $model"
runs() { # PREFIX COUNT: never and auto, alternating, the first of each pair flipping
    local i
    for i in $(seq 1 "$2"); do
        if [ $((i % 2)) = 1 ]; then
            echo "$1n$i:legacy:never@$card $1a$i:legacy:auto@$card"
        else
            echo "$1a$i:legacy:auto@$card $1n$i:legacy:never@$card"
        fi
    done
}
# shellcheck disable=SC2046
$seed --out "$out/sweep" $(runs s "$pairs")
# shellcheck disable=SC2046
$seed --out "$out/sweep-nographs" --env GGML_CUDA_DISABLE_GRAPHS=1 $(runs g 2)
# shellcheck disable=SC2046
$seed --out "$out/bench" --bench llama-bench --prompt 16384 --reps 3 $(runs b "$pairs")
