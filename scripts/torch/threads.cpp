// Alloc + free pairs of one size from N threads at once on one shared stream, for PyTorch's
// caching allocator, cudaMallocAsync and libcupool's C API (the pointers PyTorch's plug-in
// calls), in one process. Built by scripts/torch/threads.py against the installed PyTorch.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace {
using AllocFn = void* (*)(size_t, int, void*);
using FreeFn = void (*)(void*, size_t, int, void*);

// Runs `pair` `iters` times on each of `threads` threads started together; returns the wall
// time over iters, in nanoseconds: each thread's pair time while all run at once.
template <typename F>
double timed(int threads, long iters, F pair) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      cudaSetDevice(0);
      ready.fetch_add(1);
      while (!go.load()) {
      }
      for (long i = 0; i < iters; ++i) pair();
    });
  }
  while (ready.load() < threads) {
  }
  auto t0 = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& t : ts) t.join();
  auto dt = std::chrono::steady_clock::now() - t0;
  return std::chrono::duration<double, std::nano>(dt).count() / static_cast<double>(iters);
}
}  // namespace

// which: 0 PyTorch's caching allocator, 1 cudaMallocAsync, 2 libcupool (alloc/free given).
extern "C" double cupool_bench_pairs(int which, int threads, long iters, size_t size, void* alloc,
                                     void* release) {
  cudaSetDevice(0);
  static c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  cudaStream_t s = stream.stream();
  auto* a = reinterpret_cast<AllocFn>(alloc);
  auto* f = reinterpret_cast<FreeFn>(release);
  auto run = [&] {
    switch (which) {
      case 0:
        return timed(threads, iters, [&] {
          void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(size, s);
          c10::cuda::CUDACachingAllocator::raw_delete(p);
        });
      case 1:
        return timed(threads, iters, [&] {
          void* p = nullptr;
          cudaMallocAsync(&p, size, s);
          cudaFreeAsync(p, s);
        });
      default:
        return timed(threads, iters, [&] {
          void* p = a(size, 0, s);
          f(p, size, 0, s);
        });
    }
  };
  run();  // warm-up: pools filled, threads' caches made
  double ns = run();
  cudaStreamSynchronize(s);
  return ns;
}
