// cupool inside ggml-cuda: see ggml-cupool.h. Host code only; libcupool is loaded at run time
// (dlopen), so a ggml build with this file needs no libcupool unless GGML_POOL is set.

#include "common.cuh"
#include "ggml-cupool.h"
#include "cupool.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

namespace {

// The C functions the shim calls, typed by the header they come from.
struct cupool_api {
    decltype(&cupool_api_version)  api_version  = nullptr;
    decltype(&cupool_init)         init         = nullptr;
    decltype(&cupool_device_count) device_count = nullptr;
    decltype(&cupool_alloc_named)  alloc_named  = nullptr;
    decltype(&cupool_free)         free         = nullptr;
    decltype(&cupool_ubatch_end)   ubatch_end   = nullptr;
    decltype(&cupool_releases)     releases     = nullptr;
    decltype(&cupool_stats_json)   stats_json   = nullptr;
    decltype(&cupool_record_start) record_start = nullptr;
    decltype(&cupool_record_stop)  record_stop  = nullptr;
    decltype(&cupool_phase_begin)  phase_begin  = nullptr;
    decltype(&cupool_last_error)   last_error   = nullptr;
};

cupool_api api;
bool       recording = false;
thread_local const char * current_label = nullptr;
// Open ggml_cupool_oom_scope objects on this thread: a failed allocation throws instead of aborting.
thread_local int oom_scopes = 0;

constexpr double MiB = 1024.0 * 1024.0;

// What the start-up report needs to know of each device: the memory held for first computes
// now, and what ggml's buffers took since llama.cpp announced its context.
struct device_ledger {
    std::atomic<size_t> held{ 0 };
    std::atomic<size_t> since_context{ 0 };
    std::atomic<size_t> buffers{ 0 };  // every ggml buffer allocated, for the hold's measurement
};

device_ledger          ledgers[GGML_CUDA_MAX_DEVICES];
std::atomic<uint32_t>  context_cells{ 0 };

// With CUPOOL_LOG at info or finer, one line per device at each stage of a run (CUDA set up,
// model loaded, context created, each prefill ubatch): the device's free memory and the pools'
// reserve, so that what lies outside the pools can be measured run by run (seed.py reads them).
void memory_lines(const char * stage);
void memory_line(int device, const char * stage);
void startup_memory_lines();
bool memory_log();

[[noreturn]] void fail(const std::string & what) {
    fprintf(stderr, "cupool: %s\n", what.c_str());
    fflush(stderr);
    GGML_ABORT("cupool could not start: see the message above");
}

std::string dir_of(const std::string & path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// Where libcupool may be, in the order tried.
std::vector<std::string> candidates() {
    std::vector<std::string> out;
    if (const char * env = getenv("CUPOOL_LIB"); env != nullptr && env[0] != '\0') {
        out.emplace_back(env);
        return out; // an explicit choice is the only one tried
    }
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        out.push_back(dir_of(exe) + "/libcupool.so");
    }
    Dl_info self;
    if (dladdr((void *) &ggml_cupool_startup, &self) != 0 && self.dli_fname != nullptr) {
        const std::string here = dir_of(self.dli_fname) + "/libcupool.so";
        if (out.empty() || out.back() != here) {
            out.push_back(here);
        }
    }
    out.emplace_back("libcupool.so"); // LD_LIBRARY_PATH, the run path, the system's
    return out;
}

void * load_library() {
    std::string tried;
    for (const std::string & path : candidates()) {
        if (void * h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
            return h;
        }
        const char * why = dlerror();
        tried += "\n  " + path + ": " + (why ? why : "not loadable");
    }
    fail("GGML_POOL is set but libcupool could not be loaded; tried:" + tried +
         "\nset CUPOOL_LIB to the path of libcupool.so, or unset GGML_POOL to use ggml's own pools");
}

template <typename F> void resolve(void * lib, F & fn, const char * name) {
    fn = reinterpret_cast<F>(dlsym(lib, name));
    if (fn == nullptr) {
        fail(std::string("libcupool has no ") + name + ": it is older than this shim (C API " +
             std::to_string(CUPOOL_API_VERSION) + "); rebuild it");
    }
}

void at_exit() {
    if (recording) {
        uint64_t n = 0;
        if (api.record_stop(&n) != CUPOOL_STATUS_OK) {
            fprintf(stderr, "cupool: the trace could not be written: %s\n", api.last_error());
        } else {
            fprintf(stderr, "cupool: trace written to %s (%llu allocations)\n", getenv("CUPOOL_TRACE"),
                    (unsigned long long) n);
        }
    }
    const int devices = api.device_count();
    for (int d = 0; d < devices; ++d) {
        std::vector<char> buf(api.stats_json(d, nullptr, 0) + 1);
        if (api.stats_json(d, buf.data(), buf.size()) > 0) {
            fprintf(stderr, "cupool: device %d stats %s\n", d, buf.data());
        }
    }
}

struct ggml_cuda_pool_cupool : public ggml_cuda_pool {
    int      device;
    uint64_t stream;

