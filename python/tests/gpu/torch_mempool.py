"""cupool as a torch.cuda.MemPool: tensors inside use_mem_pool come from cupool, PyTorch's stats
keep working, and an out-of-memory is torch.OutOfMemoryError with cupool's report logged."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool  # noqa: E402
import cupool.torch  # noqa: E402
import torch  # noqa: E402

pool = cupool.torch.mempool(pool=os.environ.get("POOL", "direct"))
outside = torch.empty(1 << 20, device="cuda")
with torch.cuda.use_mem_pool(pool):
    x = torch.randn(8192, 8192, device="cuda")
    y = x @ x
    assert torch.isfinite(y).all()
s = cupool.stats(0)
assert s["allocated_bytes.all.current"] >= 2 * 8192 * 8192 * 4, s
assert torch.cuda.memory_allocated() >= 2 * 8192 * 8192 * 4
free, total = torch.cuda.mem_get_info()
with torch.cuda.use_mem_pool(pool):
    try:
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        print("torch.OutOfMemoryError:", str(e).splitlines()[0])
    else:
        raise AssertionError("no out-of-memory error")
    z = torch.ones(1 << 20, device="cuda")  # still usable
    assert float(z.sum()) == 1 << 20
assert cupool.stats(0)["num_ooms"] >= 1
del x, y, z, outside
print("torch mempool: ok")
