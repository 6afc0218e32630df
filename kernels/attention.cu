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
        int heads, int kv_heads, float scale_log2, int reverse) { dl_grid_begin();                           \
        flash_attention<HD>(q, k, v, o, ranges, tq, tk, heads, kv_heads, scale_log2, reverse);               \
    }
ATT_ENTRY(64)
ATT_ENTRY(128)
ATT_ENTRY(256)

// =============================================================================================
// Flash attention, version 2 (head dims 64, 128 and 256; every mask of those head dims uses it). Same
// numerics, fragment layouts, swizzle and interval masks as `flash_attention` above; what changes
// is the work per warp and the pipeline:
//
// - BM = 128 M rows per block, 4 warps × 32 rows: each warp runs two 16-row m-tiles against every
//   K/V fragment it loads, so each K/V byte read from shared memory feeds twice the tensor-core
//   work (≈ 40 KB of ldmatrix traffic per warp-MFLOP instead of ≈ 72 at 16 rows per warp).
// - K and V double-buffered: tile t+1 is loaded (cp.async) while tile t is computed, one block
//   barrier per tile.
// - The online-softmax rescale of the O accumulators is skipped when no row max of the warp
//   changed (exact: the factor would be exp2(0) = 1), the common case late in a long row.
// - Heaviest blocks first: the host sorts the query blocks by the keys they visit (`order`), and
//   the grid is 1-D with the KV heads innermost, so each wave holds blocks of similar cost and the
//   longest ones do not trail at the end of the launch.
// - Row strides are parameters, so q/k/v may be column slices of one fused QKV projection.
//
// Shared memory: Q 128×HD + 2 × (K, V) 64×HD bf16 = 96 KB at HD 128 (2 blocks per SM, which is
// also the register limit), 48 KB at HD 64.
//
// Head dim 256 (the hybrids' gated attention): 32 rows per warp would need 2 × 32 × 4 = 256 fp32
// O accumulators per thread, over the 255-register limit, so each warp runs one 16-row m-tile
// (128 accumulators + 32 S + 16 P registers) and the block has 8 warps: BM stays 128 (the same
// query blocks, heaviest-first order and GQA packing as HD 64/128; group 6 uses 126 of the 128
// rows), 256 threads, BN 64. Shared memory is Q 64 KB + double-buffered K, V 128 KB = 192 KB
// (H100/H200 allow 227 KB per block), so one block per SM — which the registers (256 threads ×
// up to 255) impose anyway; 8 warps per SM as at HD 128. Each K/V fragment feeds one m-tile, as
// in FlashAttention-2's own HD-256 forward (64 × 64 tiles, 4 warps × 16 rows); the smaller
// alternative (BM 64, BN 32, 96 KB, 2 blocks per SM) has the same warps per SM but loads each K/V
// tile from L2 for half as many query rows. Everything else (numerics, masks, order) is shared.
#define FA2_BM 128
#define FA2_BN 64
#define FA2_THREADS 128


// 2^x on the special-function unit, denormal results flushed to zero: exp2f() is the same MUFU
// instruction plus a range fix-up for results below 2^-126 (three more instructions per element),
// and such probabilities are < 1e-38 of the row's largest, far below bf16 P's resolution.
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}


// Copy FA2_BN rows of one head (row stride `ld` elements, from row `row0`) into the swizzled
// tile at shared address `tile`; rows at or past n_rows are zero-filled. Thread t copies chunk
// t % CPR of rows t / CPR + i·RPP: every row it touches has the same row & 7 (RPP is a multiple
// of 8), so its swizzled destination offset `soff` is fixed and the rows step by RPP·row bytes.
// (Same destinations as swz(); written with one base pointer and offset so that the compiler
// keeps few registers live across the main loop.)
template <int HD, int NT>
__device__ __forceinline__ void fa2_load_kv(u32 tile, const bf16_t* src, long long ld, int row0, int n_rows) {
    constexpr int CPR = HD / 8;      // 16-byte chunks per row
    constexpr int RPP = NT / CPR;    // rows per pass (8 at HD 128 and 256, 16 at HD 64)
    const int r0 = threadIdx.x / CPR, ch = threadIdx.x % CPR;
    const u32 soff = r0 * (HD * 2) + ((ch ^ (r0 & 7)) << 4);
    const bf16_t* g = src + (long long)(row0 + r0) * ld + ch * 8;
#pragma unroll
    for (int i = 0; i < FA2_BN / RPP; ++i) {
        const bool ok = row0 + r0 + i * RPP < n_rows;
        cp_async16_s(tile + soff + i * RPP * (HD * 2), ok ? (const void*)(g + (long long)i * RPP * ld) : (const void*)src, ok);
    }
}

