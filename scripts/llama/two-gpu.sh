#!/usr/bin/env bash
# llama.cpp across two GPUs with cupool under each device's pools (issue 28, item 3): one call on
# a machine with two GPUs, CUDA, nvcc, CMake, ninja and python3 with numpy, run from the root of
# the checkout:
#
#     OUT=DIR scripts/llama/two-gpu.sh mainline|ik
#
# Needs .bundle/libcupool.so and .bundle/repro-prefill (built from this tree) and the engine's
# source tarball in .llama/tarballs/ (llama.cpp-0c1e5709.tar.gz or ik_llama.cpp-8337e4cd.tar.gz;
# .llama/ is ignored by git, so it travels only when carried). It
#
#   1. builds llama-bench with the shim (scripts/llama/build.sh, TARGETS=llama-bench; ik_llama.cpp
#      with -DGGML_CUDA_NO_VMM=ON, as its measured build) into .llama/build-ENGINE, while
#      scripts/llama/gen_model.py writes the random-weight models (phi3-mini f16 and llama3-8b
#      q8_0, 32 layers each, with the engine's own gguf-py) into .llama/models;
#   2. records per-device pool traces with both devices' pools in cupool (GGML_POOL=legacy
#      CUPOOL_PURGE=never CUPOOL_TRACE=...; the trace numbers each (device, stream) pair in the
#      order it first allocates, so stream 0 is device 0, which runs the first layers):
#      `llama-bench -m M -p P -n 0 -r 1 -b 2048 -ub U -fa 1 -ctk q8_0 -ctv q8_0 -ngl 99 -sm layer
#      -ts 1/1 -v -o json`, phi3 f16 (P, U) = (8192, 2048) and llama3 q8_0 (5000, 512); mainline
#      once with CUPOOL_FA_KV=pool (the llama-b8833 profile) and once with upstream's placement
#      (the llama profile), and one `-sm row` run of llama3 q8_0 (ik_llama.cpp's llama-bench
#      has no row split: none|layer|graph);
#   3. the 12 GiB-card scenario on ONE device: the ballast holds all but LEAVE GiB of GPU 1 (7 for
#      mainline, 7.5 for ik_llama.cpp; TWO_GPU_LEAVE_GIB), phi3 f16 `-p 20480 -ub 512`
#      (CUPOOL_FA_KV=pool on mainline, so flash attention's K/V copies grow in the pool as in
#      data/h100-2026-11-25-mainline-oom): `legacy`/`never` must die mid-prompt on device 1,
#      `legacy`/`auto` must complete; then `repro-prefill plan` for that device alone: a GGUF
#      header of its layers (the output matrix included) with LEAVE GiB free;
#   4. if time is left, the phi3 f16 `-p 20480 -ub 512` trace on the whole cards.
#
# Every step has a timeout and the whole call keeps within TWO_GPU_BUDGET_S (540 s). Each result
# is written as soon as it exists: $OUT gets runs.jsonl (one JSON object per run), gpu.txt (the
# GPUs, driver, CUDA, commit, date, every command), steps.log and results.tar.gz (logs, gzipped
# traces, plans, build log), packed again after every step. A second call on the same warm machine
# resumes the build and keeps the models. scripts/llama/two-gpu-report.py makes the tables.
set -uo pipefail

engine=${1:-}
case "$engine" in
mainline)
    tarball=llama.cpp-0c1e5709.tar.gz
    plan_engine=llama-b8833 # with CUPOOL_FA_KV=pool (the OOM case); the llama profile otherwise
    leave_default=7
    cmake_extra=()
    ;;
ik)
    tarball=ik_llama.cpp-8337e4cd.tar.gz
    plan_engine=ik-llama
    leave_default=7.5
    cmake_extra=(-DGGML_CUDA_NO_VMM=ON)
    ;;
*)
    sed -n '2,7p' "$0" >&2
    exit 2
    ;;
esac
: "${OUT:?set OUT to the folder for the results}"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2
export NCCL_NVLS_ENABLE=0 # house rule on the multi-GPU machines
export CUDA_VISIBLE_DEVICES=0,1

