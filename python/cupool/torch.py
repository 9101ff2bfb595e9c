"""cupool as PyTorch's CUDA allocator.

Two modes:

- ``install(pool="vmm")``: every CUDA tensor of the process goes through cupool
  (``torch.cuda.memory.change_current_allocator``). Must run before PyTorch allocates CUDA
  memory. PyTorch's own statistics, snapshots and ``empty_cache`` do not see it; use this
  module's ``memory_stats()``, ``max_memory_allocated()``, ``reset_peak_memory_stats()`` (the
  names and meanings of ``torch.cuda``'s) and ``cupool.trim()``. An allocation cupool cannot
  serve raises ``torch.OutOfMemoryError`` with cupool's report, through a small C++ shim built
  against the installed PyTorch at the first install (cached; PyTorch does not check what a
  plug-in returns, so without the shim it would get a null pointer). Where PyTorch's CUDA
  extensions build, tensors are served by cupool's own allocator class (``torch_direct.cpp``),
  without the pointer map and lock ``CUDAPluggableAllocator`` keeps for every tensor.
- ``mempool()``: a ``torch.cuda.MemPool`` whose segments come from cupool; use it with
  ``torch.cuda.use_mem_pool(p)``. PyTorch's caching runs on top; its statistics keep working and
  an out-of-memory is PyTorch's usual ``torch.OutOfMemoryError``.

``record_memory_history()``, ``memory_snapshot()`` and ``dump_snapshot(path)`` stand in for
``torch.cuda.memory``'s ``_record_memory_history``, ``_snapshot`` and ``_dump_snapshot`` (which see
no plug-in): the pickle opens in PyTorch's memory viewer.

For NCCL, ``mempool(pool="nccl")`` makes every segment its own allocation as ``ncclMemAlloc``
makes it, and ``register_mem_pool(pool)`` registers the pool with the process group's NCCL
communicator (zero-copy collectives between GPUs) while cupool keeps its memory mapped until
``deregister_mem_pool(pool)``.
"""

import collections
import ctypes
import hashlib
import os
import warnings

import cupool
from . import _lib
from .tags import asleep_bytes, tag, wake  # noqa: F401 (cupool.torch.tag etc.)
from . import history as _history
from .tags import sleep as _sleep

_allocator = None
_raising = None
_route = None
#: Why install() did not use the direct allocator (None where it did, or before install()).
direct_error = None


def _torch():
    """PyTorch, or an ImportError that says what this module needs."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"cupool.torch needs PyTorch with CUDA ({e}): install it (pip install torch), "
                          "or use cupool's own API without it") from e
    return torch


def _pluggable():
    """The ``CUDAPluggableAllocator`` over libcupool's PyTorch entry points (made once)."""
    global _allocator
    if _allocator is None:
        torch = _torch()
        lib = _lib.load()
        _allocator = torch.cuda.memory.CUDAPluggableAllocator(
            lib.path, "cupool_torch_alloc", "cupool_torch_free")
    return _allocator