// The q norm and RoPE flash_attention2 applies to its Q tile itself (wq == nullptr: q is used
// as given). `cs` holds, per query row, rotary_dim / 2 (cos, sin) pairs: bf16 values in f32, as
// rope_cs_table_f32 writes them (rb(cosf(p · inv_freq[i]))).
struct FaQNorm {
    const bf16_t* wq;
    const float2* cs;
    float eps;
    int rotary_dim;
    int interleaved;
};

// RMSNorm + RoPE of the Q tile's rows in shared memory, in place, with exactly
// qk_norm_rope_vec_bf16's arithmetic (below): each thread takes whole rows; a row's sum of
// squares is summed per 8-element chunk in element order and the chunk sums combined in the
// vec kernel's butterfly order (offsets CPR/2, …, 1: the lanes' values are equal at every step,
// since a + b == b + a), then y = bf16(bf16(x·r)·w) and RoPE on y. Moving the q heads' norm here
// (K's stays a separate pass) takes four fifths of the separate pass's work off a Qwen3-8B layer
// and puts its bf16 conversions next to the other block's tensor-core work on the multiprocessor.
// s[0] = the sum of s[0..N) as the tree s[i] += s[i + o] for o = N/2, N/4, ..., 1 (i ascending),
// one template level per o: NVRTC 13 did not unroll that tree written as a halving loop, so the
// array became local memory (flash_attention2_hd256: 128 bytes, which cuda_fa2_hd256 refuses).
template <int N>
__device__ __forceinline__ void tree_sum(float* s) {
    if constexpr (N > 1) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) s[i] += s[i + N / 2];
        tree_sum<N / 2>(s);
    }
}

template <int HD, int NT>
__device__ void fa2_q_norm_rope(bf16_t* Qs, const float2* cs_s, const FaQNorm& qn, int pos0, int group, int ppb,
                                int tq) {
    constexpr int CPR = HD / 8;  // 16-byte chunks per row
    // The vec kernel pads a head to a power of two of lanes with zeros; the tree below skips them.
    static_assert((CPR & (CPR - 1)) == 0, "flash_attention2's head dims have a power of two of chunks");
    const int half = qn.rotary_dim >> 1;
    const int P = qn.rotary_dim >> 4;  // rotate-half: chunk distance of a pair
    for (int r = threadIdx.x; r < FA2_BM; r += NT) {
        const int p = pos0 + r / group;
        if (r >= ppb * group || p >= tq) continue;
        float s[CPR];
#pragma unroll
        for (int c = 0; c < CPR; ++c) {
            float f[8];
            unpack8(*(const uint4*)swz<HD>(Qs, r, c * 8), f);
            s[c] = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) s[c] += f[j] * f[j];
        }
        tree_sum<CPR>(s);
        const float rr = rsqrtf(s[0] / (float)HD + qn.eps);
        const float2* cs = cs_s + (r / group) * half;  // the block's table rows in shared memory
        // y of chunk c: bf16(bf16(x·r)·w).
        auto norm_chunk = [&](int c, float* y) {
            float f[8], wf[8];
            unpack8(*(const uint4*)swz<HD>(Qs, r, c * 8), f);
            unpack8(*(const uint4*)(qn.wq + c * 8), wf);
#pragma unroll
            for (int j = 0; j < 8; ++j) y[j] = rb(qk_norm_value(f[j], rr, wf[j]));
        };
#pragma unroll 1
        for (int c = 0; c < CPR; ++c) {
            float ya[8], out[8];
            if (c * 8 >= qn.rotary_dim) {
                norm_chunk(c, out);
            } else if (qn.interleaved) {
                norm_chunk(c, ya);
#pragma unroll
                for (int j = 0; j < 8; j += 2) {
                    const float2 t = cs[(c * 8 + j) >> 1];
                    const float a = ya[j], b = ya[j + 1];
                    out[j] = rope_pair_a(a, b, t.x, t.y);
                    out[j + 1] = rope_pair_b(a, b, t.x, t.y);
                }
            } else if ((c & P) == 0) {
                // Chunk c holds the "a" halves of its pairs, chunk c | P the "b" halves.
                float yb[8], outb[8];
                norm_chunk(c, ya);
                norm_chunk(c | P, yb);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float2 t = cs[(c & (P - 1)) * 8 + j];
                    out[j] = rope_pair_a(ya[j], yb[j], t.x, t.y);
                    outb[j] = rope_pair_b(ya[j], yb[j], t.x, t.y);
                }
                *(uint4*)swz<HD>(Qs, r, (c | P) * 8) = pack8(outb);
            } else {
                continue;  // written with its pair
            }
            *(uint4*)swz<HD>(Qs, r, c * 8) = pack8(out);
        }
    }
}

