// How much more than the free memory the driver reports can one cudaMalloc get, once the card is
// nearly full, after a given piece of CUDA work? ik_llama.cpp's MoE runs at 10 GiB free grew
// their pool by 146 MiB with 136.6 MiB free and kept 20.6 MiB free after it: about 30 MiB came
// from somewhere the free figure does not show (data/h100-2026-11-27-ik-warmup). The kernels'
// stacks are not it (data/h100-2026-11-27-lmem-giveback). This tries the other candidates, one
// fresh process (and CUDA context) per mode, and prints one JSON line per mode:
//
//     nvcc -O2 -arch=sm_90 -o reclaim scripts/llama/reclaim_probe.cu -lcublas
//     for m in none graph graph-destroyed async cublas graph-cublas graph-cublas-warm \
//              graph-cublas-create graph-cublas-create-f16 graph-cublas-decode \
//              graph-cublas-decode-f16; do ./reclaim $m; done
//
// Modes (what runs before the card is filled):
// - `none`: nothing beyond the context;
// - `graph`: a CUDA graph of `NODES` kernel launches captured from a stream, instantiated,
//   launched once, and kept (ik_llama.cpp captures its one-token warm-up);
// - `graph-destroyed`: the same graph, then its executable and the graph destroyed;
// - `async`: 256 MiB from the stream-ordered allocator, freed on the stream, stream synchronized;
// - `cublas`: a cuBLAS handle and one SGEMM (its workspace comes from the driver);
// - `graph-cublas`: a cuBLAS handle whose first SGEMM is captured into a graph, which is
//   instantiated, launched once and kept: ik_llama.cpp's warm-up, the engine's first compute, is
//   one captured token, and where it multiplies through cuBLAS (f16 weights, the MoE's f32
//   router) the handle's workspace is made inside the capture (cuBLAS 12.2 and later take it
//   with cudaMallocAsync, which under capture is a graph allocation node: graph memory);
// - `graph-cublas-warm`: the same, with one SGEMM on the handle before the capture;
// - `graph-cublas-create`: the handle itself made inside the capture, as ik_llama.cpp makes it
//   (`cublas_handle()` creates it at the first multiplication that needs it, TF32 math), then one
//   SGEMM captured; `graph-cublas-create-f16`: the same with an f16 GEMM (f16 weights' path);
// - `graph-cublas-decode`, `graph-cublas-decode-f16`: the same with one token's products, as the
//   warm-up multiplies: the MoE's f32 router (128 x 2048 by one column) and Phi-3's f16
//   feed-forward down projection (3072 x 8192 by one column); cuBLAS may pick other kernels,
//   with a workspace, for a single column than for a square product.
//
// Then the card is held by 2 MiB allocations down to about 40 MiB free, and cudaMalloc is asked
// for the free memory plus 2, 4, ... MiB until it fails: `beyond_mib` is the most it got above
// the free figure (0 when even the free memory plus 2 MiB failed).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstring>
#include <vector>

static const size_t MiB = 1 << 20;
static const int NODES = 4000;

static size_t free_now() {
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    return f;
}

__global__ void touch(float * x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

static bool run_graph(bool destroy) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float * x = nullptr;
    cudaMalloc(&x, 4096 * sizeof(float));
    cudaGraph_t g;
    cudaGraphExec_t e;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    for (int i = 0; i < NODES; ++i) {
        touch<<<16, 256, 0, s>>>(x, 4096);
    }
    if (cudaStreamEndCapture(s, &g) != cudaSuccess) return false;
    if (cudaGraphInstantiate(&e, g, nullptr, nullptr, 0) != cudaSuccess) return false;
    cudaGraphLaunch(e, s);
    bool ok = cudaStreamSynchronize(s) == cudaSuccess;
    if (destroy) {
        cudaGraphExecDestroy(e);
        cudaGraphDestroy(g);
    }
    return ok;
}

static bool run_async() {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    void * p = nullptr;
    if (cudaMallocAsync(&p, 256 * MiB, s) != cudaSuccess) return false;
    cudaMemsetAsync(p, 0, 256 * MiB, s);
    cudaFreeAsync(p, s);
    return cudaStreamSynchronize(s) == cudaSuccess;
}

// Three 1024 x 1024 f32 matrices for one SGEMM.
struct Operands {
    float *a, *b, *c;
};

static const int GEMM_N = 1024;

static Operands operands() {
    Operands o;
    cudaMalloc(&o.a, GEMM_N * GEMM_N * sizeof(float));
    cudaMalloc(&o.b, GEMM_N * GEMM_N * sizeof(float));
    cudaMalloc(&o.c, GEMM_N * GEMM_N * sizeof(float));
    return o;
}

static bool sgemm(cublasHandle_t h, const Operands & o) {
    const float one = 1.0f, zero = 0.0f;
    const int n = GEMM_N;
    return cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, o.a, n, o.b, n, &zero, o.c, n) == CUBLAS_STATUS_SUCCESS;
}

static bool run_cublas() {
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return false;
    const Operands o = operands();
    return sgemm(h, o) && cudaDeviceSynchronize() == cudaSuccess;
}

// Ends the capture on `s`, instantiates the graph and launches it once, keeping both (the
// modes below hold their graph while the card is filled); false on any error, or where the
// captured work failed (`captured`).
static bool launch_captured(cudaStream_t s, bool captured) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    if (cudaStreamEndCapture(s, &g) != cudaSuccess || !captured) return false;
    if (cudaGraphInstantiate(&e, g, nullptr, nullptr, 0) != cudaSuccess) return false;
    cudaGraphLaunch(e, s);
    return cudaStreamSynchronize(s) == cudaSuccess;
}

