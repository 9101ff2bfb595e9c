// cupool inside ggml-cuda: a ggml_cuda_pool over libcupool's C API.
//
// Compiled into ggml-cuda (copy this file and ggml-cupool.cu into ggml-cuda/, then apply the
// patch for the engine; docs/llama-cpp.md). With GGML_POOL unset nothing changes: ggml keeps its
// own pools and libcupool is never loaded. With GGML_POOL=vmm|legacy|managed|torch|direct every
// pool of every device and stream goes through libcupool, found at CUPOOL_LIB, beside the
// executable, beside the library holding ggml-cuda, or on the loader's path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

struct ggml_cuda_pool;

// Whether GGML_POOL selects cupool (set and not empty); read once.
bool ggml_cupool_enabled();

// Loads and opens libcupool when enabled (at backend start-up, so that a bad setting stops the
// program before any work): a missing library lists the paths tried, a bad GGML_POOL or
// CUPOOL_* value prints cupool's message; both abort. Starts recording to CUPOOL_TRACE if set.
void ggml_cupool_startup();

// The pool of `device` x `stream_no`, through libcupool.
std::unique_ptr<ggml_cuda_pool> ggml_cupool_new_pool(int device, int stream_no);

// The end of a prefill ubatch: every pool applies CUPOOL_PURGE (never | always | auto) after a
// synchronize. Returns the bytes given back to the driver.
size_t ggml_cupool_ubatch_end();

// Whether memory of `device`'s pools went back to the driver since `*seen` was last updated (a
// ubatch boundary, a trim before an out-of-memory retry, a pool without a cache); updates it.
// CUDA graphs captured before then may hold freed pool addresses: they must be recaptured
// before they are replayed. Always false when GGML_POOL is unset.
bool ggml_cupool_graphs_stale(int device, uint64_t * seen);

// Names this thread's pool allocations in a recording while in scope (the innermost wins).
struct ggml_cupool_label {
    explicit ggml_cupool_label(const char * name);
    ~ggml_cupool_label();
    ggml_cupool_label(const ggml_cupool_label &) = delete;
    ggml_cupool_label & operator=(const ggml_cupool_label &) = delete;

  private:
    const char * prev;
};

#define GGML_CUPOOL_CAT2(a, b) a##b
#define GGML_CUPOOL_CAT(a, b)  GGML_CUPOOL_CAT2(a, b)
#define GGML_CUPOOL_LABEL(name) ggml_cupool_label GGML_CUPOOL_CAT(ggml_cupool_label_, __LINE__)(name)
