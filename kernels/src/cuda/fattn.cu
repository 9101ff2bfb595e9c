// Flash attention: f32 queries, f16 K/V, f32 accumulation, causal, GQA, split-KV.
//
// Grid: (ceil(n_tokens / QPB), n_head, parallel_blocks). A block of WARPS warps handles QPB
// queries of one head; each warp owns QPW queries. Keys come in tiles of 32 through shared
// memory. For Q.K the lane is the key (no reduction per key); for P.V the lane is the output
// dimension. Split s of parallel_blocks covers its share of the key tiles and writes a partial
// normalised output plus (max, sum) to dst_tmp / dst_meta; fattn_combine merges them. With one
// split the result goes straight to dst.
//
// Layouts: q [n_tokens][n_head][D_K] f32 (unscaled); k row p, kv head h at k + p*k_row + h*k_head;
// v likewise; dst [n_tokens][n_head][D_V] f32. Query t sits at position pos0 + t and sees keys
// at positions <= pos0 + t (and < n_kv).

#define WARPS 8
#define QPW 4
#define QPB (WARPS * QPW)
#define BK 32
#define MAX_DK 576
#define MAX_DV 512

extern "C" __global__ void __launch_bounds__(WARPS * 32)
fattn(const float *q, const unsigned short *k, const unsigned short *v, float *dst, float *dst_tmp,
      float *dst_meta, int n_tokens, int n_head, int n_head_kv, int d_k, int d_v, int n_kv, int pos0,
      long long k_row, long long k_head, long long v_row, long long v_head, float scale,
      int parallel_blocks) {
    extern __shared__ unsigned char smem_raw[];
    const int kstride = d_k + 2;  // odd number of 32-bit words per row: no bank conflicts
    unsigned short *ks = (unsigned short *)smem_raw;
    unsigned short *vs = ks + BK * kstride;
    float *qs = (float *)(vs + BK * d_v + (BK * d_v) % 2);  // [QPB][d_k], 4-byte aligned

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int head = blockIdx.y, head_kv = head / (n_head / n_head_kv);
    const int split = blockIdx.z;
    const int t0 = blockIdx.x * QPB;

    for (int i = threadIdx.x; i < QPB * d_k; i += blockDim.x) {
        int t = t0 + i / d_k;
        qs[i] = t < n_tokens ? q[((long long)t * n_head + head) * d_k + i % d_k] * scale : 0.0f;
    }

    // Keys this block can see at all, and this split's share of the tiles.
    int last_pos = min(pos0 + min(t0 + QPB, n_tokens) - 1, n_kv - 1);
    int n_tiles = last_pos / BK + 1;
    int per = (n_tiles + parallel_blocks - 1) / parallel_blocks;
    int tile_begin = split * per, tile_end = min(n_tiles, tile_begin + per);

    const int dv_per_lane = (d_v + 31) / 32;  // <= 16
    float acc[QPW][MAX_DV / 32];
    float m[QPW], l[QPW];
#pragma unroll
    for (int j = 0; j < QPW; ++j) {
        m[j] = -INFINITY;
        l[j] = 0.0f;
        for (int c = 0; c < MAX_DV / 32; ++c) acc[j][c] = 0.0f;
    }

    for (int tile = tile_begin; tile < tile_end; ++tile) {
        const int kp0 = tile * BK;
        __syncthreads();
        for (int i = threadIdx.x; i < BK * d_k; i += blockDim.x) {
            int r = i / d_k, c = i % d_k, p = kp0 + r;
            ks[r * kstride + c] = p < n_kv ? k[(long long)p * k_row + (long long)head_kv * k_head + c] : 0;
        }
        for (int i = threadIdx.x; i < BK * d_v; i += blockDim.x) {
            int r = i / d_v, c = i % d_v, p = kp0 + r;
            vs[r * d_v + c] = p < n_kv ? v[(long long)p * v_row + (long long)head_kv * v_head + c] : 0;
        }
        __syncthreads();

        // Scores: lane = key.
        float s[QPW];
        for (int j = 0; j < QPW; ++j) s[j] = 0.0f;
        const unsigned short *krow = ks + lane * kstride;
        const float *qw = qs + warp * QPW * d_k;
        for (int c = 0; c < d_k; ++c) {
            float kv = h2f(krow[c]);
            for (int j = 0; j < QPW; ++j) s[j] += qw[j * d_k + c] * kv;
        }
        const int kp = kp0 + lane;
#pragma unroll
        for (int j = 0; j < QPW; ++j) {
            int t = t0 + warp * QPW + j;
            bool visible = t < n_tokens && kp < n_kv && kp <= pos0 + t;
            float sj = visible ? s[j] : -INFINITY;
            float tile_max = warp_max(sj);
            float m_new = fmaxf(m[j], tile_max);
            if (m_new == -INFINITY) continue;  // nothing visible yet for this query
            float p = visible ? __expf(sj - m_new) : 0.0f;
            float corr = __expf(m[j] - m_new);
            l[j] = l[j] * corr + warp_sum(p);
            m[j] = m_new;
#pragma unroll
            for (int c = 0; c < MAX_DV / 32; ++c) acc[j][c] *= corr;
            // Output: lane = dimension; broadcast each key's weight.
            for (int r = 0; r < BK; ++r) {
                float pr = __shfl_sync(0xffffffffu, p, r);
                if (pr == 0.0f) continue;
                const unsigned short *vrow = vs + r * d_v;
#pragma unroll
                for (int c = 0; c < MAX_DV / 32; ++c) {
                    int d = lane + 32 * c;
                    if (c < dv_per_lane && d < d_v) acc[j][c] += pr * h2f(vrow[d]);
                }
            }
        }
    }

#pragma unroll
    for (int j = 0; j < QPW; ++j) {
        int t = t0 + warp * QPW + j;
        if (t >= n_tokens) continue;
        float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
        long long row = (long long)t * n_head + head;
        float *out = parallel_blocks == 1 ? dst + row * d_v
                                          : dst_tmp + ((long long)split * n_tokens * n_head + row) * d_v;
#pragma unroll
        for (int c = 0; c < MAX_DV / 32; ++c) {
            int d = lane + 32 * c;
            if (c < dv_per_lane && d < d_v) out[d] = acc[j][c] * inv;
        }
        if (parallel_blocks > 1 && lane == 0) {
            float *meta = dst_meta + ((long long)split * n_tokens * n_head + row) * 2;
            meta[0] = m[j];
            meta[1] = l[j];
        }
    }
}

// Merges split partials: one block per (token, head), threads over D_V.
extern "C" __global__ void fattn_combine(const float *dst_tmp, const float *dst_meta, float *dst,
                                         int n_rows, int d_v, int parallel_blocks) {
    long long row = blockIdx.x;
    if (row >= n_rows) return;
    float mx = -INFINITY;
    for (int s = 0; s < parallel_blocks; ++s) mx = fmaxf(mx, dst_meta[((long long)s * n_rows + row) * 2]);
    for (int d = threadIdx.x; d < d_v; d += blockDim.x) {
        float num = 0.0f, den = 0.0f;
        for (int s = 0; s < parallel_blocks; ++s) {
            const float *meta = dst_meta + ((long long)s * n_rows + row) * 2;
            if (meta[1] == 0.0f) continue;
            float w = __expf(meta[0] - mx) * meta[1];
            num += w * dst_tmp[((long long)s * n_rows + row) * d_v + d];
            den += w;
        }
        dst[row * d_v + d] = den > 0.0f ? num / den : 0.0f;
    }
}
