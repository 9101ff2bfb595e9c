"""cupool from Python: the CUDA memory pool as PyTorch's and CuPy's allocator.

Pure Python over libcupool's C API (ctypes), which ``pip install`` builds and bundles beside
these modules (``CUPOOL_LIB`` overrides it). Importing this package imports neither torch nor
cupy::

    import cupool.torch
    cupool.torch.install(pool="vmm")     # before the first CUDA tensor
    ...
    print(cupool.stats(0)["reserved_bytes.all.peak"])

``cupool.torch.mempool()`` gives a ``torch.cuda.MemPool`` over cupool instead, and
``cupool.cupy.install()`` makes cupool CuPy's allocator. ``cupool.tag``, ``cupool.sleep`` and
``cupool.wake`` free a tagged part of the memory between phases (see ``cupool.tags``);
``cupool.record_memory_history`` and ``cupool.dump_snapshot`` write what PyTorch's memory viewer
reads (see ``cupool.history``). See docs/pytorch.md.
"""

import contextlib
import ctypes
import os

from ._lib import CupoolError, LibraryNotFound, load
from . import _lib
from .tags import asleep_bytes, current_tag, sleep, tag, wake
from .registered import deregister, register, registered_bytes
from .history import dump_snapshot, memory_snapshot, record_memory_history

__all__ = ["CupoolError", "LibraryNotFound", "init", "is_initialized", "shutdown", "stats",
           "trim", "purge", "reset_peaks", "record", "phase", "device_count", "library_path",
           "config_string", "with_environment", "ensure_open", "ubatch_end", "tag", "current_tag", "sleep", "wake",
           "asleep_bytes", "register", "deregister", "registered_bytes", "record_memory_history",
           "memory_snapshot", "dump_snapshot"]

#: The configuration names ``init`` takes as keywords, and the C API's names for them.
OPTIONS = {
    "fallback_managed": "GGML_CUDA_ALLOC_FALLBACK_MANAGED",
    "no_vmm": "GGML_CUDA_NO_VMM",
    "allow_oversubscription": "CUPOOL_ALLOW_OVERSUBSCRIPTION",
    "device": "CUPOOL_DEVICE",
    "sim_gib": "CUPOOL_SIM_GIB",
    "sim_devices": "CUPOOL_SIM_DEVICES",
    "vmm_round_large": "CUPOOL_VMM_ROUND_LARGE",
    "vmm_recycle": "CUPOOL_VMM_RECYCLE",
    "vmm_recycle_free": "CUPOOL_VMM_RECYCLE_FREE",
    "vmm_recycle_page": "CUPOOL_VMM_RECYCLE_PAGE",
    "vmm_lanes": "CUPOOL_VMM_LANES",
    "vmm_ahead": "CUPOOL_VMM_AHEAD",
    "size_classes": "CUPOOL_SIZE_CLASSES",
    "purge": "CUPOOL_PURGE",
    "auto_headroom": "CUPOOL_AUTO_HEADROOM",
    "limit_mib": "CUPOOL_LIMIT_MIB",
    "time_driver": "CUPOOL_TIME_DRIVER",
    "vmm_defer": "CUPOOL_VMM_DEFER",
}


def config_string(pool=None, **options):
    """The C API's configuration string for ``pool`` (vmm, legacy, managed, torch, direct, nccl) and
    the keywords of ``OPTIONS``; an unknown keyword is a ``TypeError`` naming the accepted ones."""
    config = {}
    if pool is not None:
        config["GGML_POOL"] = pool
    for k, v in options.items():
        if k not in OPTIONS:
            raise TypeError(f"unknown cupool option {k!r}: accepted are {', '.join(OPTIONS)}")
        if v is not None:
            config[OPTIONS[k]] = v
    return _lib.encode(config).decode()


_initialized = False


def with_environment(pool, options):
    """``pool`` and ``options`` completed from the environment: ``GGML_POOL`` where no pool is
    given, and each ``OPTIONS`` setting not passed as a keyword from its variable. A keyword
    wins over the environment; the environment over libcupool's defaults."""
    options = dict(options)
    if pool is None:
        pool = os.environ.get("GGML_POOL") or None
    for key, name in OPTIONS.items():
        if key not in options and os.environ.get(name):
            options[key] = os.environ[name]
    return pool, options


