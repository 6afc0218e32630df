// Flash attention forward on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a only):
// the opt-in alternative to flash_attention2_hd128 (kernels/attention.cu) for the packed causal
// prefill at head dim 128 (docs/cuda.md, "wgmma flash attention (opt-in)"). The host compiles this
// module by itself for `sm_90a` (the arch-specific target wgmma needs; kernels.rs SOURCES_SM90A)
// and launches it only on compute capability 9.0, only for plain causal masks (one key interval
// per query row: packed sequences without a window), no sinks and no q norm inside the kernel
// (the separate q/k norm + RoPE pass runs first).
//
// Same contract as flash_attention2: q/k/v bf16 with row strides q_ld / kv_ld (column slices of
// the fused QKV output), per-query key intervals `ranges` (only [lo1, hi1) is read: the host
// checks that every lo2 == hi2), query blocks launched in `order` (heaviest first), KV heads
// innermost in the 1-D grid, output [tq, heads·128] bf16. Grouped-query attention packs the
// `group` query heads of one KV head into the M dimension as flash_attention2 does (M row r =
// position pos0 + r / group, head kvh·group + r % group), so the same 128-row query blocks and
// launch order serve both kernels.
//
// Block: 2 consumer warpgroups (256 threads), each owning 64 of the block's 128 M rows; key tiles
// of FW_BN = 128 keys, double-buffered, loaded by all 256 threads with cp.async (no producer
// warp, no TMA). Per key tile, each warpgroup:
//   S(64×128) = Q·Kᵀ: 8 × wgmma m64n128k16, A = Q and B = K from shared memory (K-major);
//   mask, online softmax in fp32 registers (the log2 domain, as flash_attention2), P rounded to
//   bf16 in registers: the accumulator fragment of m64nN is, per 16 columns, exactly the register
//   A fragment of m64nNk16, so P needs no trip through shared memory;
//   O(64×128) += P·V: 8 × wgmma m64n128k16, A = P from registers, B = V from shared memory with
//   the transpose flag (V is stored key-major, dims contiguous: "MN-major" for this product).
//
// Shared memory (1024-byte aligned; the 128-byte swizzle works on absolute address bits): Q
// 128×128, K[2] and V[2] 128×128 bf16 = 160 KB, one block per SM. Every 128-row tile is stored as
// two column halves ("atoms") of 64 bf16 = 128 bytes per row: byte offset of (row, 16-byte chunk
// c in 0..16) = (c / 8)·16384 + row·128 + ((c % 8) ^ (row % 8))·16 — the canonical 128-byte
// swizzle (address bits 4–6 XOR bits 7–9) in which wgmma reads K-major operands (Q, K:
// 8-row groups 1024 bytes apart; stepping 16 columns = +32 bytes inside an atom) and MN-major
// ones (V: 8-key groups 1024 bytes apart, the two 64-dim atoms 16384 bytes apart).
//
// Numerics: those of flash_attention2 (S, max, sum, O in fp32; P rounded to bf16 only as the A
// operand; the row sum from fp32 P; one division at the end), so the two agree to bf16 rounding
// of the output and of P (not bit for bit: the order of the fp32 sums inside the tensor cores
// differs). Tolerance tested in crates/engine/tests/cuda_attention_wgmma.rs.

#define FW_BM 128
#define FW_BN 128
#define FW_HD 128
#define FW_THREADS 256
#define FW_TILE_BYTES (128 * FW_HD * 2)  // one 128-row tile: 32 KB
#define FW_ATOM_BYTES (128 * 128)         // one 64-column half of a 128-row tile: 16 KB

