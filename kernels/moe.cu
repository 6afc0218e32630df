// Mixture-of-experts combine (`Backend::add_weighted_rows`, crates/engine/src/backend/moe.rs is
// the host reference). Compiled as part of the `elementwise` module.
//
// acc[r] += sum_j w[r*n + j] * src[index[r*n + j]]: block (blockIdx.y, r) owns row r's columns
// [blockIdx.y * blockDim.x, ...), one a thread, so that a decode step's few rows are spread over
// many blocks (a block walking a whole 2 880-wide row took 10 us, one load round trip per 256
// columns). Each product and the running sum are rounded to f32 in j order (__fmul_rn /
// __fadd_rn: no FMA contraction), exactly the host reference's arithmetic on the same bf16
// inputs; the sum is added to acc in f32 and rounded to bf16 once. A row reads only its own
// terms: its result does not depend on the other rows or on how many there are.
extern "C" __global__ void moe_add_weighted_rows_bf16(bf16_t* __restrict__ acc, const bf16_t* __restrict__ src,
                                                      const u32* __restrict__ index,
                                                      const float* __restrict__ weights, long long cols, int n) {
    dl_grid_begin();
    const long long r = blockIdx.x;
    const long long c = (long long)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const u32* idx = index + r * n;
    const float* w = weights + r * n;
    float sum = 0.f;
    for (int j = 0; j < n; ++j) sum = __fadd_rn(sum, __fmul_rn(w[j], bf2f(src[(long long)idx[j] * cols + c])));
    acc[r * cols + c] = f2bf(__fadd_rn(bf2f(acc[r * cols + c]), sum));
}

// ---------------------------------------------------------------------------------------------
// Routing on the device (crates/engine/src/backend/cuda/moe.rs). These kernels replace the host's
// download of the router logits, `RoutingPlan` and the upload of its lists: moe_route (per row),
// moe_plan_* (the lists) and moe_gather_rows (gpt-oss's expert biases are added in the grouped
// GEMMs' epilogue, moe_gemm.cu). The
// rules are `crate::model::moe::route` (transformers' Qwen3-MoE / Qwen3.5-MoE / Qwen3-Next routers)
// and `route_topk_softmax` (gpt-oss's).

#define MOE_MAX_TOP_K 16
#define MOE_ROUTE_THREADS 128

// (value, index) of the largest value in the block, ties to the lower index. Every thread gets it.
template <typename T>
__device__ __forceinline__ void moe_block_argmax(T& v, int& i) {
    __shared__ T s_v[MOE_ROUTE_THREADS / 32];
    __shared__ int s_i[MOE_ROUTE_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        const T ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) {
            v = ov;
            i = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the previous call's readers are done with s_v / s_i
    if (lane == 0) {
        s_v[warp] = v;
        s_i[warp] = i;
    }
    __syncthreads();
    v = s_v[0];
    i = s_i[0];
    for (int w = 1; w < MOE_ROUTE_THREADS / 32; ++w)
        if (s_v[w] > v || (s_v[w] == v && s_i[w] < i)) {
            v = s_v[w];
            i = s_i[w];
        }
}

// Sum over the block in a fixed order (each thread's strided partial, a warp butterfly, then the
// warps in order): the same for every row, so a row's routing never depends on its batch-mates.
__device__ __forceinline__ float moe_block_sum(float v) {
    __shared__ float s_sum[MOE_ROUTE_THREADS / 32];
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) s_sum[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < MOE_ROUTE_THREADS / 32; ++w) s += s_sum[w];
    return s;
}

// A float's place in Rust's `f32::total_cmp` order as a signed int (the host rules sort with it):
// -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN.
__device__ __forceinline__ int moe_order_key(float v) {
    const int b = __float_as_int(v);
    return b ^ (int)((unsigned)(b >> 31) >> 1);
}
// What a chosen expert's score becomes: bits 0xffffffff, whose key is MOE_KEY_MIN (INT_MIN), below
// the key of every value a score can hold (a bf16 logit's low 16 bits are 0; a NaN the device
// computes is 0x7fffffff).
#define MOE_TAKEN __int_as_float(-1)
#define MOE_KEY_MIN (-2147483647 - 1)

