"""CUDA graph capture and replay through a cupool MemPool: the graph's private memory comes
from cupool, replays compute the right result on new inputs, and the pool's memory goes back
when the graph and the pool are dropped.
Usage: POOL=vmm|direct python3 torch_graphs.py"""
import gc
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool  # noqa: E402
import cupool.torch  # noqa: E402
import torch  # noqa: E402

pool = cupool.torch.mempool(pool=os.environ.get("POOL", "direct"))
x = torch.randn(2048, 2048, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side), torch.cuda.use_mem_pool(pool):
    for _ in range(3):  # warm-up, as torch.cuda.graph's documentation asks
        y = torch.relu(x @ x) + 1
torch.cuda.current_stream().wait_stream(side)
before = cupool.stats(0)["allocated_bytes.all.current"]
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, pool=pool.id):
    y = torch.relu(x @ x) + 1
    z = y.sum(dim=0)
captured = cupool.stats(0)["allocated_bytes.all.current"]
assert captured >= before, (before, captured)
for seed in range(3):
    torch.manual_seed(seed)
    x.copy_(torch.randn(2048, 2048, device="cuda"))
    g.replay()
    ref = (torch.relu(x.double() @ x.double()) + 1).sum(dim=0).float()
    assert torch.allclose(z, ref, rtol=1e-3, atol=1.0), (z - ref).abs().max()
print(f"graph replayed through a cupool MemPool ({os.environ.get('POOL', 'direct')}): ok; "
      f"cupool bytes live after capture {captured}")
del g, y, z
gc.collect()
torch.cuda.synchronize()
del pool
gc.collect()
torch.cuda.empty_cache()
print("after dropping the graph and the pool, cupool live bytes:", cupool.stats(0)["allocated_bytes.all.current"])
