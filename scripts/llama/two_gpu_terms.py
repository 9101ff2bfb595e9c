"""The two terms a second GPU adds to a device's memory, as the Rust models compute them, for
scripts/llama/two-gpu-replan.py (no GPU, no numpy):

- mainline llama.cpp's compute buffer of a pipeline stage: `device_compute_buffer_bytes` of
  profiles/src/llama/compute.rs (the scheduler's 4 copies of a device's split inputs, never
  freed, under the largest of its attention, feed-forward and output stages);
- ik_llama.cpp's NCCL communicators: `Outside::on_gpus` of runtime/src/planner/outside.rs (one
  communicator over every visible GPU, pairs with 3 or 4; 394 MiB each on two H100s).

The Rust tests hold these to the Rust models through the fixtures' buffers.json (the same
per-device terms as replan.json): profiles/tests/mainline_two_gpus.rs against
`device_compute_buffer_bytes`, runtime/tests/nccl_two_gpus.rs against `Outside::on_gpus`. A
change to either model without this file fails there.
"""
import re

MIB = 2**20
ALIGN = 128  # ggml-alloc's alignment on a CUDA buffer
KV_PADDING = 256  # llama.cpp pads the context and the KV length to it
SCHED_MAX_COPIES = 4  # GGML_SCHED_MAX_COPIES of mainline's ggml-backend.cpp
NCCL_COMMUNICATOR_BYTES = 394 * MIB  # runtime/src/planner/outside.rs

# the shim's cuda-init line, then the engine's `using device` line (after ggml_cuda_init)
CUDA_INIT = re.compile(r"cupool: memory device=(\d+) stage=cuda-init free_mib=([\d.]+)")
USING = re.compile(r"using device CUDA(\d+)\b.* - (\d+) MiB free")


def aligned(b: int) -> int:
    return -(-b // ALIGN) * ALIGN


def shape(presets: dict, preset: str) -> dict:
    """A dense preset's shape from gen_model.py's PRESETS."""
    _, _, n_embd, n_head, n_head_kv, n_ff, n_vocab, _ = presets[preset]
    return dict(n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=n_embd // n_head,
                n_ff=n_ff, n_vocab=n_vocab)


def n_ctx(n_prompt: int, n_gen: int) -> int:
    """llama-bench's context (prompt and generated tokens) as llama.cpp pads it."""
    return -(-(n_prompt + n_gen) // KV_PADDING) * KV_PADDING


def sched_copies(n_devices: int, n_gpu_layers: int, n_layer: int, split_mode: str) -> int:
    return SCHED_MAX_COPIES if n_devices > 1 and n_gpu_layers > n_layer and split_mode == "layer" else 1


def _inputs(m: dict, kv_quant: bool, ctx: int, n: int, out_ids: bool) -> int:
    n_kv = -(-ctx // KV_PADDING) * KV_PADDING
    b = sum(aligned(x) for x in (n_kv * n * 2, n * 4, n * 8, n * 8))
    if out_ids:
        b += aligned(n * 4)
    if kv_quant and m["head_dim"] % 64 == 0:
        k_rot = m["head_dim"] & -m["head_dim"]
        b += aligned(k_rot * k_rot * 4) + aligned(64 * 64 * 4)
    return b


def _attention(m: dict, kv_from_pool: bool, kv_quant: bool, ctx: int, n: int) -> int:
    n_kv = -(-ctx // KV_PADDING) * KV_PADDING
    q = m["n_head"] * m["head_dim"]
    fa = aligned(q * n * 4)
    if not kv_from_pool and kv_quant:
        fa += 2 * aligned(n_kv * m["n_head_kv"] * m["head_dim"] * 2)
    return aligned(m["n_embd"] * n * 4) + aligned(q * n * 4) + fa


def _output(m: dict, n: int) -> int:
    return aligned(m["n_embd"] * n * 4) + aligned(m["n_vocab"] * n * 4)


def device_compute_bytes(m: dict, kv_from_pool: bool, kv_quant: bool, ctx: int, n: int,
                         copies: int, last_layer: bool, output: bool) -> int:
    """profiles/src/llama/compute.rs's `device_compute_buffer_bytes` (a dense model)."""
    if copies <= 1:
        return max(_inputs(m, kv_quant, ctx, n, True) + _attention(m, kv_from_pool, kv_quant, ctx, n),
                   _output(m, n))
    inputs = aligned(m["n_embd"] * n * 4) + _inputs(m, kv_quant, ctx, n, last_layer)
    ffn = 2 * aligned(m["n_embd"] * n * 4) + 3 * aligned(m["n_ff"] * n * 4)
    own = max(_attention(m, kv_from_pool, kv_quant, ctx, n), ffn, _output(m, n) if output else 0)
    return copies * inputs + own


def ik_nccl_communicators(device: int, visible_gpus: int) -> int:
    """runtime/src/planner/outside.rs's `ik_nccl_communicators`."""
    if device >= visible_gpus:
        return 0
    pairs = {3: [(0, 1), (0, 2)], 4: [(0, 1), (2, 3), (0, 2), (1, 3)]}.get(visible_gpus, [])
    return int(visible_gpus > 1) + sum(1 for a, b in pairs if device in (a, b))


def nccl_bytes(engine: str, device: int, visible_gpus: int) -> int:
    """The NCCL term on `device`: ik_llama.cpp's communicators; none for mainline's -sm layer."""
    return ik_nccl_communicators(device, visible_gpus) * NCCL_COMMUNICATOR_BYTES if engine == "ik" else 0


def nccl_measured(log: str) -> dict:
    """Per device, what ggml_cuda_init's NCCL set-up took as the free-memory lines bound it (MiB):
    the shim's cuda-init free (0.1 MiB) less the engine's `using device` free (whole MiB, rounded
    down), as [low, high]: (before - after - 1, before - after]."""
    before = {int(d): float(f) for d, f in CUDA_INIT.findall(log)}
    after = {int(d): int(f) for d, f in USING.findall(log)}
    return {d: [round(before[d] - after[d] - 1, 1), round(before[d] - after[d], 1)]
            for d in sorted(before) if d in after}
