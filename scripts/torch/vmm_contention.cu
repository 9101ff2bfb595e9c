// Would moving cupool's VMM page work (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap) to a
// worker thread take it off the allocating thread's critical path, or does the driver serialise
// it with that thread's kernel launches? The HF prefill spends its time on the Python thread
// launching kernels; recycling's page calls cost 30-50 us each there
// (data/h100-2026-11-26-vmm-costs). This launches empty kernels on one thread while another
// thread maps, grants and unmaps 8 MiB pages in a loop, and prints one JSON line per case:
//
//     nvcc -O2 -arch=sm_90 -o contention scripts/torch/vmm_contention.cu -lcuda && ./contention
//
// Cases: `alone` (launches only), `worker` (launches while the worker cycles pages),
// `inline` (the launching thread cycles one page every `EVERY` launches itself, what the pool
// does today). `launch_us` is the launching thread's wall time per launch; `pages` how many page
// cycles the worker (or the thread) completed meanwhile.
#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

static const size_t PAGE = 8u << 20;
static const int LAUNCHES = 200000;
static const int EVERY = 100;

__global__ void empty_kernel() {}

struct Pager {
    CUdeviceptr va = 0;
    CUmemAllocationProp prop{};
    CUmemAccessDesc access{};
    bool ok = true;
    Pager() {
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        ok = cuMemAddressReserve(&va, PAGE, 0, 0, 0) == CUDA_SUCCESS;
    }
    // One page's life: create, map, grant, unmap, release.
    bool cycle() {
        CUmemGenericAllocationHandle h;
        if (cuMemCreate(&h, PAGE, &prop, 0) != CUDA_SUCCESS) return false;
        bool ok = cuMemMap(va, PAGE, 0, h, 0) == CUDA_SUCCESS && cuMemSetAccess(va, PAGE, &access, 1) == CUDA_SUCCESS &&
                  cuMemUnmap(va, PAGE) == CUDA_SUCCESS;
        return cuMemRelease(h) == CUDA_SUCCESS && ok;
    }
};

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
    if (cudaFree(0) != cudaSuccess) {
        printf("{\"error\":\"no CUDA device\"}\n");
        return 1;
    }
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int i = 0; i < 1000; ++i) empty_kernel<<<1, 32, 0, s>>>();
    cudaStreamSynchronize(s);
    for (const char * mode : {"alone", "worker", "inline", "alone"}) {
        std::atomic<bool> stop{false};
        std::atomic<long> pages{0};
        std::thread worker;
        const bool use_worker = mode[0] == 'w';
        const bool use_inline = mode[0] == 'i';
        Pager own;
        if (use_worker) {
            worker = std::thread([&] {
                cuCtxSetCurrent(ctx);
                Pager p;
                while (!stop.load() && p.ok && p.cycle()) pages++;
            });
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        const double t0 = now_us();
        for (int i = 0; i < LAUNCHES; ++i) {
            empty_kernel<<<1, 32, 0, s>>>();
            if (use_inline && i % EVERY == 0 && own.cycle()) pages++;
            // Keep the queue short, as a CPU-bound prefill does: the GPU is never the bottleneck.
            if (i % 1000 == 999) cudaStreamSynchronize(s);
        }
        cudaStreamSynchronize(s);
        const double t1 = now_us();
        stop = true;
        if (worker.joinable()) worker.join();
        printf("{\"mode\":\"%s\",\"launches\":%d,\"launch_us\":%.3f,\"pages\":%ld}\n", mode,
               LAUNCHES, (t1 - t0) / LAUNCHES, pages.load());
    }
    return 0;
}
