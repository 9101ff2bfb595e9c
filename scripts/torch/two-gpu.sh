#!/usr/bin/env bash
# Two GPUs, torch.distributed and NCCL registration: everything in one call on a machine with
# two GPUs, from the repository root, with libcupool at $CUPOOL_LIB (default .bundle/libcupool.so):
#   bash scripts/torch/two-gpu.sh
# Steps, each bounded by `timeout` and all together by BUDGET seconds (default 330; a step that
# no longer fits is skipped and says so):
#   1. gpu.txt: nvidia-smi, topology, driver, PyTorch, CUDA and NCCL versions, the library used;
#      cupool's out-of-memory shim is built meanwhile (once; cupool.torch.install needs it);
#   2. scripts/torch/nccl_bw.py: all_reduce and all_gather bandwidth from native buffers, a
#      cupool nccl MemPool and the same pool registered with NCCL, NCCL's INIT/REG log (and a
#      count of its registration lines per rank in steps.log), the pin check;
#   3. scripts/torch/distributed.py for every allocator x workload (ALLOCATORS, WORKLOADS), REPS
#      times (default 1; each repetition in the reverse order of the one before);
#   4. the two-GPU cases of python/tests/test_gpu.py (cupool installed and as a MemPool against
#      native, tp-mlp and ddp); PYTEST=0 leaves them out.
# Writes under $OUT (default /tmp/out): gpu.txt, steps.log (one line per step: verdict, seconds,
# name), distributed.jsonl, nccl_bw.jsonl, report.md (scripts/torch/dist-report.py's tables)
# and logs.tar.gz (every step's output, NCCL's logs). Exit status 0 when every step passed.
# NVLink multicast stays off (mandatory on the shared machines): NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out="${OUT:-/tmp/out}"
mkdir -p "$out"
logs="$out/two-gpu-logs"
rm -rf "$logs" && mkdir -p "$logs/nccl"
steps="$out/steps.log"
: > "$steps"
budget=${BUDGET:-330}
export CUPOOL_LIB="${CUPOOL_LIB:-$PWD/.bundle/libcupool.so}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 RUST_BACKTRACE=1
torchrun=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
status=0

finish() {
  python3 scripts/torch/dist-report.py "$out" > "$out/report.md" 2> "$logs/report.err" \
    || echo "dist-report.py failed (see two-gpu-logs/report.err)" >> "$out/report.md"
  tar czf "$out/logs.tar.gz" -C "$out" two-gpu-logs && rm -rf "$logs"
  grep -E '^(PASS|FAIL|TIMEOUT|SKIP)' "$steps" | awk '{ n[$1 ~ /^PASS/ ? "passed" : $1 ~ /^SKIP/ ? "skipped" : "failed"]++ }
    END { printf "%d passed, %d failed, %d skipped\n", n["passed"], n["failed"], n["skipped"] }' | tee -a "$steps"
  echo "total ${SECONDS}s" | tee -a "$steps"
}

# step NAME LIMIT COMMAND...: runs COMMAND with its output in two-gpu-logs/NAME.log, for at most
# LIMIT seconds and what is left of the budget; adds its line to steps.log. Returns its status.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  if ((left < 25)); then
    printf '%-13s %5s  %s (budget of %ss spent)\n' SKIP - "$name" "$budget" | tee -a "$steps"
    status=1
    return 99
  fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS
  echo "== $name: $* (limit ${limit}s)" > "$logs/$name.log"
  timeout -k 20 "$limit" "$@" >> "$logs/$name.log" 2>&1
  local rc=$?
  local verdict=PASS
  ((rc == 0)) || verdict=FAIL
  ((rc == 124 || rc == 137)) && verdict=TIMEOUT
  if grep -qE 'panicked|stack backtrace|Traceback' "$logs/$name.log"; then
    verdict="$verdict+TRACE"
  fi
  [ "$verdict" = PASS ] || status=1
  if [ "$verdict" != PASS ] && [ "$verdict" != FAIL ]; then
    # What still runs on the GPUs after a timeout or a crash.
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >> "$logs/$name.log" 2>&1
  fi
  printf '%-13s %5ss  %s (exit %d)\n' "$verdict" "$((SECONDS - t0))" "$name" "$rc" | tee -a "$steps"
  return "$rc"
}

reversed() { local r=""; for x in $1; do r="$x $r"; done; echo "$r"; }

