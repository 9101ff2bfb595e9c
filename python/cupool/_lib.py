"""Finding and loading libcupool, and the C functions' signatures.

Nothing here imports torch or cupy. Where the ``CUPOOL_LIB`` environment variable is set (the
file, or a folder holding it), that library is the only one tried; otherwise the library is
looked for beside this package (where ``pip install`` bundles it), then in the
``target/release`` folder of a source checkout this package sits in.
"""

import ctypes
import json
import os
import sys
import threading

LIB_NAME = {"darwin": "libcupool.dylib", "win32": "cupool.dll"}.get(sys.platform, "libcupool.so")

#: The C API version this package speaks (``cupool_api_version``).
API_VERSION = 1

# Status codes of ``enum cupool_status``.
OK, INVALID_ARGUMENT, OUT_OF_MEMORY, NOT_INITIALIZED, UNKNOWN_POINTER, SIZE_MISMATCH, DRIVER, INTERNAL = range(8)
STATUS_NAMES = ("ok", "invalid argument", "out of memory", "not initialized", "unknown pointer",
                "size mismatch", "driver error", "internal error")


class CupoolError(RuntimeError):
    """A libcupool call failed; ``status`` is its code, the message is the library's text."""

    def __init__(self, status, text):
        name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else f"status {status}"
        super().__init__(f"cupool: {name}: {text}")
        self.status = status
        self.text = text


class LibraryNotFound(CupoolError, ImportError):
    """libcupool could not be found or loaded; the message names every path tried."""

    def __init__(self, tried):
        lines = "\n".join(f"  {p}: {why}" for p, why in tried)
        text = (f"{LIB_NAME} not found or not loadable. Tried:\n{lines}\n"
                "Build it with `cargo build --release -p cupool-capi`, then set CUPOOL_LIB to the "
                "file (or its folder), or copy it beside the cupool package.")
        CupoolError.__init__(self, INTERNAL, text)
        self.tried = tried


def candidates():
    """The paths tried, in order, as (path, where it came from)."""
    out = []
    env = os.environ.get("CUPOOL_LIB")
    if env:
        out.append(os.path.join(env, LIB_NAME) if os.path.isdir(env) else env)
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(os.path.join(here, LIB_NAME))
    checkout = os.path.dirname(os.path.dirname(here))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(checkout, "target"))
    out.append(os.path.join(target, "release", LIB_NAME))
    return out


