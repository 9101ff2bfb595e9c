"""cupool as CuPy's allocator: ``cupool.cupy.install()`` (``cupy.cuda.set_allocator``).

Each allocation is one cupool block on the current device and the current stream's pool,
freed when CuPy drops its last reference to the memory.
"""

import ctypes

import cupool
from . import _lib


class _Block:
    """Owns one cupool block; frees it when CuPy lets go of it."""

    __slots__ = ("ptr", "size", "device", "stream", "__weakref__")

    def __init__(self, ptr, size, device, stream):
        self.ptr, self.size, self.device, self.stream = ptr, size, device, stream

    def __del__(self):
        lib = _lib.load()
        if lib.cupool_free(self.device, self.stream, self.ptr, self.size) != _lib.OK:
            import logging
            logging.getLogger("cupool").error("freeing a CuPy block failed: %s", _lib.last_error())


def allocate(size):
    """CuPy's allocator function: a ``cupy.cuda.MemoryPointer`` to ``size`` bytes from cupool.
    Raises ``cupy.cuda.memory.OutOfMemoryError`` with cupool's report when the pool cannot
    serve it."""
    import cupy
    device = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream().ptr
    size = max(int(size), 1)
    actual = ctypes.c_size_t(0)
    lib = _lib.load()
    ptr = lib.cupool_alloc(device, stream, size, ctypes.byref(actual))
    if not ptr:
        # CuPy's own error type, so callers' handlers work; cupool's report goes to the log.
        import logging
        logging.getLogger("cupool").error("cupool could not serve CuPy: %s", _lib.last_error())
        _, total = cupy.cuda.runtime.memGetInfo()
        raise cupy.cuda.memory.OutOfMemoryError(size, total)
    owner = _Block(ptr, size, device, stream)
    mem = cupy.cuda.memory.UnownedMemory(ptr, size, owner, device)
    return cupy.cuda.memory.MemoryPointer(mem, 0)


def install(pool=None, config=None, **options):
    """Makes cupool CuPy's allocator (``pool``, vmm by default, and ``options`` as
    ``cupool.init``; none if the library is open already)."""
    import cupy
    cupool.ensure_open(pool, "vmm", config, dict(options))
    cupy.cuda.set_allocator(allocate)
