"""The memory history and the memory snapshot, in PyTorch's format: what
``torch.cuda.memory._record_memory_history``, ``_snapshot`` and ``_dump_snapshot`` give for
PyTorch's own allocator, which cannot see a pluggable one such as cupool. ::

    cupool.torch.record_memory_history(max_entries=100_000)
    ...                                            # the work to look at
    cupool.torch.dump_snapshot("snapshot.pickle")  # open at pytorch.org/memory_viz, or:
    # python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o trace.html

The snapshot's segments are what cupool's pools hold from the driver (device allocations, or
mapped VMM memory, PyTorch's expandable segments), tiled by their blocks: the live ones
(``active_allocated``) and what lies free between them (``inactive``). Its ``device_traces``
are the history: allocations, frees, segments allocated, mapped, freed and unmapped, and
out-of-memory failures, each with address, size, stream and time. libcupool sees no Python
stack: an event's frames hold only the name ``cupool_alloc_named`` was given and the
``cupool.tag`` in force (empty otherwise). Nothing here imports torch.
"""

import ctypes
import pickle
import sys

from . import _lib
from ._lib import load

#: The most events the C API takes (``uint64_t``); PyTorch's default, ``sys.maxsize``, is below.
_MAX = (1 << 64) - 1


def record_memory_history(enabled="all", context=None, stacks=None, max_entries=sys.maxsize,
                          device=None, clear_history=False):
    """Turns the history on (``enabled`` "all" or True) or off (None or False), as
    ``torch.cuda.memory._record_memory_history``: while on, libcupool keeps the last
    ``max_entries`` events of each device (no bound by default or with None, as PyTorch's: pass
    one for a long run). Turned on again, it keeps what it has under the new bound (``clear_history=True``
    starts afresh); turned off, it forgets. "state" (PyTorch's live blocks only) turns the
    history off: the snapshot always holds the live blocks. ``context``, ``stacks`` and
    ``device`` are taken for PyTorch's signature and do nothing (there are no stacks to record;
    the history covers every device). Needs no ``cupool.init``."""
    del context, stacks, device
    if enabled is None or enabled is False or enabled == "state":
        _lib.check(load().cupool_memory_history(0, 0))
        return
    if enabled is not True and enabled != "all":
        raise ValueError(f"record_memory_history(enabled={enabled!r}): accepted are \"all\" or True (on), "
                         "None or False (off), and \"state\" (off: the snapshot always holds the live blocks)")
    if max_entries is None:
        max_entries = _MAX
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"max_entries={max_entries!r}: pass a whole number of events, 1 or more")
    lib = load()
    if clear_history:
        _lib.check(lib.cupool_memory_history(0, 0))
    _lib.check(lib.cupool_memory_history(1, min(max_entries, _MAX)))


def memory_snapshot(device=None):
    """The snapshot as a dict in the format of ``torch.cuda.memory._snapshot()``:
    ``{"segments": [...], "device_traces": [[...] per device]}``, every device's segments unless
    ``device`` (an ordinal) names one. ``device_traces`` holds a list per device either way, so
    its index is the device; a list is empty while the history is off. Raises ``CupoolError``
    if the library is not open or the device does not exist."""
    snap = _lib.snapshot_json(-1 if device is None else int(device))
    for seg in snap["segments"]:
        # A tuple in PyTorch's (JSON has none).
        seg["segment_pool_id"] = tuple(seg["segment_pool_id"])
    return snap


def dump_snapshot(filename="dump_snapshot.pickle", device=None):
    """Writes ``memory_snapshot(device)`` to ``filename`` as a pickle, as
    ``torch.cuda.memory._dump_snapshot`` does: the file opens at pytorch.org/memory_viz, and
    ``python -m torch.cuda._memory_viz trace_plot FILE -o out.html`` (or ``segment_plot``,
    ``stats``, ``trace``) reads it. Returns the snapshot."""
    snap = memory_snapshot(device)
    with open(filename, "wb") as f:
        pickle.dump(snap, f)
    return snap
