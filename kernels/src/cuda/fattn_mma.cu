// Flash attention on tensor cores: mma.sync m16n8k16 (f16 inputs, f32 accumulation), sm_80+.
//
// Same contract as `fattn` in fattn.cu (layouts, causal positions, split-KV partials that
// `fattn_combine` merges), different work split:
// - Rows are (token, head of the KV group) pairs: a block works on BQ rows of ONE KV head, so
//   each K/V tile it loads serves every query head of the group (GQA), and a decode token of
//   Llama-3 fills 4 rows instead of 1.
// - Q is scaled (by scale * log2 e, so the softmax runs on exp2) and converted to f16 in shared
//   memory once, as ggml converts Q before its MMA kernel.
// - K and V come in tiles of BK keys (64 for most shapes) through cp.async, the next K tile loading while this tile's
//   softmax and P.V run, the next V tile while the next S = Q.K^T runs.
// - The 4 warps of a block are RW row groups x CW column groups. With CW = 1 a warp owns MT
//   16-row m-tiles over all BK keys and all of D_V: P never leaves registers (the accumulator
//   layout of two n-tiles is the A-fragment layout of one k-step). Wide heads (D_V 256, 512)
//   do not fit a warp's registers that way, so with CW > 1 the warps of a row group split the
//   keys of S and the dimensions of O, agree on the row max through shared memory, and share P
//   through shared memory.
// Shared-memory rows are padded by 8 halves (16 bytes): 8 consecutive rows then start in 8
// different 16-byte bank groups, so ldmatrix reads them without conflicts.

#define FA_WARPS 4
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

