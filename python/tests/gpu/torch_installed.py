"""cupool installed as PyTorch's allocator (every CUDA tensor): tensors, matmul, SDPA, a small
model's forward and backward, several streams, eight threads, stats, trim and a recorded trace.
Usage: python3 torch_installed.py TRACE_PATH"""
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool  # noqa: E402
import cupool.torch  # noqa: E402
import torch  # noqa: E402

cupool.torch.install(pool=os.environ.get("POOL", "vmm"))
rec = cupool.record(sys.argv[1])

# cupool's own allocator class (torch_direct.cpp) wherever PyTorch's CUDA extensions build,
# unless declined; an empty tensor then gets no memory, as from PyTorch's own allocator, and
# grows by resize_ like any other.
if os.environ.get("CUPOOL_TORCH_DIRECT", "on") != "off":
    assert cupool.torch.route() == "direct", (cupool.torch.route(), cupool.torch.direct_error)
    e = torch.empty(0, device="cuda")
    assert e.data_ptr() == 0, e.data_ptr()
    e.resize_(1000).fill_(3.0)
    assert e.data_ptr() != 0 and float(e.sum()) == 3000.0
    del e
else:
    assert cupool.torch.route() == "pluggable", cupool.torch.route()

x = torch.randn(4096, 4096, device="cuda")
y = x @ x
ref = (x.double() @ x.double()).float()
assert torch.allclose(y, ref, rtol=1e-3, atol=1e-2)
q = torch.randn(2, 8, 2048, 64, device="cuda", dtype=torch.float16)
o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
r = torch.softmax((q.float() @ q.float().transpose(-1, -2)) / 8 + torch.full((2048, 2048), float("-inf"), device="cuda").triu(1), -1) @ q.float()
assert torch.allclose(o.float(), r, atol=2e-2), (o.float() - r).abs().max()
torch.cuda.synchronize()
s = cupool.stats(0)
live = s["allocated_bytes.all.current"]
assert live >= 3 * 4096 * 4096 * 4, s
del x, y, ref, q, o, r

# A small transformer: forward, backward, an optimizer step, loss going down.
STEPS = int(os.environ.get("STEPS", "20"))
torch.manual_seed(0)
model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True), 4).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randn(16, 128, 256, device="cuda")
losses = []
for _ in range(STEPS):
    loss = (model(data) - data).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(float(loss))
assert STEPS < 20 or losses[-1] < losses[0] * 0.8, losses
del model, opt, data, loss

errors = []


def work(t):
    try:
        st = torch.cuda.Stream()
        with torch.cuda.stream(st):
            for i in range(200):
                a = torch.full((1000 + 37 * i + t,), float(t), device="cuda")
                b = a * 2
                assert float(b.sum()) == 2.0 * t * a.numel()
        st.synchronize()
    except Exception as e:  # reported below
        errors.append(repr(e))


threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
assert not errors, errors
torch.cuda.synchronize()
n = rec.stop()
s = cupool.stats(0)
assert s["cupool.pools"] >= 9, s
assert s["allocation.all.allocated"] >= n > 1000, (n, s)
before = s["reserved_bytes.all.current"]
released = cupool.trim(0)
after = cupool.stats(0)["reserved_bytes.all.current"]
assert released > 0 and after == before - released, (before, released, after)
# torch.cuda's statistics functions, for what cupool serves: the same names and meanings.
ms = cupool.torch.memory_stats()
assert list(ms) == sorted(ms) and ms["allocated_bytes.all.current"] == s["allocated_bytes.all.current"], ms
big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
assert cupool.torch.memory_allocated() >= big.numel()
high = cupool.torch.max_memory_allocated()
del big
cupool.ubatch_end()  # an engine's boundary restarts no peak the user sees
assert cupool.torch.max_memory_allocated() == high >= 256 << 20, (high, cupool.torch.memory_stats())
cupool.torch.reset_peak_memory_stats()
assert cupool.torch.max_memory_allocated() == cupool.torch.memory_allocated() < 256 << 20
assert cupool.torch.max_memory_reserved() == cupool.torch.memory_reserved()
print(f"torch installed ({os.environ.get('POOL', 'vmm')}): ok; {n} allocations recorded, trim released {released} bytes")
