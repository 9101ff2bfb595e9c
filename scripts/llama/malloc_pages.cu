// What a cudaMalloc takes from the device's free memory, and how much free memory it needs to
// succeed: the rule behind a plan's last MiB at start-up (ggml's KV cache and compute buffer are
// one cudaMalloc each). Prints one JSON line per measurement.
//
//     nvcc -O2 -o malloc_pages scripts/llama/malloc_pages.cu && ./malloc_pages
//
// 1. `taken`: the drop in free memory (cudaMemGetInfo) of one cudaMalloc of each size.
// 2. `stream`/`event`: what a stream and an event take (ggml's backend makes one stream per
//    device at context creation).
// 3. `edge`: with the rest of the card held by 2 MiB allocations so that `free` MiB are left, does
//    a cudaMalloc of `size` succeed? For each size, the least free memory where it does.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

static const size_t MiB = 1 << 20;

static size_t free_now() {
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    return f;
}

int main() {
    if (cudaFree(0) != cudaSuccess) {
        printf("{\"error\":\"no CUDA device\"}\n");
        return 1;
    }
    const double sizes_mib[] = {0.5, 1.0, 2.0, 2.5, 123.78, 247.56, 300.75, 302.0, 341.54, 1024.0, 4096.3};
    for (double s : sizes_mib) {
        size_t bytes = (size_t) (s * MiB);
        size_t before = free_now();
        void * p = nullptr;
        cudaError_t e = cudaMalloc(&p, bytes);
        size_t after = free_now();
        printf("{\"what\":\"taken\",\"size_mib\":%.4f,\"ok\":%d,\"free_drop_mib\":%.4f}\n", bytes / (double) MiB,
               e == cudaSuccess, (double) (before - after) / MiB);
        if (p) cudaFree(p);
    }
    {
        size_t before = free_now();
        cudaStream_t st;
        cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
        size_t mid = free_now();
        cudaEvent_t ev;
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        size_t after = free_now();
        printf("{\"what\":\"stream\",\"free_drop_mib\":%.4f}\n", (double) (before - mid) / MiB);
        printf("{\"what\":\"event\",\"free_drop_mib\":%.4f}\n", (double) (mid - after) / MiB);
        // a kernel-free stream's first use
        void * p = nullptr;
        cudaMalloc(&p, 2 * MiB);
        cudaMemsetAsync(p, 0, 2 * MiB, st);
        cudaStreamSynchronize(st);
        size_t used = free_now();
        printf("{\"what\":\"stream_first_use\",\"free_drop_mib\":%.4f}\n", (double) (after - used) / MiB - 2.0);
        cudaFree(p);
    }
    // The edge: hold all but `left` MiB in 2 MiB pieces (and one large piece), then try.
    const double edge_sizes[] = {1.0, 123.78, 247.56, 300.75, 341.54};
    for (double s : edge_sizes) {
        size_t bytes = (size_t) (s * MiB);
        double least_ok = -1;
        for (int extra_kib = -2048; extra_kib <= 8192; extra_kib += 256) {
            // hold everything but bytes + extra
            std::vector<void *> held;
            size_t target_left = bytes + (long long) extra_kib * 1024;
            size_t f = free_now();
            if (f > target_left + 64 * MiB) {
                size_t big = (f - target_left - 32 * MiB) / (2 * MiB) * (2 * MiB);
                void * p = nullptr;
                if (cudaMalloc(&p, big) == cudaSuccess) held.push_back(p);
            }
            while (free_now() >= target_left + 2 * MiB) {
                void * p = nullptr;
                if (cudaMalloc(&p, 2 * MiB) != cudaSuccess) break;
                held.push_back(p);
            }
            size_t left = free_now();
            void * p = nullptr;
            cudaError_t e = cudaMalloc(&p, bytes);
            cudaGetLastError();
            printf("{\"what\":\"edge\",\"size_mib\":%.4f,\"free_mib\":%.4f,\"ok\":%d}\n", bytes / (double) MiB,
                   left / (double) MiB, e == cudaSuccess);
            if (p) cudaFree(p);
            for (void * h : held) cudaFree(h);
            if (e == cudaSuccess && least_ok < 0) least_ok = left / (double) MiB;
        }
        printf("{\"what\":\"edge_least\",\"size_mib\":%.4f,\"least_free_mib_that_worked\":%.4f}\n", bytes / (double) MiB,
               least_ok);
    }
    return 0;
}