// Shared-memory matrix descriptor of wgmma, 128-byte swizzle: start address, leading and stride
// byte offsets in 16-byte units (bits 0–13, 16–29, 32–45), base offset 0 (bits 49–51: every
// atom is 1024-byte aligned), layout type 1 = SWIZZLE_128B (bits 62–63).
__device__ __forceinline__ u64 fw_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)((lbo >> 4) & 0x3FFFu) << 16) |
           ((u64)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void fw_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void fw_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void fw_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to the async proxy
// that wgmma reads shared memory through; before the barrier that publishes them.
__device__ __forceinline__ void fw_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Pins 64 accumulator registers in place: the compiler may neither move a read of them above the
// preceding wgmma.wait_group nor a write below the following wgmma (the asm "redefines" them).
__device__ __forceinline__ void fw_pin(float* d) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// 2^x on the special-function unit, denormal results flushed to zero (flash_attention2's ex2_ftz).
__device__ __forceinline__ float fw_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// D(64×128, f32) (+)= A(64×16, bf16, shared: desc_a) · B(16×128, bf16, shared: desc_b, K-major).
// `accumulate` 0: D = A·B (D's old values ignored).
__device__ __forceinline__ void fw_wgmma_ss(float* d, u64 desc_a, u64 desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D(64×128, f32) += A(64×16, bf16, registers a0..a3) · B(16×128, bf16, shared: desc_b, N-major:
// the transpose flag).
__device__ __forceinline__ void fw_wgmma_rs_tb(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
}

// Copy 128 rows of one head (row stride `ld` elements, from row `row0`; rows at or past n_rows
// zero-filled) into the swizzled tile at shared address `tile`. Thread t copies chunk t % 16 of
// rows t / 16 + 16·i: every row it touches has the same row % 8, so its swizzled offset is fixed.
__device__ __forceinline__ void fw_load_tile(u32 tile, const bf16_t* src, long long ld, int row0, int n_rows) {
    const int ch = threadIdx.x & 15, r0 = threadIdx.x >> 4;
    const u32 soff = (ch >> 3) * FW_ATOM_BYTES + r0 * 128 + (((ch & 7) ^ (r0 & 7)) << 4);
    const bf16_t* g = src + (long long)(row0 + r0) * ld + ch * 8;
#pragma unroll
    for (int i = 0; i < FW_BN / 16; ++i) {
        const bool ok = row0 + r0 + 16 * i < n_rows;
        cp_async16_s(tile + soff + i * 16 * 128, ok ? (const void*)(g + (long long)i * 16 * ld) : (const void*)src, ok);
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void fw_attention(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                             const bf16_t* __restrict__ v, bf16_t* __restrict__ o,
                                             const int4* __restrict__ ranges, const int* __restrict__ order,
                                             int tq, int tk, int heads, int kv_heads, long long q_ld,
                                             long long kv_ld, float scale_log2) {
    extern __shared__ unsigned char fw_smem[];
    __shared__ int s_seg[4];  // union lo, union hi, intersection lo, intersection hi of the rows' intervals
    const u32 base = (smem_u32(fw_smem) + 1023u) & ~1023u;
    const u32 q_s = base, k_s = base + FW_TILE_BYTES, v_s = base + 3 * FW_TILE_BYTES;

    const int group = heads / kv_heads;
    const int ppb = FW_BM / group;  // query positions per block
    const int kvh = blockIdx.x % kv_heads;
    const int pos0 = order[blockIdx.x / kv_heads] * ppb;
    const int tid = threadIdx.x, lane = tid & 31;
    const int wg = tid >> 7;               // warpgroup: M rows 64·wg … 64·wg + 63
    const int wrow = wg * 64 + ((tid >> 5) & 3) * 16;  // this warp's 16 rows
    const int g = lane >> 2, tig = lane & 3;
    const long long o_ld = (long long)heads * FW_HD;

    if (tid < 4) s_seg[tid] = (tid == 0 || tid == 3) ? 0x7fffffff : -0x7fffffff;
    __syncthreads();

    // Q tile: M row r -> (position pos0 + r / group, head kvh·group + r % group); padding rows zero.
    {
        const int ch = tid & 15, r0 = tid >> 4;
#pragma unroll
        for (int i = 0; i < FW_BM / 16; ++i) {
            const int r = r0 + 16 * i;
            const int p = pos0 + r / group;
            const bool ok = r < ppb * group && p < tq;
            const bf16_t* gq = q + (long long)(ok ? p : 0) * q_ld + (long long)(kvh * group + r % group) * FW_HD + ch * 8;
            cp_async16_s(q_s + (ch >> 3) * FW_ATOM_BYTES + r * 128 + (((ch & 7) ^ (r & 7)) << 4), gq, ok);
        }
        cp_async_commit();
    }
    if (tid < ppb && pos0 + tid < tq) {
        const int4 rg = ranges[pos0 + tid];
        if (rg.x < rg.y) { atomicMin(&s_seg[0], rg.x); atomicMax(&s_seg[1], rg.y); }
        atomicMax(&s_seg[2], rg.x); atomicMin(&s_seg[3], rg.y);
    }
    __syncthreads();
    int a_lo = s_seg[0], a_hi = s_seg[1];
    const int f_lo = s_seg[2], f_hi = s_seg[3];
    if (a_lo >= a_hi) a_lo = a_hi = 0;
    const int ntiles = (a_hi - a_lo + FW_BN - 1) / FW_BN;

    // This thread's two M rows (wrow + g and wrow + g + 8) and their key intervals.
    int lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = wrow + g + 8 * h;
        const int p = pos0 + r / group;
        int4 rg = make_int4(0, 0, 0, 0);
        if (r < ppb * group && p < tq) rg = ranges[p];
        lo[h] = rg.x;
        hi[h] = rg.y;
    }

    // Accumulators in the m64nN layout: element 4j + 2h + e is (row wrow + g + 8h, column
    // 8j + 2·tig + e), j = 0 … 15.
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    float m_run[2] = {-DL_INF, -DL_INF}, l_run[2] = {0.f, 0.f};

    const bf16_t* kbase = k + (long long)kvh * FW_HD;
    const bf16_t* vbase = v + (long long)kvh * FW_HD;
    if (ntiles > 0) {
        fw_load_tile(k_s, kbase, kv_ld, a_lo, tk);
        fw_load_tile(v_s, vbase, kv_ld, a_lo, tk);
        cp_async_commit();
    }
    const u32 q_wg = q_s + wg * 64 * 128;  // this warpgroup's 64 rows of Q (8 groups of 8 rows)
    for (int t = 0; t < ntiles; ++t) {
        const int kt0 = a_lo + t * FW_BN;
        cp_async_wait_all();
        fw_fence_proxy_async();
        // Tile t (and Q) visible to both warpgroups' wgmma; both finished tile t-1 (their last
        // wgmma.wait_group 0), so its buffers, (t+1)&1, are free for tile t+1.
        __syncthreads();
        if (t + 1 < ntiles) {
            fw_load_tile(k_s + ((t + 1) & 1) * FW_TILE_BYTES, kbase, kv_ld, kt0 + FW_BN, tk);
            fw_load_tile(v_s + ((t + 1) & 1) * FW_TILE_BYTES, vbase, kv_ld, kt0 + FW_BN, tk);
            cp_async_commit();
        }
        const u32 kt_s = k_s + (t & 1) * FW_TILE_BYTES, vt_s = v_s + (t & 1) * FW_TILE_BYTES;

        // S = Q·K(t)ᵀ: k-steps of 16 dims; dims 64·a + 16·kk' lie in atom a at byte 32·kk'.
        float s[64];
        fw_pin(s);
        fw_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < FW_HD / 16; ++kk) {
            const u32 off = (kk >> 2) * FW_ATOM_BYTES + (kk & 3) * 32;
            fw_wgmma_ss(s, fw_desc(q_wg + off, 16, 1024), fw_desc(kt_s + off, 16, 1024), kk > 0);
        }
        fw_wgmma_commit();
        fw_wgmma_wait<0>();
        fw_pin(s);

        // Per-element mask only on tiles not inside every row's interval.
        const bool full = kt0 >= f_lo && kt0 + FW_BN <= f_hi;
        if (!full) {
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = kt0 + 8 * j + 2 * tig + e;
                        if (key < lo[h] || key >= hi[h]) s[4 * j + 2 * h + e] = -DL_INF;
                    }
        }

        // Online softmax (flash_attention2's arithmetic).
        float mu[2], al[2];
        bool same = true;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = -DL_INF;
#pragma unroll
            for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m_run[h], mx * scale_log2);
            mu[h] = mn == -DL_INF ? 0.f : mn;  // a row with no visible key yet: all p are 0
            al[h] = fw_ex2(m_run[h] - mu[h]);
            same = same && (mn == m_run[h]);
            m_run[h] = mn;
            l_run[h] *= al[h];
        }
        if (!__all_sync(0xffffffffu, same)) {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                acc[4 * j + 0] *= al[0]; acc[4 * j + 1] *= al[0];
                acc[4 * j + 2] *= al[1]; acc[4 * j + 3] *= al[1];
            }
        }
        // P as bf16 A fragments, one per 16-key slice: {(g, 2tig..), (g+8, 2tig..), (g, 8+2tig..), (g+8, 8+2tig..)}.
        u32 pa[8][4];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const float p0 = fw_ex2(s[4 * j + 0] * scale_log2 - mu[0]);
            const float p1 = fw_ex2(s[4 * j + 1] * scale_log2 - mu[0]);
            const float p2 = fw_ex2(s[4 * j + 2] * scale_log2 - mu[1]);
            const float p3 = fw_ex2(s[4 * j + 3] * scale_log2 - mu[1]);
            l_run[0] += p0 + p1;
            l_run[1] += p2 + p3;
            pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16x2(p0, p1);
            pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16x2(p2, p3);
        }

        // O += P·V(t): k-steps of 16 keys (2 groups of 8 key rows, 2048 bytes per step); N = the
        // 128 dims in two 64-dim atoms 16384 bytes apart (the leading byte offset).
        fw_pin(acc);
        fw_wgmma_fence();
