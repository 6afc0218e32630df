// Flash attention (FlashAttention-2 style) for bf16 q/k/v with fp32 softmax and accumulation, on
// the tensor cores through mma.sync.m16n8k16 (sm_80+). One kernel serves every mask the backend
// knows (causal prefill, KV-cache decode, packed variable-length sequences, and the DFlash drafter's
// context-prefix + own-block mask for many anchors at once): the host turns the mask into, for each
// query position, two half-open key intervals [lo1, hi1) ∪ [lo2, hi2) (already cut by any sliding
// window and by the number of keys). No T×T score matrix ever exists in memory.
//
// Grouped-query attention: the `group` query heads that share a KV head are packed into the M
// dimension of one block (M row r = query position r / group, head r % group), so a K/V tile
// loaded once into shared memory serves every head of its group.
//
// Block: 4 warps, BM = 64 M rows (16 per warp), BN = 64 keys per tile, head dim HD (64/128/256).
// Shared memory: Q, K, V tiles of 64 × HD bf16 each, rows XOR-swizzled in 16-byte chunks so that
// ldmatrix reads are bank-conflict free. Pipeline per key tile: V(t) loads while S = Q·K(t)ᵀ and the
// online softmax run; K(t+1) loads while O += P·V(t) runs.
//
// Numerics (what SDPA's flash path does): S in fp32; running max / sum in fp32; P = exp(S - max)
// in fp32, rounded to bf16 only as the A operand of the P·V product; the row sum uses the fp32 P;
// O accumulates in fp32 and is divided by the row sum once at the end, then rounded to bf16.

#define ATT_BM 64
#define ATT_BN 64
#define ATT_THREADS 128

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    int n = valid ? 16 : 0;  // 0 source bytes: the 16 destination bytes are zero-filled
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}
// D(16×8, f32) += A(16×16, bf16, row) · B(16×8, bf16, col)
__device__ __forceinline__ void mma_bf16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Address of element (row, col) of a swizzled [rows][HD] bf16 tile; col must be a multiple of 8.
template <int HD>
__device__ __forceinline__ bf16_t* swz(bf16_t* base, int row, int col) {
    return base + row * HD + ((((col >> 3) ^ (row & 7))) << 3);
}

// Copy `ATT_BN` rows of one head (row stride `ld` elements) starting at row `row0` into a tile;
// rows outside [0, n_rows) are zero-filled.
template <int HD>
__device__ __forceinline__ void load_tile(bf16_t* tile, const bf16_t* src, long long ld, int row0, int n_rows) {
    constexpr int CPR = HD / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < ATT_BN * CPR; c += ATT_THREADS) {
        int r = c / CPR, ch = c % CPR;
        int gr = row0 + r;
        bool ok = gr >= 0 && gr < n_rows;
        const bf16_t* g = src + (long long)(ok ? gr : 0) * ld + ch * 8;
        cp_async16(swz<HD>(tile, r, ch * 8), g, ok);
    }
}

__device__ __forceinline__ bool in_ranges(int j, int4 rg) { return (j >= rg.x && j < rg.y) || (j >= rg.z && j < rg.w); }

