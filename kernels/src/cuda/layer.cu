// What a transformer layer needs around attention.

// Deterministic embeddings: a token's vector is a hash of (token, dimension), in [-1, 1).
extern "C" __global__ void embed(const int *tokens, float *x, int n_tokens, int n_embd) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tokens * n_embd) return;
    unsigned int h = (unsigned int)tokens[i / n_embd] * 2654435761u ^ (unsigned int)(i % n_embd) * 2246822519u;
    h ^= h >> 15; h *= 2654435761u; h ^= h >> 13;
    x[i] = (float)(h & 0xffff) / 32768.0f - 1.0f;
}

// y = x / rms(x) * w, one block per row.
extern "C" __global__ void rms_norm(const float *x, const unsigned short *w, float *y, int n, float eps) {
    __shared__ float partial[32];
    const float *xr = x + (long long)blockIdx.x * n;
    float *yr = y + (long long)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    float scale = rsqrtf(partial[0] / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * h2f(w[i]);
}

// y[M][N] = x[M][K] (f32) . w[K][N] (f16), accumulating in f32. 64x64 tiles, 256 threads,
// 4x4 outputs a thread. If accumulate, y += the product (residual connections).
#define TM 64
#define TN 64
#define TK 16
extern "C" __global__ void __launch_bounds__(256)
matmul(const float *x, const unsigned short *w, float *y, int M, int N, int K, int accumulate) {
    __shared__ float xs[TK][TM + 1];
    __shared__ float ws[TK][TN];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TN;
    float c[4][4] = {{0}};
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int i = threadIdx.x; i < TM * TK; i += 256) {
            int r = i / TK, kk = i % TK;
            int gm = m0 + r, gk = k0 + kk;
            xs[kk][r] = (gm < M && gk < K) ? x[(long long)gm * K + gk] : 0.0f;
        }
        for (int i = threadIdx.x; i < TK * TN; i += 256) {
            int kk = i / TN, cc = i % TN;
            int gk = k0 + kk, gn = n0 + cc;
            ws[kk][cc] = (gk < K && gn < N) ? h2f(w[(long long)gk * N + gn]) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < TK; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
            for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) c[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        int gm = m0 + ty * 4 + i;
        if (gm >= M) continue;
        for (int j = 0; j < 4; ++j) {
            int gn = n0 + tx * 4 + j;
            if (gn >= N) continue;
            long long o = (long long)gm * N + gn;
            y[o] = accumulate ? y[o] + c[i][j] : c[i][j];
        }
    }
}

// SwiGLU in place: up = silu(gate) * up.
extern "C" __global__ void swiglu(float *up, const float *gate, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) up[i] *= gate[i] / (1.0f + __expf(-gate[i]));
}

// Fills f16 weights with a deterministic pseudo-random pattern of standard deviation `scale`.
extern "C" __global__ void init_weights(unsigned short *w, long long n, unsigned int seed, float scale) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int h = (unsigned int)i * 2654435761u ^ seed * 2246822519u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    w[i] = f2h(((float)(h & 0xffffff) / 8388608.0f - 1.0f) * scale * 1.7320508f);
}

// The same weights as init_weights (rounded to f16 first), stored as q8_0 rows: one warp per
// 32-value block, quantized as quantize_q8_0 does. n is a multiple of 32.
extern "C" __global__ void init_weights_q8_0(unsigned char *w, long long n, unsigned int seed, float scale) {
    long long b = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (b >= n / QK8_0) return;
    long long i = b * QK8_0 + lane;
    unsigned int h = (unsigned int)i * 2654435761u ^ seed * 2246822519u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    float x = h2f(f2h(((float)(h & 0xffffff) / 8388608.0f - 1.0f) * scale * 1.7320508f));
    float amax = warp_max(fabsf(x));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    unsigned char *blk = w + b * 34;
    if (lane == 0) {
        unsigned short dh = f2h(d);
        blk[0] = (unsigned char)(dh & 0xff);
        blk[1] = (unsigned char)(dh >> 8);
    }
    blk[2 + lane] = (unsigned char)(signed char)roundf(x * id);
}
