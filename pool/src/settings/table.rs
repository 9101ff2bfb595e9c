//! The rows of the settings table. The order is the order of `config::ENV_NAMES` and of the
//! names libcupool lists in its errors: the library's settings first.

use super::Accepts::{self, Bool, OneOf, Text};
use super::FrontEnd::{Cli, Libcupool, Library, Python, Shim};
use super::{Reader, Setting};

const fn by(front_end: super::FrontEnd, default: &'static str) -> Reader {
    Reader { front_end, default }
}

/// Off everywhere the library's settings are read.
const OFF: &[Reader] = &[by(Library, "off"), by(Cli, "off"), by(Libcupool, "off")];

/// Every setting; see the module docs.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "GGML_POOL",
        accepts: Accepts::PoolKind,
        read_by: &[
            by(Library, "vmm where the device supports VMM, else legacy (logged)"),
            by(Cli, "run without --pool compares every configuration, and plan, predict and replay take libcupool's default (vmm where the device supports VMM, else legacy)"),
            by(Libcupool, "vmm where the device supports VMM, else legacy"),
            by(Shim, "ggml's own pools, also when empty: libcupool is not loaded"),
            by(Python, "vmm (cupool.torch.install, cupool.cupy.install), direct (cupool.torch.mempool), libcupool's (cupool.init)"),
        ],
        keyword: Some("pool"),
        env_only: false,
        doc: "the pool kind: `torch` is PyTorch's caching policy (to replay traces), `direct` caches nothing (under a caching layer), `nccl` caches nothing and makes each request one VMM allocation NCCL can register (under a MemPool registered with NCCL)",
    },
    Setting {
        name: "GGML_CUDA_NO_VMM",
        accepts: Bool,
        read_by: OFF,
        keyword: Some("no_vmm"),
        env_only: false,
        doc: "never choose VMM automatically (ggml's name)",
    },
    Setting {
        name: "GGML_CUDA_POOL_USE_MANAGED",
        accepts: Bool,
        read_by: OFF,
        keyword: None,
        env_only: false,
        doc: "same as `GGML_POOL=managed` (ggml's name)",
    },
    Setting {
        name: "GGML_CUDA_ALLOC_FALLBACK_MANAGED",
        accepts: Bool,
        read_by: &[
            by(Library, "off"),
            by(Cli, "off (--fallback-managed turns it on)"),
            by(Libcupool, "off"),
        ],
        keyword: Some("fallback_managed"),
        env_only: false,
        doc: "on device OOM, serve that allocation from managed memory (tagged, counted, warned)",
    },
    Setting {
        name: "CUPOOL_ALLOW_OVERSUBSCRIPTION",
        accepts: Bool,
        read_by: OFF,
        keyword: Some("allow_oversubscription"),
        env_only: false,
        doc: "let managed memory exceed the device's free memory (can hang the GPU: opt in knowingly)",
    },
    Setting {
        name: "CUPOOL_SIZE_CLASSES",
        accepts: Text("byte bounds B1,B2,... strictly ascending, or none"),
        read_by: &[
            by(Library, "none"),
            by(Cli, "none, but libcupool's for an engine profile's pool (--engine), replay --size-classes overrides"),
            by(Libcupool, "1048576 for vmm (and an unset GGML_POOL), else none"),
            by(Python, "none (cupool.torch.install), libcupool's (cupool.init)"),
        ],
        keyword: Some("size_classes"),
        env_only: false,
        doc: "a pool of its own per range of request sizes: up to B1 bytes, up to B2, ..., above",
    },
    Setting {
        name: "CUPOOL_VMM_ROUND_LARGE",
        accepts: Text("a power of two from 128 to 1073741824 (bytes)"),
        read_by: &[
            by(Library, "128"),
            by(Cli, "128, but libcupool's for an engine profile's pool (--engine), replay --round-large overrides"),
            by(Libcupool, "2097152 (the 2 MiB granule, for a framework's traffic)"),
        ],
        keyword: Some("vmm_round_large"),
        env_only: false,
        doc: "the VMM pool rounds requests above 1 MiB up to this power of two",
    },
    Setting {
        name: "CUPOOL_VMM_RECYCLE",
        accepts: Bool,
        read_by: &[
            by(Library, "off"),
            by(Cli, "on (replay --recycle overrides)"),
            by(Libcupool, "on (a framework frees out of order)"),
            by(Shim, "off (ggml frees in stack order, and a CUDA graph capture may not be synchronized)"),
        ],
        keyword: Some("vmm_recycle"),
        env_only: false,
        doc: "the VMM pool moves the free pages of its holes to where it must grow instead of mapping new memory (a page stays mapped at its old place too until a later synchronize, so a move never waits for the device): the least footprint for out-of-order frees, at the cost of driver calls when it grows",
    },
    Setting {
        name: "CUPOOL_VMM_RECYCLE_PAGE",
        accepts: Text("a number of MiB from 1 to 1024"),
        read_by: &[by(Library, "8"), by(Cli, "8"), by(Libcupool, "8")],
        keyword: Some("vmm_recycle_page"),
        env_only: false,
        doc: "with CUPOOL_VMM_RECYCLE on: the size of the pages the VMM pool creates memory in (rounded up to the granularity), the unit a page moves in; larger pages mean fewer driver calls per byte, smaller ones that fewer pages straddle a hole's edge and stay behind free space",
    },
    Setting {
        name: "CUPOOL_VMM_RECYCLE_FREE",
        accepts: Text("a percent from 0 to 100"),
        read_by: &[by(Library, "6"), by(Cli, "6"), by(Libcupool, "6")],
        keyword: Some("vmm_recycle_free"),
        env_only: false,
        doc: "with CUPOOL_VMM_RECYCLE on: the percent of the VMM pool's memory that may lie free in its holes before it moves free pages to a block that needs memory instead of creating it; less holds less memory and moves more pages (each move a few driver calls on the allocating thread)",
    },
    Setting {
        name: "CUPOOL_VMM_LANES",
        accepts: Bool,
        read_by: &[by(Library, "on"), by(Cli, "on"), by(Libcupool, "on")],
        keyword: Some("vmm_lanes"),
        env_only: false,
        doc: "with CUPOOL_VMM_RECYCLE on: a large block replaced by a slightly larger copy (a KV cache concatenated every chunk) gets address space of its own, where the next copies land and only what they grow by gets new memory; off keeps every block in the pool's one range",
    },
    Setting {
        name: "CUPOOL_VMM_AHEAD",
        accepts: OneOf(&["worker", "inline", "off"]),
        read_by: &[
            by(Library, "off"),
            by(Cli, "off"),
            by(Libcupool, "off"),
            by(Python, "worker (cupool.torch.install), libcupool's (cupool.init)"),
        ],
        keyword: Some("vmm_ahead"),
        env_only: false,
        doc: "with CUPOOL_VMM_LANES on: the memory a growing cache's next copies will need is mapped ahead of need, on a worker thread (a page made on the allocating thread costs it about ten times as much) or inline (the same memory, for reproducible replays); off maps a block's memory when it lands. It takes most of the lanes' page work off the allocating thread at no cost in memory (Phi-3's prefill: 334 to 119 ms of driver time, the Python thread's CPU time from 1.28x expandable's to 1.08x; docs/pytorch.md)",
    },
    Setting {
        name: "CUPOOL_DEVICE",
        accepts: OneOf(&["cuda", "sim", "auto"]),
        read_by: &[
            by(Libcupool, "auto"),
            by(Python, "cuda (cupool.torch, cupool.cupy), libcupool's (cupool.init)"),
        ],
        keyword: Some("device"),
        env_only: false,
        doc: "libcupool's devices: every CUDA device, simulated cards, or cuda if present (auto)",
    },
    Setting {
        name: "CUPOOL_SIM_GIB",
        accepts: Text("a number of GiB above 0 and up to 262144"),
        read_by: &[by(Libcupool, "16")],
        keyword: Some("sim_gib"),
        env_only: false,
        doc: "each simulated card's memory",
    },
    Setting {
        name: "CUPOOL_SIM_DEVICES",
        accepts: Text("1 to 64"),
        read_by: &[by(Libcupool, "1")],
        keyword: Some("sim_devices"),
        env_only: false,
        doc: "how many simulated cards",
    },
    Setting {
        name: "CUPOOL_PURGE",
        accepts: Accepts::PurgePolicy,
        read_by: &[by(Libcupool, "auto")],
        keyword: Some("purge"),
        env_only: false,
        doc: "at an engine's prefill ubatch boundary (cupool_ubatch_end, llama.cpp's shim): keep the cache, return it all, or return what the last ubatch did not reuse when the device is short; `never` also takes no out-of-memory retry",
    },
    Setting {
        name: "CUPOOL_AUTO_HEADROOM",
        accepts: Text("ubatch, inf, or a number of MiB (0 or more)"),
        read_by: &[by(Libcupool, "ubatch")],
        keyword: Some("auto_headroom"),
        env_only: false,
        doc: "when `auto` counts the device short: free memory below twice what the last ubatch held at once (`ubatch`), below a number of MiB (0: only before an out-of-memory retry), or always (`inf`)",
    },
    Setting {
        name: "CUPOOL_LIMIT_MIB",
        accepts: Text("off, or a number of MiB from 1 to 16777216"),
        read_by: &[by(Libcupool, "off")],
        keyword: Some("limit_mib"),
        env_only: false,
        doc: "the most device memory libcupool's pools may hold on each device, all streams together (like PyTorch's per-process memory fraction): beyond it a request fails as out-of-memory, with cupool's report, after the pool's own purge-and-retry; managed memory is not counted",
    },
    Setting {
        name: "CUPOOL_TIME_DRIVER",
        accepts: Bool,
        read_by: &[by(Libcupool, "off")],
        keyword: Some("time_driver"),
        env_only: false,
        doc: "libcupool times every driver call its pools make (creating, mapping, moving and unmapping memory, synchronizing) and adds the calls and nanoseconds per primitive to cupool_stats_json (`cupool.driver_ns` and `cupool.driver_calls.NAME`, `cupool.driver_ns.NAME`): what the pool costs the allocating thread in the driver; two clock reads and a lock per driver call",
    },
    Setting {
        name: "CUPOOL_VMM_DEFER",
        accepts: Bool,
        read_by: &[
            by(Libcupool, "off"),
            by(Shim, "always off (ggml's streams are indices, not CUDA streams)"),
        ],
        keyword: Some("vmm_defer"),
        env_only: false,
        doc: "with CUPOOL_VMM_RECYCLE on: a worker thread per device makes the driver calls that move pages (a second mapping where a block lands, dropping the old one), and the allocating stream waits for them on the device (cuStreamWaitValue32), not the allocating thread: memory is usable in the allocating stream's order, as cudaMallocAsync's (another stream waits for that one first); a stream being captured, or a device whose streams cannot wait on memory, makes the thread wait instead. The `stream` a C caller passes must then be the CUstream the memory is used on (0: the legacy default stream)",
    },
    Setting {
        name: "CUPOOL_LOG",
        accepts: Text("a log filter (RUST_LOG's syntax), or off"),
        read_by: &[by(Libcupool, "RUST_LOG's filter, else warnings and errors")],
        keyword: None,
        env_only: true,
        doc: "libcupool's log filter: `info` prints each ubatch's peaks and what its boundary returned; `off` silences it",
    },
    Setting {
        name: "CUPOOL_TRACE",
        accepts: Text("a file path"),
        read_by: &[by(Shim, "no recording")],
        keyword: None,
        env_only: true,
        doc: "llama.cpp's shim records the pool's traffic here (JSON lines with ggml's names, for repro-prefill replay)",
    },
    Setting {
        name: "CUPOOL_HOLD",
        accepts: Text("auto, off, or a number of MiB (0 to 1048576)"),
        read_by: &[by(Shim, "auto: the cuBLAS workspace (32 MiB from compute capability 9.0, else 4) plus 144 MiB")],
        keyword: None,
        env_only: true,
        doc: "mainline llama.cpp's shim holds this much device memory from a context's creation to its first compute, for what that compute takes outside ggml's buffers (cuBLAS workspace, kernel modules): a context that leaves no room fails at start-up with cupool's report",
    },
    Setting {
        name: "CUPOOL_FA_KV",
        accepts: Text("buffer or pool"),
        read_by: &[by(Shim, "buffer: llama.cpp's own placement")],
        keyword: None,
        env_only: true,
        doc: "mainline llama.cpp's shim: where flash attention puts the f16 copies of a quantized K/V cache. buffer: in the compute buffer, reserved at start-up for the whole context (upstream since PR #23907); pool: from the pool per call, sized by the KV length in use, as ik_llama.cpp and llama.cpp before #23907 do (returned by `CUPOOL_PURGE=auto` when the device is short)",
    },
    Setting {
        name: "CUPOOL_LIB",
        accepts: Text("the path of libcupool.so (for the Python package, the file or its folder)"),
        read_by: &[
            by(Shim, "beside the executable, beside the library holding ggml-cuda, then the loader's path"),
            by(Python, "beside the package, then the checkout's target/release"),
        ],
        keyword: None,
        env_only: true,
        doc: "where llama.cpp's shim and the Python package find libcupool",
    },
    Setting {
        name: "CUPOOL_TORCH_DIRECT",
        accepts: Text("on or off"),
        read_by: &[by(Python, "on (cupool.torch.install)")],
        keyword: None,
        env_only: true,
        doc: "cupool.torch.install(): on makes cupool's own subclass of CUDAPluggableAllocator PyTorch's allocator where it builds against the installed PyTorch (tensors without the plug-in's pointer map and lock, empty tensors without memory; cupool.torch.route() says whether it did); off uses CUDAPluggableAllocator",
    },
];