template <int HD>
__device__ void flash_attention(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                const bf16_t* __restrict__ v, bf16_t* __restrict__ o,
                                const int4* __restrict__ ranges, int tq, int tk, int heads, int kv_heads,
                                float scale_log2, int reverse) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16_t* Qs = (bf16_t*)smem_raw;
    bf16_t* Ks = Qs + ATT_BM * HD;
    bf16_t* Vs = Ks + ATT_BN * HD;
    __shared__ int s_seg[8];  // union lo/hi and intersection lo/hi of both intervals over the block's rows

    const int group = heads / kv_heads;
    const int ppb = ATT_BM / group;  // query positions per block
    const int kvh = blockIdx.y;
    const int qb = reverse ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
    const int pos0 = qb * ppb;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long q_ld = (long long)heads * HD, kv_ld = (long long)kv_heads * HD;

    if (tid < 8) s_seg[tid] = (tid & 1) ? -0x7fffffff : 0x7fffffff;  // even slots take min, odd max
    __syncthreads();

    // Q tile: M row r -> (position pos0 + r / group, head kvh*group + r % group); padding rows zero.
    {
        constexpr int CPR = HD / 8;
        for (int c = tid; c < ATT_BM * CPR; c += ATT_THREADS) {
            int r = c / CPR, ch = c % CPR;
            int p = pos0 + r / group;
            bool ok = r < ppb * group && p < tq;
            const bf16_t* g = q + (long long)(ok ? p : 0) * q_ld + (long long)(kvh * group + r % group) * HD + ch * 8;
            cp_async16(swz<HD>(Qs, r, ch * 8), g, ok);
        }
        cp_async_commit();
    }
    // Block-wide key segments: union of the rows' intervals (which tiles to visit) and their
    // intersection (tiles inside it need no per-element mask).
    if (tid < ppb) {
        int p = pos0 + tid;
        if (p < tq) {
            int4 rg = ranges[p];
            if (rg.x < rg.y) { atomicMin(&s_seg[0], rg.x); atomicMax(&s_seg[1], rg.y); }
            if (rg.z < rg.w) { atomicMin(&s_seg[2], rg.z); atomicMax(&s_seg[3], rg.w); }
            atomicMax(&s_seg[5], rg.x); atomicMin(&s_seg[4], rg.y);  // intersection of interval 1: [max lo, min hi)
            atomicMax(&s_seg[7], rg.z); atomicMin(&s_seg[6], rg.w);
        }
    }
    __syncthreads();
    int a_lo = s_seg[0], a_hi = s_seg[1], b_lo = s_seg[2], b_hi = s_seg[3];
    const int fa_lo = s_seg[5], fa_hi = s_seg[4], fb_lo = s_seg[7], fb_hi = s_seg[6];
    if (a_lo >= a_hi) { a_lo = b_lo; a_hi = b_hi; b_lo = b_hi = 0; }       // only interval 2 non-empty
    else if (b_lo < b_hi && b_lo <= a_hi && a_lo <= b_hi) {                 // overlapping: merge
        a_lo = min(a_lo, b_lo); a_hi = max(a_hi, b_hi); b_lo = b_hi = 0;
    }
    if (a_lo >= a_hi) { a_lo = a_hi = 0; }
    if (b_lo >= b_hi) { b_lo = b_hi = 0; }
    const int na = (a_hi - a_lo + ATT_BN - 1) / ATT_BN;
    const int ntiles = na + (b_hi - b_lo + ATT_BN - 1) / ATT_BN;

    // This thread's two M rows (g and g + 8 of its warp's 16) and their key intervals.
    const int g = lane >> 2, tig = lane & 3;
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    int4 rg0 = make_int4(0, 0, 0, 0), rg1 = make_int4(0, 0, 0, 0);
    {
        int p0 = pos0 + r0 / group, p1 = pos0 + r1 / group;
        if (r0 < ppb * group && p0 < tq) rg0 = ranges[p0];
        if (r1 < ppb * group && p1 < tq) rg1 = ranges[p1];
    }

    float acc[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float m0 = -DL_INF, m1 = -DL_INF, l0 = 0.f, l1 = 0.f;

    const bf16_t* kbase = k + (long long)kvh * HD;
    const bf16_t* vbase = v + (long long)kvh * HD;
    if (ntiles > 0) {
        load_tile<HD>(Ks, kbase, kv_ld, a_lo, tk);
        cp_async_commit();
    }
    for (int t = 0; t < ntiles; ++t) {
        const int kt0 = t < na ? a_lo + t * ATT_BN : b_lo + (t - na) * ATT_BN;
        cp_async_wait_all();
        __syncthreads();  // K(t) (and Q) visible to all; every warp finished P·V(t-1): V is free
        load_tile<HD>(Vs, vbase, kv_ld, kt0, tk);
        cp_async_commit();

        // S = Q · K(t)ᵀ for this warp's 16 rows × 64 keys (8 n-tiles of 8 keys).
        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            u32 a0, a1, a2, a3;
            ldmatrix_x4(a0, a1, a2, a3, swz<HD>(Qs, warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                u32 b0, b1, b2, b3;
                ldmatrix_x4(b0, b1, b2, b3,
                            swz<HD>(Ks, np * 16 + (lane & 7) + (lane >> 4) * 8, kk * 16 + ((lane >> 3) & 1) * 8));
                mma_bf16(s[2 * np], a0, a1, a2, a3, b0, b1);
                mma_bf16(s[2 * np + 1], a0, a1, a2, a3, b2, b3);
            }
        }

        // Mask (only tiles not wholly inside every row's visible range), then online softmax.
        // A tile may run past the end of its segment into the other one: keys at or beyond
        // seg_hi belong to the other segment's tiles and must not be counted twice.
        const int seg_hi = t < na ? a_hi : b_hi;
        const bool full = kt0 + ATT_BN <= seg_hi &&
                          ((kt0 >= fa_lo && kt0 + ATT_BN <= fa_hi) || (kt0 >= fb_lo && kt0 + ATT_BN <= fb_hi));
        if (!full) {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                int j = kt0 + nt * 8 + tig * 2;
                if (j >= seg_hi || !in_ranges(j, rg0)) s[nt][0] = -DL_INF;
                if (j + 1 >= seg_hi || !in_ranges(j + 1, rg0)) s[nt][1] = -DL_INF;
                if (j >= seg_hi || !in_ranges(j, rg1)) s[nt][2] = -DL_INF;
                if (j + 1 >= seg_hi || !in_ranges(j + 1, rg1)) s[nt][3] = -DL_INF;
            }
        }
        float mx0 = -DL_INF, mx1 = -DL_INF;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0 * scale_log2), mn1 = fmaxf(m1, mx1 * scale_log2);
        // A row that has seen no visible key yet keeps max -inf; subtract 0 instead (all p are 0).
        const float mu0 = mn0 == -DL_INF ? 0.f : mn0, mu1 = mn1 == -DL_INF ? 0.f : mn1;
        const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
        m0 = mn0;
        m1 = mn1;
        l0 *= al0;
        l1 *= al1;