t0=$(date +%s)
budget=${TWO_GPU_BUDGET_S:-540}
leave=${TWO_GPU_LEAVE_GIB:-$leave_default}
lib=$root/.bundle/libcupool.so
repro=$root/.bundle/repro-prefill
src_tar=$root/.llama/tarballs/$tarball
build=$root/.llama/build-$engine
bin=$build/build/bin
models=$root/.llama/models
work=$root/.llama/two-gpu-$engine
res=$work/two-gpu-$engine # packed as results.tar.gz: one folder
mkdir -p "$OUT" "$models" "$work"
rm -rf "$res"
mkdir -p "$res"
runs=$res/runs.jsonl
: >"$runs"

elapsed() { echo $(($(date +%s) - t0)); }
left() { echo $((t0 + budget - $(date +%s))); }
# A step's timeout: at most $1 seconds, and never past the budget less 15 s for packing.
limit() {
    local l
    l=$(($(left) - 15))
    [ "$l" -gt "$1" ] && l=$1
    echo "$l"
}
say() {
    echo "[$(elapsed) s] $*" | tee -a "$res/steps.log"
    cp "$res/steps.log" "$OUT/steps.log"
}
pack() {
    cp "$runs" "$OUT/runs.jsonl"
    cp "$res/gpu.txt" "$OUT/gpu.txt"
    tar czf "$OUT/results.tar.gz.part" -C "$work" "$(basename "$res")" && mv "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"
}
cmdlog() { printf '%s\n' "$*" >>"$res/gpu.txt"; }

# ---- the machine ---------------------------------------------------------------------------
{
    echo "# two-gpu.sh $engine, started $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,memory.free,pci.bus_id --format=csv
    nvidia-smi topo -m 2>&1 | head -12
    nvcc --version 2>&1 | tail -2
    echo "cmake: $(cmake --version 2>&1 | head -1), ninja $(ninja --version 2>&1), python: $(python3 --version 2>&1), cores: $(nproc)"
    echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo "${CUPOOL_COMMIT:-unknown (no .git here; CUPOOL_COMMIT unset)}")"
    git -C "$root" status --short 2>/dev/null | head -20
    sha256sum "$lib" "$repro" "$src_tar" "$0" 2>&1
    echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES budget=${budget}s leave=${leave}GiB"
    echo "# commands, in order"
} >"$res/gpu.txt" 2>&1
say "two-gpu.sh $engine: results in $OUT"
pack