    ggml_cuda_pool_cupool(int device, int stream_no) : device(device), stream((uint64_t) stream_no) {}

    void * alloc(size_t size, size_t * actual_size) override {
        void * ptr = api.alloc_named(device, stream, size, actual_size, recording ? current_label : nullptr);
        if (ptr == nullptr) {
            fprintf(stderr, "cupool: device %d, stream %llu: allocating %zu bytes failed:\n%s\n", device,
                    (unsigned long long) stream, size, api.last_error());
            fflush(stderr);
            if (oom_scopes > 0) {
                throw ggml_cupool_oom("cupool: a pool allocation failed (its report is above)");
            }
            GGML_ABORT("cupool: allocation failed (see above)");
        }
        return ptr;
    }

    void free(void * ptr, size_t size) override {
        if (api.free(device, stream, ptr, size) != CUPOOL_STATUS_OK) {
            fprintf(stderr, "cupool: device %d: freeing %p (%zu bytes) failed: %s\n", device, ptr, size,
                    api.last_error());
            GGML_ABORT("cupool: free failed (see above)");
        }
    }
};

} // namespace

bool ggml_cupool_enabled() {
    static const bool enabled = [] {
        const char * v = getenv("GGML_POOL");
        return v != nullptr && v[0] != '\0';
    }();
    return enabled;
}

bool ggml_cupool_fa_kv_pool() {
    static const bool pool = [] {
        if (!ggml_cupool_enabled()) {
            return false; // ggml's own pools: upstream's placement, whatever the variable says
        }
        const char * v = getenv("CUPOOL_FA_KV");
        if (v == nullptr || v[0] == '\0' || strcmp(v, "buffer") == 0) {
            return false;
        }
        if (strcmp(v, "pool") != 0) {
            fail(std::string("CUPOOL_FA_KV=") + v +
                 " is not accepted: use buffer (flash attention's f16 K/V copies in the compute buffer, for the"
                 " whole context) or pool (from cupool's pool, per call)");
        }
        return true;
    }();
    return pool;
}

void ggml_cupool_startup() {
    static bool started = false;
    if (started || !ggml_cupool_enabled()) {
        return;
    }
    started = true;
    void * lib = load_library();
    resolve(lib, api.api_version, "cupool_api_version");
    if (api.api_version() != CUPOOL_API_VERSION) {
        fail("libcupool implements C API " + std::to_string(api.api_version()) + ", this shim was built for " +
             std::to_string(CUPOOL_API_VERSION) + ": rebuild one of them");
    }
    resolve(lib, api.init, "cupool_init");
    resolve(lib, api.device_count, "cupool_device_count");
    resolve(lib, api.alloc_named, "cupool_alloc_named");
    resolve(lib, api.free, "cupool_free");
    resolve(lib, api.ubatch_end, "cupool_ubatch_end");
    resolve(lib, api.releases, "cupool_releases");
    resolve(lib, api.stats_json, "cupool_stats_json");
    resolve(lib, api.record_start, "cupool_record_start");
    resolve(lib, api.record_stop, "cupool_record_stop");
    resolve(lib, api.phase_begin, "cupool_phase_begin");
    resolve(lib, api.last_error, "cupool_last_error");
    // ggml frees in stack order within a stream, so VMM page recycling would buy little here,
    // and CUDA graphs capture pool allocations: the synchronize recycling needs may not run
    // inside a capture. Off unless the user asks for it.
    setenv("CUPOOL_VMM_RECYCLE", "off", 0);
    // ggml names a device's streams by index, and libcupool's stream argument is that index
    // here, not a CUstream: page moves on a worker would have the "stream" wait on garbage.
    if (const char * d = getenv("CUPOOL_VMM_DEFER");
        d != nullptr && d[0] != '\0' && strcmp(d, "off") != 0 && strcmp(d, "0") != 0 && strcmp(d, "false") != 0 &&
        strcmp(d, "no") != 0) {
        fprintf(stderr, "cupool: CUPOOL_VMM_DEFER=%s is ignored inside ggml (its streams are indices, not CUDA streams)\n", d);
    }
    setenv("CUPOOL_VMM_DEFER", "off", 1);
    if (api.init(nullptr) != CUPOOL_STATUS_OK) {
        fail(std::string("libcupool refused the configuration: ") + api.last_error());
    }
    if (const char * trace = getenv("CUPOOL_TRACE"); trace != nullptr && trace[0] != '\0') {
        if (api.record_start(trace) != CUPOOL_STATUS_OK) {
            fail(std::string("CUPOOL_TRACE: ") + api.last_error());
        }
        api.phase_begin("start-up");
        recording = true;
    }
    (void) ggml_cupool_fa_kv_pool(); // a bad CUPOOL_FA_KV stops start-up too
    atexit(at_exit);
    fprintf(stderr, "cupool: GGML_POOL=%s: ggml's pools go through libcupool (%d devices)\n", getenv("GGML_POOL"),
            api.device_count());
    startup_memory_lines();
}

