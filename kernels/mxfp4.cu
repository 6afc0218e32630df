// MXFP4 weights kept packed on the device (crates/engine/src/backend/cuda/mxfp4.rs launches these;
// compiled as part of the `decode` module after decode_gemm.cu and moe_gemm.cu, whose device
// functions it uses).
//
// A packed weight [N, K] (K a multiple of 32) is one buffer: its blocks, N·K/2 bytes row-major (a
// row is K/32 groups of 16 bytes; byte b of a group holds the e2m1 code of column 2b in its low
// nibble and that of column 2b + 1 in its high nibble), then its scales, N·K/32 e8m0 bytes
// row-major, one per group: the gpt-oss checkpoints' layout (crates/engine/src/formats/mxfp4.rs,
// crates/engine/src/backend/mxfp4.rs). Value (n, k) = E2M1[code] · 2^(scale − 127).
//
// The arithmetic is the CPU dequantiser's, from its own definition: `lut` (MX_LUT_LEN floats made by
// the host from formats::mxfp4's E2M1 table and e8m0 rule, backend::mxfp4::device_table) holds the
// 16 code values, then the 256 scale factors. Each block copies it to shared memory, and a value is
// f2bf(lut[code] · lut[16 + scale]): the CPU's f32 product (exact: at most two significant bits times
// a power of two; NVRTC's default -ftz=false keeps subnormal products) rounded to bf16 as the upload
// of the CPU's f32 values rounds it (exact as well: bf16 has f32's exponent range and 8 significant
// bits; products past f32's range are inf in both). So every weight these kernels give the tensor
// cores is the bf16 value the bf16 path stores, bit for bit.

#define MX_LUT_LEN (16 + 256)

// Every thread of the block copies part of the table; all reads come after the barrier.
__device__ __forceinline__ void mx_load_lut(float* s_lut, const float* __restrict__ lut) {
    for (int i = threadIdx.x; i < MX_LUT_LEN; i += blockDim.x) s_lut[i] = lut[i];
    __syncthreads();
}

// The two values of one byte of blocks times the group's scale factor `s`, as a bf16 pair: the low
// nibble's value (the earlier column) in bits 0..15.
__device__ __forceinline__ u32 mx_pair(u32 byte, float s, const float* e2m1) {
    return pack_bf16x2(e2m1[byte & 15u] * s, e2m1[(byte >> 4) & 15u] * s);
}

// 8 consecutive values of a row from their 4 bytes `q` (byte i, little-endian, holds values 2i and
// 2i + 1): the registers a 16-byte load of the same 8 bf16 values gives (value 2i in the low half of
// word i).
__device__ __forceinline__ uint4 mx_dequant8(u32 q, float s, const float* e2m1) {
    return make_uint4(mx_pair(q & 0xffu, s, e2m1), mx_pair((q >> 8) & 0xffu, s, e2m1),
                      mx_pair((q >> 16) & 0xffu, s, e2m1), mx_pair(q >> 24, s, e2m1));
}

// 4 bytes of blocks (4-byte aligned: rows are K/2 bytes, K a multiple of 32). Cached in L1: the 4
// lanes of a row read 16 of a 32-byte sector's bytes per chunk, the next chunk the other 16.
__device__ __forceinline__ u32 mx_ld(const unsigned char* p) {
    u32 v;
    asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// decode_gemm.cu's dg_accumulate on a packed weight `wq`: the same chunks in the same order into
// the same registers through the same dg_chunk, each lane's 8 weights of a row and chunk dequantised
// from 4 bytes and the row's group scale instead of loaded as 16 bytes of bf16. Every output
// element is therefore summed exactly as the bf16 kernels sum it on the dequantised weight. K is a
// multiple of 32 (the host checks), so every chunk is whole and dg_chunk reads x unchecked, as
// dg_accumulate does for such K. `lut`: the table in shared memory.
template <int NT, int MT>
__device__ __forceinline__ void mx_accumulate(float (&acc)[MT][NT][4], const bf16_t* __restrict__ x,
                                              const unsigned char* __restrict__ wq, const float* lut, int R, int N,
                                              int K, long long n0, int g, int t) {
    const DgRange rg = dg_range(K);
    const long long row_bytes = K >> 1, row_groups = K >> 5;
    const unsigned char* ws = wq + (long long)N * row_bytes;  // the scales follow the blocks
    const float* e2m1 = lut;
    const float* e8m0 = lut + 16;
    // Rows g and g + 8 of each feature tile, clamped to N − 1 as dg_rows clamps them (their
    // outputs are never written).
    const unsigned char* qa[MT];
    const unsigned char* qb[MT];
    const unsigned char* sa[MT];
    const unsigned char* sb[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const long long na = min(n0 + mt * 16 + g, (long long)N - 1);
        const long long nb = min(n0 + mt * 16 + g + 8, (long long)N - 1);
        qa[mt] = wq + na * row_bytes + 4 * t;
        qb[mt] = wq + nb * row_bytes + 4 * t;
        sa[mt] = ws + na * row_groups;
        sb[mt] = ws + nb * row_groups;
    }
    dg_zero<NT, MT>(acc);

    int c = rg.c0;
    // Main loop: the packed loads of DG_UNROLL chunks in flight before the first is used.
    for (; c + DG_UNROLL <= rg.c1; c += DG_UNROLL) {
        u32 pa[DG_UNROLL][MT], pb[DG_UNROLL][MT], ea[DG_UNROLL][MT], eb[DG_UNROLL][MT];
#pragma unroll
        for (int u = 0; u < DG_UNROLL; ++u)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                pa[u][mt] = mx_ld(qa[mt] + (c + u) * 16);
                pb[u][mt] = mx_ld(qb[mt] + (c + u) * 16);
                ea[u][mt] = sa[mt][c + u];
                eb[u][mt] = sb[mt][c + u];
            }
#pragma unroll
        for (int u = 0; u < DG_UNROLL; ++u) {
            uint4 wa[MT], wb[MT];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                wa[mt] = mx_dequant8(pa[u][mt], e8m0[ea[u][mt]], e2m1);
                wb[mt] = mx_dequant8(pb[u][mt], e8m0[eb[u][mt]], e2m1);
            }
            dg_chunk<NT, MT>(acc, wa, wb, x, R, K, (c + u) * 32 + 8 * t, g, true);
        }
    }
    // Remaining chunks one at a time (same order).
    for (; c < rg.c1; ++c) {
        uint4 wa[MT], wb[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            wa[mt] = mx_dequant8(mx_ld(qa[mt] + c * 16), e8m0[sa[mt][c]], e2m1);
            wb[mt] = mx_dequant8(mx_ld(qb[mt] + c * 16), e8m0[sb[mt][c]], e2m1);
        }
        dg_chunk<NT, MT>(acc, wa, wb, x, R, K, c * 32 + 8 * t, g, true);
    }
}