missing=()
for f in "$lib" "$repro" "$src_tar"; do [ -e "$f" ] || missing+=("$f"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "missing: ${missing[*]} (carry .bundle and .llama/tarballs)"
    pack
    exit 2
fi
n_gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if [ "$n_gpus" -lt 2 ]; then
    say "this machine has $n_gpus GPU(s): two are needed"
    pack
    exit 2
fi

# ---- the models, written while the engine builds --------------------------------------------
gguf_py=$work/gguf-py
if [ ! -e "$gguf_py/gguf/__init__.py" ]; then
    rm -rf "$work/gguf-src"
    mkdir -p "$work/gguf-src"
    tar xzf "$src_tar" -C "$work/gguf-src" --wildcards '*gguf-py/*'
    rm -rf "$gguf_py"
    mv "$work/gguf-src/gguf-py" "$gguf_py" 2>/dev/null || mv "$work/gguf-src/./gguf-py" "$gguf_py"
fi
pypath=$gguf_py
# gguf-py imports yaml for model cards only; a stand-in where PyYAML is not installed
if ! python3 -c 'import yaml' 2>/dev/null; then
    mkdir -p "$work/pystub"
    printf 'def safe_load(*a, **k):\n    raise ImportError("PyYAML is not installed (two-gpu.sh stand-in)")\n' >"$work/pystub/yaml.py"
    pypath=$pypath:$work/pystub
fi
gen_pids=()
gen() { # preset type file
    local out=$models/$3
    if [ -s "$out" ]; then
        say "model $3: already written"
        return
    fi
    cmdlog "PYTHONPATH=$pypath python3 scripts/llama/gen_model.py --preset $1 --type $2 --out $out"
    (
        s=$(date +%s)
        PYTHONPATH=$pypath timeout "$(limit 420)" python3 scripts/llama/gen_model.py --preset "$1" --type "$2" \
            --out "$out.part" >"$res/gen-$3.log" 2>&1 && mv "$out.part" "$out"
        echo "exit $? after $(($(date +%s) - s)) s" >>"$res/gen-$3.log"
    ) &
    gen_pids+=($!)
    say "model $3: writing (pid $!)"
}
gen phi3-mini f16 phi3-f16.gguf
gen llama3-8b q8_0 llama3-q8.gguf

# ---- the engine -------------------------------------------------------------------------------
if [ -x "$bin/llama-bench" ] && [ -x "$bin/ballast" ]; then
    say "build: $bin/llama-bench already built"
else
    say "build: $engine into $build (TARGETS=llama-bench ${cmake_extra[*]})"
    cmdlog "TARGETS=llama-bench scripts/llama/build.sh $src_tar $build ${cmake_extra[*]}"
    s=$(date +%s)
    TARGETS=llama-bench timeout "$(limit 480)" bash scripts/llama/build.sh "$src_tar" "$build" ${cmake_extra[@]+"${cmake_extra[@]}"} \
        >"$res/build.log" 2>&1
    rc=$?
    cp "$build/configure.log" "$res/configure.log" 2>/dev/null
    say "build: exit $rc after $(($(date +%s) - s)) s ($(grep -c '^\[' "$res/build.log") ninja lines)"
    pack
    if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/ballast" ]; then
        say "build: no llama-bench or ballast; stopping (a second call on the warm machine resumes the build)"
        for p in "${gen_pids[@]}"; do wait "$p"; done
        pack
        exit 1
    fi
fi
for p in "${gen_pids[@]}"; do wait "$p"; done
for m in phi3-f16.gguf llama3-q8.gguf; do
    say "model $m: $(tail -2 "$res/gen-$m.log" 2>/dev/null | tr '\n' ' ')$(stat -c %s "$models/$m" 2>&1) bytes"
    if [ ! -s "$models/$m" ]; then
        say "model $m was not written (gen-$m.log); stopping"
        pack
        exit 1
    fi
done
pack

# ---- the runs -------------------------------------------------------------------------------
# record NAME KEY=VALUE...: one JSON object in runs.jsonl (VALUE parsed as JSON where it is)
record() {
    python3 - "$runs" "$@" <<'EOF'
import json, sys
out, name, *kv = sys.argv[1:]
r = {"name": name}
for item in kv:
    k, _, v = item.partition("=")
    try:
        r[k] = json.loads(v)
    except ValueError:
        r[k] = v
with open(out, "a") as f:
    f.write(json.dumps(r) + "\n")
EOF
}

gpu_free() { nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | tr '\n' ',' | sed 's/,$//'; }

ballast_pid=
ballast_line=
start_ballast() { # leave_gib device
    local f=$res/ballast.out
    : >"$f"
    "$bin/ballast" "$1" "$2" >"$f" 2>&1 &
    ballast_pid=$!
    for _ in $(seq 1 120); do
        ballast_line=$(grep -m1 '^ballast:' "$f")
        [ -n "$ballast_line" ] && return 0
        kill -0 "$ballast_pid" 2>/dev/null || break
        sleep 0.5
    done
    say "ballast did not start: $(cat "$f")"
    stop_ballast
    return 1
}
stop_ballast() {
    if [ -n "$ballast_pid" ]; then
        kill "$ballast_pid" 2>/dev/null
        wait "$ballast_pid" 2>/dev/null
        ballast_pid=
    fi
}
trap 'stop_ballast' EXIT

# bench NAME MODEL PROMPT UBATCH SPLIT FA_KV PURGE [BALLAST_DEVICE]: FA_KV pool sets CUPOOL_FA_KV=pool
# (mainline's K/V copies in the pool), buffer is upstream's placement, n/a for ik_llama.cpp (whose
# copies always come from the pool)
bench() {
    local name=$1 model=$2 prompt=$3 ubatch=$4 split=$5 fa_kv=$6 purge=$7 bdev=${8:-}
    local t
    last_rc=
    t=$(limit 150)
    if [ "$t" -lt 30 ]; then
        say "$name: skipped, $(left) s left"
        record "$name" skipped=true reason="out of time"
        return 1
    fi
    local envs=(GGML_POOL=legacy CUPOOL_PURGE="$purge" CUPOOL_LOG=info CUPOOL_LIB="$lib"
        CUPOOL_TRACE="$res/$name.trace.jsonl")
    [ "$fa_kv" = pool ] && envs+=(CUPOOL_FA_KV=pool)
    local cmd=("$bin/llama-bench" -m "$models/$model" -p "$prompt" -n 0 -r 1 -b 2048 -ub "$ubatch" -fa 1
        -ctk q8_0 -ctv q8_0 -ngl 99 -sm "$split" -ts 1/1 -v -o json)
    ballast_line=
    if [ -n "$bdev" ]; then
        cmdlog "$bin/ballast $leave $bdev &"
        start_ballast "$leave" "$bdev" || {
            record "$name" skipped=true reason="the ballast did not start"
            return 1
        }
    fi
    local free_before
    free_before=$(gpu_free)
    cmdlog "${envs[*]} ${cmd[*]}"
    say "$name: running (timeout ${t} s; free MiB per GPU: $free_before${ballast_line:+; $ballast_line})"
    local s rc
    s=$(date +%s.%N)
    env "${envs[@]}" timeout -k 5 "$t" "${cmd[@]}" >"$res/$name.log" 2>&1
    rc=$?
    last_rc=$rc
    local secs
    secs=$(python3 -c "import time; print(round(time.time() - $s, 1))")
    stop_ballast
    [ -e "$res/$name.trace.jsonl" ] && gzip -f "$res/$name.trace.jsonl"
    local preset=llama3-8b weights=q8_0
    [ "$model" = phi3-f16.gguf ] && preset=phi3-mini weights=f16
    record "$name" engine="$engine" model_file="$model" preset="$preset" weights="$weights" n_layer=32 n_prompt="$prompt" n_gen=0 n_batch=2048 n_ubatch="$ubatch" reps=1 \
        n_gpu_layers=99 split_mode="$split" tensor_split='[1, 1]' fa_kv="$fa_kv" pool=legacy purge="$purge" \
        ballast_device="${bdev:-null}" ballast_leave_gib="$([ -n "$bdev" ] && echo "$leave" || echo null)" \
        ballast_line="$ballast_line" free_before_mib="[$free_before]" rc="$rc" seconds="$secs" \
        log="$name.log" trace="$([ -e "$res/$name.trace.jsonl.gz" ] && echo "$name.trace.jsonl.gz" || echo null)" \
        env="$(printf '%s\n' "${envs[@]}" | python3 -c 'import json,sys; print(json.dumps(dict(l.rstrip("\n").split("=",1) for l in sys.stdin)))')" \
        cmd="$(printf '%s\n' "${cmd[@]}" | python3 -c 'import json,sys; print(json.dumps([l.rstrip("\n") for l in sys.stdin]))')"
    local oom
    oom=$(grep -m1 -o 'cupool: device [0-9]*, stream [0-9]*: allocating [0-9]* bytes failed' "$res/$name.log")
    say "$name: exit $rc after $secs s${oom:+; $oom}; $(grep -c 'ubatch end' "$res/$name.log") ubatch-end lines"
    pack
    return 0
}

# plan_device NAME: repro-prefill plan for the device that ran out in NAME (the never run), with
# the free memory the ballast left it: a GGUF header of that device's layers (the output matrix
# included, as the plan's profiles count it), zeros for weights (only the header is read).
plan_device() {
    local name=$1
    [ "$(left)" -lt 40 ] && { say "plan: skipped, $(left) s left"; return; }
    python3 - "$res" "$name" "$engine" >"$res/plan-$name.args" 2>"$res/plan-$name.err" <<'EOF'
import json, re, sys
res, name, engine = sys.argv[1:]
log = open(f"{res}/{name}.log", errors="replace").read()
run = [json.loads(l) for l in open(f"{res}/runs.jsonl") if json.loads(l)["name"] == name][-1]
m = re.search(r"cupool: device (\d+), stream \d+: allocating (\d+) bytes failed", log)
dev = int(m.group(1)) if m else int(run["ballast_device"])
n_layer = run["n_layer"]
if engine == "mainline":
    where = {int(l): d for l, d in re.findall(r"load_tensors: layer\s+(\d+) assigned to device (\S+),", log)}
    on = [l for l, d in where.items() if d == f"CUDA{dev}"]
else:
    where = {int(l): int(d) for l, d in re.findall(r"Setting default device in layer\s+(\d+) to (\d+)", log)}
    on = [l for l, d in where.items() if d == dev]
layers = sorted(l for l in on if l < n_layer)
output = n_layer in on
if not layers:
    # no placement in the log: the device's flash-attention calls (one K_f16 per layer) in the
    # second phase of a trace of the same model, the output layer taken to be on the last device
    import glob, gzip
    for t in sorted(glob.glob(f"{res}/{name[:-len('never')]}*.trace.jsonl.gz")):
        phase, n = 0, 0
        for line in gzip.open(t, "rt"):
            phase += '"phase_begin"' in line
            if phase == 2 and '"K_f16"' in line and f'"stream":{dev},' in line:
                n += 1
        if n:
            layers, output = list(range(n_layer - n, n_layer)), dev == 1
            print(f"placement from {t}: {n} layers", file=sys.stderr)
            break
b = re.search(r"ballast: device \d+ holds \d+ MiB, (\d+) MiB free", run.get("ballast_line") or "")
free_gib = int(b.group(1)) / 1024 if b else float(run["ballast_leave_gib"])
print(json.dumps({"device": dev, "layers": layers, "output": output, "free_gib": round(free_gib, 4),
                  "preset": run["preset"], "weights": run["weights"], "n_prompt": run["n_prompt"],
                  "n_ubatch": run["n_ubatch"], "oom": bool(m)}))
EOF
    if [ ! -s "$res/plan-$name.args" ]; then
        say "plan: could not read $name's device and layers: $(tail -3 "$res/plan-$name.err")"
        return
    fi
    local args n preset weights free prompt ubatch
    args=$(cat "$res/plan-$name.args")
    n=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["layers"]))' "$args")
    read -r preset weights free prompt ubatch < <(python3 -c 'import json,sys; a=json.loads(sys.argv[1]); print(a["preset"], a["weights"], a["free_gib"], a["n_prompt"], a["n_ubatch"])' "$args")
    if [ "$n" -lt 1 ]; then
        say "plan: no layers found for the device in $name's log"
        return
    fi
    local hdr=$work/header-$preset-$weights-$n.gguf
    say "plan: $args; header GGUF of $n layers"
    PYTHONPATH=$pypath:$root/scripts/llama timeout "$(limit 120)" python3 - --preset "$preset" --type "$weights" \
        --layers "$n" --out "$hdr" >"$res/plan-header.log" 2>&1 <<'EOF'