def _shim_path(torch):
    """Builds the out-of-memory shim (``torch_oom.cpp``) against this PyTorch, once per PyTorch
    version and source, binds it to libcupool, and returns its path."""
    from torch.utils import cpp_extension
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_oom.cpp")
    with open(src, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    build = os.path.join(cache, "cupool", f"torch-{torch.__version__}-{digest}")
    os.makedirs(build, exist_ok=True)
    cpp_extension.load(name="cupool_torch_oom", sources=[src], build_directory=build,
                       is_python_module=False, verbose=False)
    path = os.path.join(build, "cupool_torch_oom.so")
    shim, lib = ctypes.CDLL(path), _lib.load()
    shim.cupool_torch_oom_bind.argtypes = [ctypes.c_void_p] * 3
    addr = [ctypes.cast(f, ctypes.c_void_p) for f in
            (lib.cupool_torch_alloc, lib.cupool_torch_free, lib.cupool_last_error)]
    if shim.cupool_torch_oom_bind(*addr) != 0:
        raise RuntimeError("the shim refused libcupool's entry points")
    return path


def _install_direct(torch):
    """Makes ``torch_direct.cpp``'s allocator PyTorch's (tensors served without the plug-in
    interface's pointer map and lock, empty tensors without memory), over the out-of-memory
    shim. True if it did; False with the reason in ``direct_error`` where it cannot be built
    (no CUDA toolkit for PyTorch's extensions, say) or PyTorch refused it: install() then
    uses CUDAPluggableAllocator, which serves the same memory a little slower."""
    global _route, direct_error
    try:
        from torch.utils import cpp_extension
        oom = ctypes.CDLL(_shim_path(torch))
        here = os.path.dirname(os.path.abspath(__file__))
        src = os.path.join(here, "torch_direct.cpp")
        digest = hashlib.sha256()
        for f in (src, os.path.join(here, "torch_oom.cpp")):
            with open(f, "rb") as fh:
                digest.update(fh.read())
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        build = os.path.join(cache, "cupool", f"torch-{torch.__version__}-direct-{digest.hexdigest()[:12]}")
        os.makedirs(build, exist_ok=True)
        cpp_extension.load(name="cupool_torch_direct", sources=[src], build_directory=build,
                           with_cuda=True, is_python_module=False, verbose=False)
        shim = ctypes.CDLL(os.path.join(build, "cupool_torch_direct.so"))
        shim.cupool_torch_direct_install.argtypes = [ctypes.c_void_p] * 2
        shim.cupool_torch_direct_error.restype = ctypes.c_char_p
        addr = [ctypes.cast(f, ctypes.c_void_p) for f in (oom.cupool_torch_oom_alloc, oom.cupool_torch_oom_free)]
        if shim.cupool_torch_direct_install(*addr) != 0:
            raise RuntimeError(shim.cupool_torch_direct_error().decode(errors="replace"))
    except Exception as e:  # noqa: BLE001 (any failure falls back, the reason kept)
        direct_error = str(e).splitlines()[0] if str(e) else repr(e)
        return False
    _route, direct_error = "direct", None
    return True


def route():
    """How ``install()`` made cupool PyTorch's allocator: ``"direct"`` (cupool's own allocator
    class, ``torch_direct.cpp``), ``"pluggable"`` (``CUDAPluggableAllocator``; the reason the
    direct one was not used is in ``direct_error``), or None before install()."""
    return _route


def _raising_pluggable(torch):
    """The allocator ``install`` uses: the shim's entry points, which raise
    ``torch.OutOfMemoryError``; libcupool's own (with a warning saying why) where the shim
    cannot be built (no C++ compiler, say)."""
    global _raising
    if _raising is None:
        try:
            path = _shim_path(torch)
        except Exception as e:  # noqa: BLE001 (any build failure falls back, with the reason)
            version = getattr(torch, "__version__", "of unknown version")
            warnings.warn(f"cupool: out-of-memory errors cannot be raised to PyTorch (building the C++ shim "
                          f"against torch {version} failed: {str(e).splitlines()[0] if str(e) else e!r}); "
                          "an allocation cupool cannot serve gives PyTorch a null pointer. Install a C++ "
                          "compiler and ninja, or pass raise_oom=False to silence this.", RuntimeWarning)
            return _pluggable()
        _raising = torch.cuda.memory.CUDAPluggableAllocator(
            path, "cupool_torch_oom_alloc", "cupool_torch_oom_free")
    return _raising


def install(pool=None, config=None, raise_oom=True, direct=None, **options):
    """Makes cupool the allocator of every CUDA tensor in this process. ``pool`` is vmm (the
    default), legacy, managed, torch, direct or nccl; ``options`` are ``cupool.OPTIONS``. If
    ``cupool.init`` already opened the library, pass no settings: its own are used. Raises a
    ``RuntimeError`` if PyTorch already allocated CUDA memory. With ``raise_oom`` (the default)
    an allocation cupool cannot serve raises ``torch.OutOfMemoryError`` (see the module text).
    With ``direct`` (the default with ``raise_oom``; ``CUPOOL_TORCH_DIRECT=off`` or
    ``direct=False`` declines it) tensors are served by cupool's own allocator class where it
    builds against this PyTorch, else through ``CUDAPluggableAllocator`` (``route()`` says
    which)."""
    torch = _torch()
    if torch.cuda.is_initialized() and (torch.cuda.memory_reserved() > 0
                                        or torch.cuda.memory_allocated() > 0):
        raise RuntimeError(
            "cupool.torch.install() must run before PyTorch allocates CUDA memory: "
            f"its own allocator already holds {torch.cuda.memory_reserved()} bytes. Call it "
            "first thing (before any CUDA tensor or model.to('cuda')), or use "
            "cupool.torch.mempool() to route part of the work through cupool.")
    cupool.ensure_open(pool, "vmm", config, install_options(config, options))
    global _route
    if direct is None:
        direct = os.environ.get("CUPOOL_TORCH_DIRECT", "on") != "off"
    if raise_oom and direct and _install_direct(torch):
        return
    try:
        torch.cuda.memory.change_current_allocator(_raising_pluggable(torch) if raise_oom else _pluggable())
        _route = "pluggable"
    except RuntimeError as e:
        raise RuntimeError(f"cupool.torch.install() came too late: PyTorch refused to swap its "
                           f"allocator ({e}). Call it before any CUDA work.") from e


# install()'s own defaults for a framework's tensors, each with the variable that overrides it.
INSTALL_DEFAULTS = (
    # The growth a KV cache's next copies need is made on a worker thread (Phi-3's prefill: the
    # Python thread's CPU time 1.28x ``expandable``'s without it, 1.08x with it, at the same
    # memory; docs/pytorch.md).
    ("vmm_ahead", "worker", "CUPOOL_VMM_AHEAD"),
    # Small and large tensors in one range: the pages of small tensors freed after the model's
    # build go to large blocks, where a range of their own kept them for the whole run (the
    # recorded MoE prefill: 16,444 MiB reserved with size classes, 16,418 without;
    # docs/pytorch.md, "One range for a framework's tensors").
    ("size_classes", "none", "CUPOOL_SIZE_CLASSES"),
)


def install_options(config, options):
    """``options`` with install's own defaults (``INSTALL_DEFAULTS``: ``vmm_ahead="worker"``,
    ``size_classes="none"``) where the library is not open yet and neither a keyword, its
    variable nor a configuration string sets them."""
    options = dict(options)
    if config is None and not cupool.is_initialized():
        for key, value, variable in INSTALL_DEFAULTS:
            if key not in options and not os.environ.get(variable):
                options[key] = value
    return options


def mempool(pool=None, config=None, **options):
    """A ``torch.cuda.MemPool`` whose memory comes from cupool. Use with
    ``torch.cuda.use_mem_pool(p)``. PyTorch caches on top and returns segments when it empties
    its cache (after an out-of-memory, too), so the default pool, ``direct``, caches nothing
    and gives each segment back to the driver at once; ``fallback_managed=True`` serves what
    the device cannot from managed memory."""
    torch = _torch()
    cupool.ensure_open(pool, "direct", config, dict(options))
    return torch.cuda.MemPool(_pluggable().allocator())


def _index(device):
    """A device ordinal from what ``torch.cuda`` functions take: None (the current device), an
    int, or a ``torch.device`` / string such as ``"cuda:1"``."""
    if device is None:
        import sys
        torch = sys.modules.get("torch")
        return torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized() else 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        index = int(device.split(":")[1]) if ":" in device else None
    else:
        index = getattr(device, "index", None)
    return _index(None) if index is None else index


def memory_stats(device=None):
    """``torch.cuda.memory_stats()`` for what cupool serves: an ordered dict of the keys that
    mean the same (``allocated_bytes.all.current``/``peak``, ``reserved_bytes.all.*``,
    ``active_bytes.all.*``, ``num_ooms``, ``num_alloc_retries``, ``num_device_alloc``, ...),
    sorted as PyTorch sorts them. Peaks restart only at ``reset_peak_memory_stats()``."""
    s = cupool.stats(_index(device))
    return collections.OrderedDict(sorted((k, v) for k, v in s.items() if not k.startswith("cupool.")))


def reset_peak_memory_stats(device=None):
    """Sets the peaks of ``memory_stats()`` to the current values, as ``torch.cuda``'s does."""
    cupool.reset_peaks(_index(device))


def memory_allocated(device=None):
    """Bytes cupool has handed to live tensors on ``device``."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    """The highest ``memory_allocated()`` since the last ``reset_peak_memory_stats()``."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    """Bytes cupool holds from the driver on ``device`` (live and cached)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    """The highest ``memory_reserved()`` since the last ``reset_peak_memory_stats()``."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def record_memory_history(enabled="all", context=None, stacks=None, max_entries=None, device=None,
                          clear_history=False):
    """``torch.cuda.memory._record_memory_history`` for what cupool serves (``cupool.history``):
    "all" (or True) keeps the last ``max_entries`` allocator events of each device (no bound when
    None, PyTorch's default), None (or False) stops and forgets them."""
    _history.record_memory_history(enabled, context, stacks, max_entries, device, clear_history)


def memory_snapshot(device=None):
    """``torch.cuda.memory._snapshot()`` for what cupool serves: a dict with ``segments`` (what
    cupool holds from the driver, tiled by blocks) and ``device_traces`` (the history), in
    PyTorch's format; every device unless ``device`` names one."""
    return _history.memory_snapshot(None if device is None else _index(device))


def dump_snapshot(filename="dump_snapshot.pickle", device=None):
    """``torch.cuda.memory._dump_snapshot``: ``memory_snapshot()`` pickled to ``filename``, for
    pytorch.org/memory_viz and ``python -m torch.cuda._memory_viz trace_plot|segment_plot``."""
    return _history.dump_snapshot(filename, None if device is None else _index(device))


def sleep(tags, offload=(), device=None):
    """``cupool.sleep`` for tensors: synchronizes the device (every queued kernel finishes),
    then releases the GPU memory of ``tags`` (tensors made inside ``with cupool.torch.tag(name):``)
    keeping every tensor's address; tags in ``offload`` are copied to page-locked host memory
    first and restored bit for bit by ``wake``. Made for ``install()`` (with a MemPool, PyTorch
    caches on top and could hand a sleeping block to a new tensor: allocate nothing in it while
    it sleeps); returns the bytes released."""
    return _sleep(tags, offload=offload, device=-1 if device is None else _index(device))


#: What ``register_mem_pool`` pinned, per pool: ``pool.id`` -> {"ranges": {address: (device, bytes)},
#: "backend": the NCCL backend it registered the pool with, or None}.
_registered_pools = {}


def _nccl_backend(group):
    """The NCCL backend (``ProcessGroupNCCL``) of ``group`` (the default group when None), or a
    ``RuntimeError`` that says what is missing."""
    torch = _torch()
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("register_mem_pool needs torch.distributed initialised with the NCCL backend "
                           "(dist.init_process_group('nccl', device_id=...)) first")
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(torch.device("cuda"))
    except Exception as e:  # noqa: BLE001 (the reason goes into the message)
        raise RuntimeError(f"the process group has no CUDA (NCCL) backend: {e}") from e
    for name in ("register_mem_pool", "deregister_mem_pool"):
        if not hasattr(backend, name):
            raise RuntimeError(f"{type(backend).__name__} has no {name} in torch {torch.__version__}: NCCL "
                               "registration of a MemPool needs a PyTorch whose ProcessGroupNCCL offers it")
    return backend


def _segments(pool):
    """(address, total_size, device) of every segment PyTorch holds in ``pool`` now."""
    try:
        snap = pool.snapshot(include_traces=False)
    except TypeError:  # a PyTorch whose MemPool.snapshot takes no argument
        snap = pool.snapshot()
    here = None
    out = []
    for s in snap:
        if "device" not in s and here is None:  # the pool's device: where it was made
            here = _torch().cuda.current_device()
        out.append((int(s["address"]), int(s["total_size"]), int(s.get("device", here))))
    return out


def register_mem_pool(pool, group=None):
    """Registers ``pool`` (a ``torch.cuda.MemPool``, best ``mempool(pool="nccl")``) with the NCCL
    communicator of ``group`` (the default process group when None) through
    ``ProcessGroupNCCL.register_mem_pool``, and pins every segment it holds with
    ``cupool.register``: until ``deregister_mem_pool``, cupool keeps that memory mapped at its
    address (a free of it by PyTorch is deferred, a sleep of the device is refused), since NCCL
    and its peers use it by address.

    The communicator must exist first: pass ``device_id`` to ``init_process_group`` (or run one
    collective). PyTorch's allocator hook registers with NCCL the segments the pool allocates
    later, but cupool does not see them: call this again after the pool grew to pin them (what
    is pinned already is left as it is; NCCL ignores a registration it has). NCCL's symmetric
    windows (``symm=True``) are not offered: they may use NVLink multicast. Returns the bytes
    this call pinned."""
    backend = _nccl_backend(group)
    entry = _registered_pools.setdefault(tuple(pool.id), {"ranges": {}, "backend": None})
    # Pin first: between NCCL's registration and the pin nothing may release the memory, and a
    # pin that fails leaves nothing registered with NCCL.
    pinned = []
    try:
        for address, size, device in _segments(pool):
            if address in entry["ranges"]:
                continue
            cupool.register(address, size, device=device)
            entry["ranges"][address] = (device, size)
            pinned.append(address)
        backend.register_mem_pool(pool)  # again: the new segments; NCCL ignores those it has
        entry["backend"] = backend
    except BaseException:
        for address in pinned:
            device, _ = entry["ranges"].pop(address)
            try:
                cupool.deregister(address, device=device)
            except cupool.CupoolError:
                pass
        if not entry["ranges"] and entry["backend"] is None:
            _registered_pools.pop(tuple(pool.id), None)
        raise
    return sum(entry["ranges"][a][1] for a in pinned)


def deregister_mem_pool(pool, group=None):
    """Undoes ``register_mem_pool``: deregisters ``pool`` from the NCCL communicator (PyTorch's
    ``ProcessGroupNCCL.deregister_mem_pool``), then unpins every range ``register_mem_pool``
    pinned, also those PyTorch freed meanwhile (cupool releases those now). Call it on every
    rank before the process group is destroyed. Returns the bytes unpinned."""
    _torch().cuda.synchronize()
    entry = _registered_pools.get(tuple(pool.id))
    if entry is None:
        raise ValueError("this MemPool was not registered through cupool.torch.register_mem_pool")
    # Before the record goes: a group without an NCCL backend raises with the pool still known.
    backend = entry["backend"] if group is None else _nccl_backend(group)
    _registered_pools.pop(tuple(pool.id), None)
    errors = []
    if backend is not None:
        try:
            backend.deregister_mem_pool(pool)
        except Exception as e:  # noqa: BLE001 (unpin all the same, then raise)
            errors.append(e)
    unpinned = 0
    for address, (device, size) in sorted(entry["ranges"].items()):
        try:
            cupool.deregister(address, device=device)
            unpinned += size
        except cupool.CupoolError as e:
            errors.append(e)
    if errors:
        raise errors[0]
    return unpinned


def pinned_bytes(pool):
    """Bytes of ``pool`` that ``register_mem_pool`` pinned and ``deregister_mem_pool`` has not
    released yet (0 for a pool never registered)."""
    entry = _registered_pools.get(tuple(pool.id))
    return sum(size for _, size in entry["ranges"].values()) if entry else 0
