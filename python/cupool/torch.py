"""cupool as PyTorch's CUDA allocator.

Two modes:

- ``install(pool="vmm")``: every CUDA tensor of the process goes through cupool
  (``torch.cuda.memory.change_current_allocator``). Must run before PyTorch allocates CUDA
  memory. PyTorch's own statistics, snapshots and ``empty_cache`` do not see it; use
  ``cupool.stats()`` and ``cupool.trim()``.
- ``mempool()``: a ``torch.cuda.MemPool`` whose segments come from cupool; use it with
  ``torch.cuda.use_mem_pool(p)``. PyTorch's caching runs on top; its statistics keep working and
  an out-of-memory is PyTorch's usual ``torch.OutOfMemoryError``.
"""

import cupool
from . import _lib

_allocator = None


def _pluggable():
    """The ``CUDAPluggableAllocator`` over libcupool's PyTorch entry points (made once)."""
    global _allocator
    if _allocator is None:
        import torch
        lib = _lib.load()
        _allocator = torch.cuda.memory.CUDAPluggableAllocator(
            lib.path, "cupool_torch_alloc", "cupool_torch_free")
    return _allocator


def install(pool=None, config=None, **options):
    """Makes cupool the allocator of every CUDA tensor in this process. ``pool`` is vmm (the
    default), legacy, managed, torch or direct; ``options`` are ``cupool.OPTIONS``. If
    ``cupool.init`` already opened the library, pass no settings: its own are used. Raises a
    ``RuntimeError`` if PyTorch already allocated CUDA memory."""
    import torch
    if torch.cuda.is_initialized() and (torch.cuda.memory_reserved() > 0
                                        or torch.cuda.memory_allocated() > 0):
        raise RuntimeError(
            "cupool.torch.install() must run before PyTorch allocates CUDA memory: "
            f"its own allocator already holds {torch.cuda.memory_reserved()} bytes. Call it "
            "first thing (before any CUDA tensor or model.to('cuda')), or use "
            "cupool.torch.mempool() to route part of the work through cupool.")
    cupool.ensure_open(pool, "vmm", config, dict(options))
    try:
        torch.cuda.memory.change_current_allocator(_pluggable())
    except RuntimeError as e:
        raise RuntimeError(f"cupool.torch.install() came too late: PyTorch refused to swap its "
                           f"allocator ({e}). Call it before any CUDA work.") from e


def mempool(pool=None, config=None, **options):
    """A ``torch.cuda.MemPool`` whose memory comes from cupool. Use with
    ``torch.cuda.use_mem_pool(p)``. PyTorch caches on top and returns segments when it empties
    its cache (after an out-of-memory, too), so the default pool, ``direct``, caches nothing
    and gives each segment back to the driver at once; ``fallback_managed=True`` serves what
    the device cannot from managed memory."""
    import torch
    cupool.ensure_open(pool, "direct", config, dict(options))
    return torch.cuda.MemPool(_pluggable().allocator())