_P = ctypes.c_void_p
_SIGNATURES = {
    "cupool_api_version": (ctypes.c_uint32, []),
    "cupool_init": (ctypes.c_int, [ctypes.c_char_p]),
    "cupool_shutdown": (ctypes.c_int, []),
    "cupool_device_count": (ctypes.c_int32, []),
    "cupool_alloc": (_P, [ctypes.c_int32, ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "cupool_alloc_named": (_P, [ctypes.c_int32, ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                ctypes.c_char_p]),
    "cupool_ubatch_end": (ctypes.c_int, [ctypes.c_int32, ctypes.POINTER(ctypes.c_size_t)]),
    "cupool_free": (ctypes.c_int, [ctypes.c_int32, ctypes.c_uint64, _P, ctypes.c_size_t]),
    "cupool_purge": (ctypes.c_int, [ctypes.c_int32, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "cupool_trim": (ctypes.c_int, [ctypes.c_int32, ctypes.POINTER(ctypes.c_size_t)]),
    "cupool_reset_peaks": (ctypes.c_int, [ctypes.c_int32]),
    "cupool_stats_json": (ctypes.c_size_t, [ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]),
    "cupool_memory_history": (ctypes.c_int, [ctypes.c_int32, ctypes.c_uint64]),
    "cupool_memory_snapshot_json": (ctypes.c_size_t, [ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]),
    "cupool_last_error": (ctypes.c_char_p, []),
    "cupool_record_start": (ctypes.c_int, [ctypes.c_char_p]),
    "cupool_record_stop": (ctypes.c_int, [ctypes.POINTER(ctypes.c_uint64)]),
    "cupool_phase_begin": (ctypes.c_int, [ctypes.c_char_p]),
    "cupool_phase_end": (ctypes.c_int, [ctypes.c_int32]),
    "cupool_set_tag": (ctypes.c_int, [ctypes.c_char_p]),
    "cupool_tag": (ctypes.c_char_p, []),
    "cupool_sleep": (ctypes.c_int, [ctypes.c_int32, ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_size_t)]),
    "cupool_wake": (ctypes.c_int, [ctypes.c_int32, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]),
    "cupool_asleep_bytes": (ctypes.c_int, [ctypes.c_int32, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]),
    "cupool_register": (ctypes.c_int, [ctypes.c_int32, _P, ctypes.c_size_t]),
    "cupool_deregister": (ctypes.c_int, [ctypes.c_int32, _P]),
    "cupool_registered_bytes": (ctypes.c_int, [ctypes.c_int32, ctypes.POINTER(ctypes.c_size_t)]),
    "cupool_torch_alloc": (_P, [ctypes.c_size_t, ctypes.c_int, _P]),
    "cupool_torch_free": (None, [_P, ctypes.c_size_t, ctypes.c_int, _P]),
}

_lock = threading.Lock()
_loaded = None


def load():
    """The loaded library (a ``ctypes.CDLL``), loaded on the first call."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        tried = []
        paths = candidates()
        if os.environ.get("CUPOOL_LIB"):
            # An explicit choice: that library or an error, never a silent fallback to another.
            paths = paths[:1]
        for path in paths:
            if not os.path.exists(path):
                tried.append((path, "no such file"))
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append((path, f"could not be loaded ({e})"))
                continue
            missing = [n for n in _SIGNATURES if not hasattr(lib, n)]
            if missing:
                tried.append((path, f"lacks {', '.join(missing)} (an older build?)"))
                continue
            for name, (res, args) in _SIGNATURES.items():
                f = getattr(lib, name)
                f.restype, f.argtypes = res, args
            version = lib.cupool_api_version()
            if version != API_VERSION:
                tried.append((path, f"speaks C API version {version}, this package {API_VERSION}"))
                continue
            lib.path = path
            _loaded = lib
            return lib
        raise LibraryNotFound(tried)


def last_error():
    """This thread's last error text from the library."""
    return load().cupool_last_error().decode("utf-8", "replace")


def check(status):
    """Raises ``CupoolError`` for a failed call's status."""
    if status != OK:
        raise CupoolError(status, last_error())


def encode(config):
    """A configuration as the C API's ``NAME=VALUE`` string: a string passes through, a dict is
    joined (``True`` becomes 1)."""
    if config is None or isinstance(config, str):
        return None if config is None else config.encode()
    parts = []
    for k, v in config.items():
        v = 1 if v is True else 0 if v is False else v
        if any(c.isspace() for c in f"{k}{v}"):
            raise ValueError(f"configuration {k}={v!r}: names and values cannot hold spaces")
        parts.append(f"{k}={v}")
    return " ".join(parts).encode()


def _grown_json(call, device):
    """What ``call`` (a ``cupool_*_json(device, buf, cap)`` entry point) writes, as a dict. The
    text may grow between asking its size and fetching it (another thread allocates, or a driver
    call timed for the first time adds a key): a truncated one is fetched again, larger."""
    n = call(device, None, 0)
    while True:
        if n == 0:
            text = last_error()
            raise CupoolError(NOT_INITIALIZED if "cupool_init" in text else INVALID_ARGUMENT, text)
        cap = n + n // 8 + 4096
        buf = ctypes.create_string_buffer(cap)
        m = call(device, buf, cap)
        if 0 < m < cap:
            return json.loads(buf.raw[:m])
        n = m


def stats_json(device):
    """``cupool_stats_json`` as a dict."""
    return _grown_json(load().cupool_stats_json, device)


def snapshot_json(device):
    """``cupool_memory_snapshot_json`` as a dict."""
    return _grown_json(load().cupool_memory_snapshot_json, device)