# gen_model.py's file with zeros for weights: the plan reads only the header.
import numpy as np
import gen_model as g
def zeros(rng, shape, qtype):
    if qtype == g.gguf.GGMLQuantizationType.Q8_0:
        return np.zeros(tuple(reversed(shape[1:])) + (shape[0] // g.QK8_0 * (2 + g.QK8_0),), dtype=np.uint8)
    return np.zeros(tuple(reversed(shape)), dtype=np.float16)
g.random_tensor = zeros
g.main()
EOF
    local purge
    for purge in never auto; do
        local pcmd=("$repro" plan --gguf "$hdr" --engine "$plan_engine" --pool legacy --purge "$purge"
            -c "$prompt" -b 2048 -ub "$ubatch" --kv-type q8_0 --free "$free" --format json --quiet)
        cmdlog "${pcmd[*]}"
        timeout 60 "${pcmd[@]}" >"$res/plan-$name-$purge.json" 2>"$res/plan-$name-$purge.err"
        say "plan ($purge): exit $? (3 = does not fit), $(python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print("fits" if p["fits"] else "dies at token %s" % p["oom_at_token"])' "$res/plan-$name-$purge.json" 2>&1)"
    done
    cp "$res/plan-$name.args" "$res/plan-$name.device.json"
    rm -f "$hdr"
    pack
}

# died_mid_run NAME: whether the run died of cupool's out-of-memory on a device after that
# device had ended at least one ubatch (not at start-up, not at the first compute)
died_mid_run() {
    python3 - "$res/$1.log" <<'EOF'
import re, sys
log = open(sys.argv[1], errors="replace").read()
m = re.search(r"cupool: device (\d+), stream \d+: allocating \d+ bytes failed", log)
ends = m and len(re.findall(r"ubatch end ubatch=\d+ device=%s " % m.group(1), log[:m.start()]))
sys.exit(0 if ends else 1)
EOF
}

# oom_case BASE FA_KV: phi3 f16 -p 20480 -ub 512 with the ballast on GPU 1 leaving $leave GiB:
# legacy/never, which must die there mid-prompt (once more with 0.75 GiB less if it completes, or
# more if it dies before that device ended a ubatch), then legacy/auto on the same card, and the
# plan for that device. Runs are named BASE-oom-LEAVEgib-never|auto.
oom_case() {
    local base=$1 fa_kv=$2 name
    name=$base-oom-${leave}gib
    bench "$name-never" phi3-f16.gguf 20480 512 layer "$fa_kv" never 1 || return
    if [ "$last_rc" != 0 ] && ! died_mid_run "$name-never"; then
        leave=$(python3 -c "print(round($leave + 0.75, 2))")
        say "$name-never: did not die mid-prompt: once more with $leave GiB left"
    elif [ "$last_rc" = 0 ]; then
        leave=$(python3 -c "print(round($leave - 0.75, 2))")
        say "$name-never: completed: once more with $leave GiB left"
    fi
    if [ "$name" != "$base-oom-${leave}gib" ]; then
        name=$base-oom-${leave}gib
        bench "$name-never" phi3-f16.gguf 20480 512 layer "$fa_kv" never 1 || return
    fi
    bench "$name-auto" phi3-f16.gguf 20480 512 layer "$fa_kv" auto 1
    plan_device "$name-never"
}

if [ "$engine" = mainline ]; then
    bench phi3-f16-fapool-p8192-ub2048-layer phi3-f16.gguf 8192 2048 layer pool never
    bench llama3-q8-fapool-p5000-ub512-layer llama3-q8.gguf 5000 512 layer pool never
    oom_case phi3-f16-fapool-p20480-ub512 pool
    bench llama3-q8-p5000-ub512-row llama3-q8.gguf 5000 512 row buffer never
    bench phi3-f16-p8192-ub2048-layer phi3-f16.gguf 8192 2048 layer buffer never
    bench llama3-q8-p5000-ub512-layer llama3-q8.gguf 5000 512 layer buffer never
    bench phi3-f16-fapool-p20480-ub512-layer phi3-f16.gguf 20480 512 layer pool never
else
    bench phi3-f16-p8192-ub2048-layer phi3-f16.gguf 8192 2048 layer n/a never
    bench llama3-q8-p5000-ub512-layer llama3-q8.gguf 5000 512 layer n/a never
    oom_case phi3-f16-p20480-ub512 n/a
    record llama3-q8-p5000-ub512-row skipped=true reason="ik_llama.cpp's llama-bench has no -sm row (none|layer|graph)"
    say "llama3-q8-p5000-ub512-row: skipped: ik_llama.cpp's llama-bench accepts -sm none|layer|graph"
    bench phi3-f16-p20480-ub512-layer phi3-f16.gguf 20480 512 layer n/a never
fi
nvidia-smi --query-gpu=index,memory.used,memory.free --format=csv >>"$res/gpu.txt" 2>&1
say "done after $(elapsed) s"
pack