__device__ __forceinline__ unsigned smem_addr(const void *p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// 16 bytes global -> shared, bypassing L1; `bytes` 0 fills zeros (keys past the cache).
__device__ __forceinline__ void cp_async16(unsigned dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a . b for one m16n8k16 tile.
__device__ __forceinline__ void mma16816(float *c, const unsigned *a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats into one f16x2 register, `lo` in the low half (the lower column).
__device__ __forceinline__ unsigned pack_h2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <int DK, int DV, int MT, int CW, int BK>
__device__ __forceinline__ void
fattn_mma_body(const float *__restrict__ q, const unsigned short *__restrict__ k,
               const unsigned short *__restrict__ v, float *__restrict__ dst, float *__restrict__ dst_tmp,
               float *__restrict__ dst_meta, int n_tokens, int n_head, int n_head_kv, int n_kv, int pos0,
               long long k_row, long long k_head, long long v_row, long long v_head, float scale,
               int parallel_blocks) {
    constexpr int RW = FA_WARPS / CW;     // row groups
    constexpr int BQ = 16 * MT * RW;      // rows of a block
    constexpr int KS = DK + 8;            // shared row strides, in halves
    constexpr int VS = DV + 8;
    constexpr int PS = BK + 8;
    constexpr int KEYS_W = BK / CW;    // keys of S a warp computes
    constexpr int NTS = KEYS_W / 8;       // ... in n-tiles
    constexpr int DV_W = DV / CW;         // output dimensions a warp owns
    constexpr int NTO = DV_W / 8;         // ... in n-tiles
    static_assert(DK % 16 == 0 && DV % 16 == 0 && NTS % 2 == 0 && NTO % 2 == 0, "tile shapes");
    // One m-tile of a head up to 128 wide keeps its Q fragments in registers (32 at most):
    // the K fragments are then the only shared-memory reads of S = Q.K^T.
    constexpr bool Q_REG = MT == 1 && CW == 1 && DK <= 128;

    extern __shared__ __align__(16) unsigned char fa_smem[];
    // V is a view of K (MLA as ggml runs it): the K tile already holds V's dimensions.
    const bool v_in_k = v == k && v_row == k_row && v_head == k_head && DV <= DK;
    unsigned short *qs = (unsigned short *)fa_smem;
    unsigned short *ks = qs + BQ * KS;
    unsigned short *vs = v_in_k ? ks : ks + BK * KS;
    const int vstride = v_in_k ? KS : VS;
    unsigned short *ps = ks + BK * KS + (v_in_k ? 0 : BK * VS);  // P, when CW > 1
    float *red = (float *)(ps + (CW > 1 ? BQ * PS : 0));                // [BQ][CW]

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rw = warp / CW, cw = warp % CW;
    const int g = lane / 4, c = lane % 4;
    const int group = n_head / n_head_kv;
    const int n_rows = n_tokens * group;
    const int hkv = blockIdx.y, split = blockIdx.z;
    const int r0 = blockIdx.x * BQ;

    // Q rows, scaled, as f16 pairs.
    for (int i = threadIdx.x; i < BQ * DK / 2; i += FA_WARPS * 32) {
        const int row = i / (DK / 2), c2 = i % (DK / 2), r = r0 + row;
        unsigned h = 0;
        if (r < n_rows) {
            const int t = r / group, head = hkv * group + r % group;
            const float2 x = *(const float2 *)(q + ((long long)t * n_head + head) * DK + 2 * c2);
            h = pack_h2(x.x * scale * FA_LOG2E, x.y * scale * FA_LOG2E);
        }
        *(unsigned *)(qs + row * KS + 2 * c2) = h;
    }

    unsigned qf[Q_REG ? DK / 16 : 1][4];
    if constexpr (Q_REG) {
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < DK / 16; ++kk)
            ldsm_x4(smem_addr(qs + (rw * 16 + lane % 16) * KS + kk * 16 + (lane / 16) * 8), qf[kk]);
    }

    // The keys the block's rows can see, and this split's share of the tiles.
    const int t_min = r0 / group;
    const int t_max = (min(r0 + BQ, n_rows) - 1) / group;
    const int last_pos = min(pos0 + t_max, n_kv - 1);
    const int n_tiles = last_pos / BK + 1;
    const int per = (n_tiles + parallel_blocks - 1) / parallel_blocks;
    const int tile_begin = split * per, tile_end = min(n_tiles, tile_begin + per);

    // The last key each of this thread's rows may see (-1: a row past the end).
    int limit[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = r0 + (rw * MT + mt) * 16 + g + 8 * h;
            limit[mt][h] = r < n_rows ? pos0 + r / group : -1;
        }

    auto load_rows = [&](unsigned short *to, int stride, const unsigned short *from, long long row,
                         long long head, int dims, int kp0) {
        const int chunks = dims / 8;
        for (int i = threadIdx.x; i < BK * chunks; i += FA_WARPS * 32) {
            const int r = i / chunks, ch = i % chunks, p = kp0 + r;
            const unsigned short *src = from + (long long)min(p, n_kv - 1) * row + hkv * head + ch * 8;
            cp_async16(smem_addr(to + r * stride + ch * 8), src, p < n_kv ? 16 : 0);
        }
    };

    float o[MT][NTO][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            m[mt][h] = -INFINITY;
            l[mt][h] = 0.0f;
        }
#pragma unroll
        for (int n = 0; n < NTO; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.0f;
    }

    if (tile_begin < tile_end) {
        load_rows(ks, KS, k, k_row, k_head, DK, tile_begin * BK);
        cp_async_commit();
        if (!v_in_k) load_rows(vs, VS, v, v_row, v_head, DV, tile_begin * BK);
        cp_async_commit();
    }

    for (int tile = tile_begin; tile < tile_end; ++tile) {
        const int kp0 = tile * BK;
        // K of this tile (with V in K the previous tile's load is the only one pending).
        if (v_in_k) cp_async_wait<0>();
        else cp_async_wait<1>();
        __syncthreads();

        // S = Q . K^T for this warp's rows and keys.
        float s[MT][NTS][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NTS; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][n][e] = 0.0f;
#pragma unroll(Q_REG ? DK / 16 : 4)
        for (int kk = 0; kk < DK / 16; ++kk) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if constexpr (Q_REG) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[mt][e] = qf[kk][e];
                } else {
                    ldsm_x4(smem_addr(qs + ((rw * MT + mt) * 16 + lane % 16) * KS + kk * 16 + (lane / 16) * 8), a[mt]);
                }
            }
#pragma unroll
            for (int np = 0; np < NTS / 2; ++np) {
                const int key = cw * KEYS_W + np * 16 + (lane / 16) * 8 + lane % 8;
                unsigned b[4];
                ldsm_x4(smem_addr(ks + key * KS + kk * 16 + ((lane / 8) % 2) * 8), b);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816(s[mt][2 * np], a[mt], b[0], b[1]);
                    mma16816(s[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
            }
        }
        // The K buffer is free once every warp has its S: start the next K tile.
        if (!v_in_k) {
            __syncthreads();
            if (tile + 1 < tile_end) load_rows(ks, KS, k, k_row, k_head, DK, kp0 + BK);
        }
        cp_async_commit();

        // Causal and cache-end mask, only on tiles some row cannot fully see.
        const bool full = kp0 + BK - 1 <= pos0 + t_min && kp0 + BK <= n_kv;
        if (!full) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int n = 0; n < NTS; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int kp = kp0 + cw * KEYS_W + n * 8 + 2 * c + (e & 1);
                        if (kp > limit[mt][e / 2] || kp >= n_kv) s[mt][n][e] = -INFINITY;
                    }
        }

        // Online softmax (log2 domain).
        float mx[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float x = -INFINITY;
#pragma unroll
                for (int n = 0; n < NTS; ++n) x = fmaxf(x, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
                mx[mt][h] = x;
            }
        if constexpr (CW > 1) {
            // Row maxima over the warps that split the keys.
            if (c == 0)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        red[((rw * MT + mt) * 16 + g + 8 * h) * CW + cw] = mx[mt][h];
            __syncthreads();
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int w = 0; w < CW; ++w)
                        mx[mt][h] = fmaxf(mx[mt][h], red[((rw * MT + mt) * 16 + g + 8 * h) * CW + w]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float m_new = fmaxf(m[mt][h], mx[mt][h]);
                // A row that has seen nothing yet stays at zero weight (no inf - inf).
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                const float corr = ex2(m[mt][h] - m_use);
                m[mt][h] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < NTS; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float p = ex2(s[mt][n][2 * h + e] - m_use);
                        s[mt][n][2 * h + e] = p;
                        sum += p;
                    }
                l[mt][h] = l[mt][h] * corr + sum;
#pragma unroll
                for (int n = 0; n < NTO; ++n) {
                    o[mt][n][2 * h] *= corr;
                    o[mt][n][2 * h + 1] *= corr;
                }
            }
        if constexpr (CW > 1) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int n = 0; n < NTS; ++n)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = (rw * MT + mt) * 16 + g + 8 * h;
                        *(unsigned *)(ps + row * PS + cw * KEYS_W + n * 8 + 2 * c) =
                            pack_h2(s[mt][n][2 * h], s[mt][n][2 * h + 1]);
                    }
        }

        // V of this tile (and, with CW > 1, every warp's P) ready.
        cp_async_wait<1>();
        __syncthreads();

        // O += P . V over the tile's BK keys, for this warp's dimensions.
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if constexpr (CW == 1) {
                    a[mt][0] = pack_h2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    a[mt][1] = pack_h2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    a[mt][2] = pack_h2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    a[mt][3] = pack_h2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                } else {
                    ldsm_x4(smem_addr(ps + ((rw * MT + mt) * 16 + lane % 16) * PS + kk * 16 + (lane / 16) * 8), a[mt]);
                }
            }