template <int HD, int MT, int NW, bool SINKS>
__device__ void flash_attention2(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                 const bf16_t* __restrict__ v, bf16_t* __restrict__ o,
                                 const int4* __restrict__ ranges, const int* __restrict__ order, int tq, int tk,
                                 int heads, int kv_heads, long long q_ld, long long kv_ld, float scale_log2,
                                 const FaQNorm& qn, const float* __restrict__ sinks) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16_t* Qs = (bf16_t*)smem_raw;     // [FA2_BM][HD]
    bf16_t* Ks = Qs + FA2_BM * HD;      // [2][FA2_BN][HD]
    bf16_t* Vs = Ks + 2 * FA2_BN * HD;  // [2][FA2_BN][HD]
    __shared__ int s_seg[8];
    constexpr int NT = NW * 32;  // threads
    static_assert(NW * 16 * MT == FA2_BM, "NW warps x MT m-tiles of 16 rows make the block's M rows");

    const int group = heads / kv_heads;
    const int ppb = FA2_BM / group;  // query positions per block
    const int kvh = blockIdx.x % kv_heads;
    const int qb = order[blockIdx.x / kv_heads];
    const int pos0 = qb * ppb;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long o_ld = (long long)heads * HD;

    if (tid < 8) s_seg[tid] = (tid & 1) ? -0x7fffffff : 0x7fffffff;  // even slots take min, odd max
    __syncthreads();

    // Q tile: M row r -> (position pos0 + r / group, head kvh*group + r % group); padding rows zero.
    {
        constexpr int CPR = HD / 8;
#pragma unroll 4
        for (int i = 0; i < FA2_BM * CPR / NT; ++i) {
            int c = tid + i * NT;
            int r = c / CPR, ch = c % CPR;
            int p = pos0 + r / group;
            bool ok = r < ppb * group && p < tq;
            const bf16_t* gq = q + (long long)(ok ? p : 0) * q_ld + (long long)(kvh * group + r % group) * HD + ch * 8;
            cp_async16(swz<HD>(Qs, r, ch * 8), gq, ok);
        }
        cp_async_commit();
    }
    // With the q norm inside: the block's rows of RoPE's (cos, sin) table into K's second buffer,
    // which stays free until the loop prefetches tile 1 (ppb · rotary_dim / 2 pairs of 8 bytes fit
    // its FA2_BN · HD bf16 from 4 query heads per KV head on: the host's condition). Read from
    // global memory instead, every chunk of the norm waited on its own L2 round trip.
    float2* cs_s = (float2*)(Qs + FA2_BM * HD + FA2_BN * HD);
    if (qn.wq != nullptr) {
        const int half = qn.rotary_dim >> 1;
        const int bytes = min(ppb, tq - pos0) * half * 8;  // a multiple of 32: half % 4 == 0
        const char* src = (const char*)(qn.cs + (long long)pos0 * half);
        for (int i = tid * 16; i < bytes; i += NT * 16) cp_async16((char*)cs_s + i, src + i);
        cp_async_commit();
    }
    // Block-wide key segments: union of the rows' intervals (which tiles to visit) and their
    // intersection (tiles inside it need no per-element mask), as in flash_attention above.
    if (tid < ppb) {
        int p = pos0 + tid;
        if (p < tq) {
            int4 rg = ranges[p];
            if (rg.x < rg.y) { atomicMin(&s_seg[0], rg.x); atomicMax(&s_seg[1], rg.y); }
            if (rg.z < rg.w) { atomicMin(&s_seg[2], rg.z); atomicMax(&s_seg[3], rg.w); }
            atomicMax(&s_seg[5], rg.x); atomicMin(&s_seg[4], rg.y);
            atomicMax(&s_seg[7], rg.z); atomicMin(&s_seg[6], rg.w);
        }
    }
    __syncthreads();
    int a_lo = s_seg[0], a_hi = s_seg[1], b_lo = s_seg[2], b_hi = s_seg[3];
    const int fa_lo = s_seg[5], fa_hi = s_seg[4], fb_lo = s_seg[7], fb_hi = s_seg[6];
    if (a_lo >= a_hi) { a_lo = b_lo; a_hi = b_hi; b_lo = b_hi = 0; }
    else if (b_lo < b_hi && b_lo <= a_hi && a_lo <= b_hi) {
        a_lo = min(a_lo, b_lo); a_hi = max(a_hi, b_hi); b_lo = b_hi = 0;
    }
    if (a_lo >= a_hi) { a_lo = a_hi = 0; }
    if (b_lo >= b_hi) { b_lo = b_hi = 0; }
    const int na = (a_hi - a_lo + FA2_BN - 1) / FA2_BN;
    const int ntiles = na + (b_hi - b_lo + FA2_BN - 1) / FA2_BN;

    const int g = lane >> 2, tig = lane & 3;
    const int wrow = warp * 16 * MT;  // this warp's first M row; m-tile mt covers wrow + 16·mt + [0, 16)
    // ldmatrix lane addresses (bytes, shared space). Every row a lane addresses has row & 7 ==
    // lane & 7, and a 16-element column block kk covers chunks 2kk and 2kk + 1, so the swizzled
    // chunk (2kk + c) ^ (row & 7) equals 2kk ^ (c ^ (lane & 7)): one lane constant y, XORed with
    // kk·32 bytes per step (the same addresses as swz()).
    constexpr int ROWB = HD * 2;  // bytes per tile row
    const u32 yq = (u32)(((lane >> 4) ^ (lane & 7)) << 4);        // Q (A operand) and V (.trans)
    const u32 yk = (u32)((((lane >> 3) & 1) ^ (lane & 7)) << 4);  // K (B operand)
    const u32 q_lane = smem_u32(Qs) + (wrow + (lane & 15)) * ROWB;
    const u32 k_lane0 = smem_u32(Ks) + ((lane & 7) + (lane >> 4) * 8) * ROWB;
    const u32 v_lane0 = smem_u32(Vs) + ((lane & 7) + ((lane >> 3) & 1) * 8) * ROWB;

    float acc[MT][HD / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < HD / 8; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
    // Row state [mt][h] belongs to M row wrow + 16·mt + g + 8·h.
    // gpt-oss's sink logit z of the row's head (the SINKS instances; `sinks` non-null) joins the
    // softmax's denominator and not its values: the row's state starts at max z·log2(e) with sum
    // exp2(0) = 1, held by one of the four threads that share the row (their sums are added at
    // the end). The instances without sinks compile to the plain start: at 254 registers the
    // head-dim-256 kernel cannot spare the extra state (the device's NVRTC spilled 128 bytes).
    float m_run[MT][2], l_run[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wrow + mt * 16 + g + 8 * h;
            const bool sunk = SINKS && sinks != nullptr && r < ppb * group;
            m_run[mt][h] = sunk ? sinks[kvh * group + r % group] * 1.4426950408889634f : -DL_INF;
            l_run[mt][h] = sunk && tig == 0 ? 1.f : 0.f;
        }

    const bf16_t* kbase = k + (long long)kvh * HD;
    const bf16_t* vbase = v + (long long)kvh * HD;
    const u32 ks_s = smem_u32(Ks), vs_s = smem_u32(Vs);
    if (ntiles > 0) {
        fa2_load_kv<HD, NT>(ks_s, kbase, kv_ld, a_lo, tk);
        fa2_load_kv<HD, NT>(vs_s, vbase, kv_ld, a_lo, tk);
        cp_async_commit();
    }
    if (qn.wq != nullptr && ntiles > 0) {
        // Q's and the table's copies have landed (tile 0's may still be in flight) and are
        // visible to every thread; the loop's first barrier orders the normalised rows before
        // any ldmatrix, and the table's reads before tile 1's copies into the same buffer.
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        __syncthreads();
        fa2_q_norm_rope<HD, NT>(Qs, cs_s, qn, pos0, group, ppb, tq);
    }
    for (int t = 0; t < ntiles; ++t) {
        const int kt0 = t < na ? a_lo + t * FA2_BN : b_lo + (t - na) * FA2_BN;
        cp_async_wait_all();
        // Tile t (and Q) visible to every thread; every warp finished tile t-1, so its buffer,
        // (t+1)&1, is free for the prefetch of tile t+1.
        __syncthreads();
        if (t + 1 < ntiles) {
            const int kn = (t + 1) < na ? a_lo + (t + 1) * FA2_BN : b_lo + (t + 1 - na) * FA2_BN;
            fa2_load_kv<HD, NT>(ks_s + ((t + 1) & 1) * FA2_BN * ROWB, kbase, kv_ld, kn, tk);
            fa2_load_kv<HD, NT>(vs_s + ((t + 1) & 1) * FA2_BN * ROWB, vbase, kv_ld, kn, tk);
            cp_async_commit();
        }
        const u32 k_lane = k_lane0 + (t & 1) * FA2_BN * ROWB;
        const u32 v_lane = v_lane0 + (t & 1) * FA2_BN * ROWB;

        // S = Q · K(t)ᵀ: MT m-tiles × 64 keys (8 n-tiles of 8 keys).
        float s[MT][8][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 8; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], q_lane + mt * 16 * ROWB + ((kk << 5) ^ yq));
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                u32 b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, k_lane + np * 16 * ROWB + ((kk << 5) ^ yk));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_bf16(s[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                    mma_bf16(s[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
                }
            }
        }

        // Per-element mask only on tiles not inside every row's visible range. The rows' intervals
        // are read (cached) only here, rather than held in registers for the whole loop. A tile
        // may run past its segment's end into the other segment: keys at or beyond seg_hi belong
        // to the other segment's tiles and must not be counted twice.
        const int seg_hi = t < na ? a_hi : b_hi;
        const bool full = kt0 + FA2_BN <= seg_hi &&
                          ((kt0 >= fa_lo && kt0 + FA2_BN <= fa_hi) || (kt0 >= fb_lo && kt0 + FA2_BN <= fb_hi));
        if (!full) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = wrow + mt * 16 + g + 8 * h;
                    const int p = pos0 + r / group;
                    const int4 rg = (r < ppb * group && p < tq) ? ranges[p] : make_int4(0, 0, 0, 0);
#pragma unroll
                    for (int nt = 0; nt < 8; ++nt) {
                        const int j = kt0 + nt * 8 + tig * 2;
                        if (j >= seg_hi || !in_ranges(j, rg)) s[mt][nt][2 * h] = -DL_INF;
                        if (j + 1 >= seg_hi || !in_ranges(j + 1, rg)) s[mt][nt][2 * h + 1] = -DL_INF;
                    }
                }
        }

        // Online softmax in the log2 domain (the scale folded into the exponent's FMA).
        float mu[MT][2], al[MT][2];
        bool same = true;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = -DL_INF;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mn = fmaxf(m_run[mt][h], mx * scale_log2);
                // A row that has seen no visible key yet keeps max -inf; subtract 0 (all p are 0).
                mu[mt][h] = mn == -DL_INF ? 0.f : mn;
                al[mt][h] = ex2_ftz(m_run[mt][h] - mu[mt][h]);  // exactly 1 when the max is unchanged
                same = same && (mn == m_run[mt][h]);
                m_run[mt][h] = mn;
                l_run[mt][h] *= al[mt][h];
            }
        if (!__all_sync(0xffffffffu, same)) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < HD / 8; ++i) {
                    acc[mt][i][0] *= al[mt][0]; acc[mt][i][1] *= al[mt][0];
                    acc[mt][i][2] *= al[mt][1]; acc[mt][i][3] *= al[mt][1];
                }
        }
        u32 pa[MT][4][4];  // P as bf16 A fragments: [m-tile][16-key slice][register]
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const float p0 = ex2_ftz(s[mt][nt][0] * scale_log2 - mu[mt][0]);
                const float p1 = ex2_ftz(s[mt][nt][1] * scale_log2 - mu[mt][0]);
                const float p2 = ex2_ftz(s[mt][nt][2] * scale_log2 - mu[mt][1]);
                const float p3 = ex2_ftz(s[mt][nt][3] * scale_log2 - mu[mt][1]);
                l_run[mt][0] += p0 + p1;
                l_run[mt][1] += p2 + p3;
                pa[mt][nt >> 1][(nt & 1) * 2 + 0] = pack_bf16x2(p0, p1);
                pa[mt][nt >> 1][(nt & 1) * 2 + 1] = pack_bf16x2(p2, p3);
            }

        // O += P · V(t): per 16-key slice and 16 dims, one ldmatrix.trans feeds four mma.