# 1. The machine.
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: ${REPS:+REPS=$REPS }${BUDGET:+BUDGET=$BUDGET }${ALLOCATORS:+ALLOCATORS=\"$ALLOCATORS\" }${WORKLOADS:+WORKLOADS=\"$WORKLOADS\" }bash scripts/torch/two-gpu.sh"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "host: $(hostname), $(nproc) CPU cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "libcupool: $CUPOOL_LIB ($(sha256sum "$CUPOOL_LIB" 2>/dev/null | cut -c1-16 || echo missing))"
  echo "multicast guards: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
  echo "python: $(python3 --version 2>&1)"
  python3 -c 'import torch
print("torch:", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
v = torch.cuda.nccl.version()
print("nccl (torch.cuda.nccl.version()):", ".".join(map(str, v)) if isinstance(v, tuple) else v)' 2>&1
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-nccl|nvidia-cuda-runtime|transformers|numpy|pytest) ' || true
  echo
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,memory.used,clocks.max.sm --format=csv 2>&1
  echo
  nvidia-smi 2>&1
  echo
  nvidia-smi topo -m 2>&1
} > "$out/gpu.txt"
cat "$out/gpu.txt"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -lt 2 ]; then
  echo "two-gpu.sh needs two GPUs, this machine has ${gpus:-0}" | tee -a "$steps"
  finish
  exit 2
fi
if [ ! -f "$CUPOOL_LIB" ]; then
  echo "no libcupool at $CUPOOL_LIB (set CUPOOL_LIB, or copy it to .bundle/libcupool.so)" | tee -a "$steps"
  finish
  exit 2
fi
# cupool.torch.install() builds its out-of-memory shim against this PyTorch on first use: once
# here, in the background, rather than by two ranks at once inside a timed run.
(
  timeout 300 python3 -c 'import sys; sys.path.insert(0, "python")
import torch, cupool.torch
print("shim:", cupool.torch._shim_path(torch))' > "$logs/oom-shim.log" 2>&1
  echo "exit $?" >> "$logs/oom-shim.log"
) &
shim=$!

# 2. NCCL bandwidth and registration.
[ "${NCCL_BW:-1}" != 0 ] && step nccl-bw 150 "${torchrun[@]}" scripts/torch/nccl_bw.py --out "$out/nccl_bw.jsonl" --log-dir "$logs/nccl"
for f in "$logs"/nccl/nccl-rank*.log; do
  [ -f "$f" ] || continue
  # NCCL 2.28's wording (src/register/register.cc, src/transport/p2p.cc).
  printf '       %s: %s ncclCommRegister, %s IPC register, %s IPC reuse, %s failed to register, %s NCCL WARN\n' \
    "$(basename "$f")" "$(grep -c 'register comm .* buffer' "$f")" "$(grep -cE 'IPC register(ed)? buffer' "$f")" \
    "$(grep -c 'IPC reuse buffer' "$f")" "$(grep -ciE 'failed to [a-z]* ?register' "$f")" \
    "$(grep -c 'NCCL WARN' "$f")" | tee -a "$steps"
done
grep -h '^probe:' "$logs/nccl-bw.log" >> "$out/gpu.txt" 2>/dev/null

wait "$shim"
printf '%-13s %5s  oom-shim (%s)\n' "$(grep -q '^exit 0' "$logs/oom-shim.log" && echo PASS || echo FAIL)" - \
  "$(tail -n 1 "$logs/oom-shim.log")" | tee -a "$steps"

# 3. Every allocator on every workload.
allocators=${ALLOCATORS:-native expandable async cupool cupool-mempool}
workloads=${WORKLOADS:-tp-mlp ddp}
order=$allocators
for rep in $(seq 1 "${REPS:-1}"); do
  for w in $workloads; do
    for a in $order; do
      step "dist-$w-$a-$rep" 120 "${torchrun[@]}" scripts/torch/distributed.py --allocator "$a" --workload "$w" \
        --out "$out/distributed.jsonl"
      rc=$?
      if ((rc != 0 && rc != 99)); then
        echo "{\"allocator\": \"$a\", \"workload\": \"$w\", \"rep\": $rep, \"failed\": $rc}" >> "$out/distributed.jsonl"
      fi
    done
  done
  order=$(reversed "$order")
done

# 4. The two-GPU test cases (their own shorter runs, compared with a native run).
# PYTEST=0 leaves it out (scripts/gpu-run.sh's python-gpu step runs the same cases).
if [ "${PYTEST:-1}" != 0 ]; then
  step pytest-two-gpu 240 python3 -m pytest -q -rs -c python/pytest.ini -m gpu -k torch_distributed \
    python/tests/test_gpu.py
fi
[ -f "$logs/pytest-two-gpu.log" ] && grep -E '(passed|failed|skipped|error)' "$logs/pytest-two-gpu.log" | tail -n 1 \
  | sed 's/^/       pytest: /' | tee -a "$steps"

finish
exit $status
