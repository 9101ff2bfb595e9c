// Does the CUDA driver give back the local memory (per-thread stacks) its kernels grew, when a
// cudaMalloc would otherwise fail? ik_llama.cpp's MoE runs at 10 GiB free saw the device's free
// memory fall 28-30 MiB less than the pool grew, in the growth that left it nearly full
// (data/h100-2026-11-27-ik-warmup). Prints one JSON line per step.
//
//     nvcc -O2 -o lmem_giveback scripts/llama/lmem_giveback.cu && ./lmem_giveback
//
// 1. `start`: free memory, and the stack limit per thread.
// 2. `kernel`: after a kernel whose threads each use `lmem` bytes of local memory (a dynamically
//    indexed array), over a grid that fills every SM: what the driver took for the stacks.
// 3. `edge`: the rest of the card held by 2 MiB allocations so that `left` MiB are free, then a
//    cudaMalloc of `ask` MiB (more than is free, less than free plus the stacks): whether it
//    succeeds, and the free memory after it.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

static const size_t MiB = 1 << 20;

static size_t free_now() {
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    return f;
}

template <int N>
__global__ void stack_user(int * out, int k) {
    volatile char buf[N];
    for (int i = 0; i < N; ++i) {
        buf[i] = (char) (i + threadIdx.x);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = buf[(k + threadIdx.x) % N];
}

int main() {
    if (cudaFree(0) != cudaSuccess) {
        printf("{\"error\":\"no CUDA device\"}\n");
        return 1;
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    size_t stack = 0;
    cudaDeviceGetLimit(&stack, cudaLimitStackSize);
    const size_t f0 = free_now();
    printf("{\"what\":\"start\",\"free_mib\":%.1f,\"stack_bytes\":%zu,\"sms\":%d,\"threads_per_sm\":%d}\n",
           f0 / (double) MiB, stack, prop.multiProcessorCount, prop.maxThreadsPerMultiProcessor);
    const int blocks = prop.multiProcessorCount * (prop.maxThreadsPerMultiProcessor / 256) * 4;
    int * out = nullptr;
    cudaMalloc(&out, (size_t) blocks * 256 * sizeof(int));
    const size_t f1 = free_now();
    stack_user<2048><<<blocks, 256>>>(out, 7);
    cudaError_t e = cudaDeviceSynchronize();
    cudaDeviceGetLimit(&stack, cudaLimitStackSize);
    const size_t f2 = free_now();
    const double lmem = (double) (f1 - f2) / MiB;
    printf("{\"what\":\"kernel\",\"ok\":%d,\"lmem_per_thread\":2048,\"stack_bytes\":%zu,\"free_drop_mib\":%.1f}\n",
           e == cudaSuccess, stack, lmem);
    // Hold the card in 2 MiB allocations until `left` MiB are free.
    const double left = 40.0;
    std::vector<void *> held;
    while (free_now() > (size_t) ((left + 2.0) * MiB)) {
        void * p = nullptr;
        if (cudaMalloc(&p, 2 * MiB) != cudaSuccess) {
            (void) cudaGetLastError();
            break;
        }
        held.push_back(p);
    }
    const size_t f3 = free_now();
    const double ask = f3 / (double) MiB + lmem / 2;
    void * p = nullptr;
    e = cudaMalloc(&p, (size_t) (ask * MiB));
    const size_t f4 = free_now();
    (void) cudaGetLastError();
    printf("{\"what\":\"edge\",\"free_before_mib\":%.1f,\"ask_mib\":%.1f,\"ok\":%d,\"free_after_mib\":%.1f}\n",
           f3 / (double) MiB, ask, e == cudaSuccess, f4 / (double) MiB);
    // The kernel again: does it take its stacks back?
    if (p) cudaFree(p);
    stack_user<2048><<<blocks, 256>>>(out, 9);
    e = cudaDeviceSynchronize();
    printf("{\"what\":\"again\",\"ok\":%d,\"free_mib\":%.1f}\n", e == cudaSuccess, free_now() / (double) MiB);
    for (void * h : held) cudaFree(h);
    return 0;
}
