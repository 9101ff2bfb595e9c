"""Whether cupool's own PyTorch allocator class (python/cupool/torch_direct.cpp) builds and
installs against this PyTorch: installs cupool with the compiler's output shown, then prints
the route install() took and what an empty tensor and a resized one get.

    CUPOOL_LIB=... python3 scripts/torch/direct-check.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

import cupool  # noqa: E402
import cupool.torch  # noqa: E402

_load = cpp_extension.load
cpp_extension.load = lambda *a, **k: _load(*a, **{**k, "verbose": True})  # show the compiler
cupool.torch.install()
print(f"route: {cupool.torch.route()} (torch {torch.__version__}); not direct because: {cupool.torch.direct_error}")
e = torch.empty(0, device="cuda")
print(f"empty tensor at {e.data_ptr():#x}")
e.resize_(1 << 20).fill_(1.0)
print(f"resized to 4 MiB at {e.data_ptr():#x}, sum {float(e.sum()):.0f}")
sys.exit(0 if cupool.torch.route() == "direct" else 3)