#pragma unroll
        for (int sl = 0; sl < 4; ++sl) {
#pragma unroll
            for (int dp = 0; dp < HD / 16; ++dp) {
                u32 b0, b1, b2, b3;
                ldsm_x4_trans(b0, b1, b2, b3, v_lane + sl * 16 * ROWB + ((dp << 5) ^ yq));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_bf16(acc[mt][2 * dp], pa[mt][sl][0], pa[mt][sl][1], pa[mt][sl][2], pa[mt][sl][3], b0, b1);
                    mma_bf16(acc[mt][2 * dp + 1], pa[mt][sl][0], pa[mt][sl][1], pa[mt][sl][2], pa[mt][sl][3], b2, b3);
                }
            }
        }
    }
    cp_async_wait_all();

    // Row sums across the 4 threads that share a row, normalise, store bf16.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_run[mt][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const int r = wrow + mt * 16 + g + 8 * h;
            const int p = pos0 + r / group;
            if (r < ppb * group && p < tq) {
                bf16_t* orow = o + (long long)p * o_ld + (long long)(kvh * group + r % group) * HD;
#pragma unroll
                for (int nt = 0; nt < HD / 8; ++nt)
                    *(u32*)(orow + nt * 8 + tig * 2) = pack_bf16x2(acc[mt][nt][2 * h] * inv, acc[mt][nt][2 * h + 1] * inv);
            }
        }
}

