#!/usr/bin/env bash
# The plan against an engine on the GPU machine, in device calls of at most 10 minutes:
#
#     scripts/llama/predict-gpu.sh build ENGINE            # ENGINE: ik or mainline
#     scripts/llama/predict-gpu.sh run ENGINE [predict-check.py run arguments, cases...]
#
# `build` builds the engine with the shim (scripts/llama/build.sh, targets llama-bench and, for
# ik_llama.cpp, llama-sweep-bench) into .llama/build-ENGINE and, meanwhile, writes the models the
# prediction checks use into .llama/models (random weights, gen_model.py): phi3-f16.gguf,
# llama3-q8.gguf, qwen3-q8.gguf (Qwen3-30B-A3B's shape, 12 layers) and qwen3-q8-4l.gguf (4
# layers); PREDICT_GPU_MODELS="FILE ..." writes only those. A second `build` on the warm machine
# resumes where the first stopped. `run` runs
# scripts/llama/predict-check.py run with --bin, --repro and --out filled in (the cases name
# models by file name; .llama/models/ is prefixed), then its two reports. Everything is logged
# under $OUT: gpu.txt (the machine, the commands), steps.log, the check's folder as check.tar.gz.
#
# Carry .bundle (libcupool.so, repro-prefill: scripts/gpu-bundle.sh, or just those two) and
# .llama/tarballs (the engines' source tarballs from the third-party folder; mainline's for its
# gguf-py in any case). One GPU: the engine
# sees GPU 0 only (seed.py), so a machine of several GPUs measures as one of one.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2
phase=${1:-}
engine=${2:-}
shift 2 2>/dev/null || true
case "$engine" in
ik) tarball=ik_llama.cpp-8337e4cd.tar.gz targets="llama-bench llama-sweep-bench" ;;
mainline) tarball=llama.cpp-0c1e5709.tar.gz targets="llama-bench" ;;
*)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
OUT=${OUT:-$root/.llama/out}
mkdir -p "$OUT"
t0=$(date +%s)
budget=${PREDICT_GPU_BUDGET_S:-560}
lib=$root/.bundle/libcupool.so
repro=$root/.bundle/repro-prefill
src_tar=$root/.llama/tarballs/$tarball
build=$root/.llama/build-$engine
bin=$build/build/bin
models=$root/.llama/models
mkdir -p "$models"
say() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$OUT/steps.log"; }
left() { echo $((t0 + budget - $(date +%s))); }
cmdlog() { printf '%s\n' "$*" >>"$OUT/gpu.txt"; }
{
    echo "# predict-gpu.sh $phase $engine, started $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.free --format=csv
    nvcc --version 2>&1 | tail -2
    echo "cmake: $(cmake --version 2>&1 | head -1), cores: $(nproc)"
    echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo "${CUPOOL_COMMIT:-unknown}")"
    sha256sum "$lib" "$repro" "$src_tar" 2>&1
    echo "# commands, in order"
} >>"$OUT/gpu.txt" 2>&1

gguf_py() { # mainline's gguf-py (it writes every architecture the presets have), for gen_model.py
    local dir=$root/.llama/gguf-py gguf_tar=$root/.llama/tarballs/llama.cpp-0c1e5709.tar.gz
    if [ ! -e "$dir/gguf/__init__.py" ]; then
        rm -rf "$dir.src" && mkdir -p "$dir.src"
        tar xzf "$gguf_tar" -C "$dir.src" --wildcards '*gguf-py/*'
        rm -rf "$dir" && mv "$(find "$dir.src" -maxdepth 2 -type d -name gguf-py | head -1)" "$dir"
    fi
    local path=$dir
    if ! python3 -c 'import yaml' 2>/dev/null; then # gguf-py imports yaml for model cards only
        mkdir -p "$root/.llama/pystub"
        printf 'def safe_load(*a, **k):\n    raise ImportError("PyYAML is not installed")\n' >"$root/.llama/pystub/yaml.py"
        path=$path:$root/.llama/pystub
    fi
    echo "$path"
}

if [ "$phase" = build ]; then
    for f in "$lib" "$repro" "$src_tar"; do
        [ -e "$f" ] || { say "missing: $f (carry .bundle and .llama/tarballs)"; exit 2; }
    done
    pypath=$(gguf_py)
    pids=()
    gen() { # preset type file [extra]
        local out=$models/$3
        [ -s "$out" ] && { say "model $3: already written"; return; }
        [[ " ${PREDICT_GPU_MODELS:-$3} " == *" $3 "* ]] || return 0
        cmdlog "python3 scripts/llama/gen_model.py --preset $1 --type $2 ${4:-} --out $out"
        (PYTHONPATH=$pypath timeout "$(left)" python3 scripts/llama/gen_model.py --preset "$1" --type "$2" ${4:-} \
            --out "$out.part" >"$OUT/gen-$3.log" 2>&1 && mv "$out.part" "$out") &
        pids+=($!)
    }
    gen phi3-mini f16 phi3-f16.gguf
    gen llama3-8b q8_0 llama3-q8.gguf
    gen qwen3-30b-a3b q8_0 qwen3-q8.gguf "--layers 12"
    gen qwen3-30b-a3b q8_0 qwen3-q8-4l.gguf "--layers 4"
    cmdlog "TARGETS=\"$targets\" scripts/llama/build.sh $src_tar $build"
    s=$(date +%s)
    TARGETS=$targets timeout "$(($(left) - 10))" bash scripts/llama/build.sh "$src_tar" "$build" >"$OUT/build.log" 2>&1
    say "build: exit $? after $(($(date +%s) - s)) s ($(grep -c '^\[' "$OUT/build.log") ninja lines)"
    for p in "${pids[@]}"; do wait "$p"; done
    for m in "$models"/*.gguf; do say "model $(basename "$m"): $(stat -c %s "$m") bytes"; done
    ls "$bin" 2>/dev/null | tr '\n' ' ' | sed 's/^/bin: /' | tee -a "$OUT/steps.log"
    exit 0
fi

if [ "$phase" = run ]; then
    check=$root/.llama/check-$engine
    rm -rf "$check"
    args=()
    for a in "$@"; do # NAME:FILE.gguf:FREE[:CTX] with FILE under .llama/models
        if [[ "$a" =~ ^([^:]+):([^:/]+\.gguf):(.*)$ ]]; then
            a="${BASH_REMATCH[1]}:$models/${BASH_REMATCH[2]}:${BASH_REMATCH[3]}"
        fi
        args+=("$a")
    done
    cmdlog "python3 scripts/llama/predict-check.py run --bin $bin --repro $repro --out $check ${args[*]}"
    CUPOOL_LIB=$lib timeout "$(($(left) - 15))" python3 scripts/llama/predict-check.py run --bin "$bin" \
        --repro "$repro" --out "$check" "${args[@]}" 2>&1 | tee "$OUT/check.log"
    say "check: exit ${PIPESTATUS[0]}"
    python3 scripts/llama/predict-check.py report-oom "$check" >"$OUT/report-oom.txt" 2>&1
    python3 scripts/llama/predict-check.py report "$check" >"$OUT/report.txt" 2>&1
    tar czf "$OUT/check.tar.gz" -C "$root/.llama" "check-$engine"
    exit 0
fi
sed -n '2,16p' "$0" >&2
exit 2
