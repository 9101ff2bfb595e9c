// Does a page map made on another thread break a CUDA graph capture? With CUPOOL_VMM_DEFER a
// worker thread makes the VMM pool's cuMemCreate / cuMemMap / cuMemSetAccess / cuMemUnmap
// calls while the application goes on, and may do so while the application captures a graph
// (torch.cuda.graph captures in the global mode by default). CUDA prohibits "potentially unsafe"
// API calls during a global capture, on the capturing thread and, in the global mode, on every
// other thread. This runs each mode of capture on the main thread while a second thread makes
// those calls once the capture has begun, and prints one JSON line per (capture mode, call):
// the call's result on the worker, the capture's end, and whether the captured graph replays.
//
//     nvcc -O2 -arch=sm_90 -o capture_map scripts/torch/capture_map_probe.cu -lcuda
//     ./capture_map
#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

__global__ void add_one(float * x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

static const char * err_name(CUresult r) {
    const char * s = nullptr;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

// What the worker does while the capture is open: `which` 0 creates and maps a page (and
// grants access), 1 unmaps and releases a page mapped before the capture.
static CUresult worker_call(int which, CUdeviceptr va, size_t page, CUmemGenericAllocationHandle before) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    if (which == 0) {
        CUmemGenericAllocationHandle h;
        CUresult r = cuMemCreate(&h, page, &prop, 0);
        if (r != CUDA_SUCCESS) return r;
        r = cuMemMap(va + page, page, 0, h, 0);
        if (r != CUDA_SUCCESS) return r;
        CUmemAccessDesc acc = {};
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = cuMemSetAccess(va + page, page, &acc, 1);
        if (r != CUDA_SUCCESS) return r;
        cuMemUnmap(va + page, page);
        return cuMemRelease(h);
    }
    CUresult r = cuMemUnmap(va + 2 * page, page);
    if (r != CUDA_SUCCESS) return r;
    return cuMemRelease(before);
}

int main() {
    cuInit(0);
    cudaFree(0);
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t page = 0;
    cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    const char * modes[] = {"global", "thread_local", "relaxed"};
    const cudaStreamCaptureMode cm[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                        cudaStreamCaptureModeRelaxed};
    const char * calls[] = {"create+map+access", "unmap+release"};
    float * x = nullptr;
    cudaMalloc(&x, 1024 * sizeof(float));
    cudaMemset(x, 0, 1024 * sizeof(float));
    for (int m = 0; m < 3; ++m) {
        for (int c = 0; c < 2; ++c) {
            CUdeviceptr va = 0;
            cuMemAddressReserve(&va, 4 * page, 0, 0, 0);
            // A page mapped before the capture, for the unmap case.
            CUmemGenericAllocationHandle before = 0;
            cuMemCreate(&before, page, &prop, 0);
            cuMemMap(va + 2 * page, page, 0, before, 0);
            CUmemAccessDesc acc = {};
            acc.location = prop.location;
            acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            cuMemSetAccess(va + 2 * page, page, &acc, 1);
            cudaStream_t s;
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
            std::atomic<int> phase{0};
            CUresult worker = CUDA_SUCCESS;
            std::thread t([&] {
                cuCtxSetCurrent(ctx);
                while (phase.load() < 1) {
                }
                worker = worker_call(c, va, page, before);
                phase.store(2);
            });
            cudaGraph_t g = nullptr;
            cudaError_t begin = cudaStreamBeginCapture(s, cm[m]);
            add_one<<<4, 256, 0, s>>>(x, 1024);
            phase.store(1);
            while (phase.load() < 2) {
            }
            add_one<<<4, 256, 0, s>>>(x, 1024);
            cudaError_t end = cudaStreamEndCapture(s, &g);
            t.join();
            cudaGetLastError();
            bool replayed = false;
            if (end == cudaSuccess && g) {
                cudaGraphExec_t ge;
                if (cudaGraphInstantiate(&ge, g, 0) == cudaSuccess) {
                    replayed = cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
                    cudaGraphExecDestroy(ge);
                }
                cudaGraphDestroy(g);
            }
            cudaGetLastError();
            printf("{\"capture\": \"%s\", \"worker_call\": \"%s\", \"worker_result\": \"%s\", \"begin\": \"%s\", "
                   "\"end_capture\": \"%s\", \"graph_replays\": %s}\n",
                   modes[m], calls[c], err_name(worker), cudaGetErrorName(begin), cudaGetErrorName(end),
                   replayed ? "true" : "false");
            fflush(stdout);
            cudaStreamDestroy(s);
            if (c == 0 || worker != CUDA_SUCCESS) {
                // The page mapped before the capture, unless the worker released it.
                cuMemUnmap(va + 2 * page, page);
                cuMemRelease(before);
            }
            cuMemAddressFree(va, 4 * page);
        }
    }
    cudaFree(x);
    return 0;
}
