// Log-softmax + top-k over fp32 logits, one block per row, for the fused LM head: the host runs the
// LM-head GEMM for a chunk of rows into an fp32 scratch buffer (fp32 output of a bf16 × bf16 GEMM
// with fp32 accumulation) and this kernel reduces each row to k (id, log-prob) pairs, so full
// vocabulary logits never exist for more than one chunk of rows.
//
// Each thread scans a strided slice of the row keeping (a) an online max / sum of exp in fp32 and
// (b) its own best K candidates in registers (sorted; ties go to the lower id, as on the CPU). The
// block then merges: log-sum-exp by a tree reduction, the top k by k rounds of a block-wide argmax
// over every thread's current best candidate. Few rows (decode steps) split each row into slices
// of TOPK_SLICE logits over many blocks and merge the slices' results in a second launch.

#define TOPK_THREADS 256

__device__ __forceinline__ bool better(float a, u32 ia, float b, u32 ib) { return a > b || (a == b && ia < ib); }

#define TOPK_UNROLL 4

// Folds a group of TOPK_UNROLL float4s into the online (max m, sum of exp s): one rescale for the
// group's max, then the group's exps independently (the old one-value-at-a-time update made
// every exp wait for the previous one). Returns the group's max.
// __expf (ex2.approx): the sum's terms are ≤ 1 and its relative error stays ~1e-6, far inside
// what the log-probs are checked to (1e-5 relative against the CPU).
__device__ __forceinline__ float fold_group(const float4 (&q)[TOPK_UNROLL], float& m, float& s) {
    float gm = -DL_INF;
#pragma unroll
    for (int u = 0; u < TOPK_UNROLL; ++u) gm = fmaxf(gm, fmaxf(fmaxf(q[u].x, q[u].y), fmaxf(q[u].z, q[u].w)));
    if (gm != -DL_INF) {
        if (gm > m) {
            s = m == -DL_INF ? 0.f : s * expf(m - gm);
            m = gm;
        }
        float t = 0.f;
#pragma unroll
        for (int u = 0; u < TOPK_UNROLL; ++u)
            t += (__expf(q[u].x - m) + __expf(q[u].y - m)) + (__expf(q[u].z - m) + __expf(q[u].w - m));
        s += t;
    }
    return gm;
}

// Folds one value into (m, s) (the few values outside the float4 body).
__device__ __forceinline__ void fold_one(float v, float& m, float& s) {
    if (v > m) { s = s * expf(m - v) + 1.f; m = v; }
    else if (v != -DL_INF) s += expf(v - m);
}

// The block's (max, sum of exp) from every thread's (m, s), combined first within warps, then
// across warps in order; thread 0 gets it in `ms`.
__device__ __forceinline__ void block_max_sum(float m, float s, float2& ms) {
    __shared__ float s_m[TOPK_THREADS / 32], s_s[TOPK_THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
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
        ms = make_float2(mm, ss);
    }
}

// k rounds of a block-wide argmax over every thread's head candidate (`head(v, i)`); thread 0
// calls `win(r, v, i)` for the r-th winner, and the thread whose head won calls `pop()`.
template <typename Head, typename Pop, typename Win>
__device__ __forceinline__ void block_k_rounds(int k, Head head, Pop pop, Win win) {
    __shared__ float s_bv[TOPK_THREADS / 32];
    __shared__ u32 s_bi[TOPK_THREADS / 32];
    __shared__ u32 s_win;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int r = 0; r < k; ++r) {
        float bv;
        u32 bi;
        head(bv, bi);
        const u32 mine = bi;
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
            win(r, wv, wi);
        }
        __syncthreads();
        if (mine == s_win && s_win != 0xffffffffu) pop();
    }
}

