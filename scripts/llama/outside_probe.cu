// The device memory outside an engine's buffers and pool that does not depend on the engine,
// term by term, on whatever GPU runs it: the CUDA context, a cuBLAS handle, cuBLAS's workspace
// and kernel modules at its first GEMM (f16 in, f32 out, as ggml's `ggml_cuda_op_mul_mat_cublas`
// calls `cublasGemmEx`), and a kernel module of one kernel loaded lazily. The planner's terms
// (runtime/src/planner/outside.rs) were measured on an H100 through llama.cpp's logs; this
// measures the same causes without an engine, so another GPU (an H200) can be compared:
//
//     nvcc -O2 -arch=sm_90 -o outside scripts/llama/outside_probe.cu -lcublas -lnvidia-ml
//     ./outside               # one JSON line, MiB
//     CUDA_MODULE_LOADING=EAGER ./outside
//
// Free memory before the context comes from NVML (the figure nvidia-smi shows); after it, from
// cudaMemGetInfo. Each step's figure is what the free memory fell by; the driver hands out whole
// 2 MiB pages.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nvml.h>
#include <cstdio>
#include <cstdlib>

static const double MiB = 1024.0 * 1024.0;

static size_t free_now() {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        fprintf(stderr, "cudaMemGetInfo failed\n");
        exit(1);
    }
    return f;
}

__global__ void touch(float * x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

int main() {
    if (nvmlInit() != NVML_SUCCESS) {
        fprintf(stderr, "nvmlInit failed\n");
        return 1;
    }
    nvmlDevice_t dev;
    nvmlMemory_t mem;
    char name[96] = {0};
    if (nvmlDeviceGetHandleByIndex(0, &dev) != NVML_SUCCESS || nvmlDeviceGetMemoryInfo(dev, &mem) != NVML_SUCCESS) {
        fprintf(stderr, "NVML could not read device 0\n");
        return 1;
    }
    nvmlDeviceGetName(dev, name, sizeof name);
    size_t before = mem.free;

    cudaFree(0);  // the context
    size_t ctx = free_now();

    // This program's own module, loaded at its first launch (lazily by default).
    float * x = nullptr;
    cudaMalloc(&x, 2 << 20);  // one 2 MiB page, taken off below
    size_t after_malloc = free_now();
    touch<<<1, 256>>>(x, 256);
    cudaDeviceSynchronize();
    size_t own_module = free_now();

    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    size_t handle = free_now();

    const int n = 1024;
    half *a = nullptr, *b = nullptr;
    float * c = nullptr;
    cudaMalloc(&a, n * n * sizeof(half));
    cudaMalloc(&b, n * n * sizeof(half));
    cudaMalloc(&c, n * n * sizeof(float));
    size_t operands = free_now();
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16F, n, b, CUDA_R_16F,
                                    n, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP);
    cudaDeviceSynchronize();
    size_t gemm = free_now();
    const char * loading = getenv("CUDA_MODULE_LOADING");
    int major = 0, minor = 0, driver = 0, runtime = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    printf("{\"gpu\": \"%s\", \"cc\": \"%d.%d\", \"driver_api\": %d, \"runtime\": %d, \"module_loading\": \"%s\", "
           "\"gemm_ok\": %s, \"free_before_mib\": %.1f, \"context_mib\": %.1f, \"own_module_mib\": %.1f, "
           "\"cublas_handle_mib\": %.1f, \"first_gemm_mib\": %.1f}\n",
           name, major, minor, driver, runtime, loading ? loading : "default (lazy)",
           s == CUBLAS_STATUS_SUCCESS ? "true" : "false", before / MiB, (before - ctx) / MiB,
           (after_malloc - own_module) / MiB, (own_module - handle) / MiB, (operands - gemm) / MiB);
    cublasDestroy(h);
    nvmlShutdown();
    return 0;
}