// One block of MOE_ROUTE_THREADS per row r of the router logits ([T, width] bf16: E routing
// logits, then with a shared expert its gate logit), by one of two rules:
//   topk_first = 0 (`route`, Qwen): probs = softmax(logits) in f32 (max subtracted), the top_k
//     largest probabilities, divided by their sum (added largest first) when `renorm`;
//   topk_first = 1 (`route_topk_softmax`, gpt-oss): the top_k largest logits, then softmax over
//     those k in f32 (the largest subtracted, the exponentials summed largest first; `renorm` 0).
// The top-k by k rounds of block argmax in total_cmp order, ties to the lower expert. Written as
// row r's top_k (expert, weight) in ascending expert order, and sigmoid(gate logit) to
// shared_gate[r] when width > E. Dynamic shared memory: E floats.
extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS)
    moe_route(const bf16_t* __restrict__ logits, int width, int E, int top_k, int renorm, int topk_first,
              int* __restrict__ route_expert, float* __restrict__ route_weight, float* __restrict__ shared_gate) {
    dl_grid_begin();
    extern __shared__ float moe_probs[];
    __shared__ int s_exp[MOE_MAX_TOP_K];
    __shared__ float s_p[MOE_MAX_TOP_K];
    const long long r = blockIdx.x;
    const bf16_t* l = logits + r * width;
    if (topk_first) {
        for (int i = threadIdx.x; i < E; i += blockDim.x) moe_probs[i] = bf2f(l[i]);
    } else {
        float m = -DL_INF;
        for (int i = threadIdx.x; i < E; i += blockDim.x) m = fmaxf(m, bf2f(l[i]));
        int unused = 0;
        moe_block_argmax(m, unused);
        float part = 0.f;
        for (int i = threadIdx.x; i < E; i += blockDim.x) {
            const float x = expf(bf2f(l[i]) - m);
            moe_probs[i] = x;
            part += x;
        }
        const float sum = moe_block_sum(part);
        for (int i = threadIdx.x; i < E; i += blockDim.x) moe_probs[i] = moe_probs[i] / sum;
    }
    __syncthreads();
    for (int j = 0; j < top_k; ++j) {
        int key = MOE_KEY_MIN;  // below every score's key: a thread without candidates keeps best = E
        int best = E;
        for (int i = threadIdx.x; i < E; i += blockDim.x) {
            const int ki = moe_order_key(moe_probs[i]);
            if (ki > key) {  // strided ascending: the first of equal values stays
                key = ki;
                best = i;
            }
        }
        moe_block_argmax(key, best);  // top_k <= E: an expert not yet taken wins, best < E
        if (threadIdx.x == 0) {
            s_exp[j] = best;
            s_p[j] = moe_probs[best];
            moe_probs[best] = MOE_TAKEN;  // never chosen again
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float total = 0.f;
        if (topk_first) {
            // Softmax over the k logits, chosen largest first: s_p[0] is their max.
            const float m = s_p[0];
            for (int j = 0; j < top_k; ++j) {
                s_p[j] = expf(__fsub_rn(s_p[j], m));
                total = __fadd_rn(total, s_p[j]);
            }
            for (int j = 0; j < top_k; ++j) s_p[j] = __fdiv_rn(s_p[j], total);
        } else {
            for (int j = 0; j < top_k; ++j) total += s_p[j];
        }
        // Insertion sort by expert id (top_k ≤ 16).
        for (int j = 1; j < top_k; ++j) {
            const int e = s_exp[j];
            const float p = s_p[j];
            int q = j - 1;
            while (q >= 0 && s_exp[q] > e) {
                s_exp[q + 1] = s_exp[q];
                s_p[q + 1] = s_p[q];
                --q;
            }
            s_exp[q + 1] = e;
            s_p[q + 1] = p;
        }
        for (int j = 0; j < top_k; ++j) {
            route_expert[r * top_k + j] = s_exp[j];
            route_weight[r * top_k + j] = renorm ? s_p[j] / total : s_p[j];
        }
        if (width > E) shared_gate[r] = 1.f / (1.f + expf(-bf2f(l[E])));
    }
}

// The plan of a step, from the T·top_k routes (row r's experts at r·top_k …, ascending): what
// `RoutingPlan::from_routes` builds on the host, in three launches that scale to a packed
// prefill's rows:
//   moe_plan_count (one thread per route): cnt[e] = routes to expert e (cnt zeroed before);
//   moe_plan_groups (one warp): start[e] = Σ_{e' < e} cnt[e'], the group table (expert, first
//     gathered row, rows ≤ max_rows) in ascending expert order and n_groups[0] = G; cursor zeroed;
//   moe_plan_fill (one thread per route): each route takes the next slot of its expert's block,
//     gather[slot] = its row, and row r's term j = (slot, weight); with a shared expert, row r's
//     last term = (T·top_k + r, shared_gate[r]).
// A step of few routes runs the same three phases in one block (moe_plan_one_block, below).
// Which slot of its expert's block a row takes depends on the order the atomics land in; nothing
// else does: the grouped GEMM gives a row the same bits wherever it sits in its group
// (moe_gemm.cu), and the combine reads each row's terms in its own fixed order.
extern "C" __global__ void moe_plan_count(const int* __restrict__ route_expert, int n, int* __restrict__ cnt) {
    dl_grid_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(cnt + route_expert[i], 1);
}

// One warp: 32 experts at a time, each lane one expert, the block offsets by warp scans.
__device__ __forceinline__ void plan_groups(const int* __restrict__ cnt, int E, int max_rows, int* __restrict__ start,
                                            int* __restrict__ cursor, int* __restrict__ groups,
                                            int* __restrict__ n_groups) {
    const int lane = threadIdx.x & 31;
    int rows_before = 0, groups_before = 0;  // of the experts below this 32-expert slice
    for (int base = 0; base < E; base += 32) {
        const int e = base + lane;
        const int c = e < E ? cnt[e] : 0;
        const int g = (c + max_rows - 1) / max_rows;
        int c_incl = c, g_incl = g;  // inclusive scans over the slice's lanes
        for (int o = 1; o < 32; o <<= 1) {
            const int cu = __shfl_up_sync(0xffffffffu, c_incl, o), gu = __shfl_up_sync(0xffffffffu, g_incl, o);
            if (lane >= o) {
                c_incl += cu;
                g_incl += gu;
            }
        }
        const int s = rows_before + c_incl - c, G0 = groups_before + g_incl - g;
        if (e < E) {
            start[e] = s;
            cursor[e] = 0;
            for (int q = 0; q < g; ++q) {
                groups[3 * (G0 + q)] = e;
                groups[3 * (G0 + q) + 1] = s + q * max_rows;
                groups[3 * (G0 + q) + 2] = min(max_rows, c - q * max_rows);
            }
        }
        rows_before += __shfl_sync(0xffffffffu, c_incl, 31);
        groups_before += __shfl_sync(0xffffffffu, g_incl, 31);
    }
    if (lane == 0) *n_groups = groups_before;
}

extern "C" __global__ void moe_plan_groups(const int* __restrict__ cnt, int E, int max_rows, int* __restrict__ start,
                                           int* __restrict__ cursor, int* __restrict__ groups,
                                           int* __restrict__ n_groups) {
    dl_grid_begin();
    plan_groups(cnt, E, max_rows, start, cursor, groups, n_groups);
}

// Route i's slot, gather entry and term (moe_plan_fill's thread i).
__device__ __forceinline__ void plan_fill_route(int i, const int* __restrict__ route_expert,
                                                const float* __restrict__ route_weight,
                                                const float* __restrict__ shared_gate, int T, int top_k,
                                                const int* __restrict__ start, int* __restrict__ cursor,
                                                u32* __restrict__ gather, u32* __restrict__ term_index,
                                                float* __restrict__ term_weight) {
    const int e = route_expert[i], r = i / top_k, j = i % top_k;
    const int terms = top_k + (shared_gate != nullptr ? 1 : 0);
    const int slot = start[e] + atomicAdd(cursor + e, 1);
    gather[slot] = (u32)r;
    term_index[(long long)r * terms + j] = (u32)slot;
    term_weight[(long long)r * terms + j] = route_weight[i];
    if (shared_gate != nullptr && j == 0) {
        term_index[(long long)r * terms + top_k] = (u32)(T * top_k + r);
        term_weight[(long long)r * terms + top_k] = shared_gate[r];
    }
}

extern "C" __global__ void moe_plan_fill(const int* __restrict__ route_expert, const float* __restrict__ route_weight,
                                         const float* __restrict__ shared_gate, int T, int top_k,
                                         const int* __restrict__ start, int* __restrict__ cursor,
                                         u32* __restrict__ gather, u32* __restrict__ term_index,
                                         float* __restrict__ term_weight) {
    dl_grid_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < T * top_k)
        plan_fill_route(i, route_expert, route_weight, shared_gate, T, top_k, start, cursor, gather, term_index,
                        term_weight);
}