// Scans x[begin, end) with the whole block: thread t takes the float4s t, t + 256, … of the
// 16-byte-aligned body (four in flight at a time), keeping an online max / sum of exp and its
// best K candidates. Thread 0 then holds the block's (max, sum) in `ms`, and `win(r, v,
// i)` is called by thread 0 for the r-th best (value v, id i), r = 0..k−1 (i = 0xffffffff when
// the range has fewer than k elements).
template <int K, typename Win>
__device__ void topk_scan_lists(const float* __restrict__ x, int begin, int end, int k, float2& ms, Win win) {
    const int tid = threadIdx.x, lane = tid & 31;

    float vals[K];
    u32 ids[K];
#pragma unroll
    for (int j = 0; j < K; ++j) { vals[j] = -DL_INF; ids[j] = 0xffffffffu; }
    float m = -DL_INF, s = 0.f;
    // Insert (v, i) into this thread's sorted list when it beats the list's tail (after the first
    // few groups almost every value fails the one comparison).
    auto consider = [&](float v, u32 i) {
        if (better(v, i, vals[K - 1], ids[K - 1])) {
            vals[K - 1] = v;
            ids[K - 1] = i;
#pragma unroll
            for (int j = K - 1; j > 0; --j) {
                if (better(vals[j], ids[j], vals[j - 1], ids[j - 1])) {
                    float tv = vals[j]; vals[j] = vals[j - 1]; vals[j - 1] = tv;
                    u32 ti = ids[j]; ids[j] = ids[j - 1]; ids[j - 1] = ti;
                }
            }
        }
    };
    // One value at a time: the online max / sum update (the few elements outside the float4 body).
    auto take = [&](float v, int i) {
        fold_one(v, m, s);
        consider(v, (u32)i);
    };
    // The body in float4 loads, TOPK_UNROLL of them in flight per thread, each group of 4·UNROLL
    // values folded into (m, s) at once: one rescale for the group's max, then independent exps
    // (the old one-value-at-a-time update made every exp wait for the previous one, and the scan
    // read its logits far below the copy rate: docs/benchmarks-cuda.md, "Session 14"). The elements before the first 16-byte boundary and after
    // the last whole float4 (fewer than 4 each) go through `take`.
    const int mis = (int)((reinterpret_cast<size_t>(x + begin) >> 2) & 3);
    const int a0 = min(end, begin + ((4 - mis) & 3));
    const int nvec = (end - a0) >> 2;
    const int a1 = a0 + 4 * nvec;
    if (tid < a0 - begin) take(x[begin + tid], begin + tid);
    if (tid < end - a1) take(x[a1 + tid], a1 + tid);
    const float4* __restrict__ xv = reinterpret_cast<const float4*>(x + a0);
    // A lower bound of the range's k-th largest value: a lane whose list is full holds K values
    // ≥ its list's tail, so the largest tail of the warp's lanes bounds the k-th largest from
    // below, and a value below it cannot be among the range's best (a value equal to it still
    // can, by a lower id, so only values strictly below are dropped). A lane's own tail is a weak
    // bound (it has seen ~1/256 of the row), so nearly every group used to go through the
    // insertion checks, divergent across the warp: the scan was bound by those instructions,
    // not by its loads (docs/benchmarks-cuda.md, "Session 14" and "Session 15"). The results are
    // unchanged.
    float bound = -DL_INF;
    int j = tid;
    // Warp-uniform trip count (the bound's shuffles need every lane); the rest goes below.
    for (; j - lane + 31 + (TOPK_UNROLL - 1) * TOPK_THREADS < nvec; j += TOPK_UNROLL * TOPK_THREADS) {
        float4 q[TOPK_UNROLL];
#pragma unroll
        for (int u = 0; u < TOPK_UNROLL; ++u) q[u] = xv[j + u * TOPK_THREADS];
        const float gm = fold_group(q, m, s);
        // A group whose largest value is below the bound or the list's tail cannot enter the
        // list (after the first groups, almost every group): the scan is then loads, a max and
        // the exps.
        if (!(gm < fmaxf(bound, vals[K - 1]))) {
#pragma unroll
            for (int u = 0; u < TOPK_UNROLL; ++u) {
                const u32 e = (u32)(a0 + 4 * (j + u * TOPK_THREADS));
                if (!(q[u].x < bound)) consider(q[u].x, e);
                if (!(q[u].y < bound)) consider(q[u].y, e + 1);
                if (!(q[u].z < bound)) consider(q[u].z, e + 2);
                if (!(q[u].w < bound)) consider(q[u].w, e + 3);
            }
        }
        float tail = vals[K - 1];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) tail = fmaxf(tail, __shfl_xor_sync(0xffffffffu, tail, o));
        bound = fmaxf(bound, tail);
    }
    for (; j < nvec; j += TOPK_THREADS) {
        const float4 q = xv[j];
        const int e = a0 + 4 * j;
        take(q.x, e);
        take(q.y, e + 1);
        take(q.z, e + 2);
        take(q.w, e + 3);
    }
    block_max_sum(m, s, ms);
    block_k_rounds(
        k, [&](float& v, u32& i) { v = vals[0]; i = ids[0]; },
        [&] {
#pragma unroll
            for (int j = 0; j < K - 1; ++j) { vals[j] = vals[j + 1]; ids[j] = ids[j + 1]; }
            vals[K - 1] = -DL_INF;
            ids[K - 1] = 0xffffffffu;
        },
        win);
}