static bool run_graph_cublas(bool warm) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    const Operands o = operands();
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return false;
    cublasSetStream(h, s);
    if (warm && (!sgemm(h, o) || cudaStreamSynchronize(s) != cudaSuccess)) return false;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    const bool ok = sgemm(h, o);
    return launch_captured(s, ok);
}

static bool gemm_f16(cublasHandle_t h, const Operands & o) {
    // The f32 buffers hold the f16 operands (half the bytes); the result is f32.
    const float one = 1.0f, zero = 0.0f;
    const int n = GEMM_N;
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, o.a, CUDA_R_16F, n, o.b, CUDA_R_16F, n,
                        &zero, o.c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP) ==
           CUBLAS_STATUS_SUCCESS;
}

// A cuBLAS handle made while `s` captures, as ik_llama.cpp's `cublas_handle()` makes it (TF32
// math), bound to `s`.
static bool handle_in_capture(cudaStream_t s, cublasHandle_t * h) {
    return cublasCreate(h) == CUBLAS_STATUS_SUCCESS &&
           cublasSetMathMode(*h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS &&
           cublasSetStream(*h, s) == CUBLAS_STATUS_SUCCESS;
}

static bool run_graph_cublas_create(bool f16) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    const Operands o = operands();
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    cublasHandle_t h;
    const bool ok = handle_in_capture(s, &h) && (f16 ? gemm_f16(h, o) : sgemm(h, o));
    return launch_captured(s, ok);
}

// One token's product through a handle made inside the capture (see the modes above).
static bool run_graph_cublas_decode(bool f16) {
    const int m = f16 ? 3072 : 128, k = f16 ? 8192 : 2048, n = 1;
    const size_t elt = f16 ? 2 : 4;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    void *w, *x, *y;
    cudaMalloc(&w, (size_t) m * k * elt);
    cudaMalloc(&x, (size_t) k * n * elt);
    cudaMalloc(&y, (size_t) m * n * sizeof(float));
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = f16 ? CUDA_R_16F : CUDA_R_32F;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    cublasHandle_t h;
    const bool ok = handle_in_capture(s, &h) &&
              cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, t, k, x, t, k, &zero, y, CUDA_R_32F, m,
                           f16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT_TENSOR_OP) ==
                  CUBLAS_STATUS_SUCCESS;
    return launch_captured(s, ok);
}

int main(int argc, char ** argv) {
    const char * mode = argc > 1 ? argv[1] : "none";
    if (cudaFree(0) != cudaSuccess) {
        printf("{\"error\":\"no CUDA device\"}\n");
        return 1;
    }
    const size_t f0 = free_now();
    bool ok = true;
    if (!strcmp(mode, "graph")) ok = run_graph(false);
    else if (!strcmp(mode, "graph-destroyed")) ok = run_graph(true);
    else if (!strcmp(mode, "async")) ok = run_async();
    else if (!strcmp(mode, "cublas")) ok = run_cublas();
    else if (!strcmp(mode, "graph-cublas")) ok = run_graph_cublas(false);
    else if (!strcmp(mode, "graph-cublas-warm")) ok = run_graph_cublas(true);
    else if (!strcmp(mode, "graph-cublas-create")) ok = run_graph_cublas_create(false);
    else if (!strcmp(mode, "graph-cublas-create-f16")) ok = run_graph_cublas_create(true);
    else if (!strcmp(mode, "graph-cublas-decode")) ok = run_graph_cublas_decode(false);
    else if (!strcmp(mode, "graph-cublas-decode-f16")) ok = run_graph_cublas_decode(true);
    else if (strcmp(mode, "none")) {
        printf("{\"error\":\"unknown mode %s: none, graph, graph-destroyed, async, cublas, graph-cublas, graph-cublas-warm, graph-cublas-create, graph-cublas-create-f16, graph-cublas-decode or graph-cublas-decode-f16\"}\n", mode);
        return 2;
    }
    const size_t f1 = free_now();
    std::vector<void *> held;
    while (free_now() > 42 * MiB) {
        void * p = nullptr;
        if (cudaMalloc(&p, 2 * MiB) != cudaSuccess) {
            (void) cudaGetLastError();
            break;
        }
        held.push_back(p);
    }
    const size_t f2 = free_now();
    size_t beyond = 0;
    for (size_t extra = 2 * MiB; extra <= 512 * MiB; extra += 2 * MiB) {
        void * p = nullptr;
        if (cudaMalloc(&p, f2 + extra) != cudaSuccess) {
            (void) cudaGetLastError();
            break;
        }
        beyond = extra;
        cudaFree(p);
    }
    const size_t f3 = free_now();
    printf("{\"mode\":\"%s\",\"ok\":%d,\"free_start_mib\":%.1f,\"work_took_mib\":%.1f,\"free_held_mib\":%.1f,"
           "\"beyond_mib\":%.1f,\"free_end_mib\":%.1f}\n",
           mode, ok, f0 / (double) MiB, ((double) f0 - (double) f1) / MiB, f2 / (double) MiB,
           beyond / (double) MiB, f3 / (double) MiB);
    for (void * h : held) cudaFree(h);
    return 0;
}