// MT m-tiles per warp, NW warps (NW·32 threads), BLOCKS blocks per SM (the register budget);
// NAME flash_attention2_hdHD (no sinks: `sinks` is ignored) or flash_attention2_sinks_hdHD.
#define ATT2_ENTRY(NAME, HD, MT, NW, BLOCKS, SINKS)                                                         \
    extern "C" __global__ void __launch_bounds__(NW * 32, BLOCKS) NAME(                                     \
        const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* o, const int4* ranges, const int* order,  \
        int tq, int tk, int heads, int kv_heads, long long q_ld, long long kv_ld, float scale_log2,          \
        FaQNorm qn, const float* sinks) { dl_grid_begin();                                                   \
        flash_attention2<HD, MT, NW, SINKS>(q, k, v, o, ranges, order, tq, tk, heads, kv_heads, q_ld,       \
                                            kv_ld, scale_log2, qn, sinks);                                   \
    }
ATT2_ENTRY(flash_attention2_hd64, 64, 2, 4, 2, false)
ATT2_ENTRY(flash_attention2_hd128, 128, 2, 4, 2, false)
// Head dim 256: 8 warps × one 16-row m-tile (see the section comment above).
ATT2_ENTRY(flash_attention2_hd256, 256, 1, 8, 1, false)
// With attention sinks (gpt-oss: heads of 64).
ATT2_ENTRY(flash_attention2_sinks_hd64, 64, 2, 4, 2, true)

