"""torch.compile with cupool installed as PyTorch's allocator: plain compiled code runs and
matches eager; mode="reduce-overhead" (CUDA graphs through cudagraph trees) is refused by
PyTorch with its reason, not run on memory the graphs cannot own. Cudagraph trees need
graph-private pools and checkPoolLiveAllocations, which no pluggable allocator provides in
PyTorch 2.11; use cupool.torch.mempool() for CUDA graphs (torch_graphs.py)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool  # noqa: E402
import cupool.torch  # noqa: E402
import torch  # noqa: E402

cupool.torch.install(pool="vmm")


def f(a, b):
    return torch.relu(a @ b) + 1


a = torch.randn(512, 512, device="cuda")
plain = torch.compile(f)
assert torch.allclose(plain(a, a), f(a, a), rtol=1e-3, atol=1e-2)
print("torch.compile (default mode): ok")
try:
    graphed = torch.compile(f, mode="reduce-overhead")
    for _ in range(3):
        graphed(a, a)
    raise SystemExit("reduce-overhead ran: cupool cannot keep graph-private memory, this must not pass silently")
except RuntimeError as e:
    assert "pluggable" in str(e) and "checkPoolLiveAllocations" in str(e), e
    print("torch.compile reduce-overhead refused:", str(e).splitlines()[0])
