"""The baseline of the full-depth prefill benchmark: HF transformers with SDPA attention and a
StaticCache, a Phi-3-mini-shaped model (random f16 weights), a prompt prefilled in chunks of
`--chunk` tokens (logits of each chunk's last token only, as llama.cpp asks). One warm-up
prefill of two chunks, then `--reps` timed prefills; prints one JSON line with the median.

    python3 scripts/hf_prefill.py --prompt 20000 --chunk 512
"""
import argparse
import json
import time

import torch
import transformers
from transformers import StaticCache

p = argparse.ArgumentParser()
p.add_argument("--prompt", type=int, default=20000)
p.add_argument("--chunk", type=int, default=512)
p.add_argument("--layers", type=int, default=32)
p.add_argument("--reps", type=int, default=3)
a = p.parse_args()

cfg = transformers.Phi3Config(hidden_size=3072, num_hidden_layers=a.layers, num_attention_heads=32,
                              num_key_value_heads=32, intermediate_size=8192, vocab_size=32064,
                              max_position_embeddings=131072)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float16)
model.eval()
ids = torch.randint(0, cfg.vocab_size, (1, a.prompt), device="cuda")
max_len = -(-a.prompt // 256) * 256


def new_cache():
    try:
        return StaticCache(config=cfg, max_cache_len=max_len)
    except TypeError:  # transformers 4.x signature
        return StaticCache(config=cfg, max_batch_size=1, max_cache_len=max_len, device="cuda",
                           dtype=torch.float16)


def prefill(n):
    cache = new_cache()
    with torch.no_grad():
        for s in range(0, n, a.chunk):
            e = min(n, s + a.chunk)
            out = model(input_ids=ids[:, s:e], past_key_values=cache, use_cache=True,
                        cache_position=torch.arange(s, e, device="cuda"), logits_to_keep=1)
            del out
    torch.cuda.synchronize()


prefill(2 * a.chunk)
times = []
for _ in range(a.reps):
    t0 = time.perf_counter()
    prefill(a.prompt)
    times.append(time.perf_counter() - t0)
    torch.cuda.empty_cache()
times.sort()
s = times[len(times) // 2]
print(json.dumps({"suite": "prefill-full", "impl": "hf-transformers-sdpa-static", "model": "phi3-mini",
                  "layers": a.layers, "prompt": a.prompt, "chunk": a.chunk, "seconds": round(s, 3),
                  "tokens_per_s": round(a.prompt / s, 1), "runs_s": [round(t, 3) for t in times],
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "gpu": torch.cuda.get_device_name(0)}))
