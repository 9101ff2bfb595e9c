// A recorded PyTorch allocation stream replayed on one thread, paced as the prefill ran it, with
// kernel launches in between: what the allocator costs the thread that runs the model.
//
// A real prefill's time on this machine varies by tens of percent between identical runs (the
// Python thread's speed), far more than the allocator's share of it, so a comparison of two
// allocators' prefill times cannot resolve a 2% goal. This replay keeps the one thread's work
// that depends on the allocator (its allocation and free calls, and the kernel launches a worker
// thread's driver calls may slow down) and drops the rest, so two allocators can alternate in one
// process, round after round, on the same stream of requests.
//
// Built by trace_cost.py with PyTorch's extension tooling (a C++ compiler, no nvcc): the
// launches are an empty kernel loaded from PTX through the driver API.
#include <c10/cuda/CUDACachingAllocator.h>
#include <dlfcn.h>
#include <torch/extension.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
using AllocFn = void* (*)(size_t, int, void*);
using FreeFn = void (*)(void*, size_t, int, void*);

// The driver entry points the launches need, looked up once (no link-time libcuda).
using CuModuleLoadData = int (*)(void**, const void*);
using CuModuleGetFunction = int (*)(void**, void*, const char*);
using CuLaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, void*, void**, void**);

const char* kNoopPtx =
    ".version 6.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry cupool_noop()\n{\n  ret;\n}\n";

struct Launcher {
  CuLaunchKernel launch = nullptr;
  void* function = nullptr;

  Launcher() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw std::runtime_error("libcuda.so.1 not found: the replay launches kernels");
    auto load = reinterpret_cast<CuModuleLoadData>(dlsym(lib, "cuModuleLoadData"));
    auto get = reinterpret_cast<CuModuleGetFunction>(dlsym(lib, "cuModuleGetFunction"));
    launch = reinterpret_cast<CuLaunchKernel>(dlsym(lib, "cuLaunchKernel"));
    if (!load || !get || !launch) throw std::runtime_error("libcuda lacks the module entry points");
    void* module = nullptr;
    // The caller made PyTorch's context current (a CUDA tensor exists before the replay).
    if (load(&module, kNoopPtx) != 0) throw std::runtime_error("cuModuleLoadData failed");
    if (get(&function, module, "cupool_noop") != 0)
      throw std::runtime_error("cuModuleGetFunction failed");
  }

  void operator()() const {
    if (launch(function, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) != 0)
      throw std::runtime_error("cuLaunchKernel failed");
  }
};

// One allocator's replay of one part of a trace: kinds[i] is 0 for an allocation of sizes[i]
// bytes into slots[i], 1 for the free of slots[i]'s block.
class Replayer {
 public:
  Replayer(std::vector<int64_t> kinds, std::vector<int64_t> slots, std::vector<int64_t> sizes,
           int64_t nslots, int64_t alloc_fn, int64_t free_fn)
      : kinds_(std::move(kinds)),
        slots_(std::move(slots)),
        sizes_(std::move(sizes)),
        ptrs_(nslots, nullptr),
        bytes_(nslots, 0),
        alloc_(reinterpret_cast<AllocFn>(alloc_fn)),
        free_(reinterpret_cast<FreeFn>(free_fn)) {
    if (kinds_.size() != slots_.size() || kinds_.size() != sizes_.size())
      throw std::invalid_argument("kinds, slots and sizes must have one entry per event");
    for (auto s : slots_)
      if (s < 0 || s >= nslots) throw std::invalid_argument("a slot lies outside 0..nslots");
  }

  // Runs every event once, event i no earlier than i * pace_ns after the start, and `launches`
  // kernel launches spread evenly between the events. Times each call on its own.
  py::dict run(int64_t pace_ns, int64_t launches) {
    static Launcher launcher;
    int64_t alloc_ns = 0, free_ns = 0, launch_ns = 0, allocs = 0, frees = 0, launched = 0;
    const auto n = static_cast<int64_t>(kinds_.size());
    const auto start = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      const auto due = start + std::chrono::nanoseconds(i * pace_ns);
      while (Clock::now() < due) {
      }
      const auto slot = slots_[i];
      auto t = Clock::now();
      if (kinds_[i] == 0) {
        if (ptrs_[slot])
          throw std::logic_error("event " + std::to_string(i) + " allocates into slot " +
                                 std::to_string(slot) + ", which holds a live block");
        void* p = call_alloc(sizes_[i]);
        alloc_ns += since(t);
        if (!p) throw std::runtime_error("allocation " + std::to_string(i) + " of " +
                                         std::to_string(sizes_[i]) + " bytes failed");
        ptrs_[slot] = p;
        bytes_[slot] = sizes_[i];
        ++allocs;
      } else if (ptrs_[slot]) {
        call_free(slot);
        free_ns += since(t);
        ++frees;
      }
      for (auto k = (i + 1) * launches / n - i * launches / n; k > 0; --k) {
        t = Clock::now();
        launcher();
        launch_ns += since(t);
        ++launched;
      }
    }
    py::dict out;
    out["wall_ns"] = since(start);
    out["alloc_ns"] = alloc_ns;
    out["free_ns"] = free_ns;
    out["launch_ns"] = launch_ns;
    out["allocs"] = allocs;
    out["frees"] = frees;
    out["launches"] = launched;
    return out;
  }

  // Frees what the last run left live (a prefill's cache), untimed.
  int64_t free_all() {
    int64_t n = 0;
    for (size_t s = 0; s < ptrs_.size(); ++s)
      if (ptrs_[s]) {
        call_free(static_cast<int64_t>(s));
        ++n;
      }
    return n;
  }

 private:
  static int64_t since(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
  }

  // PyTorch's allocator as its tensors reach it (raw_alloc: the same malloc and free as a
  // tensor's), or libcupool's PyTorch entry points, on the legacy default stream.
  void* call_alloc(int64_t size) {
    if (alloc_) return alloc_(static_cast<size_t>(size), 0, nullptr);
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(static_cast<size_t>(size),
                                                                  nullptr);
  }

  void call_free(int64_t slot) {
    if (free_)
      free_(ptrs_[slot], static_cast<size_t>(bytes_[slot]), 0, nullptr);
    else
      c10::cuda::CUDACachingAllocator::raw_delete(ptrs_[slot]);
    ptrs_[slot] = nullptr;
  }

  std::vector<int64_t> kinds_, slots_, sizes_;
  std::vector<void*> ptrs_;
  std::vector<int64_t> bytes_;
  AllocFn alloc_;
  FreeFn free_;
};
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Replayer>(m, "Replayer")
      .def(py::init<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, int64_t,
                    int64_t, int64_t>())
      .def("run", &Replayer::run)
      .def("free_all", &Replayer::free_all);
}
