"""Choosing PyTorch's allocator for a benchmark process: call ``select`` before anything else
touches CUDA."""
import os
import sys

#: The allocators the benchmarks compare.
NAMES = ["native", "expandable", "async", "cupool", "cupool-mempool"]
_CONF = {"expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}


def select(allocator, pool=None):
    """Sets PyTorch's allocator (the cupool package from this checkout); returns torch.
    ``cupool-mempool`` leaves PyTorch's own in place: the script opens the MemPool."""
    if allocator in _CONF:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = _CONF[allocator]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import torch
    import cupool.torch
    if allocator == "cupool":
        cupool.torch.install(pool=pool or "vmm")
    torch.cuda.init()
    torch.cuda.synchronize()
    return torch