// =============================================================================================
// Attention input preparation for a fused QKV projection output: per-head RMSNorm of the q and k
// heads followed by RoPE, in place (v untouched), so that flash_attention2 can read q/k/v straight
// from the fused buffer. The arithmetic is that of rms_norm_bf16 (group = head_dim) followed by
// rope_bf16 in kernels/elementwise.cu, bit for bit (same fp32 summation order, same roundings):
//   y = bf16(bf16(x · rsqrt(mean(x²) + eps)) · w);  a' = bf16(bf16(a·c) + bf16(−b·s)),
//   b' = bf16(bf16(b·c) + bf16(a·s)) with c, s = bf16(cos), bf16(sin) of fp32 pos · inv_freq.
// One block per row (grid-stride): the row's cos/sin table is computed once into shared memory
// and shared by all its heads (rope_bf16 recomputes the full-range cosf/sinf for every head),
// then each warp normalises and rotates heads warp, warp + 8, ...; heads [0, hq) are q heads
// (weight wq), [hq, hq + hk) k heads (wk), at column head·head_dim of rows of `ld` elements.
// head_dim ≤ 256.
#define QKN_WARPS 8
extern "C" __global__ void __launch_bounds__(QKN_WARPS * 32) qk_norm_rope_bf16(
    bf16_t* __restrict__ x, long long ld, long long rows, int hq, int hk, int head_dim,
    const bf16_t* __restrict__ wq, const bf16_t* __restrict__ wk, float eps, const u32* __restrict__ pos,
    const float* __restrict__ inv_freq, int rotary_dim, int interleaved) {
    dl_grid_begin();
    __shared__ bf16_t sh[QKN_WARPS][256];  // the normalised head of each warp
    __shared__ float s_cos[128], s_sin[128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nh = hq + hk;
    const int half = rotary_dim >> 1;
    const bool chunked = (head_dim & 7) == 0;
    const bool vec = chunked && (ld & 7) == 0;
    bf16_t* hs = sh[warp];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float p = (float)pos[row];
        for (int i = threadIdx.x; i < half; i += QKN_WARPS * 32) {
            const float angle = p * inv_freq[i];
            s_cos[i] = rb(cosf(angle));
            s_sin[i] = rb(sinf(angle));
        }
        __syncthreads();
        for (int head = warp; head < nh; head += QKN_WARPS) {
            bf16_t* hx = x + row * ld + (long long)head * head_dim;
            const bf16_t* w = head < hq ? wq : wk;
            // RMSNorm (rms_norm_bf16's order: 8-element chunks per lane when head_dim % 8 == 0).
            float ss = 0.f;
            if (chunked) {
                for (int i = lane * 8; i < head_dim; i += 256) {
                    float f[8];
                    if (vec) {
                        unpack8(*(const uint4*)(hx + i), f);
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; ++j) f[j] = bf2f(hx[i + j]);
                    }
#pragma unroll
                    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
                }
            } else {
                for (int i = lane; i < head_dim; i += 32) {
                    float f = bf2f(hx[i]);
                    ss += f * f;
                }
            }
            ss = warp_sum(ss);
            const float r = rsqrtf(ss / (float)head_dim + eps);
            if (chunked) {
                for (int i = lane * 8; i < head_dim; i += 256) {
                    float f[8], wf[8];
                    if (vec) {
                        unpack8(*(const uint4*)(hx + i), f);
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; ++j) f[j] = bf2f(hx[i + j]);
                    }
                    unpack8(*(const uint4*)(w + i), wf);
#pragma unroll
                    for (int j = 0; j < 8; ++j) hs[i + j] = f2bf(qk_norm_value(f[j], r, wf[j]));
                }
            } else {
                for (int i = lane; i < head_dim; i += 32) hs[i] = f2bf(qk_norm_value(bf2f(hx[i]), r, bf2f(w[i])));
            }
            __syncwarp();
            // RoPE (rope_bf16's arithmetic) on the normalised values; dimensions past rotary_dim
            // keep their normalised values.
            for (int i = lane; i < half; i += 32) {
                const float c = s_cos[i], sn = s_sin[i];
                const int ia = interleaved ? 2 * i : i;
                const int ib = interleaved ? 2 * i + 1 : i + half;
                const float a = bf2f(hs[ia]);
                const float b = bf2f(hs[ib]);
                hx[ia] = f2bf(rope_pair_a(a, b, c, sn));
                hx[ib] = f2bf(rope_pair_b(a, b, c, sn));
            }
            for (int i = rotary_dim + lane; i < head_dim; i += 32) hx[i] = hs[i];
            __syncwarp();  // hs is rewritten by this warp's next head
        }
        __syncthreads();  // the table is rewritten for the next row
    }
}

