// Log-softmax + top-k over fp32 logits, one block per row, for the fused LM head: the host runs the
// LM-head GEMM for a chunk of rows into an fp32 scratch buffer (fp32 output of a bf16 × bf16 GEMM
// with fp32 accumulation) and this kernel reduces each row to k (id, log-prob) pairs, so full
// vocabulary logits never exist for more than one chunk of rows.
//
// Each thread scans a strided slice of the row keeping (a) an online max / sum of exp in fp32 and
// (b) its own best K candidates in registers (sorted; ties go to the lower id, as on the CPU). The
// block then merges: log-sum-exp by a tree reduction, the top k by k rounds of a block-wide argmax
// over every thread's current best candidate.

#define TOPK_THREADS 256

__device__ __forceinline__ bool better(float a, u32 ia, float b, u32 ib) { return a > b || (a == b && ia < ib); }

template <int K>
__device__ void topk_logsoftmax(const float* __restrict__ logits, long long ld, int vocab, int k,
                                u32* __restrict__ out_ids, float* __restrict__ out_lp) {
    __shared__ float s_m[TOPK_THREADS / 32], s_s[TOPK_THREADS / 32];
    __shared__ float s_bv[TOPK_THREADS / 32];
    __shared__ u32 s_bi[TOPK_THREADS / 32];
    __shared__ float s_lse;
    __shared__ u32 s_win;

    const long long row = blockIdx.x;
    const float* x = logits + row * ld;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    float vals[K];
    u32 ids[K];
#pragma unroll
    for (int j = 0; j < K; ++j) { vals[j] = -DL_INF; ids[j] = 0xffffffffu; }
    float m = -DL_INF, s = 0.f;
    for (int i = tid; i < vocab; i += TOPK_THREADS) {
        float v = x[i];
        if (v > m) { s = s * expf(m - v) + 1.f; m = v; }
        else if (v != -DL_INF) s += expf(v - m);
        if (better(v, (u32)i, vals[K - 1], ids[K - 1])) {
            vals[K - 1] = v;
            ids[K - 1] = (u32)i;
#pragma unroll
            for (int j = K - 1; j > 0; --j) {
                if (better(vals[j], ids[j], vals[j - 1], ids[j - 1])) {
                    float tv = vals[j]; vals[j] = vals[j - 1]; vals[j - 1] = tv;
                    u32 ti = ids[j]; ids[j] = ids[j - 1]; ids[j - 1] = ti;
                }
            }
        }
    }
    // log-sum-exp: combine (m, s) pairs, first within warps, then across warps.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        float mm = fmaxf(m, m2);
        s = (m == -DL_INF ? 0.f : s * expf(m - mm)) + (m2 == -DL_INF ? 0.f : s2 * expf(m2 - mm));
        m = mm;
    }
    if (lane == 0) { s_m[warp] = m; s_s[warp] = s; }
    __syncthreads();
    if (tid == 0) {
        float mm = -DL_INF, ss = 0.f;
        for (int w = 0; w < TOPK_THREADS / 32; ++w) mm = fmaxf(mm, s_m[w]);
        for (int w = 0; w < TOPK_THREADS / 32; ++w)
            if (s_m[w] != -DL_INF) ss += s_s[w] * expf(s_m[w] - mm);
        s_lse = mm + logf(ss);
    }
    // k rounds: block argmax over each thread's head candidate; the winner drops its head.
    for (int r = 0; r < k; ++r) {
        float bv = vals[0];
        u32 bi = ids[0];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            u32 i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(v2, i2, bv, bi)) { bv = v2; bi = i2; }
        }
        if (lane == 0) { s_bv[warp] = bv; s_bi[warp] = bi; }
        __syncthreads();
        if (tid == 0) {
            float wv = s_bv[0];
            u32 wi = s_bi[0];
            for (int w = 1; w < TOPK_THREADS / 32; ++w)
                if (better(s_bv[w], s_bi[w], wv, wi)) { wv = s_bv[w]; wi = s_bi[w]; }
            s_win = wi;
            out_ids[row * k + r] = wi;
            out_lp[row * k + r] = wv - s_lse;
        }
        __syncthreads();
        if (ids[0] == s_win && s_win != 0xffffffffu) {
#pragma unroll
            for (int j = 0; j < K - 1; ++j) { vals[j] = vals[j + 1]; ids[j] = ids[j + 1]; }
            vals[K - 1] = -DL_INF;
            ids[K - 1] = 0xffffffffu;
        }
    }
}

#define TOPK_ENTRY(K)                                                                                  \
    extern "C" __global__ void __launch_bounds__(TOPK_THREADS)                                         \
        topk_logsoftmax_k##K(const float* logits, long long ld, int vocab, int k, u32* ids, float* lp) { \
        topk_logsoftmax<K>(logits, ld, vocab, k, ids, lp);                                             \
    }
TOPK_ENTRY(8)
TOPK_ENTRY(16)
TOPK_ENTRY(32)
TOPK_ENTRY(64)