std::unique_ptr<ggml_cuda_pool> ggml_cupool_new_pool(int device, int stream_no) {
    ggml_cupool_startup(); // a no-op when start-up already ran
    return std::unique_ptr<ggml_cuda_pool>(new ggml_cuda_pool_cupool(device, stream_no));
}

size_t ggml_cupool_ubatch_end() {
    if (!ggml_cupool_enabled()) {
        return 0;
    }
    size_t released = 0;
    if (api.ubatch_end(-1, &released) != CUPOOL_STATUS_OK) {
        fprintf(stderr, "cupool: the ubatch boundary failed: %s\n", api.last_error());
        GGML_ABORT("cupool: ubatch boundary failed (see above)");
    }
    memory_lines("ubatch");
    return released;
}

bool ggml_cupool_graphs_stale(int device, uint64_t * seen) {
    if (!ggml_cupool_enabled()) {
        return false;
    }
    uint64_t now = 0;
    if (api.releases(device, &now) != CUPOOL_STATUS_OK) {
        fprintf(stderr, "cupool: reading device %d's release count failed: %s\n", device, api.last_error());
        GGML_ABORT("cupool: release count failed (see above)");
    }
    const bool stale = now != *seen;
    *seen = now;
    return stale;
}

ggml_cupool_oom_scope::ggml_cupool_oom_scope() {
    ++oom_scopes;
}

ggml_cupool_oom_scope::~ggml_cupool_oom_scope() {
    --oom_scopes;
}

ggml_cupool_label::ggml_cupool_label(const char * name) : prev(current_label) {
    current_label = name;
}

ggml_cupool_label::~ggml_cupool_label() {
    current_label = prev;
}

// ---- the start-up hold ----

