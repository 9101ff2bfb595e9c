// Holds all but N GiB of a GPU's free memory until it is stopped (SIGTERM or SIGINT), to make a 12 GiB card of an 80 or 141 GiB one without touching the
// program under test. Plain cudaMalloc only: never managed memory.
//
//     ballast LEAVE_GIB [DEVICE]
//
// Prints one line when it holds the memory ("ballast: device D holds H MiB, F MiB free").
#include <cuda_runtime.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <unistd.h> // pause
#include <vector>

static volatile sig_atomic_t stop = 0;

static void on_signal(int) {
    stop = 1;
}

int main(int argc, char ** argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: ballast LEAVE_GIB [DEVICE]\n");
        return 2;
    }
    char * end = nullptr;
    const double leave_gib = strtod(argv[1], &end);
    if (end == argv[1] || *end != '\0' || !(leave_gib >= 0.0)) {
        fprintf(stderr, "ballast: LEAVE_GIB %s is not a number of GiB (0 or more)\n", argv[1]);
        return 2;
    }
    const int device = argc == 3 ? atoi(argv[2]) : 0;
    if (cudaSetDevice(device) != cudaSuccess) {
        fprintf(stderr, "ballast: no CUDA device %d\n", device);
        return 2;
    }
    const size_t leave = (size_t) (leave_gib * (1ull << 30));
    const size_t chunk_max = 1ull << 30;
    const size_t granule = 2ull << 20;
    std::vector<void *> held;
    size_t total = 0;
    for (;;) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        if (free_b <= leave + granule) {
            break;
        }
        size_t want = free_b - leave;
        want = want > chunk_max ? chunk_max : want - want % granule;
        void * p = nullptr;
        if (want == 0 || cudaMalloc(&p, want) != cudaSuccess) {
            cudaGetLastError();
            break;
        }
        held.push_back(p);
        total += want;
    }
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    printf("ballast: device %d holds %zu MiB, %zu MiB free\n", device, total >> 20, free_b >> 20);
    fflush(stdout);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    while (!stop) {
        pause();
    }
    for (void * p : held) {
        cudaFree(p);
    }
    return 0;
}
