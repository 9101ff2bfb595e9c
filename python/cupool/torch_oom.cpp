// PyTorch's allocator entry points over libcupool's, raising PyTorch's out-of-memory error.
//
// CUDAPluggableAllocator does not check the pointer its allocation function returns: a null
// from libcupool would become a tensor at address 0. Thrown from here instead, the error is
// c10::OutOfMemoryError, which PyTorch turns into torch.OutOfMemoryError in Python, with
// cupool's report (what was asked, what the pool and the device hold) as its message. Built at
// the first cupool.torch.install() against the PyTorch in use (C++ exceptions and c10's types
// must match that build), cached, and given libcupool's functions by address.
#include <c10/util/Exception.h>

#include <cstddef>

namespace {
using AllocFn = void* (*)(size_t, int, void*);
using FreeFn = void (*)(void*, size_t, int, void*);
using ErrorFn = const char* (*)();
// libcupool's cupool_torch_alloc, cupool_torch_free and cupool_last_error.
AllocFn g_alloc = nullptr;
FreeFn g_free = nullptr;
ErrorFn g_error = nullptr;
}  // namespace

extern "C" int cupool_torch_oom_bind(void* alloc, void* release, void* error) {
  if (alloc == nullptr || release == nullptr || error == nullptr) {
    return 1;
  }
  g_alloc = reinterpret_cast<AllocFn>(alloc);
  g_free = reinterpret_cast<FreeFn>(release);
  g_error = reinterpret_cast<ErrorFn>(error);
  return 0;
}

extern "C" void* cupool_torch_oom_alloc(size_t size, int device, void* stream) {
  TORCH_CHECK(g_alloc != nullptr, "cupool's PyTorch shim is not bound to libcupool");
  void* p = g_alloc(size, device, stream);
  if (p == nullptr && size > 0) {
    const char* why = g_error();
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory in cupool: ", why);
  }
  return p;
}

extern "C" void cupool_torch_oom_free(void* ptr, size_t size, int device, void* stream) {
  if (g_free != nullptr) {
    g_free(ptr, size, device, stream);
  }
}
