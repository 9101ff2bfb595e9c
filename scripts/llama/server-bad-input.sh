#!/usr/bin/env bash
# llama-server (mainline, with cupool's shim) started with a bad setting or without libcupool:
# each must stop at start-up, before loading the model, with cupool's message. Writes each
# run's output to OUT/NAME.log and one line per run (name, exit status, cupool's first message
# line) to standard output.
#
#     scripts/llama/server-bad-input.sh BIN_DIR MODEL OUT
set -uo pipefail
if [ $# -ne 3 ]; then
    sed -n '2,7p' "$0" >&2
    exit 2
fi
bin=$1 model=$2 out=$3
mkdir -p "$out"
lib=${CUPOOL_LIB:-}
port=18480
check() { # NAME, then the environment for the run
    local name=$1
    shift
    port=$((port + 1))
    env -u GGML_POOL -u CUPOOL_LIB "$@" timeout 120 "$bin/llama-server" -m "$model" --host 127.0.0.1 --port $port \
        -c 4096 -fa on -ngl 99 --no-webui >"$out/$name.log" 2>&1
    local rc=$?
    local loaded=no
    grep -q "model loaded\|server is listening" "$out/$name.log" && loaded=yes
    echo "$name: exit $rc, model loaded: $loaded: $(grep -m1 '^cupool' "$out/$name.log")"
}
check bad-pool GGML_POOL=bogus CUPOOL_LIB="$lib"
check missing-lib GGML_POOL=vmm CUPOOL_LIB=/nonexistent/libcupool.so
check lib-not-found GGML_POOL=vmm LD_LIBRARY_PATH=
check bad-fa-kv GGML_POOL=legacy CUPOOL_FA_KV=sideways CUPOOL_LIB="$lib"
check bad-hold GGML_POOL=vmm CUPOOL_HOLD=lots CUPOOL_LIB="$lib"