// The whole plan of a few routes in one block (a decode step: T · top_k ≤ a few hundred): the
// counts zeroed, then moe_plan_count, moe_plan_groups (warp 0) and moe_plan_fill in turn, each
// phase's global writes made visible to the block by __syncthreads. One launch instead of a memset
// and three: at batch 1 each of those took ~1 µs of GPU time and ~1 µs of gap around it.
extern "C" __global__ void moe_plan_one_block(const int* __restrict__ route_expert,
                                              const float* __restrict__ route_weight,
                                              const float* __restrict__ shared_gate, int T, int top_k, int E,
                                              int max_rows, int* __restrict__ cnt, int* __restrict__ start,
                                              int* __restrict__ cursor, int* __restrict__ groups,
                                              int* __restrict__ n_groups, u32* __restrict__ gather,
                                              u32* __restrict__ term_index, float* __restrict__ term_weight) {
    dl_grid_begin();
    const int n = T * top_k;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(cnt + route_expert[i], 1);
    __syncthreads();
    if (threadIdx.x < 32) plan_groups(cnt, E, max_rows, start, cursor, groups, n_groups);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        plan_fill_route(i, route_expert, route_weight, shared_gate, T, top_k, start, cursor, gather, term_index,
                        term_weight);
}

// y[i] = x[rows[i]] for rows of `cols` bf16 values: one block per output row.
extern "C" __global__ void moe_gather_rows_bf16(const bf16_t* __restrict__ x, const u32* __restrict__ rows,
                                                bf16_t* __restrict__ y, long long cols) {
    dl_grid_begin();
    const long long i = blockIdx.x;
    const bf16_t* src = x + (long long)rows[i] * cols;
    bf16_t* dst = y + i * cols;
    if ((cols & 7) == 0) {
        for (long long c = threadIdx.x * 8; c < cols; c += blockDim.x * 8) *(uint4*)(dst + c) = *(const uint4*)(src + c);
    } else {
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
    }
}