#pragma unroll
        for (int sl = 0; sl < FW_BN / 16; ++sl)
            fw_wgmma_rs_tb(acc, pa[sl][0], pa[sl][1], pa[sl][2], pa[sl][3],
                           fw_desc(vt_s + sl * 16 * 128, FW_ATOM_BYTES, 1024));
        fw_wgmma_commit();
        fw_wgmma_wait<0>();
        fw_pin(acc);
    }
    cp_async_wait_all();

    // Row sums across the 4 threads that share a row, normalise, store bf16.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = l_run[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int r = wrow + g + 8 * h;
        const int p = pos0 + r / group;
        if (r < ppb * group && p < tq) {
            bf16_t* orow = o + (long long)p * o_ld + (long long)(kvh * group + r % group) * FW_HD;
#pragma unroll
            for (int j = 0; j < 16; ++j)
                *(u32*)(orow + 8 * j + 2 * tig) = pack_bf16x2(acc[4 * j + 2 * h] * inv, acc[4 * j + 2 * h + 1] * inv);
        }
    }
}
#endif

// Signature of flash_attention2_hd128 without its q norm and sinks (kernels/attention.cu).
extern "C" __global__ void __launch_bounds__(FW_THREADS, 1) flash_attention_wgmma_hd128(
    const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* o, const int4* ranges, const int* order, int tq,
    int tk, int heads, int kv_heads, long long q_ld, long long kv_ld, float scale_log2) {
    dl_grid_begin();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    fw_attention(q, k, v, o, ranges, order, tq, tk, heads, kv_heads, q_ld, kv_ld, scale_log2);
#else
    asm volatile("trap;");  // compiled for sm_90a only (kernels.rs); never launched elsewhere
#endif
}