// topk_scan_lists' contract with one list per warp instead of one per thread (K ≤ 32): lane l of
// a warp holds the warp's l-th best (value, id) so far, and a value enters only if it beats the
// list's tail, which every lane knows. A warp's values are offered 32 at a time by one ballot;
// the few that beat the tail are inserted one after another (a shuffle up of the entries behind
// the insertion point). The tail is the warp's k-th best of everything it has seen, so after the
// first groups almost nothing passes: Nsight Compute showed the per-thread lists' divergent
// insertions keeping topk_scan_lists compute-bound, most of each warp's lanes idle
// (docs/benchmarks-cuda.md, "Session 15", call 3). The online max / sum of exp is
// topk_scan_lists', value for value in the same order, and the block's k rounds then treat each
// lane's entry as a one-element list: the same log-sum-exp bits and the same (value, id) results,
// ties to the lower id.
template <int K, typename Win>
__device__ void topk_scan_warps(const float* __restrict__ x, int begin, int end, int k, float2& ms, Win win) {
    static_assert(K <= 32, "one list entry per lane");
    const unsigned FULL = 0xffffffffu;
    const int tid = threadIdx.x, lane = tid & 31;
    float lv = -DL_INF;  // this lane's entry of the warp's sorted list (lanes < K)
    u32 li = 0xffffffffu;
    float tv = -DL_INF;  // the list's tail (lane K − 1's entry), the same in every lane
    u32 ti = 0xffffffffu;
    float m = -DL_INF, s = 0.f;
    // Every lane calls it (the warp's loops are uniform); `has`: this lane offers (v, i).
    auto offer = [&](bool has, float v, u32 i) {
        unsigned want = __ballot_sync(FULL, has && better(v, i, tv, ti));
        while (want) {
            const int src = __ffs(want) - 1;
            want &= want - 1;
            const float bv = __shfl_sync(FULL, v, src);
            const u32 bi = __shfl_sync(FULL, i, src);
            if (!better(bv, bi, tv, ti)) continue;  // an earlier insertion raised the tail
            const int pos = __popc(__ballot_sync(FULL, lane < K && better(lv, li, bv, bi)));
            const float uv = __shfl_up_sync(FULL, lv, 1);
            const u32 ui = __shfl_up_sync(FULL, li, 1);
            if (lane == pos) {
                lv = bv;
                li = bi;
            } else if (lane > pos && lane < K) {
                lv = uv;
                li = ui;
            }
            tv = __shfl_sync(FULL, lv, K - 1);
            ti = __shfl_sync(FULL, li, K - 1);
        }
    };
    const int mis = (int)((reinterpret_cast<size_t>(x + begin) >> 2) & 3);
    const int a0 = min(end, begin + ((4 - mis) & 3));
    const int nvec = (end - a0) >> 2;
    const int a1 = a0 + 4 * nvec;
    {
        // The elements before the first 16-byte boundary and after the last whole float4 (fewer
        // than 4 each), folded first as topk_scan_lists does.
        const bool h = tid < a0 - begin, t = tid < end - a1;
        const float hv = h ? x[begin + tid] : -DL_INF, tv2 = t ? x[a1 + tid] : -DL_INF;
        if (h) fold_one(hv, m, s);
        if (t) fold_one(tv2, m, s);
        offer(h, hv, (u32)(begin + tid));
        offer(t, tv2, (u32)(a1 + tid));
    }
    const float4* __restrict__ xv = reinterpret_cast<const float4*>(x + a0);
    int j = tid;
    for (; j - lane + 31 + (TOPK_UNROLL - 1) * TOPK_THREADS < nvec; j += TOPK_UNROLL * TOPK_THREADS) {
        float4 q[TOPK_UNROLL];
#pragma unroll
        for (int u = 0; u < TOPK_UNROLL; ++u) q[u] = xv[j + u * TOPK_THREADS];
        const float gm = fold_group(q, m, s);
        // No lane's group reaches the tail (after the first groups, nearly always): skip the
        // ballots. A value equal to the tail may still win on its id, so equality does not skip.
        if (__any_sync(FULL, !(gm < tv))) {
#pragma unroll
            for (int u = 0; u < TOPK_UNROLL; ++u) {
                const u32 e = (u32)(a0 + 4 * (j + u * TOPK_THREADS));
                offer(true, q[u].x, e);
                offer(true, q[u].y, e + 1);
                offer(true, q[u].z, e + 2);
                offer(true, q[u].w, e + 3);
            }
        }
    }
    for (; j - lane < nvec; j += TOPK_THREADS) {
        const bool has = j < nvec;
        const float4 q = has ? xv[j] : make_float4(-DL_INF, -DL_INF, -DL_INF, -DL_INF);
        const u32 e = (u32)(a0 + 4 * j);
        if (has) {
            fold_one(q.x, m, s);
            fold_one(q.y, m, s);
            fold_one(q.z, m, s);
            fold_one(q.w, m, s);
        }
        offer(has, q.x, e);
        offer(has, q.y, e + 1);
        offer(has, q.z, e + 2);
        offer(has, q.w, e + 3);
    }
    block_max_sum(m, s, ms);
    // Each lane's entry is a one-element list: a won entry empties.
    block_k_rounds(
        k, [&](float& v, u32& i) { v = lv; i = li; },
        [&] {
            lv = -DL_INF;
            li = 0xffffffffu;
        },
        win);
}