namespace {

// The allowance above the cuBLAS workspace for what a context's first computes take lazily:
// kernel modules (CUDA loads a kernel's module at its first launch), cuBLAS's handle and its
// own kernels, CUDA graphs. Measured by the hold itself (the line each context prints at its
// end) on an H100 with mainline 0c1e5709: 164 MiB with the workspace for an f16 model (cuBLAS
// GEMMs), 66 MiB for a q8_0 one (MMQ, no cuBLAS); 144 covers the first
// (data/h100-2026-11-24-mainline-hold).
constexpr size_t HOLD_ALLOWANCE_MIB = 144;

// The cuBLAS workspace mainline ggml-cuda allocates with each handle (common.cuh,
// cublas_handle(): 32 MiB from compute capability 9.0, Hopper, on; 4 MiB before).
size_t cublas_workspace(int device) {
    return ggml_cuda_info().devices[device].cc >= 900 ? 32u << 20 : 4u << 20;
}

// CUPOOL_HOLD: auto (unset), off, or MiB. Read once; a bad value stops start-up.
struct hold_setting {
    bool   automatic = true;
    size_t bytes     = 0;  // when not automatic
};

const hold_setting & hold_config() {
    static const hold_setting s = [] {
        hold_setting h;
        const char * v = getenv("CUPOOL_HOLD");
        if (v == nullptr || v[0] == '\0' || strcmp(v, "auto") == 0) {
            return h;
        }
        h.automatic = false;
        if (strcmp(v, "off") == 0) {
            return h;
        }
        char *       end = nullptr;
        const double mib = strtod(v, &end);
        if (end == v || *end != '\0' || !(mib >= 0.0) || mib > 1048576.0) {
            fail(std::string("CUPOOL_HOLD=") + v +
                 " is not accepted: use auto (the cuBLAS workspace plus an allowance for kernel modules), off, or"
                 " a number of MiB from 0 to 1048576");
        }
        h.bytes = (size_t) (mib * MiB);
        return h;
    }();
    return s;
}

size_t hold_size(int device) {
    const hold_setting & h = hold_config();
    return h.automatic ? cublas_workspace(device) + (HOLD_ALLOWANCE_MIB << 20) : h.bytes;
}

// The device's pools' reserve, read from libcupool's statistics.
size_t pool_reserved(int device) {
    char         buf[4096];
    const size_t n = api.stats_json(device, buf, sizeof(buf));
    if (n == 0 || n >= sizeof(buf)) {
        return 0;
    }
    const char * key = strstr(buf, "\"reserved_bytes.all.current\":");
    return key == nullptr ? 0 : (size_t) strtoull(key + strlen("\"reserved_bytes.all.current\":"), nullptr, 10);
}

size_t device_free(int device) {
    ggml_cuda_set_device(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
        (void) cudaGetLastError();
        return 0;
    }
    return free;
}

// How many computes after the first are measured: the lazily made things come with the first
// prompt and the first single-token step; later computes make none.
constexpr unsigned HOLD_SAMPLES = 64;

} // namespace

bool ggml_cupool_hold::take(int dev) {
    if (!ggml_cupool_enabled()) {
        return true;
    }
    ggml_cupool_startup();
    const size_t want = hold_size(dev);
    device            = dev; // measured from the first compute on, even with nothing held
    if (want == 0) {
        return true;
    }
    ggml_cuda_set_device(dev);
    void * p = nullptr;
    if (cudaMalloc(&p, want) != cudaSuccess) {
        device = -1;
        (void) cudaGetLastError();
        fprintf(stderr,
                "cupool: start-up: device %d cannot spare the %.1f MiB a context's first compute takes outside"
                " ggml's buffers (cuBLAS workspace, kernel modules, graphs): %.1f MiB free. Without this check"
                " the context would start and die at its first compute. Free memory on the device or use a"
                " smaller model or context (CUPOOL_HOLD sizes the hold).\n",
                dev, want / MiB, device_free(dev) / MiB);
        fflush(stderr);
        return false;
    }
    ptr   = p;
    bytes = want;
    ledgers[dev].held += want;
    return true;
}

void ggml_cupool_hold::release() {
    if (device < 0) {
        return;
    }
    if (!released) {
        released = true;
        if (ptr != nullptr) {
            ggml_cuda_set_device(device);
            CUDA_CHECK(cudaFree(ptr));
            ptr = nullptr;
            ledgers[device].held -= bytes;
        }
        base    = device_free(device);
        pool_at = pool_reserved(device) + ledgers[device].buffers.load();
        if (memory_log()) {
            memory_line(device, "context-created");
        }
        return;
    }
    if (samples >= HOLD_SAMPLES) {
        return;
    }
    ++samples;
    const size_t now   = device_free(device);
    const size_t owned = pool_reserved(device) + ledgers[device].buffers.load();
    // What left the device since the hold went back, less what pools and buffers took.
    const long long t = (long long) base - (long long) now - ((long long) owned - (long long) pool_at);
    if (t > (long long) taken) {
        taken = (size_t) t;
    }
}

ggml_cupool_hold::~ggml_cupool_hold() {
    if (device < 0) {
        return;
    }
    if (!released) { // never computed
        if (ptr != nullptr) {
            ggml_cuda_set_device(device);
            (void) cudaFree(ptr);
            ledgers[device].held -= bytes;
        }
        return;
    }
    // No measurement here: the context's cuBLAS handles and buffers may be gone already.
    fprintf(stderr,
            "cupool: device %d: this context's computes took %.1f MiB outside ggml's buffers and pools"
            " (held for them at start-up: %.1f MiB)%s\n",
            device, taken / MiB, bytes / MiB, taken > bytes ? ": CUPOOL_HOLD should be larger" : "");
}

