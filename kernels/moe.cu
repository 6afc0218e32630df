// Mixture-of-experts combine (`Backend::add_weighted_rows`, crates/engine/src/backend/moe.rs is
// the host reference). Compiled as part of the `elementwise` module.
//
// acc[r] += sum_j w[r*n + j] * src[index[r*n + j]]: one block per row r, threads over columns.
// Each product and the running sum are rounded to f32 in j order (__fmul_rn / __fadd_rn: no FMA
// contraction), exactly the host reference's arithmetic on the same bf16 inputs; the sum is added
// to acc in f32 and rounded to bf16 once. A row reads only its own terms: its result does not
// depend on the other rows or on how many there are.
extern "C" __global__ void moe_add_weighted_rows_bf16(bf16_t* __restrict__ acc, const bf16_t* __restrict__ src,
                                                      const u32* __restrict__ index,
                                                      const float* __restrict__ weights, long long cols, int n) {
    const long long r = blockIdx.x;
    const u32* idx = index + r * n;
    const float* w = weights + r * n;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
        float sum = 0.f;
        for (int j = 0; j < n; ++j) sum = __fadd_rn(sum, __fmul_rn(w[j], bf2f(src[(long long)idx[j] * cols + c])));
        acc[r * cols + c] = f2bf(__fadd_rn(bf2f(acc[r * cols + c]), sum));
    }
}