#pragma unroll
            for (int np = 0; np < NTO / 2; ++np) {
                const int key = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8;
                const int dim = cw * DV_W + np * 16 + (lane / 16) * 8;
                unsigned b[4];
                ldsm_x4_t(smem_addr(vs + key * vstride + dim), b);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816(o[mt][2 * np], a[mt], b[0], b[1]);
                    mma16816(o[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
            }
        }
        __syncthreads();
        // The V buffer (or, with V in K, the K buffer) is free: start the next tile's load.
        if (tile + 1 < tile_end) {
            if (v_in_k) load_rows(ks, KS, k, k_row, k_head, DK, kp0 + BK);
            else load_rows(vs, VS, v, v_row, v_head, DV, kp0 + BK);
        }
        cp_async_commit();
    }

    // Row sums: over the quad, then over the warps that split the keys.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 1);
            l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 2);
        }
    if constexpr (CW > 1) {
        __syncthreads();
        if (c == 0)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) red[((rw * MT + mt) * 16 + g + 8 * h) * CW + cw] = l[mt][h];
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float sum = 0.0f;
#pragma unroll
                for (int w = 0; w < CW; ++w) sum += red[((rw * MT + mt) * 16 + g + 8 * h) * CW + w];
                l[mt][h] = sum;
            }
    }

#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = r0 + (rw * MT + mt) * 16 + g + 8 * h;
            if (r >= n_rows) continue;
            const int t = r / group, head = hkv * group + r % group;
            const long long row = (long long)t * n_head + head;
            const float inv = l[mt][h] > 0.0f ? 1.0f / l[mt][h] : 0.0f;
            float *out = parallel_blocks == 1
                             ? dst + row * DV
                             : dst_tmp + ((long long)split * n_tokens * n_head + row) * DV;
#pragma unroll
            for (int n = 0; n < NTO; ++n) {
                const int d = cw * DV_W + n * 8 + 2 * c;
                *(float2 *)(out + d) = make_float2(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
            }
            if (parallel_blocks > 1 && cw == 0 && c == 0) {
                float *meta = dst_meta + ((long long)split * n_tokens * n_head + row) * 2;
                meta[0] = m[mt][h] * FA_LN2;  // back to the natural-log domain of fattn_combine
                meta[1] = l[mt][h];
            }
        }
}

// One entry point per head shape: fattn_mma_<DK>_<DV>. MT, CW and BK (keys per tile) as chosen
// in fa.rs.
#define FA_MMA_ENTRY(DK, DV, MT, CW, BK)                                                                  \
    extern "C" __global__ void __launch_bounds__(FA_WARPS * 32)                                        \
        fattn_mma_##DK##_##DV(const float *q, const unsigned short *k, const unsigned short *v,       \
                              float *dst, float *dst_tmp, float *dst_meta, int n_tokens, int n_head,  \
                              int n_head_kv, int n_kv, int pos0, long long k_row, long long k_head,   \
                              long long v_row, long long v_head, float scale, int parallel_blocks) {  \
        fattn_mma_body<DK, DV, MT, CW, BK>(q, k, v, dst, dst_tmp, dst_meta, n_tokens, n_head, n_head_kv,  \
                                       n_kv, pos0, k_row, k_head, v_row, v_head, scale,              \
                                       parallel_blocks);                                              \
    }
