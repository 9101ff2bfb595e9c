"""One allocator, one process: HF transformers prefill of a long prompt in chunks with the
default DynamicCache, then greedy decode. Prints one JSON line of measurements.

    python3 scripts/torch/prefill.py --allocator cupool --model phi3 --prompt 20000 --chunk 512

Allocators: native, expandable (expandable_segments:True), async (backend:cudaMallocAsync),
cupool (installed as PyTorch's allocator), cupool-mempool (a torch.cuda.MemPool over cupool).
Weights are random bf16; only shapes matter. The peak device memory the driver saw is sampled
by nvidia-smi in another process (no load on this one), over the prefill, above the memory
in use just before the model is built.
"""
import argparse
import datetime
import gc
import json
import os
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--allocator", required=True,
               choices=["native", "expandable", "async", "cupool", "cupool-mempool"])
p.add_argument("--model", default="phi3", choices=["phi3", "llama3", "qwen3moe"])
p.add_argument("--prompt", type=int, default=20000)
p.add_argument("--chunk", type=int, default=512)
p.add_argument("--decode", type=int, default=32)
p.add_argument("--pool", help="cupool's pool kind (default: vmm installed, direct as a MemPool)")
p.add_argument("--record", help="write cupool's trace here (cupool allocators only)")
p.add_argument("--sample-ms", type=int, default=50)
p.add_argument("--speed-reps", type=int, default=0,
               help="after the measured run, prefill the prompt this many more times, each from an "
                    "empty cache with the allocator's free memory given back to the driver first "
                    "(torch.cuda.empty_cache, cupool.trim), so every one starts as the first did: "
                    "repeated timings in one process, with the GPU's busy share of each")
p.add_argument("--keep-cache", action="store_true",
               help="with --speed-reps: keep the allocator's cache between the prefills (no "
                    "empty_cache or trim), as a server or a notebook runs one request after "
                    "another; each prefill's driver peak is reported too")
p.add_argument("--profile", metavar="FILE",
               help="after the timed prefills, run one more under torch.profiler (not timed with "
                    "them) and write its tables here: ops by their own CPU time on the Python "
                    "thread, and by their kernels' time")
p.add_argument("--warmup", type=int, default=0,
               help="tokens run through the model (their cache dropped) before the timed prefill, "
                    "so the first chunk's one-off set-up (cuBLAS, kernel loading) is not timed")
a = p.parse_args()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocators  # noqa: E402

torch = allocators.select(a.allocator, a.pool)
import cupool  # noqa: E402
import cupool.torch  # noqa: E402

dev = torch.cuda.current_device()

import transformers  # noqa: E402
from transformers import DynamicCache  # noqa: E402

if a.model == "phi3":
    cfg = transformers.Phi3Config(hidden_size=3072, num_hidden_layers=32, num_attention_heads=32,
                                  num_key_value_heads=32, intermediate_size=8192, vocab_size=32064,
                                  max_position_embeddings=131072)
elif a.model == "qwen3moe":
    # Qwen3-30B-A3B's shape (128 experts, 8 per token, GQA 32/4, head 128) with 12 of its 48
    # layers, so that the weights (about 16 GiB in bf16) leave the KV cache the card
    cfg = transformers.Qwen3MoeConfig(hidden_size=2048, num_hidden_layers=12, num_attention_heads=32,
                                      num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                                      moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                      vocab_size=151936, max_position_embeddings=40960)
else:
    cfg = transformers.LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                                   max_position_embeddings=131072, rope_theta=500000.0)
cfg._attn_implementation = "sdpa"


