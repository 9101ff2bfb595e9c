// PyTorch's CUDA allocator over libcupool, without the plug-in interface's bookkeeping.
//
// torch.cuda.memory.CUDAPluggableAllocator records every pointer it hands out in one
// unordered_map under one mutex, and looks it up again at every free: a node allocated, a
// lock taken and a hash probed twice per tensor, the same lock for every thread. It also hands
// a zero-byte request to the plug-in, whose non-null answer then makes each resize_ of an empty
// tensor copy zero bytes with a cudaMemcpyAsync (PyTorch's own allocator returns null there).
// This allocator keeps the plug-in class for everything else (raw_alloc, streams, pools, the
// statistics it refuses) and serves tensors itself: each DataPtr carries its size, device and
// stream in its own context, freed by its own deleter, and an empty tensor gets no memory.
//
// Built at cupool.torch.install() against the PyTorch in use, over the out-of-memory shim's
// entry points (torch_oom.cpp: they raise torch.OutOfMemoryError), given to it by address;
// where it cannot be built install() falls back to CUDAPluggableAllocator.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/version.h>

#include <cstddef>
#include <exception>
#include <memory>
#include <new>
#include <string>

// c10::Allocator::allocate lost its const in PyTorch 2.3.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define CUPOOL_ALLOCATE_CONST
#else
#define CUPOOL_ALLOCATE_CONST const
#endif

namespace {
using AllocFn = void* (*)(size_t, int, void*);
using FreeFn = void (*)(void*, size_t, int, void*);
// The out-of-memory shim's cupool_torch_oom_alloc and cupool_torch_oom_free.
AllocFn g_alloc = nullptr;
FreeFn g_free = nullptr;
std::string g_error;

// What a tensor's free must pass back: libcupool keeps one pool per device and stream.
struct Held {
  void* ptr;
  size_t size;
  void* stream;
  int device;
};

void release(void* ctx) {
  auto* held = static_cast<Held*>(ctx);
  g_free(held->ptr, held->size, held->device, held->stream);
  delete held;
}

using Pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

class Direct final : public Pluggable {
 public:
  Direct()
      : Pluggable(
            [](size_t size, int device, cudaStream_t stream) { return g_alloc(size, device, stream); },
            [](void* ptr, size_t size, int device, cudaStream_t stream) {
              g_free(ptr, size, device, stream);
            }) {}

  c10::DataPtr allocate(size_t size) CUPOOL_ALLOCATE_CONST override {
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    const c10::Device where(c10::DeviceType::CUDA, device);
    if (size == 0) {
      return c10::DataPtr(nullptr, where);
    }
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device);
    void* ptr = g_alloc(size, device, stream);  // raises torch.OutOfMemoryError
    Held* held = new (std::nothrow) Held{ptr, size, stream, device};
    if (held == nullptr) {
      g_free(ptr, size, device, stream);
      throw std::bad_alloc();
    }
    return {ptr, held, &release, where};
  }
};
}  // namespace

// Makes this allocator PyTorch's, over the shim's entry points. 0 on success, else 1 with the
// reason in cupool_torch_direct_error(). PyTorch refuses once it has allocated CUDA memory.
extern "C" int cupool_torch_direct_install(void* alloc, void* release_fn) {
  try {
    if (alloc == nullptr || release_fn == nullptr) {
      g_error = "cupool_torch_direct_install needs the out-of-memory shim's alloc and free";
      return 1;
    }
    g_alloc = reinterpret_cast<AllocFn>(alloc);
    g_free = reinterpret_cast<FreeFn>(release_fn);
    auto direct = std::make_shared<Direct>();
    direct->init(c10::cuda::device_count());
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(direct);
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
    return 1;
  }
}

extern "C" const char* cupool_torch_direct_error() {
  return g_error.c_str();
}