// The same computation as qk_norm_rope_bf16, vectorised, for head_dim % 8 == 0, head_dim ≤ 256,
// row stride % 8 == 0 and a rotary part that whole 16-byte chunks cover: interleaved with
// rotary_dim % 8 == 0, or rotate-half with rotary_dim / 16 = P a power of two (P ≤ 16).
// A head is handled by G = next_pow2(head_dim / 8) threads, thread c owning the head's chunk c
// (elements 8c … 8c + 7); a block of 256 threads covers 256 / G heads of one row at a time, so a
// row's loads are all in flight together and every store is 16 bytes.
//   Sum of squares: rms_norm_bf16 has lane c sum chunk c element by element, then butterflies over
//   32 lanes of which lanes ≥ head_dim / 8 hold 0; the steps xor 16 … xor G add exact zeros to the
//   lanes < G, so the butterfly xor G/2 … 1 within the G-thread group gives the same bits.
//   RoPE: rotate-half pairs element i of chunk c with element i of chunk c ^ P (one shuffle of the
//   normalised values); interleaved pairs are inside a chunk.
// One head of qk_norm_rope_vec_bf16: thread c of a G-thread group owns chunk c of the head at
// `hx` (inactive threads shuffle zeros). `cs(i)` gives the (cos, sin) of rotary pair i.
template <class CosSin>
__device__ __forceinline__ void qkn_vec_head(bf16_t* hx, bool active, const bf16_t* w, int c, int G,
                                             int head_dim, float eps, int rotary_dim, int interleaved,
                                             CosSin cs) {
    const int P = rotary_dim >> 4;  // rotate-half: chunk distance of a pair
    float f[8];
    if (active) {
        unpack8(*(const uint4*)hx, f);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
    for (int o = G >> 1; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / (float)head_dim + eps);
    float y[8];
    if (active) {
        float wf[8];
        unpack8(*(const uint4*)(w + c * 8), wf);
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = rb(qk_norm_value(f[j], r, wf[j]));
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = 0.f;
    }
    // Rotate-half partner chunk's normalised values (every lane shuffles: P < G).
    float q[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = interleaved ? 0.f : __shfl_xor_sync(0xffffffffu, y[j], P > 0 ? P : 1);
    float out[8];
    if (c * 8 < rotary_dim) {
        if (interleaved) {
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const float2 t = cs((c * 8 + j) >> 1);
                const float a = y[j], b = y[j + 1];
                out[j] = rope_pair_a(a, b, t.x, t.y);
                out[j + 1] = rope_pair_b(a, b, t.x, t.y);
            }
        } else {
            const bool first = (c & P) == 0;  // chunk holds the "a" halves of its pairs
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float2 t = cs((c & (P - 1)) * 8 + j);
                // Chunk c holds a, its partner chunk c ^ P holds b (or the other way round).
                out[j] = first ? rope_pair_a(y[j], q[j], t.x, t.y) : rope_pair_b(q[j], y[j], t.x, t.y);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) out[j] = y[j];
    }
    if (active) *(uint4*)hx = pack8(out);
}

// Two walks over the (row, head) pairs. Without `cs`: one row per block at a time, its
// (cos, sin) computed into shared memory first (two barriers per row). With `cs`
// (rope_cs_table_f32's table, the same values): the block's 256 / G groups take consecutive
// (row, head) pairs grid-stride, each reading its row's pairs from the table, with no barrier — the
// k-only pass of the fused prefill, where a row has few heads.
extern "C" __global__ void __launch_bounds__(256) qk_norm_rope_vec_bf16(
    bf16_t* __restrict__ x, long long ld, long long rows, int hq, int hk, int head_dim,
    const bf16_t* __restrict__ wq, const bf16_t* __restrict__ wk, float eps, const u32* __restrict__ pos,
    const float* __restrict__ inv_freq, int rotary_dim, int interleaved, const float2* __restrict__ cs) {
    dl_grid_begin();
    __shared__ float s_cos[128], s_sin[128];
    const int tid = threadIdx.x;
    const int nh = hq + hk;
    const int half = rotary_dim >> 1;
    const int cph = head_dim >> 3;  // chunks per head
    int G = 1;
    while (G < cph) G <<= 1;
    const int hpi = 256 / G;         // heads per pass
    const int c = tid & (G - 1);     // this thread's chunk in its head
    if (cs != nullptr) {
        const long long items = rows * nh;
        // Uniform across the block (every lane reaches every shuffle): the block's first item.
        for (long long i0 = (long long)blockIdx.x * hpi; i0 < items; i0 += (long long)gridDim.x * hpi) {
            const long long item = i0 + tid / G;
            const long long row = item / nh;
            const int head = (int)(item - row * nh);
            const bool active = item < items && c < cph;
            const float2* rcs = cs + row * half;
            qkn_vec_head(x + row * ld + (long long)head * head_dim + c * 8, active, head < hq ? wq : wk, c, G,
                         head_dim, eps, rotary_dim, interleaved, [&](int i) { return rcs[i]; });
        }
        return;
    }
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float p = (float)pos[row];
        for (int i = tid; i < half; i += 256) {
            const float angle = p * inv_freq[i];
            s_cos[i] = rb(cosf(angle));
            s_sin[i] = rb(sinf(angle));
        }
        __syncthreads();
        for (int h0 = 0; h0 < nh; h0 += hpi) {
            const int head = h0 + tid / G;
            qkn_vec_head(x + row * ld + (long long)head * head_dim + c * 8, head < nh && c < cph,
                         head < hq ? wq : wk, c, G, head_dim, eps, rotary_dim, interleaved,
                         [&](int i) { return make_float2(s_cos[i], s_sin[i]); });
        }
        __syncthreads();  // the table is rewritten for the next row
    }
}

// The (cos, sin) table of RoPE at `rows` positions: out[r · half + i] = (bf16(cos a), bf16(sin a))
// with a = f32(pos[r]) · inv_freq[i], in f32 — the values qk_norm_rope_vec_bf16 computes for its
// shared table, computed once per forward (every layer shares the positions) for the kernels that
// take the table instead: flash_attention2's q norm and the k-only norm pass.
extern "C" __global__ void rope_cs_table_f32(const u32* __restrict__ pos, const float* __restrict__ inv_freq,
                                             long long rows, int half, float2* __restrict__ out) {
    dl_grid_begin();
    const long long n = rows * half;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / half;
        const int i = (int)(e - r * half);
        const float angle = (float)pos[r] * inv_freq[i];
        out[e] = make_float2(rb(cosf(angle)), rb(sinf(angle)));
    }
}
