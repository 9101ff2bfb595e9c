// cupool inside ggml-cuda: a ggml_cuda_pool over libcupool's C API.
//
// Compiled into ggml-cuda (copy this file and ggml-cupool.cu into ggml-cuda/, then apply the
// patch for the engine; docs/llama-cpp.md). With GGML_POOL unset nothing changes: ggml keeps its
// own pools and libcupool is never loaded. With GGML_POOL=vmm|legacy|managed|torch|direct|nccl every
// pool of every device and stream goes through libcupool, found at CUPOOL_LIB, beside the
// executable, beside the library holding ggml-cuda, or on the loader's path.
//
// Environment (generated from cupool's settings table, pool/src/settings/table.rs, by its tests):
//   GGML_POOL=vmm|legacy|managed|torch|direct|nccl: the pool kind: torch is PyTorch's caching
//       policy (to replay traces), direct caches nothing (under a caching layer), nccl caches
//       nothing and makes each request one VMM allocation NCCL can register (under a MemPool
//       registered with NCCL). Unset: ggml's own pools, also when empty: libcupool is not loaded.
//   GGML_CUDA_NO_VMM=1|0|true|false|yes|no|on|off: never choose VMM automatically (ggml's name).
//       Unset: off.
//   GGML_CUDA_POOL_USE_MANAGED=1|0|true|false|yes|no|on|off: same as GGML_POOL=managed (ggml's
//       name). Unset: off.
//   GGML_CUDA_ALLOC_FALLBACK_MANAGED=1|0|true|false|yes|no|on|off: on device OOM, serve that
//       allocation from managed memory (tagged, counted, warned). Unset: off.
//   CUPOOL_ALLOW_OVERSUBSCRIPTION=1|0|true|false|yes|no|on|off: let managed memory exceed the
//       device's free memory (can hang the GPU: opt in knowingly). Unset: off.
//   CUPOOL_SIZE_CLASSES (byte bounds B1,B2,... strictly ascending, or none): a pool of its own per
//       range of request sizes: up to B1 bytes, up to B2, ..., above. Unset: 1048576 for vmm (and
//       an unset GGML_POOL), else none.
//   CUPOOL_VMM_ROUND_LARGE (a power of two from 128 to 1073741824 (bytes)): the VMM pool rounds
//       requests above 1 MiB up to this power of two. Unset: 2097152 (the 2 MiB granule, for a
//       framework's traffic).
//   CUPOOL_VMM_RECYCLE=1|0|true|false|yes|no|on|off: the VMM pool moves the free pages of its holes
//       to where it must grow instead of mapping new memory (a page stays mapped at its old place
//       too until a later synchronize, so a move never waits for the device): the least footprint
//       for out-of-order frees, at the cost of driver calls when it grows. Unset: off (ggml frees
//       in stack order, and a CUDA graph capture may not be synchronized).
//   CUPOOL_VMM_RECYCLE_PAGE (a number of MiB from 1 to 1024): with CUPOOL_VMM_RECYCLE on: the size
//       of the pages the VMM pool creates memory in (rounded up to the granularity), the unit a
//       page moves in; larger pages mean fewer driver calls per byte, smaller ones that fewer pages
//       straddle a hole's edge and stay behind free space. Unset: 8.
//   CUPOOL_VMM_RECYCLE_FREE (a percent from 0 to 100): with CUPOOL_VMM_RECYCLE on: the percent of
//       the VMM pool's memory that may lie free in its holes before it moves free pages to a block
//       that needs memory instead of creating it; less holds less memory and moves more pages (each
//       move a few driver calls on the allocating thread). Unset: 6.
//   CUPOOL_VMM_LANES=1|0|true|false|yes|no|on|off: with CUPOOL_VMM_RECYCLE on: a large block
//       replaced by a slightly larger copy (a KV cache concatenated every chunk) gets address space
//       of its own, where the next copies land and only what they grow by gets new memory; off
//       keeps every block in the pool's one range. Unset: on.
//   CUPOOL_VMM_AHEAD=worker|inline|off: with CUPOOL_VMM_LANES on: the memory a growing cache's next
//       copies will need is mapped ahead of need, on a worker thread (a page made on the allocating
//       thread costs it about ten times as much) or inline (the same memory, for reproducible
//       replays); off maps a block's memory when it lands. It takes most of the lanes' page work
//       off the allocating thread at no cost in memory (Phi-3's prefill: 334 to 119 ms of driver
//       time, the Python thread's CPU time from 1.28x expandable's to 1.08x; docs/pytorch.md).
//       Unset: off.
//   CUPOOL_DEVICE=cuda|sim|auto: libcupool's devices: every CUDA device, simulated cards, or cuda
//       if present (auto). Unset: auto.
//   CUPOOL_SIM_GIB (a number of GiB above 0 and up to 262144): each simulated card's memory. Unset:
//       16.
//   CUPOOL_SIM_DEVICES (1 to 64): how many simulated cards. Unset: 1.
//   CUPOOL_PURGE=never|always|auto: at an engine's prefill ubatch boundary (cupool_ubatch_end,
//       llama.cpp's shim): keep the cache, return it all, or return what the last ubatch did not
//       reuse when the device is short; never also takes no out-of-memory retry. Unset: auto.
//   CUPOOL_AUTO_HEADROOM (ubatch, inf, or a number of MiB (0 or more)): when auto counts the device
//       short: free memory below twice what the last ubatch held at once (ubatch), below a number
//       of MiB (0: only before an out-of-memory retry), or always (inf). Unset: ubatch.
//   CUPOOL_LIMIT_MIB (off, or a number of MiB from 1 to 16777216): the most device memory
//       libcupool's pools may hold on each device, all streams together (like PyTorch's per-process
//       memory fraction): beyond it a request fails as out-of-memory, with cupool's report, after
//       the pool's own purge-and-retry; managed memory is not counted. Unset: off.
//   CUPOOL_TIME_DRIVER=1|0|true|false|yes|no|on|off: libcupool times every driver call its pools
//       make (creating, mapping, moving and unmapping memory, synchronizing) and adds the calls and
//       nanoseconds per primitive to cupool_stats_json (cupool.driver_ns and
//       cupool.driver_calls.NAME, cupool.driver_ns.NAME): what the pool costs the allocating thread
//       in the driver; two clock reads and a lock per driver call. Unset: off.
//   CUPOOL_VMM_DEFER=1|0|true|false|yes|no|on|off: with CUPOOL_VMM_RECYCLE on: a worker thread per
//       device makes the driver calls that move pages (a second mapping where a block lands,
//       dropping the old one), and the allocating stream waits for them on the device
//       (cuStreamWaitValue32), not the allocating thread: memory is usable in the allocating
//       stream's order, as cudaMallocAsync's (another stream waits for that one first); a stream
//       being captured, or a device whose streams cannot wait on memory, makes the thread wait
//       instead. The stream a C caller passes must then be the CUstream the memory is used on (0:
//       the legacy default stream). Unset: always off (ggml's streams are indices, not CUDA
//       streams).
//   CUPOOL_LOG (a log filter (RUST_LOG's syntax), or off): libcupool's log filter: info prints each
//       ubatch's peaks and what its boundary returned; off silences it. Unset: RUST_LOG's filter,
//       else warnings and errors.
//   CUPOOL_TRACE (a file path): llama.cpp's shim records the pool's traffic here (JSON lines with
//       ggml's names, for repro-prefill replay). Unset: no recording.
//   CUPOOL_HOLD (auto, off, or a number of MiB (0 to 1048576)): mainline llama.cpp's shim holds
//       this much device memory from a context's creation to its first compute, for what that
//       compute takes outside ggml's buffers (cuBLAS workspace, kernel modules): a context that
//       leaves no room fails at start-up with cupool's report. Unset: auto: the cuBLAS workspace
//       (32 MiB from compute capability 9.0, else 4) plus 144 MiB.
//   CUPOOL_FA_KV (buffer or pool): mainline llama.cpp's shim: where flash attention puts the f16
//       copies of a quantized K/V cache. buffer: in the compute buffer, reserved at start-up for
//       the whole context (upstream since PR #23907); pool: from the pool per call, sized by the KV
//       length in use, as ik_llama.cpp and llama.cpp before #23907 do (returned by
//       CUPOOL_PURGE=auto when the device is short). Unset: buffer: llama.cpp's own placement.
//   CUPOOL_LIB (the path of libcupool.so (for the Python package, the file or its folder)): where
//       llama.cpp's shim and the Python package find libcupool. Unset: beside the executable,
//       beside the library holding ggml-cuda, then the loader's path.
// (end of the generated list)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>

