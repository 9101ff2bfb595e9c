"""Installing cupool after PyTorch allocated CUDA memory is refused with an error that says why."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool.torch  # noqa: E402
import torch  # noqa: E402

x = torch.ones(1024, device="cuda")
try:
    cupool.torch.install()
except RuntimeError as e:
    assert "before PyTorch allocates CUDA memory" in str(e), e
    print("refused:", str(e).splitlines()[0])
else:
    raise AssertionError("install() after a CUDA allocation was accepted")
assert float(x.sum()) == 1024
