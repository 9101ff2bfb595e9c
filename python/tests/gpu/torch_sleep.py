"""Sleep and wake through cupool installed as PyTorch's allocator: a model's weights and its KV
cache tagged; sleep frees at least 99.5% of the tagged bytes (cudaMemGetInfo), every tensor keeps
its address, the offloaded weights come back bit for bit and the model's output after wake equals
the output before sleep.
Usage: python3 torch_sleep.py"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool  # noqa: E402
import cupool.torch  # noqa: E402
import torch  # noqa: E402

cupool.torch.install(pool="vmm")
torch.manual_seed(0)
D, LAYERS, SEQ = 4096, 8, 2048
with cupool.torch.tag("weights"):
    model = torch.nn.Sequential(*[torch.nn.Linear(D, D, dtype=torch.float16) for _ in range(LAYERS)]).cuda()
with cupool.torch.tag("kv_cache"):
    kv = torch.randn(LAYERS, 2, SEQ, D, device="cuda", dtype=torch.float16)
x = torch.randn(64, D, device="cuda", dtype=torch.float16)


def forward():
    # The "attention" reads the cache so the output depends on it as well as on the weights.
    h = x
    for i, layer in enumerate(model):
        h = layer(h) + kv[i, 0, :64] * 0.01
    return h


weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
tagged = weights_bytes + kv.numel() * kv.element_size()
before_out = forward()
ptrs = [p.data_ptr() for p in model.parameters()] + [kv.data_ptr()]
weights_cpu = [p.detach().cpu() for p in model.parameters()]
kv_cpu = kv.cpu()
torch.cuda.synchronize()

free0 = torch.cuda.mem_get_info()[0]
released = cupool.torch.sleep(["weights", "kv_cache"], offload=["weights"])
free1 = torch.cuda.mem_get_info()[0]
freed = free1 - free0
print(f"tagged {tagged} B, released {released} B, cudaMemGetInfo freed {freed} B "
      f"({100.0 * freed / tagged:.2f}% of the tagged bytes)")
assert freed >= 0.995 * tagged, (freed, tagged)
assert cupool.torch.asleep_bytes("weights") >= weights_bytes
# Untagged work goes on while the tags sleep.
y = torch.ones(1024, device="cuda") * 2
assert float(y.sum()) == 2048.0

mapped = cupool.torch.wake(["weights", "kv_cache"])
assert mapped == released, (mapped, released)
assert [p.data_ptr() for p in model.parameters()] + [kv.data_ptr()] == ptrs, "addresses kept"
for p, w in zip(model.parameters(), weights_cpu):
    assert torch.equal(p.detach().cpu(), w), "offloaded weights restored bit for bit"
kv.copy_(kv_cpu)  # the cache was not offloaded: refill it, as an engine refills its KV cache
after_out = forward()
assert torch.equal(before_out, after_out), (before_out - after_out).abs().max()
print("sleep and wake through torch: ok")
