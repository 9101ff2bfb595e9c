"""cupool installed as PyTorch's allocator on two GPUs: tensors on each, a copy between them,
one pool per (device, stream), statistics per device."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool  # noqa: E402
import cupool.torch  # noqa: E402
import torch  # noqa: E402

cupool.torch.install(pool=os.environ.get("POOL", "vmm"))
assert torch.cuda.device_count() >= 2, "needs two GPUs"
assert cupool.device_count() >= 2
a = torch.randn(4096, 4096, device="cuda:0")
b = torch.randn(2048, 2048, device="cuda:1")
c = a.to("cuda:1")
with torch.cuda.device(1):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        d = c[:2048, :2048] @ b
    s.synchronize()
assert torch.allclose(d.cpu(), a[:2048, :2048].cpu() @ b.cpu(), rtol=1e-3, atol=1e-2)
s0, s1 = cupool.stats(0), cupool.stats(1)
assert s0["allocated_bytes.all.current"] >= 4096 * 4096 * 4, s0
assert s1["allocated_bytes.all.current"] >= (4096 * 4096 + 2 * 2048 * 2048) * 4, s1
assert s1["cupool.pools"] >= 2, s1  # the default stream and s
del a, b, c, d
torch.cuda.synchronize(0)
torch.cuda.synchronize(1)
# What PyTorch keeps (cuBLAS workspaces) may stay; the tensors are gone from each device.
MIB = 1 << 20
assert cupool.stats(0)["allocated_bytes.all.current"] <= s0["allocated_bytes.all.current"] - 64 * MIB
assert cupool.stats(1)["allocated_bytes.all.current"] <= s1["allocated_bytes.all.current"] - 96 * MIB
print("two devices: ok", cupool.trim(0), cupool.trim(1))
