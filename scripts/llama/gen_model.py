#!/usr/bin/env python3
"""Writes a GGUF model of a preset's shape with random weights, which llama.cpp loads like a
real model (its memory traffic and kernels are a real model's; its text is noise).

    python3 scripts/llama/gen_model.py --preset phi3-mini --type f16 --out phi3-mini-f16.gguf

With --header-only it writes the same header and leaves the tensor data a hole of its length (a
sparse file): what `repro-prefill plan --gguf` reads, in seconds and without gigabytes on disk.

Needs numpy and gguf: `pip install './python[tools]'` from the checkout installs both, or put
the gguf-py folder of the engine's source tree on PYTHONPATH. The vocabulary is a
SentencePiece-style one of the preset's size (control tokens, the 256 byte tokens, then
placeholders): its size, not its text, shapes the embedding and output matrices.
"""
import argparse
import sys
import time

import numpy as np

try:
    import gguf
except ImportError as e:
    sys.exit(f"gen_model: cannot import gguf: {type(e).__name__}: {e}\n"
             "gen_model: install it (pip install gguf, or pip install './python[tools]' from the checkout)"
             " or put the engine's gguf-py folder on PYTHONPATH")

# The shapes of cupool's presets (runtime/src/model.rs), with the vocabulary of each model.
PRESETS = {
    # arch, layers, width, heads, kv heads, ffn, vocab, context trained
    "phi3-mini": ("phi3", 32, 3072, 32, 32, 8192, 32064, 131072),
    "llama3-8b": ("llama", 32, 4096, 32, 8, 14336, 128256, 131072),
    "qwen3-30b-a3b": ("qwen3moe", 48, 2048, 32, 4, 6144, 151936, 40960),
    "deepseek-v3": ("deepseek2", 61, 7168, 128, 128, 18432, 129280, 163840),
}
# Mixture-of-experts presets: head dimension, experts, experts used per token, expert FFN width.
MOE = {
    "qwen3-30b-a3b": (128, 128, 8, 768),
    "deepseek-v3": (192, 256, 8, 2048),
}
# DeepSeek's multi-head latent attention: Q and KV low ranks, the rotary part of a head, the
# value head, the dense layers before the experts, the shared experts.
MLA = {
    "deepseek-v3": dict(q_lora=1536, kv_lora=512, rope=64, v_head=128, dense_lead=3, shared=1),
}
TYPES = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
QK8_0 = 32


def tensors(preset: str, n_layer: int):
    """(name, shape as ggml orders it: fastest dimension first, kind) of every tensor: kind is True
    for a matrix of the chosen type, None for an f32 matrix, False for a norm (ones)."""
    arch, _, n_embd, n_head, n_head_kv, n_ff, n_vocab, _ = PRESETS[preset]
    head_dim = MOE[preset][0] if preset in MOE else n_embd // n_head
    n_gqa = n_head_kv * head_dim
    yield "token_embd.weight", (n_embd, n_vocab), True
    yield "output_norm.weight", (n_embd,), False
    yield "output.weight", (n_embd, n_vocab), True
    for i in range(n_layer):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (n_embd,), False
        yield b + "ffn_norm.weight", (n_embd,), False
        if arch == "phi3":
            yield b + "attn_qkv.weight", (n_embd, n_embd + 2 * n_gqa), True
            yield b + "ffn_up.weight", (n_embd, 2 * n_ff), True
        elif arch == "deepseek2":
            mla = MLA[preset]
            _, n_expert, _, n_ff_exp = MOE[preset]
            yield b + "attn_q_a_norm.weight", (mla["q_lora"],), False
            yield b + "attn_kv_a_norm.weight", (mla["kv_lora"],), False
            yield b + "attn_q_a.weight", (n_embd, mla["q_lora"]), True
            yield b + "attn_q_b.weight", (mla["q_lora"], n_head * head_dim), True
            yield b + "attn_kv_a_mqa.weight", (n_embd, mla["kv_lora"] + mla["rope"]), True
            nope = head_dim - mla["rope"]
            yield b + "attn_kv_b.weight", (mla["kv_lora"], n_head * (nope + mla["v_head"])), True
            yield b + "attn_output.weight", (n_head * mla["v_head"], n_embd), True
            if i < min(mla["dense_lead"], n_layer - 1):
                yield b + "ffn_gate.weight", (n_embd, n_ff), True
                yield b + "ffn_up.weight", (n_embd, n_ff), True
                yield b + "ffn_down.weight", (n_ff, n_embd), True
            else:
                yield b + "ffn_gate_inp.weight", (n_embd, n_expert), None
                yield b + "exp_probs_b.bias", (n_expert,), None
                yield b + "ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), True
                yield b + "ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), True
                yield b + "ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), True
                shared = n_ff_exp * mla["shared"]
                yield b + "ffn_gate_shexp.weight", (n_embd, shared), True
                yield b + "ffn_up_shexp.weight", (n_embd, shared), True
                yield b + "ffn_down_shexp.weight", (shared, n_embd), True
            continue
        elif arch == "qwen3moe":
            _, n_expert, _, n_ff_exp = MOE[preset]
            yield b + "attn_q.weight", (n_embd, n_head * head_dim), True
            yield b + "attn_k.weight", (n_embd, n_gqa), True
            yield b + "attn_v.weight", (n_embd, n_gqa), True
            yield b + "attn_q_norm.weight", (head_dim,), False
            yield b + "attn_k_norm.weight", (head_dim,), False
            yield b + "attn_output.weight", (n_head * head_dim, n_embd), True
            # The router stays f32, as in published GGUFs.
            yield b + "ffn_gate_inp.weight", (n_embd, n_expert), None
            yield b + "ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), True
            yield b + "ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), True
            yield b + "ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), True
            continue
        else:
            yield b + "attn_q.weight", (n_embd, n_embd), True
            yield b + "attn_k.weight", (n_embd, n_gqa), True
            yield b + "attn_v.weight", (n_embd, n_gqa), True
            yield b + "ffn_gate.weight", (n_embd, n_ff), True
            yield b + "ffn_up.weight", (n_embd, n_ff), True
        yield b + "attn_output.weight", (n_embd, n_embd), True
        yield b + "ffn_down.weight", (n_ff, n_embd), True


