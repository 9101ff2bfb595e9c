// Do VMM page calls on one thread slow the GPU's work queued by another? The contention probe
// (scripts/torch/vmm_contention.cu) showed a worker thread's page calls barely slow another
// thread's kernel launches while the GPU idles; the HF Phi-3 prefill kept its gap to PyTorch's
// allocators with its lanes' pages made on a worker (data/h100-2026-11-28-ahead-guess). This
// keeps the GPU busy instead: one thread queues kernels that each take about 50 us, and a
// worker thread meanwhile does one kind of page call in a loop, as fast as it can. One JSON line
// per case:
//
//     nvcc -O2 -arch=sm_90 -o stall scripts/torch/vmm_gpu_stall.cu -lcuda && ./stall
//
// Kernels: `spin` (one block per SM, no memory traffic) and `copy` (streams a 256 MiB buffer:
// every access goes through the GPU's page tables). Worker cases, 2 MiB pages (the granule):
// `none`; `create` (cuMemCreate + cuMemRelease, no mapping); `grow` (cuMemCreate, cuMemMap and
// cuMemSetAccess onto fresh address space, as a lane's growth: nothing unmapped while timed);
// `cycle` (create, map, grant, unmap, release: a page made ahead and given back); `remap` (map,
// grant and unmap one handle made beforehand: a page moved). `gpu_us` is the queue's wall time
// per kernel; `ops` how many the worker completed meanwhile; `worker_us` its time per op.
#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

static const size_t PAGE = 2u << 20;
static const size_t GROW_VA = 64ull << 30;
static const int KERNELS = 6000;

__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

__global__ void copy(const float4 * __restrict__ a, float4 * __restrict__ b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) b[i] = a[i];
}

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Worker {
    CUmemAllocationProp prop{};
    CUmemAccessDesc access{};
    CUdeviceptr va = 0;
    size_t used = 0;
    CUmemGenericAllocationHandle fixed = 0;
    std::vector<CUmemGenericAllocationHandle> made;
    Worker() {
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        cuMemAddressReserve(&va, GROW_VA, 0, 0, 0);
        cuMemCreate(&fixed, PAGE, &prop, 0);
    }
    bool op(const char * kind) {
        CUmemGenericAllocationHandle h;
        if (!strcmp(kind, "create")) {
            return cuMemCreate(&h, PAGE, &prop, 0) == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS;
        }
        if (!strcmp(kind, "grow")) {
            if (used + PAGE > GROW_VA || cuMemCreate(&h, PAGE, &prop, 0) != CUDA_SUCCESS) return false;
            made.push_back(h);
            bool ok = cuMemMap(va + used, PAGE, 0, h, 0) == CUDA_SUCCESS &&
                      cuMemSetAccess(va + used, PAGE, &access, 1) == CUDA_SUCCESS;
            used += PAGE;
            return ok;
        }
        if (!strcmp(kind, "cycle")) {
            if (cuMemCreate(&h, PAGE, &prop, 0) != CUDA_SUCCESS) return false;
            bool ok = cuMemMap(va, PAGE, 0, h, 0) == CUDA_SUCCESS && cuMemSetAccess(va, PAGE, &access, 1) == CUDA_SUCCESS &&
                      cuMemUnmap(va, PAGE) == CUDA_SUCCESS;
            return cuMemRelease(h) == CUDA_SUCCESS && ok;
        }
        if (!strcmp(kind, "remap")) {
            return cuMemMap(va, PAGE, 0, fixed, 0) == CUDA_SUCCESS && cuMemSetAccess(va, PAGE, &access, 1) == CUDA_SUCCESS &&
                   cuMemUnmap(va, PAGE) == CUDA_SUCCESS;
        }
        return false;
    }
    // Gives back what `grow` made (outside the timing).
    void clear() {
        if (used) cuMemUnmap(va, used);
        for (auto h : made) cuMemRelease(h);
        made.clear();
        used = 0;
    }
    ~Worker() {
        clear();
        cuMemRelease(fixed);
        cuMemAddressFree(va, GROW_VA);
    }
};

int main() {
    if (cudaFree(0) != cudaSuccess) {
        printf("{\"error\":\"no CUDA device\"}\n");
        return 1;
    }
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);
    int sms = 0, khz = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    const long long cycles = (long long)khz * 50 / 1000;  // about 50 us
    const size_t n = (256u << 20) / sizeof(float4);
    float4 *a, *b;
    cudaMalloc(&a, n * sizeof(float4));
    cudaMalloc(&b, n * sizeof(float4));
    cudaMemset(a, 0, n * sizeof(float4));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (const char * kernel : {"spin", "copy"}) {
        for (const char * kind : {"none", "create", "grow", "cycle", "remap", "none"}) {
            std::atomic<bool> stop{false};
            std::atomic<long> ops{0};
            std::atomic<double> busy{0};
            auto launch = [&] {
                if (kernel[0] == 's') spin<<<sms, 32, 0, s>>>(cycles);
                else copy<<<sms * 4, 256, 0, s>>>(a, b, n / 2);
            };
            for (int i = 0; i < 200; ++i) launch();
            cudaStreamSynchronize(s);
            Worker w;
            std::thread worker;
            if (strcmp(kind, "none")) {
                worker = std::thread([&] {
                    cuCtxSetCurrent(ctx);
                    const double t0 = now_us();
                    while (!stop.load() && w.op(kind)) ops++;
                    busy = now_us() - t0;
                });
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
            // Queued in batches the GPU never catches up with: it is the bottleneck.
            const double t0 = now_us();
            for (int i = 0; i < KERNELS; ++i) {
                launch();
                if (i % 500 == 499) cudaStreamSynchronize(s);
            }
            cudaStreamSynchronize(s);
            const double t1 = now_us();
            stop = true;
            if (worker.joinable()) worker.join();
            const long done = ops.load();
            printf("{\"kernel\":\"%s\",\"worker\":\"%s\",\"kernels\":%d,\"gpu_us\":%.3f,\"ops\":%ld,\"worker_us\":%.2f}\n",
                   kernel, kind, KERNELS, (t1 - t0) / KERNELS, done, done ? busy.load() / done : 0.0);
            fflush(stdout);
            w.clear();
        }
    }
    return 0;
}