// moe_gemm.cu's grouped GEMM on packed experts: `weights[e]` is expert e's packed [N, K] buffer.
// The group lookup, the row tiles, the single K split and the epilogue are moe_grouped_gemm's, the
// accumulation mx_accumulate: a row's outputs are the bits moe_grouped_gemm gives on the
// dequantised weights, whatever its batch-mates.
template <int NT, int MT>
__device__ void moe_grouped_gemm_mxfp4(const bf16_t* __restrict__ x, const u64* __restrict__ weights,
                                       const float* __restrict__ lut, const u64* __restrict__ biases, bf16_t* y,
                                       const int* __restrict__ groups, const int* __restrict__ n_groups, int N,
                                       int K) {
    const int gi = blockIdx.z;
    if (gi >= *n_groups) return;  // the whole block: before the barrier
    __shared__ float s_lut[MX_LUT_LEN];
    mx_load_lut(s_lut, lut);
    const int e = groups[3 * gi], row0 = groups[3 * gi + 1], R = groups[3 * gi + 2];
    const unsigned char* w = (const unsigned char*)weights[e];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const long long n0 = ((long long)blockIdx.x * DG_WARPS + warp) * MT * 16;
    float acc[MT][NT][4];
    mx_accumulate<NT, MT>(acc, x + (long long)row0 * K, w, s_lut, R, N, K, n0, g, t);
    if (biases) moe_bias_in_registers<NT, MT>(acc, (const bf16_t*)biases[e], N, n0, g);
    dg_finish<NT, MT>(acc, y + (long long)row0 * N, R, N, N, 0, nullptr, nullptr, n0, warp, lane, g, t);
}

// The (NT, MT, blocks per multiprocessor) of MOE_GG_ENTRY.
#define MOE_GG_MX_ENTRY(NT, MT, MINB)                                                                         \
    extern "C" __global__ void __launch_bounds__(DG_WARPS * 32, MINB) moe_grouped_gemm_mxfp4_n##NT##_m##MT( \
        const bf16_t* __restrict__ x, const u64* __restrict__ weights, const float* __restrict__ lut,       \
        const u64* __restrict__ biases, bf16_t* y, const int* __restrict__ groups,                          \
        const int* __restrict__ n_groups, int N, int K) { dl_grid_begin();                                  \
        moe_grouped_gemm_mxfp4<NT, MT>(x, weights, lut, biases, y, groups, n_groups, N, K);                  \
    }
MOE_GG_MX_ENTRY(1, 1, 2)
MOE_GG_MX_ENTRY(2, 1, 2)
MOE_GG_MX_ENTRY(3, 2, 3)
MOE_GG_MX_ENTRY(4, 2, 3)
MOE_GG_MX_ENTRY(5, 2, 2)
MOE_GG_MX_ENTRY(6, 2, 2)
MOE_GG_MX_ENTRY(7, 2, 2)
MOE_GG_MX_ENTRY(8, 2, 2)

// The bf16 values of a packed weight [N, K] into `out` (row-major), n8 = N·K/8 pieces of 8 values,
// one a thread: for GEMMs that read bf16 weights (an expert on the host-routed path) and the tests'
// view of the device dequantisation. Piece i is bytes 4i..4i+3 of the blocks, in group i/4.
extern "C" __global__ void __launch_bounds__(256) mxfp4_dequant_bf16(const unsigned char* __restrict__ w,
                                                                     const float* __restrict__ lut,
                                                                     bf16_t* __restrict__ out, long long n8) {
    dl_grid_begin();
    __shared__ float s_lut[MX_LUT_LEN];
    mx_load_lut(s_lut, lut);
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    const unsigned char* scales = w + 4 * n8;  // after the N·K/2 = 4·n8 bytes of blocks
    const u32 q = ((const u32*)w)[i];
    ((uint4*)out)[i] = mx_dequant8(q, s_lut[16 + scales[i >> 2]], s_lut);
}
