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
    atexit(at_exit);
    fprintf(stderr, "cupool: GGML_POOL=%s: ggml's pools go through libcupool (%d devices)\n", getenv("GGML_POOL"),
            api.device_count());
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

ggml_cupool_label::ggml_cupool_label(const char * name) : prev(current_label) {
    current_label = name;
}

ggml_cupool_label::~ggml_cupool_label() {
    current_label = prev;
}
