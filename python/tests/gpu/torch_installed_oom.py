"""What an out-of-memory looks like when cupool is installed as PyTorch's allocator."""
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
    print("no exception; data_ptr", t.data_ptr())
except torch.OutOfMemoryError as e:
    print("torch.OutOfMemoryError:", str(e).splitlines()[0])
except Exception as e:
    print("other exception:", type(e).__name__, str(e).splitlines()[0])
print("still usable:", float(x.sum()) == 1 << 20)
