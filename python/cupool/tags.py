"""Tags, sleep and wake: free the GPU memory of a whole part of a program between phases and
bring it back at the same addresses.

Allocations made inside ``with cupool.tag("weights"):`` (on this thread) lie in pools of their
own. ``cupool.sleep(["weights", "kv_cache"], offload=["weights"])`` synchronizes the device and
gives the physical memory of those tags back to the driver, every tensor keeping its address;
offloaded tags are copied to page-locked host memory first. ``cupool.wake()`` maps new memory at
the same addresses and copies the offloaded bytes back: tensors that were offloaded hold exactly
what they held, the others hold garbage until written (a KV cache is refilled anyway). While a
tag sleeps, allocating under it raises; freeing its tensors is fine. Work queued after
``sleep`` must not touch the sleeping memory until ``wake``. Only the vmm pool (the default)
sleeps.
"""

import contextlib
import ctypes

from . import _lib
from ._lib import load


def current_tag():
    """The tag of this thread's allocations ("" for none)."""
    return load().cupool_tag().decode()


@contextlib.contextmanager
def tag(name):
    """Allocations on this thread inside the block are tagged ``name`` (None or "": untagged);
    the previous tag comes back after it."""
    previous = current_tag()
    _lib.check(load().cupool_set_tag(None if not name else str(name).encode()))
    try:
        yield
    finally:
        _lib.check(load().cupool_set_tag(previous.encode() if previous else None))


def _tags(tags):
    if tags is None or isinstance(tags, str):
        return [tags or ""]
    return [t or "" for t in tags]


def sleep(tags, offload=(), device=-1):
    """Puts ``tags`` (a name or a list; "" or None: untagged memory) to sleep on ``device``
    (every device when -1); the tags also in ``offload`` are copied to page-locked host memory
    first. Returns the bytes released. A tag never used raises ``CupoolError`` naming those
    that were."""
    offload = set(_tags(offload)) if offload else set()
    unknown = offload - set(_tags(tags))
    if unknown:
        raise ValueError(f"offload names {sorted(unknown)}, which are not among the tags to sleep {_tags(tags)}")
    total = 0
    for t in _tags(tags):
        out = ctypes.c_size_t(0)
        _lib.check(load().cupool_sleep(device, t.encode(), 1 if t in offload else 0, ctypes.byref(out)))
        total += out.value
    return total


def wake(tags, device=-1):
    """Wakes ``tags`` (a name or a list) on ``device`` (every device when -1): new memory at
    every address, offloaded bytes restored. Returns the bytes mapped again."""
    total = 0
    for t in _tags(tags):
        out = ctypes.c_size_t(0)
        _lib.check(load().cupool_wake(device, t.encode(), ctypes.byref(out)))
        total += out.value
    return total


def asleep_bytes(tag_name, device=-1):
    """Bytes of ``tag_name``'s memory asleep now on ``device`` (every device when -1)."""
    out = ctypes.c_size_t(0)
    _lib.check(load().cupool_asleep_bytes(device, (tag_name or "").encode(), ctypes.byref(out)))
    return out.value