// The scan for K: one list per warp up to 32 entries, else one per thread.
template <int K, typename Win>
__device__ void topk_scan(const float* __restrict__ x, int begin, int end, int k, float2& ms, Win win) {
    if constexpr (K <= 32) {
        topk_scan_warps<K>(x, begin, end, k, ms, win);
    } else {
        topk_scan_lists<K>(x, begin, end, k, ms, win);
    }
}

// The whole row in one block.
template <int K>
__device__ void topk_logsoftmax(const float* __restrict__ logits, long long ld, int vocab, int k,
                                u32* __restrict__ out_ids, float* __restrict__ out_lp) {
    const long long row = blockIdx.x;
    float2 ms;
    float lse = 0.f;
    topk_scan<K>(logits + row * ld, 0, vocab, k, ms, [&](int r, float v, u32 i) {
        if (r == 0) lse = ms.x + logf(ms.y);
        out_ids[row * k + r] = i;
        out_lp[row * k + r] = v - lse;
    });
}

// Few rows (a decode step: at most 64): one block per (slice of TOPK_SLICE logits, row), so that
// a row's scan is spread over many multiprocessors instead of one block walking 150 k logits with
// a load latency per step. Each block writes its slice's (max, sum of exp) and its best k (value,
// id) pairs; topk_merge combines them. The slices are a function of the vocabulary alone, so a
// row's result does not depend on how many rows share the launch.
#define TOPK_SLICE 4096
template <int K>
__device__ void topk_partial(const float* __restrict__ logits, long long ld, int vocab, int k,
                             float2* __restrict__ pms, float* __restrict__ pv, u32* __restrict__ pi) {
    const int sl = blockIdx.x, S = gridDim.x;
    const long long row = blockIdx.y;
    const long long at = row * S + sl;
    const int begin = sl * TOPK_SLICE, end = min(vocab, begin + TOPK_SLICE);
    float2 ms;
    topk_scan<K>(logits + row * ld, begin, end, k, ms, [&](int r, float v, u32 i) {
        if (r == 0) pms[at] = ms;
        pv[at * k + r] = v;
        pi[at * k + r] = i;
    });
}