class Sampler:
    """nvidia-smi's memory.used and utilization.gpu of this GPU, sampled in another process."""

    def __init__(self, ms):
        self.p = subprocess.Popen(
            ["nvidia-smi", f"--id=GPU-{torch.cuda.get_device_properties(dev).uuid}",
             "--query-gpu=timestamp,memory.used,utilization.gpu", "--format=csv,noheader,nounits",
             f"-lms={ms}"],
            stdout=subprocess.PIPE, text=True)

    def stop(self):
        """[(time.time() of the sample, MiB used, percent of the sample's period a kernel ran)]."""
        self.p.terminate()
        out, _ = self.p.communicate()
        rows = []
        for line in out.splitlines():
            f = [x.strip() for x in line.split(",")]
            if len(f) == 3 and f[1].isdigit() and f[2].isdigit():
                t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((t, int(f[1]), int(f[2])))
        return rows


def busy(rows, t0, t1):
    """The mean GPU utilization (percent) of the samples taken between t0 and t1."""
    u = [r[2] for r in rows if t0 <= r[0] <= t1]
    return sum(u) / len(u) if u else None


def used_mib():
    free, total = torch.cuda.mem_get_info(dev)
    return (total - free) / 2**20


mempool = cupool.torch.mempool(pool=a.pool or "direct") if a.allocator == "cupool-mempool" else None
ctx = torch.cuda.use_mem_pool(mempool) if mempool is not None else None
if ctx:
    ctx.__enter__()
rec = cupool.record(a.record) if a.record else None

base = used_mib()
t0 = time.time()
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.eval()
torch.cuda.synchronize()
build_s = time.time() - t0
ids = torch.randint(0, cfg.vocab_size, (1, a.prompt), device="cuda")
if a.allocator in ("native", "expandable"):
    torch.cuda.reset_peak_memory_stats()

if a.warmup:
    with torch.no_grad():
        model(input_ids=ids[:, :min(a.warmup, a.prompt)], past_key_values=DynamicCache(), use_cache=True)
    torch.cuda.synchronize()

sampler = Sampler(a.sample_ms)
time.sleep(0.3)
torch.cuda.synchronize()
# With CUPOOL_TIME_DRIVER=on libcupool counts and times its driver calls: read before and after
# the timed prefill, the difference is what its allocations cost this thread in the driver.
timed_before = cupool.stats(dev) if a.allocator.startswith("cupool") else {}


def prefill():
    """Prefills the prompt in chunks into a new cache: (cache, next token, seconds). The Python
    thread's own CPU time of the last call is left in ``thread_cpu[0]``: the launches, the
    allocator's calls and PyTorch's dispatch, without the time the thread waited or was not
    running (this machine's wall times vary by tens of percent between identical prefills)."""
    c0 = time.thread_time()
    t0 = time.time()
    cache = DynamicCache()
    for s in range(0, a.prompt, a.chunk):
        if rec:
            with cupool.phase(f"prefill {s}"):
                out = model(input_ids=ids[:, s:s + a.chunk], past_key_values=cache, use_cache=True)
        else:
            out = model(input_ids=ids[:, s:s + a.chunk], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        del out
    torch.cuda.synchronize()
    thread_cpu[0] = time.thread_time() - c0
    return cache, nxt, time.time() - t0


thread_cpu = [0.0]


def settle():
    """Between prefills: the last one's tensors freed and, unless --keep-cache, the allocator's
    free memory given back to the driver, so the next starts as the first did."""
    gc.collect()
    torch.cuda.synchronize()
    if not a.keep_cache:
        torch.cuda.empty_cache()
        if a.allocator.startswith("cupool"):
            cupool.trim(dev)


with torch.no_grad():
    t_start = time.time()
    cache, nxt, prefill_s = prefill()
    timed_after = cupool.stats(dev) if "cupool.driver_ns" in timed_before else {}
    time.sleep(0.3)
    rows = sampler.stop()
    samples = [r[1] for r in rows]
    util = busy(rows, t_start, t_start + prefill_s)
    peak_torch = {}
    if a.allocator in ("native", "expandable", "async"):
        st = torch.cuda.memory_stats()
        peak_torch = {"peak_allocated_mib": st.get("allocated_bytes.all.peak", 0) / 2**20,
                      "peak_reserved_mib": st.get("reserved_bytes.all.peak", 0) / 2**20,
                      "num_alloc_retries": st.get("num_alloc_retries", 0)}
    t1 = time.time()
    for _ in range(a.decode):
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        del out
    torch.cuda.synchronize()
    decode_s = time.time() - t1
    own = cupool.stats(dev) if a.allocator.startswith("cupool") else None
    # Repeated timings: every prefill from an empty cache, the allocator's free memory back
    # with the driver, as before the first.
    speed, speed_driver_ms, speed_peak, speed_pool, speed_cpu = [], [], [], [], []
    for _ in range(a.speed_reps):
        del cache, nxt
        settle()
        sampler = Sampler(a.sample_ms)
        time.sleep(0.3)
        before = cupool.stats(dev) if timed_after else None
        t_start = time.time()
        cache, nxt, took = prefill()
        speed_cpu.append(thread_cpu[0])
        if before:
            speed_driver_ms.append((cupool.stats(dev)["cupool.driver_ns"] - before["cupool.driver_ns"]) / 1e6)
        time.sleep(0.3)
        rows = sampler.stop()
        speed.append((took, busy(rows, t_start, t_start + took)))
        speed_peak.append(max((r[1] for r in rows), default=base) - base)
        if a.allocator.startswith("cupool"):
            speed_pool.append(cupool.stats(dev)["reserved_bytes.all.peak"] / 2**20)

    if a.profile:
        # One more prefill under torch.profiler, not among the timed ones (the profiler slows
        # each op): its ops by their own CPU time on the Python thread, and the kernels' time.
        del cache, nxt
        settle()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            cache, nxt, took = prefill()
        with open(a.profile, "w") as f:
            f.write(f"# profiled prefill: {took:.3f} s\n")
            f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
            f.write(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))

