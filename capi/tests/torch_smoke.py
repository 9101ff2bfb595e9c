"""libcupool as PyTorch's allocator on a GPU (CUDAPluggableAllocator + change_current_allocator):
tensors, matmul, SDPA, eight threads, and cupool's stats through ctypes.
Usage: python3 torch_smoke.py PATH/TO/libcupool.so"""
import ctypes, json, sys, threading
import torch

path = sys.argv[1]
alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "cupool_torch_alloc", "cupool_torch_free")
torch.cuda.memory.change_current_allocator(alloc)
lib = ctypes.CDLL(path)
lib.cupool_stats_json.restype = ctypes.c_size_t
lib.cupool_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
lib.cupool_last_error.restype = ctypes.c_char_p

def stats():
    n = lib.cupool_stats_json(0, None, 0)
    assert n > 0, lib.cupool_last_error()
    buf = ctypes.create_string_buffer(n + 1)
    lib.cupool_stats_json(0, buf, n + 1)
    return json.loads(buf.value)

x = torch.randn(4096, 4096, device="cuda")
y = x @ x
ref = (x.double() @ x.double()).float()
assert torch.allclose(y, ref, rtol=1e-3, atol=1e-2)
q = torch.randn(2, 8, 2048, 64, device="cuda", dtype=torch.float16)
o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
torch.cuda.synchronize()
s = stats()
live = s["allocated_bytes.all.current"]
assert live >= 3 * 4096 * 4096 * 4, s
print("during:", {k: s[k] for k in ("allocated_bytes.all.current", "reserved_bytes.all.current", "allocation.all.allocated")})
del x, y, ref, q, o
torch.cuda.synchronize()

errors = []
def work(t):
    try:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for i in range(200):
                a = torch.full((1000 + 37 * i + t,), float(t), device="cuda")
                b = a * 2
                assert float(b.sum()) == 2.0 * t * a.numel()
        s.synchronize()
    except Exception as e:  # reported below
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
assert not errors, errors
torch.cuda.synchronize()
s = stats()
print("after:", {k: s[k] for k in ("allocated_bytes.all.current", "reserved_bytes.all.current", "allocation.all.allocated", "allocation.all.freed", "cupool.pools")})
assert s["allocated_bytes.all.current"] < live, s
assert s["cupool.pools"] >= 2, s
print("torch smoke: ok")
