"""An out-of-memory with cupool installed as PyTorch's allocator: the user catches
torch.OutOfMemoryError (torch.cuda.OutOfMemoryError) with cupool's report in its message, and
the process goes on computing."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool  # noqa: E402
import cupool.torch  # noqa: E402
import torch  # noqa: E402

cupool.torch.install(pool=os.environ.get("POOL", "vmm"))
x = torch.ones(1 << 20, device="cuda")
free, total = torch.cuda.mem_get_info()
try:
    t = torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    raise SystemExit(f"no exception: PyTorch got a tensor at {t.data_ptr():#x}")
except torch.cuda.OutOfMemoryError as e:
    text = str(e)
    print("torch.OutOfMemoryError:", text.splitlines()[0][:300])
    assert "cupool" in text and "out of device memory" in text, text
    assert f"({total * 2} bytes)" in text, text
assert cupool.torch.memory_stats()["num_ooms"] >= 1
y = torch.ones(1 << 20, device="cuda") + x
assert float(y.sum()) == 2 * (1 << 20)
print("installed-route out-of-memory: ok")
