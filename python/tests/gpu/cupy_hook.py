"""cupool as CuPy's allocator: arrays, a matmul, frees, and an out-of-memory as CuPy's error."""
import gc
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool  # noqa: E402
import cupool.cupy  # noqa: E402
import cupy  # noqa: E402

cupool.cupy.install(pool=os.environ.get("POOL", "vmm"))
a = cupy.random.rand(2048, 2048, dtype=cupy.float32)
b = a @ a
ref = cupy.asnumpy(a).astype("float64") @ cupy.asnumpy(a).astype("float64")
assert abs(cupy.asnumpy(b) - ref).max() < 1e-2
s = cupool.stats(0)
assert s["allocated_bytes.all.current"] >= 2 * 2048 * 2048 * 4, s
with cupy.cuda.Stream():
    c = cupy.arange(1 << 20) * 2
    assert int(c[-1]) == 2 * ((1 << 20) - 1)
    del c
del a, b
gc.collect()
cupy.cuda.Device().synchronize()
s = cupool.stats(-1)
assert s["allocated_bytes.all.current"] == 0 and s["allocation.all.freed"] == s["allocation.all.allocated"], s
free, total = cupy.cuda.runtime.memGetInfo()
try:
    cupy.empty(total * 2, dtype=cupy.uint8)
except cupy.cuda.memory.OutOfMemoryError as e:
    print("cupy OutOfMemoryError:", e)
else:
    raise AssertionError("no out-of-memory error")
print("cupy hook: ok")
