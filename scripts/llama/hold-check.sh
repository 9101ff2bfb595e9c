#!/usr/bin/env bash
# Mainline llama.cpp's start-up hold on a GPU: llama-bench prompts of each size on a card made
# smaller by the ballast, with ggml's own pool, cupool's vmm pool with the hold (CUPOOL_HOLD
# auto) and without it (off). Each run's log and one JSON line per run (whether it completed,
# whether it failed at start-up or in a compute, what the computes took outside the buffers,
# the context cupool's report says fits) go to OUT (seed.py's format).
#
#     scripts/llama/hold-check.sh BIN_DIR MODEL FREE_GIB OUT PROMPT [PROMPT ...]
#
# KV=f16 (default q8_0) sets the cache type; REPS (default 1) llama-bench's repetitions.
set -euo pipefail
if [ $# -lt 5 ]; then
    sed -n '2,11p' "$0" >&2
    exit 2
fi
bin=$1 model=$2 free=$3 out=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
for p in "$@"; do
    common=(--bench llama-bench --bin "$bin" --model "$model" --out "$out" --prompt "$p" --reps "${REPS:-1}"
        --kv "${KV:-q8_0}")
    python3 "$here/seed.py" "${common[@]}" "ggml-p$p:ggml@$free" "vmm-p$p:vmm@$free"
    python3 "$here/seed.py" "${common[@]}" --env CUPOOL_HOLD=off "vmm-nohold-p$p:vmm@$free"
done
