"""PyTorch's scaled_dot_product_attention on the shapes of benches/fattn.rs, timed the same way
(CUDA events, median of 20 after 3 warm-up calls). Prints one JSON line per shape."""
import json
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from cuda_timing import median_ms

for name, n_head, n_head_kv, d in [("phi3-mini", 32, 32, 96), ("llama3-8b", 32, 8, 128)]:
    for n_kv in [4096, 16384]:
        n_tokens = 512
        q = torch.randn(1, n_head, n_tokens, d, device="cuda", dtype=torch.float16)
        k = torch.randn(1, n_head_kv, n_kv, d, device="cuda", dtype=torch.float16)
        v = torch.randn(1, n_head_kv, n_kv, d, device="cuda", dtype=torch.float16)
        mask = causal_lower_right(n_tokens, n_kv)
        gqa = n_head != n_head_kv
        run = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        ms = median_ms(run)
        pos0 = n_kv - n_tokens
        pairs = sum(pos0 + t + 1 for t in range(n_tokens)) * n_head
        tflops = pairs * 2 * (2 * d) / (ms * 1e-3) / 1e12
        print(json.dumps({"suite": "fattn", "impl": "pytorch-sdpa", "torch": torch.__version__, "shape": name,
                          "n_head": n_head, "n_head_kv": n_head_kv, "d": d, "n_tokens": n_tokens, "n_kv": n_kv,
                          "ms": round(ms, 4), "tflops": round(tflops, 2), "q": "f16", "kv": "f16"}))
