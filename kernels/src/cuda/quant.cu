// q8_0 as ggml stores it: blocks of 32 values, one f16 scale d = max|x| / 127, then 32 int8.
// Block layout in memory: [d (2 bytes)][qs (32 bytes)] = 34 bytes.

// One warp per block. `src` rows of `row_len` floats; writes rows [row0, row0 + n_rows) of `dst`.
extern "C" __global__ void quantize_q8_0(const float *src, unsigned char *dst, long long n_rows,
                                         long long row_len, long long row0) {
    long long blocks_per_row = row_len / QK8_0;
    long long b = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (b >= n_rows * blocks_per_row) return;
    long long r = b / blocks_per_row, c = b % blocks_per_row;
    float x = src[r * row_len + c * QK8_0 + lane];
    float amax = warp_max(fabsf(x));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    unsigned char *blk = dst + ((row0 + r) * blocks_per_row + c) * 34;
    if (lane == 0) {
        unsigned short dh = f2h(d);
        blk[0] = (unsigned char)(dh & 0xff);
        blk[1] = (unsigned char)(dh >> 8);
    }
    blk[2 + lane] = (unsigned char)(signed char)roundf(x * id);
}

// f32 rows -> f16 rows at row offset row0 (the f16 KV cache).
extern "C" __global__ void store_f16(const float *src, unsigned short *dst, long long n_rows,
                                     long long row_len, long long row0) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * row_len) return;
    dst[row0 * row_len + i] = f2h(src[i]);
}

// q8_0 rows [0, n_rows) -> f16, as ggml's K_f16/V_f16 conversion.
extern "C" __global__ void dequantize_q8_0(const unsigned char *src, unsigned short *dst,
                                           long long n_rows, long long row_len) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * row_len) return;
    long long b = i / QK8_0;
    const unsigned char *blk = src + b * 34;
    unsigned short dh = (unsigned short)blk[0] | ((unsigned short)blk[1] << 8);
    signed char q = (signed char)blk[2 + i % QK8_0];
    dst[i] = f2h((float)q * h2f(dh));
}