struct ggml_cuda_pool;

// Whether GGML_POOL selects cupool (set and not empty); read once.
bool ggml_cupool_enabled();

// Loads and opens libcupool when enabled (at backend start-up, so that a bad setting stops the
// program before any work): a missing library lists the paths tried, a bad GGML_POOL or
// CUPOOL_* value prints cupool's message; both abort. Starts recording to CUPOOL_TRACE if set.
void ggml_cupool_startup();

// CUPOOL_FA_KV=pool (GGML_POOL set; mainline llama.cpp): flash attention takes the f16 copies of
// a quantized K/V cache from the pool, sized by each call's KV length, instead of from space in
// the compute buffer reserved at start-up for the whole context. Read once; a value other than
// buffer or pool stops start-up.
bool ggml_cupool_fa_kv_pool();

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

// Device memory held for what a context's first computes take outside every ggml buffer and pool:
// the cuBLAS handle and its workspace, the kernel modules CUDA loads lazily, CUDA graphs. ggml
// makes them in the middle of the first compute, after the KV cache and the compute buffer were
// allocated, so a context that was created can still die at its first compute. Taken when the
// backend is created (before the context's buffers), given back just before its first compute: a
// context whose buffers leave no room for it fails at start-up, with cupool's report, instead.
// CUPOOL_HOLD sizes it: auto (the cuBLAS workspace ggml will allocate plus an allowance for the
// rest), off, or a number of MiB. With GGML_POOL unset nothing is held.
struct ggml_cupool_hold {
    // Holds the memory for `device`. False, after printing why and what would fit, when the device
    // cannot spare it: the backend must not start.
    bool take(int device);
    // Gives the memory back (the first compute); later calls measure what the lazily made things
    // took, for the report at the context's end.
    void release();
    ggml_cupool_hold() = default;
    ~ggml_cupool_hold();
    ggml_cupool_hold(const ggml_cupool_hold &) = delete;
    ggml_cupool_hold & operator=(const ggml_cupool_hold &) = delete;

