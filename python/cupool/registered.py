"""Ranges registered with NCCL (or shared with peers by their physical memory): while registered,
cupool keeps their memory mapped at their address. A free of such a range is taken but done at
``deregister``; a sleep of the device is refused. ``cupool.torch.register_mem_pool`` registers
a ``MemPool``'s segments with NCCL and here in one call."""

import ctypes

from . import _lib
from ._lib import load


def _device(device):
    return 0 if device is None else int(device)


def register(ptr, size, device=None):
    """Keeps ``size`` bytes at ``ptr`` (memory cupool handed out on ``device``) mapped until
    ``deregister(ptr)``."""
    _lib.check(load().cupool_register(_device(device), ptr, size))


def deregister(ptr, device=None):
    """Ends the registration at ``ptr``; a free that came meanwhile is done now."""
    _lib.check(load().cupool_deregister(_device(device), ptr))


def registered_bytes(device=None):
    """Bytes registered on ``device``."""
    out = ctypes.c_size_t(0)
    _lib.check(load().cupool_registered_bytes(_device(device), ctypes.byref(out)))
    return out.value