def init(pool=None, config=None, **options):
    """Opens the library: with ``config`` (a ``NAME=VALUE`` string) if given, else with
    ``pool`` and the keywords of ``OPTIONS``, the rest from the environment
    (``with_environment``); with neither, from the environment (``GGML_POOL`` and the rest)."""
    global _initialized
    if config is None and (pool is not None or options):
        pool, options = with_environment(pool, options)
        config = config_string(pool, **options)
    _lib.check(load().cupool_init(_lib.encode(config)))
    _initialized = True


def ensure_open(pool, default_pool, config, options):
    """Opens the library on CUDA with ``pool`` (else ``default_pool``), ``config`` and
    ``options``; if it is open already, checks that no settings are asked for."""
    if not _initialized:
        if config is None:
            pool = pool or os.environ.get("GGML_POOL") or default_pool
        init(pool=pool, config=config, device=options.pop("device", "cuda"), **options)
    elif pool is not None or config is not None or options:
        raise CupoolError(_lib.INVALID_ARGUMENT,
                          "cupool is already open with another configuration: "
                          "call cupool.shutdown() first, or pass no configuration")


def is_initialized():
    """Whether ``init`` (or an install) opened the library in this process."""
    return _initialized


def shutdown():
    """Closes the library (refused while blocks are live)."""
    global _initialized
    _lib.check(load().cupool_shutdown())
    _initialized = False


def device_count():
    """How many devices the open library has."""
    n = load().cupool_device_count()
    if n < 0:
        raise CupoolError(_lib.NOT_INITIALIZED, _lib.last_error())
    return n


def library_path():
    """The path of the loaded libcupool."""
    return load().path


def stats(device=-1):
    """Statistics of ``device`` (every device when -1) as a dict, with the keys of
    ``torch.cuda.memory_stats()`` where they mean the same, plus ``cupool.*``."""
    return _lib.stats_json(device)


def purge(device=0, smaller_than=0):
    """Synchronizes ``device`` and returns its pools' idle memory smaller than ``smaller_than``
    bytes (all of it when 0) to the driver. Returns the bytes released."""
    out = ctypes.c_size_t(0)
    _lib.check(load().cupool_purge(device, smaller_than, ctypes.byref(out)))
    return out.value


def trim(device=0):
    """Synchronizes ``device`` and returns everything its pools hold idle. Returns the bytes
    released."""
    return purge(device, 0)


def ubatch_end(device=-1):
    """Ends a prefill ubatch of an engine on ``device`` (every device when -1): each pool applies
    ``CUPOOL_PURGE`` (``purge=`` of ``init``; ``auto`` by default) and the ubatch's peaks are
    logged; ``stats()``'s peaks go on until ``reset_peaks()``. Returns the bytes given back to
    the driver."""
    out = ctypes.c_size_t(0)
    _lib.check(load().cupool_ubatch_end(device, ctypes.byref(out)))
    return out.value


def reset_peaks(device=-1):
    """Sets the peaks of ``device`` (every device when -1) to the current values."""
    _lib.check(load().cupool_reset_peaks(device))


class Recording:
    """A trace being written; ``stop()`` (or leaving the ``with`` block) closes it."""

    def __init__(self, path):
        self.path = str(path)
        self.allocations = None
        _lib.check(load().cupool_record_start(self.path.encode()))

    def stop(self):
        """Flushes and closes the trace; returns the number of allocations recorded."""
        import ctypes
        if self.allocations is None:
            n = ctypes.c_uint64(0)
            _lib.check(load().cupool_record_stop(ctypes.byref(n)))
            self.allocations = n.value
        return self.allocations

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def record(path):
    """Starts writing every allocation and free through cupool to ``path`` as a trace that
    ``repro-prefill replay PATH --pool KIND`` reads. Use as ``with cupool.record(p): ...`` or
    call ``.stop()`` on the result."""
    return Recording(path)


@contextlib.contextmanager
def phase(name, prefill=False):
    """Marks a phase (a prefill chunk, a decode step) in an open recording; a replay reports each
    phase's high-water mark, and ``prefill=True`` makes its end a purge boundary."""
    _lib.check(load().cupool_phase_begin(str(name).encode()))
    try:
        yield
    finally:
        _lib.check(load().cupool_phase_end(1 if prefill else 0))
