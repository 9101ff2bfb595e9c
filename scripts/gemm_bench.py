"""PyTorch's f16 matmul (cuBLAS through PyTorch) on the shapes of benches/gemm.rs, timed the same
way (CUDA events, median of 20 after 3 warm-up calls): one JSON line per shape. `torch-f16` is
x16 @ w16 with an f16 result; `torch-f32-in-out` converts an f32 input and the result as the
runtime's path does (f32 in, f32 out)."""
import json
import torch

from cuda_timing import median_ms

m = 512
for model, name, n, k in [("phi3-mini", "q/k/v/o", 3072, 3072), ("phi3-mini", "up", 8192, 3072),
                          ("phi3-mini", "down", 3072, 8192), ("llama3-8b", "q/o", 4096, 4096),
                          ("llama3-8b", "k/v", 1024, 4096), ("llama3-8b", "up", 14336, 4096),
                          ("llama3-8b", "down", 4096, 14336)]:
    x = torch.randn(m, k, device="cuda")
    x16 = x.half()
    w = (torch.randn(k, n, device="cuda") * 0.02).half()
    for label, run in [("torch-f16", lambda: x16 @ w), ("torch-f32-in-out", lambda: (x.half() @ w).float())]:
        ms = median_ms(run)
        print(json.dumps({"suite": "gemm", "impl": label, "torch": torch.__version__, "model": model,
                          "matrix": name, "m": m, "n": n, "k": k, "ms": round(ms, 4),
                          "tflops": round(2 * m * n * k / (ms * 1e-3) / 1e12, 1)}))