#pragma unroll
        for (int i = 0; i < HD / 8; ++i) {
            acc[i][0] *= al0; acc[i][1] *= al0;
            acc[i][2] *= al1; acc[i][3] *= al1;
        }
        u32 pa[4][4];  // P as bf16 A fragments, one per 16-key slice
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            float p0 = exp2f(s[nt][0] * scale_log2 - mu0), p1 = exp2f(s[nt][1] * scale_log2 - mu0);
            float p2 = exp2f(s[nt][2] * scale_log2 - mu1), p3 = exp2f(s[nt][3] * scale_log2 - mu1);
            l0 += p0 + p1;
            l1 += p2 + p3;
            pa[nt >> 1][(nt & 1) * 2 + 0] = pack_bf16x2(p0, p1);
            pa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16x2(p2, p3);
        }

        cp_async_wait_all();
        __syncthreads();  // V(t) visible; every warp finished reading K(t)
        if (t + 1 < ntiles) {
            const int kn = (t + 1) < na ? a_lo + (t + 1) * ATT_BN : b_lo + (t + 1 - na) * ATT_BN;
            load_tile<HD>(Ks, kbase, kv_ld, kn, tk);
            cp_async_commit();
        }
        // O += P · V(t): A = P (16 rows × 16 keys per slice), B = V slice (16 keys × 8 dims per n-tile).
#pragma unroll
        for (int sl = 0; sl < 4; ++sl) {
#pragma unroll
            for (int dp = 0; dp < HD / 16; ++dp) {
                u32 b0, b1, b2, b3;
                ldmatrix_x4_trans(b0, b1, b2, b3,
                                  swz<HD>(Vs, sl * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dp * 16 + (lane >> 4) * 8));
                mma_bf16(acc[2 * dp], pa[sl][0], pa[sl][1], pa[sl][2], pa[sl][3], b0, b1);
                mma_bf16(acc[2 * dp + 1], pa[sl][0], pa[sl][1], pa[sl][2], pa[sl][3], b2, b3);
            }
        }
    }
    cp_async_wait_all();

    // Row sums across the 4 threads that share a row, normalise, store bf16.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    {
        int p0 = pos0 + r0 / group, p1 = pos0 + r1 / group;
        bool ok0 = r0 < ppb * group && p0 < tq, ok1 = r1 < ppb * group && p1 < tq;
        bf16_t* o0 = o + (long long)p0 * q_ld + (long long)(kvh * group + r0 % group) * HD;
        bf16_t* o1 = o + (long long)p1 * q_ld + (long long)(kvh * group + r1 % group) * HD;
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt) {
            int d = nt * 8 + tig * 2;
            if (ok0) *(u32*)(o0 + d) = pack_bf16x2(acc[nt][0] * inv0, acc[nt][1] * inv0);
            if (ok1) *(u32*)(o1 + d) = pack_bf16x2(acc[nt][2] * inv1, acc[nt][3] * inv1);
        }
    }
}

#define ATT_ENTRY(HD)                                                                                        \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) flash_attention_hd##HD(                        \
        const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* o, const int4* ranges, int tq, int tk,    \
        int heads, int kv_heads, float scale_log2, int reverse) {                                            \
        flash_attention<HD>(q, k, v, o, ranges, tq, tk, heads, kv_heads, scale_log2, reverse);               \
    }
ATT_ENTRY(64)
ATT_ENTRY(128)
ATT_ENTRY(256)
