"""The shared library through ctypes, on a simulated card: PyTorch's entry points, stats,
errors. Usage: python3 smoke.py PATH/TO/libcupool.so"""
import ctypes, json, sys

lib = ctypes.CDLL(sys.argv[1])
lib.cupool_last_error.restype = ctypes.c_char_p
lib.cupool_torch_alloc.restype = ctypes.c_void_p
lib.cupool_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.cupool_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.cupool_stats_json.restype = ctypes.c_size_t
lib.cupool_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
lib.cupool_init.argtypes = [ctypes.c_char_p]

def stats():
    n = lib.cupool_stats_json(-1, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.cupool_stats_json(-1, buf, n + 1)
    return json.loads(buf.value)

assert lib.cupool_init(b"CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 GGML_POOL=vmm") == 0, lib.cupool_last_error()
ptrs = [(lib.cupool_torch_alloc(s, 0, None), s) for s in (512, 1 << 20, 3 << 20)]
assert all(p for p, _ in ptrs), lib.cupool_last_error()
assert stats()["allocated_bytes.all.current"] == 512 + (1 << 20) + (3 << 20)
for p, s in ptrs:
    lib.cupool_torch_free(p, s, 0, None)
    assert lib.cupool_last_error() == b"", lib.cupool_last_error()
lib.cupool_torch_free(ptrs[0][0], 512, 0, None)
assert b"freed already" in lib.cupool_last_error(), lib.cupool_last_error()
s = stats()
assert s["allocated_bytes.all.current"] == 0 and s["allocation.all.freed"] == 3, s
assert lib.cupool_shutdown() == 0
print("python ctypes smoke: ok", s)