def random_tensor(rng, shape, qtype):
    """Random weights of `shape` (ggml order) as the bytes of `qtype`; norms are ones."""
    n = int(np.prod(shape))
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        # Blocks of 32: an f16 scale, then 32 int8 values.
        blocks = n // QK8_0
        raw = np.empty((blocks, 2 + QK8_0), dtype=np.uint8)
        raw[:, :2] = np.full(blocks, 0.02 / 127, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
        raw[:, 2:] = rng.integers(0, 256, size=(blocks, QK8_0), dtype=np.uint8)
        # Rows of bytes, the outer dimensions as they are (experts of a 3-d tensor).
        return raw.reshape(tuple(reversed(shape[1:])) + (-1,))
    w = rng.standard_normal(n, dtype=np.float32)
    w *= 0.02
    return w.astype(np.float16).reshape(tuple(reversed(shape)))


def layout(shape, matrix, qtype):
    """(numpy shape, numpy dtype, bytes) of a tensor as random_tensor and main write it: a
    quantized matrix as rows of bytes, the rest as floats."""
    n = int(np.prod(shape))
    if matrix and qtype == gguf.GGMLQuantizationType.Q8_0:
        row = shape[0] // QK8_0 * (2 + QK8_0)
        return tuple(reversed(shape[1:])) + (row,), np.dtype(np.uint8), n // QK8_0 * (2 + QK8_0)
    if matrix:
        return tuple(reversed(shape)), np.dtype(np.float16), 2 * n
    return tuple(reversed(shape)), np.dtype(np.float32), 4 * n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--type", choices=sorted(TYPES), default="f16", help="the matrices' type (norms are f32)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="another number of layers (the preset's by default)")
    ap.add_argument("--header-only", action="store_true",
                    help="write the header only, the tensor data a hole of its length (for planning, not running)")
    a = ap.parse_args()
    arch, n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx_train = PRESETS[a.preset]
    if a.layers is not None:
        if not 1 <= a.layers <= 1024:
            sys.exit(f"gen_model: --layers {a.layers}: accepted values are 1 to 1024")
        n_layer = a.layers
    qtype = TYPES[a.type]
    rng = np.random.default_rng(a.seed)
    t0 = time.time()

    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"random {a.preset} ({a.type})")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    if a.preset in MOE:
        head_dim, n_expert, n_expert_used, n_ff_exp = MOE[a.preset]
        mla = MLA.get(a.preset)
        w.add_key_length(head_dim)
        w.add_value_length(mla["v_head"] if mla else head_dim)
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        w.add_expert_feed_forward_length(n_ff_exp)
        w.add_rope_dimension_count(mla["rope"] if mla else head_dim)
        if mla:
            # The dense layers come first; a model of fewer layers keeps at least one MoE layer.
            w.add_leading_dense_block_count(min(mla["dense_lead"], n_layer - 1))
            w.add_q_lora_rank(mla["q_lora"])
            w.add_kv_lora_rank(mla["kv_lora"])
            w.add_expert_shared_count(mla["shared"])
            w.add_expert_weights_scale(2.5)
            w.add_expert_weights_norm(True)
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    else:
        w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0 if arch == "phi3" else 500000.0)
    if arch == "phi3":
        w.add_sliding_window(n_ctx_train * 2)  # no sliding window, as Phi-3-mini-128k
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if a.type == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0)

    specials = ["<unk>", "<s>", "</s>"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)]
    # llama.cpp looks <|endoftext|> up by name in a model named like Phi-3.
    tokens += ["<|endoftext|>"] + [f"t{i}" for i in range(n_vocab - len(tokens) - 1)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (n_vocab - 260)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(n_vocab - 259)])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    total = 0
    for name, shape, matrix in tensors(a.preset, n_layer):
        if a.header_only:
            np_shape, dtype, nbytes = layout(shape, matrix, qtype)
            w.add_tensor_info(name, np_shape, dtype, nbytes, raw_dtype=qtype if matrix else None)
            total += nbytes
            continue
        if matrix:
            data = random_tensor(rng, shape, qtype)
            w.add_tensor(name, data, raw_dtype=qtype)
        elif matrix is None:
            data = (rng.standard_normal(int(np.prod(shape)), dtype=np.float32) * 0.02).reshape(tuple(reversed(shape)))
            w.add_tensor(name, data)
        else:
            data = np.ones(shape, dtype=np.float32)
            w.add_tensor(name, data)
        total += data.nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    if a.header_only:
        w.write_ti_data_to_file()
        w.close()
        # The data section starts at the next multiple of the alignment, each tensor padded to it,
        # as write_tensors_to_file would lay them out.
        align = w.data_alignment
        pad = lambda x: -(-x // align) * align
        with open(a.out, "r+b") as f:
            f.truncate(pad(f.seek(0, 2)) + sum(pad(ti.nbytes) for ti in w.tensors[0].values()))
    else:
        w.write_tensors_to_file()
        w.close()
    print(f"gen_model: {a.out}: {a.preset}, {a.type}, {total / 2**30:.2f} GiB of weights, {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