void ggml_cupool_context(uint32_t n_ctx) {
    context_cells = n_ctx;
    for (device_ledger & l : ledgers) {
        l.since_context = 0;
    }
    if (ggml_cupool_enabled()) {
        memory_lines("model-loaded");
    }
}

void ggml_cupool_context_ready() {
    if (ggml_cupool_enabled()) {
        memory_lines("context-created");
    }
}

namespace {

bool memory_log() {
    static const bool on = [] {
        const char * v = getenv("CUPOOL_LOG");
        return v != nullptr && (strstr(v, "info") || strstr(v, "debug") || strstr(v, "trace"));
    }();
    return on;
}

// Prints the line of a device the caller made current.
void memory_line_current(int device, const char * stage) {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
        (void) cudaGetLastError();
        return;
    }
    fprintf(stderr, "cupool: memory device=%d stage=%s free_mib=%.1f total_mib=%.1f pool_reserved_mib=%.1f buffers_mib=%.1f\n",
            device, stage, free / MiB, total / MiB, pool_reserved(device) / MiB, ledgers[device].buffers.load() / MiB);
}

void memory_line(int device, const char * stage) {
    ggml_cuda_set_device(device);
    memory_line_current(device, stage);
}

void memory_lines(const char * stage) {
    if (!memory_log()) {
        return;
    }
    for (int d = 0; d < ggml_cuda_info().device_count; ++d) {
        memory_line(d, stage);
    }
}

// The lines at start-up, which runs inside ggml_cuda_info()'s first call: asking ggml for its
// devices there (ggml_cuda_info, ggml_cuda_set_device) would wait on that call forever, so this
// walks CUDA's devices itself (no pool exists yet, so nothing is attributed to one).
void startup_memory_lines() {
    if (!memory_log()) {
        return;
    }
    int devices = 0, current = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || cudaGetDevice(&current) != cudaSuccess) {
        (void) cudaGetLastError();
        return;
    }
    for (int d = 0; d < devices; ++d) {
        if (cudaSetDevice(d) == cudaSuccess) {
            memory_line_current(d, "cuda-init");
        }
    }
    (void) cudaSetDevice(current);
    (void) cudaGetLastError();
}

} // namespace

void ggml_cupool_buffer(int device, size_t size, bool ok) {
    if (!ggml_cupool_enabled() || device < 0 || device >= GGML_CUDA_MAX_DEVICES) {
        return;
    }
    device_ledger & l = ledgers[device];
    if (ok) {
        l.since_context += size;
        l.buffers += size;
        return;
    }
    const size_t free  = device_free(device);
    const size_t held  = l.held.load();
    const size_t made  = l.since_context.load();
    const uint32_t ctx = context_cells.load();
    fprintf(stderr,
            "cupool: start-up: device %d cannot allocate a ggml buffer of %.1f MiB: %.1f MiB free, %.1f MiB of it"
            " held for what the first compute takes outside ggml's buffers (cuBLAS workspace %.1f MiB, kernel"
            " modules and the rest).",
            device, size / MiB, (free + held) / MiB, held / MiB, (held ? cublas_workspace(device) : 0) / MiB);
    if (held > 0 && free + held >= size) {
        fprintf(stderr, " Without that hold this context would start and then die at its first compute.");
    }
    if (ctx > 0) {
        // The KV cache and the compute buffer both grow with the context; what this context has
        // already allocated could go to a smaller one. The driver refuses an allocation that
        // would leave less than a 2 MiB page free (scripts/llama/malloc_pages.cu), so the last
        // page is no room.
        const size_t page  = 2u << 20;
        const size_t room  = free + made > page ? free + made - page : 0;
        const double scale = (double) room / (double) (made + size);
        const uint32_t fit = (uint32_t) (ctx * scale) / 256 * 256;
        fprintf(stderr, " This context (-c %u) allocated %.1f MiB of buffers before this one; ", ctx, made / MiB);
        if (made > 0) {
            fprintf(stderr, "about -c %u fits (its buffers scaled to the room).", fit);
        } else {
            fprintf(stderr, "at most -c %u fits (the buffers still to come not counted).", fit);
        }
    }
    fprintf(stderr, "\n");
    fflush(stderr);
}