if rec:
    rec.stop()
result = {
    "allocator": a.allocator, "model": a.model, "prompt": a.prompt, "chunk": a.chunk,
    "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__,
    "transformers": transformers.__version__,
    "warmup": a.warmup, "prefill_tok_s": a.prompt / prefill_s, "decode_tok_s": a.decode / decode_s,
    "build_s": build_s, "baseline_used_mib": base,
    "driver_peak_mib": (max(samples) - base) if samples else None, "samples": len(samples),
    "prefill_s": prefill_s, "gpu_busy_pct": util,
    **({"speed_prefill_s": [t for t, _ in speed], "speed_gpu_busy_pct": [u for _, u in speed]} if speed else {}),
    **({"speed_thread_cpu_s": speed_cpu} if speed_cpu else {}),
    **({"speed_driver_ms": speed_driver_ms} if speed_driver_ms else {}),
    **({"keep_cache": True, "speed_driver_peak_mib": speed_peak} if a.keep_cache and speed else {}),
    **({"speed_cupool_reserved_peak_mib": speed_pool} if a.keep_cache and speed_pool else {}),
    **peak_torch,
}
if timed_after:
    def delta(prefix):
        return {k[len(prefix):]: timed_after[k] - timed_before.get(k, 0)
                for k in timed_after if k.startswith(prefix) and timed_after[k] != timed_before.get(k, 0)}
    result.update({"cupool_driver_ms": (timed_after["cupool.driver_ns"] - timed_before["cupool.driver_ns"]) / 1e6,
                   "cupool_driver_calls": delta("cupool.driver_calls."),
                   "cupool_driver_call_ms": {k: v / 1e6 for k, v in delta("cupool.driver_ns.").items()}})
if a.allocator == "cupool":
    result["cupool_route"] = cupool.torch.route()
if own is not None:
    result.update({"cupool_peak_reserved_mib": own["reserved_bytes.all.peak"] / 2**20,
                   "cupool_peak_allocated_mib": own["allocated_bytes.all.peak"] / 2**20,
                   "cupool_ooms": own["num_ooms"]})
if mempool is not None:
    st = torch.cuda.memory_stats()
    result.update({"peak_allocated_mib": st.get("allocated_bytes.all.peak", 0) / 2**20,
                   "peak_reserved_mib": st.get("reserved_bytes.all.peak", 0) / 2**20})
print(json.dumps(result))