    int      device   = -1;    // -1: GGML_POOL unset, nothing held or measured
    bool     released = false; // the first compute came
    void *   ptr      = nullptr;
    size_t   bytes    = 0;     // held
    size_t   base     = 0;     // device free memory right after the hold was given back
    size_t   pool_at  = 0;     // the device's pool reserve then
    size_t   taken    = 0;     // the most taken outside buffers and pools since, measured
    unsigned samples  = 0;     // computes measured so far
};

// A ggml buffer of `size` bytes on `device` was (ok) or could not be (!ok) allocated. A failure
// while GGML_POOL is set prints cupool's start-up report: what was needed, what was free, what is
// held for the first compute and the context that would fit.
void ggml_cupool_buffer(int device, size_t size, bool ok);

// llama.cpp's context is about to allocate its buffers for `n_ctx` cells (for the fitting context
// in a start-up report).
void ggml_cupool_context(uint32_t n_ctx);

// The context's buffers (KV cache, compute buffers) are allocated: with CUPOOL_LOG=info each
// device's `context-created` memory line, where no start-up hold gives it back at the first
// compute (ik_llama.cpp; mainline logs it when its hold goes back).
void ggml_cupool_context_ready();

// A pool allocation cupool could not serve (its report is already printed), thrown only while a
// ggml_cupool_oom_scope is open on the thread: the compute that opened it catches it and fails
// cleanly (mainline: GGML_STATUS_ALLOC_FAILED, so llama_decode returns -2 and llama-server fails
// the request instead of the process). With no scope open the shim aborts, as ggml's pools do.
struct ggml_cupool_oom : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// While in scope, a failed pool allocation on this thread throws ggml_cupool_oom.
struct ggml_cupool_oom_scope {
    ggml_cupool_oom_scope();
    ~ggml_cupool_oom_scope();
    ggml_cupool_oom_scope(const ggml_cupool_oom_scope &) = delete;
    ggml_cupool_oom_scope & operator=(const ggml_cupool_oom_scope &) = delete;
};

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
