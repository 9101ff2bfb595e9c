// Reads from the device what mainline ggml's flash-attention launch reads: the blocks per SM
// of its MMA kernel (cudaOccupancyMaxActiveBlocksPerMultiprocessor on the compiled kernel,
// with the dynamic shared memory the launch asks for) and the SM count, for the head sizes
// and column counts cupool's `llama` profiles use. Built against ggml's own headers:
//
//     nvcc -O2 -std=c++17 -arch=sm_90 --extended-lambda -I GGML/src/ggml-cuda -I GGML/src \
//          -I GGML/include scripts/llama/fattn_occupancy.cu -o fattn_occupancy && ./fattn_occupancy
//
// One JSON object per (head size, columns) on stdout: what `--fa-occupancy` takes.
#include "common.cuh"
#include "fattn-common.cuh"
#include "fattn-mma-f16.cuh"
#include "fattn-vec.cuh"

#include <cstdio>
#include <cstdlib>

// ggml defines these; the probe links nothing else of it.
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "fattn_occupancy: ggml abort at %s:%d (%s)\n", file, line, fmt);
    exit(1);
}

void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    fprintf(stderr, "fattn_occupancy: CUDA error %s in %s (%s:%d): %s\n", msg, func, file, line, stmt);
    exit(1);
}

template <int DKQ, int DV, int ncols1, int ncols2>
static void probe(int device, int cc, int nsm) {
    constexpr int ncols = ncols1 * ncols2;
    // The same arithmetic as ggml_cuda_flash_attn_ext_mma_f16_case.
    const int  nthreads       = ggml_cuda_fattn_mma_get_nthreads      (DKQ, DV, ncols, cc);
    const int  nbatch_fa      = ggml_cuda_fattn_mma_get_nbatch_fa     (DKQ, DV, ncols, cc);
    const int  nbatch_K2      = ggml_cuda_fattn_mma_get_nbatch_K2     (DKQ, DV, ncols, cc);
    const int  nbatch_V2      = ggml_cuda_fattn_mma_get_nbatch_V2     (DKQ, DV, ncols, cc);
    const int  nbatch_combine = ggml_cuda_fattn_mma_get_nbatch_combine(DKQ, DV, ncols, cc);
    const bool Q_in_reg       = ggml_cuda_fattn_mma_get_Q_in_reg      (DKQ, DV, ncols, cc);
    const int  nstages        = ggml_cuda_fattn_mma_get_nstages       (DKQ, DV, ncols1, ncols2, cc);
    const int  cols_per_warp  = std::min(ncols, get_cols_per_warp(cc));
    const int  nwarps         = nthreads / WARP_SIZE;

    const size_t kv_1 = nbatch_fa * std::max(nbatch_K2 + 4, nbatch_V2 + 4) * sizeof(half2);
    const size_t kv_2 = nbatch_fa * (nbatch_K2 + 4 + nbatch_V2 + 4) * sizeof(half2);
    const size_t q    = ncols * (DKQ/2 + 4) * sizeof(half2);
    const size_t mask = ncols1 * (nbatch_fa/2 + 4) * sizeof(half2);
    const size_t comb = nwarps * cols_per_warp * (nbatch_combine + 4) * sizeof(half2);
    const size_t kv   = nstages <= 1 ? kv_1 : kv_2;
    const size_t shared = std::max(comb, Q_in_reg ? std::max(q, kv + mask) : q + kv + mask);

    auto kernel = flash_attn_ext_f16<DKQ, DV, ncols1, ncols2, false, DKQ == 576>;
    cudaFuncAttributes attr;
    CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared));
    int blocks = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, nthreads, shared));
    printf("{\"device\": %d, \"cc\": %d, \"nsm\": %d, \"kernel\": \"mma\", \"head\": %d, \"ncols\": %d, \"ncols1\": %d, \"ncols2\": %d, "
           "\"threads\": %d, \"registers\": %d, \"shared_bytes\": %zu, \"launch_bound\": %d, \"blocks_per_sm\": %d}\n",
           device, cc, nsm, DKQ, ncols, ncols1, ncols2, nthreads, attr.numRegs, shared,
           ggml_cuda_fattn_mma_get_occupancy(DKQ, DV, ncols, cc), blocks);
}

// The vector kernel (one or two tokens): 128 threads, no dynamic shared memory.
template <int D, int cols, ggml_type type_KV>
static void probe_vec(int device, int cc, int nsm) {
    auto kernel = flash_attn_ext_vec<D, cols, type_KV, type_KV, false>;
    const int nthreads = ggml_cuda_fattn_vec_get_nthreads_host(cc);
    cudaFuncAttributes attr;
    CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    int blocks = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, nthreads, 0));
    printf("{\"device\": %d, \"cc\": %d, \"nsm\": %d, \"kernel\": \"vec\", \"head\": %d, \"ncols\": %d, \"kv\": \"%s\", "
           "\"threads\": %d, \"registers\": %d, \"shared_bytes\": %zu, \"launch_bound\": 1, \"blocks_per_sm\": %d}\n",
           device, cc, nsm, D, cols, type_KV == GGML_TYPE_F16 ? "f16" : "q8_0", nthreads, attr.numRegs,
           attr.sharedSizeBytes, blocks);
}

template <int D>
static void head(int device, int cc, int nsm) {
    // Every ncols1 × ncols2 the profiles pick for GQA ratios 1, 2, 4 and 8.
    probe<D, D,  8, 1>(device, cc, nsm); probe<D, D, 16, 1>(device, cc, nsm);
    probe<D, D, 32, 1>(device, cc, nsm); probe<D, D, 64, 1>(device, cc, nsm);
    probe<D, D,  4, 2>(device, cc, nsm); probe<D, D,  8, 2>(device, cc, nsm);
    probe<D, D, 16, 2>(device, cc, nsm); probe<D, D, 32, 2>(device, cc, nsm);
    probe<D, D,  2, 4>(device, cc, nsm); probe<D, D,  4, 4>(device, cc, nsm);
    probe<D, D,  8, 4>(device, cc, nsm); probe<D, D, 16, 4>(device, cc, nsm);
    probe<D, D,  1, 8>(device, cc, nsm); probe<D, D,  2, 8>(device, cc, nsm);
    probe<D, D,  4, 8>(device, cc, nsm); probe<D, D,  8, 8>(device, cc, nsm);
}

int main() {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const int cc  = 100*prop.major + 10*prop.minor;
    const int nsm = prop.multiProcessorCount;
    head<96>(device, cc, nsm);
    head<128>(device, cc, nsm);
    probe_vec<128, 1, GGML_TYPE_F16>(device, cc, nsm);
    probe_vec<128, 1, GGML_TYPE_Q8_0>(device, cc, nsm);
    probe_vec<128, 2, GGML_TYPE_Q8_0>(device, cc, nsm);
    probe_vec<64, 1, GGML_TYPE_Q8_0>(device, cc, nsm);
    return 0;
}
