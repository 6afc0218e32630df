// Grouped batch-invariant GEMM of a mixture of experts' decode step (compiled as part of the
// `decode` module, after decode_gemm.cu; crates/engine/src/backend/cuda/moe.rs launches it).
//
// Group i of the launch (blockIdx.z) multiplies `rows` consecutive rows of x, from `row0` on, by
// its expert's weight: y[row0 + r, n] = Σ_k x[row0 + r, k] · W_e[n, k], W_e = weights[e] ([N, K]
// bf16 as stored). The group table (expert, row0, rows) and its length were written on the device
// by moe_plan (moe.cu) in the same step, so the host launches with gridDim.z = an upper bound on
// the groups and never waits for the routing; blocks of groups past the table's length return at
// once. One launch covers every expert of a layer.
//
// Each group is decode_gemm's register kernel at one K split: the same `dg_accumulate`, with
// gridDim.y = 1, so every output element is reduced in the order that fixes, which depends on
// (N, K) alone: not on the group's row count, on which other experts run, or on how many. A
// token's expert outputs are therefore the same bits whatever batch it is decoded in. (The split
// is 1 rather than decode_gemm's k_splits because the partial-sum scratch would grow with the
// number of groups; the groups supply the parallelism a split would.)
//
// `biases` (null: none) is a table like `weights` of each expert's N bf16 bias values (gpt-oss):
// the epilogue then stores bf16(bf16(sum) + bias[n]), the bits of storing the product and adding
// the bias in a second pass (add_row_bias_bf16's rounding, which the host-planned path takes),
// without that pass's launch and its read and write of y. The rounding of the sum happens here, in
// registers, before dg_finish rounds again: rounding a bf16 value to bf16 leaves it unchanged.
template <int NT, int MT>
__device__ __forceinline__ void moe_bias_in_registers(float (&acc)[MT][NT][4], const bf16_t* __restrict__ bias,
                                                      int N, long long n0, int g) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            const long long n = n0 + mt * 16 + g + ((e & 2) ? 8 : 0);
            if (n >= N) continue;
            const float b = bf2f(bias[n]);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                acc[mt][j][e] = rb(acc[mt][j][e]) + b;
                acc[mt][j][e + 1] = rb(acc[mt][j][e + 1]) + b;
            }
        }
}

template <int NT, int MT>
__device__ void moe_grouped_gemm(const bf16_t* __restrict__ x, const u64* __restrict__ weights,
                                 const u64* __restrict__ biases, bf16_t* y, const int* __restrict__ groups,
                                 const int* __restrict__ n_groups, int N, int K) {
    const int gi = blockIdx.z;
    if (gi >= *n_groups) return;
    const int e = groups[3 * gi], row0 = groups[3 * gi + 1], R = groups[3 * gi + 2];
    const bf16_t* w = (const bf16_t*)weights[e];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const long long n0 = ((long long)blockIdx.x * DG_WARPS + warp) * MT * 16;
    float acc[MT][NT][4];
    dg_accumulate<NT, MT>(acc, x + (long long)row0 * K, w, R, N, K, n0, g, t);
    if (biases) moe_bias_in_registers<NT, MT>(acc, (const bf16_t*)biases[e], N, n0, g);
    dg_finish<NT, MT>(acc, y + (long long)row0 * N, R, N, N, 0, nullptr, nullptr, n0, warp, lane, g, t);
}

// The same (NT, MT) pairs as DG_ENTRY: NT row tiles cover the largest group (at most the step's
// row count), MT = 2 above 16 rows. Launch bounds as DG_ENTRY's but 2 blocks per multiprocessor
// from 5 row tiles: the group lookup's registers made the 6-tile instance spill at 3
// (scripts/check-kernels.sh).
#define MOE_GG_ENTRY(NT, MT, MINB)                                                                             \
    extern "C" __global__ void __launch_bounds__(DG_WARPS * 32, MINB)                                         \
        moe_grouped_gemm_n##NT##_m##MT(const bf16_t* __restrict__ x, const u64* __restrict__ weights,           \
                                       const u64* __restrict__ biases, bf16_t* y, const int* __restrict__ groups, \
                                       const int* __restrict__ n_groups, int N, int K) { dl_grid_begin();      \
        moe_grouped_gemm<NT, MT>(x, weights, biases, y, groups, n_groups, N, K);                               \
    }
MOE_GG_ENTRY(1, 1, 2)
MOE_GG_ENTRY(2, 1, 2)
MOE_GG_ENTRY(3, 2, 3)
MOE_GG_ENTRY(4, 2, 3)
MOE_GG_ENTRY(5, 2, 2)
MOE_GG_ENTRY(6, 2, 2)
MOE_GG_ENTRY(7, 2, 2)
MOE_GG_ENTRY(8, 2, 2)