#define TOPK_MERGE_MAX_SLICES 256
// One warp per row: log-sum-exp over the slices in slice order (lane 0), then k rounds of a warp
// argmax over the slices' heads (lane l owns slices l, l + 32, …; each slice's list is sorted, ties
// to the lower id, so its head is its best remaining candidate).
extern "C" __global__ void __launch_bounds__(32) topk_merge(const float2* __restrict__ pms, const float* __restrict__ pv,
                                                          const u32* __restrict__ pi, int S, int k,
                                                          u32* __restrict__ out_ids, float* __restrict__ out_lp) {
    dl_grid_begin();
    constexpr int OWN = TOPK_MERGE_MAX_SLICES / 32;
    const long long row = blockIdx.x;
    const int lane = threadIdx.x;
    float lse = 0.f;
    if (lane == 0) {
        float mm = -DL_INF, ss = 0.f;
        for (int s = 0; s < S; ++s) mm = fmaxf(mm, pms[row * S + s].x);
        for (int s = 0; s < S; ++s) {
            const float2 p = pms[row * S + s];
            if (p.x != -DL_INF) ss += p.y * expf(p.x - mm);
        }
        lse = mm + logf(ss);
    }
    lse = __shfl_sync(0xffffffffu, lse, 0);
    int head[OWN];
#pragma unroll
    for (int o = 0; o < OWN; ++o) head[o] = 0;
    for (int r = 0; r < k; ++r) {
        float bv = -DL_INF;
        u32 bi = 0xffffffffu;
        int bo = -1;
#pragma unroll
        for (int o = 0; o < OWN; ++o) {
            const int s = lane + 32 * o;
            if (s < S && head[o] < k) {
                const long long at = (row * S + s) * k + head[o];
                const float v = pv[at];
                const u32 i = pi[at];
                if (i != 0xffffffffu && better(v, i, bv, bi)) { bv = v; bi = i; bo = o; }
            }
        }
        float wv = bv;
        u32 wi = bi;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, wv, o);
            u32 i2 = __shfl_xor_sync(0xffffffffu, wi, o);
            if (better(v2, i2, wv, wi)) { wv = v2; wi = i2; }
        }
        if (wi == bi && bo >= 0) {
#pragma unroll
            for (int o = 0; o < OWN; ++o)
                if (o == bo) ++head[o];
        }
        if (lane == 0) {
            out_ids[row * k + r] = wi;
            out_lp[row * k + r] = wv - lse;
        }
    }
}

#define TOPK_ENTRY(K)                                                                                  \
    extern "C" __global__ void __launch_bounds__(TOPK_THREADS)                                         \
        topk_logsoftmax_k##K(const float* logits, long long ld, int vocab, int k, u32* ids, float* lp) { dl_grid_begin(); \
        topk_logsoftmax<K>(logits, ld, vocab, k, ids, lp);                                             \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(TOPK_THREADS)                                         \
        topk_partial_k##K(const float* logits, long long ld, int vocab, int k, float2* pms, float* pv,   \
                          u32* pi) { dl_grid_begin();                                                  \
        topk_partial<K>(logits, ld, vocab, k, pms, pv, pi);                                            \
    }
TOPK_ENTRY(8)
TOPK_ENTRY(16)
TOPK_ENTRY(32)
TOPK_ENTRY(64)
