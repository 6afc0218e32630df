// The LM head fused with its top-K for many rows (more than 64: the drafter's scoring, thousands of
// anchors × block positions against a ~152k vocabulary): per row, the k best (id, logit) of
// x · Wᵀ and the row's log-sum-exp, without ever writing the [rows, vocab] logits.
//
// Operands: x [R, H] bf16 (R rows of the hidden state), W [N, H] bf16 (the LM head as stored,
// N = vocabulary), H % 8 == 0 (16-byte rows for cp.async; the host falls back to the unfused path
// otherwise). Logits are fp32 sums of bf16 products on the tensor cores (mma.sync m16n8k16, fp32
// accumulation): the unfused path's GEMM with fp32 output, in another order of summation.
//
// Work split. The vocabulary is cut into slices of `tiles_per_slice` tiles of LH_BN = 256 ids
// (the host picks the slice so that there are at most TOPK_MERGE_MAX_SLICES of them); one block
// owns LH_BM = 128 rows × one slice and walks the slice's tiles one after another. Each tile is an
// ordinary tiled GEMM (below); its epilogue folds the tile's logits into per-row state that lives
// in shared memory for the whole slice:
//   - per (row, warp column group wn of 64 ids): a running (max, sum of exp), online;
//   - per row: a sorted list of the k best (logit, id) so far, ties to the lower id (the CPU's and
//     kernels/topk.cu's rule), and its tail, below which nothing can enter.
// At the end of the slice each row's list and its (max, sum) go to small partials
// [R, slices, k] values and ids + [R, slices] float2: exactly the format of kernels/topk.cu's
// sliced pass, so `topk_merge` (one warp per row) finishes the job: log-sum-exp over the slices
// in slice order, the k best of the slices' lists, log-prob = logit − logsumexp. Only the partials
// (≈ slices × (8k + 8) bytes per row: 2.7 KB at k = 8 and 38 slices, against 608 KB of fp32
// logits) reach memory.
//
// The GEMM. Block: 8 warps, 2 (rows) × 4 (ids), warp tile 64 rows × 64 ids = 4 m16 tiles × 8 n8
// tiles, 128 fp32 accumulators per thread. Stages of LH_BK = 32 hidden values: x [128][32] and
// W [256][32] bf16, 64 bytes per row, the 16-byte chunk c of row r stored at chunk
// c ^ ((r >> 1) & 3) (two rows share a 128-byte line, so eight consecutive rows at one chunk hit
// eight distinct 16-byte bank groups: ldmatrix and cp.async are bank-conflict free). LH_STAGES = 4
// stages of cp.async copies in flight across tile boundaries (the loop runs over (tile, chunk)
// steps, so the next tile's first chunks load during this tile's epilogue). Operand fragments by
// ldmatrix.x4, the lane addressing of flash_attention2's Q·Kᵀ (x is its Q, W its K).
//
// Summation order, fixed by (N, H) and the slice width alone, never by R or a row's block-mates
// (the fused path is batch-invariant, though not bit-identical to the unfused one):
//   1. logit (r, n): the hidden dimension in 16-wide steps, increasing, each one mma.sync step
//      accumulating into the same fp32 register (the tensor core's order within a step);
//   2. per tile and row, each of the 4 lanes that share the row in a warp sums exp(v − m) over its
//      16 values: per n8 tile its two columns' terms added, those pair sums added in n8-tile order;
//      m the warp's 64-id maximum (`__expf`, as topk.cu's bulk); the 4 lanes' sums by an xor
//      butterfly (1 then 2);
//   3. that (m, sum) folds into the (row, wn) running state tile after tile in vocabulary order
//      (rescale by `expf`);
//   4. at the slice's end the four wn states combine in wn order 0..3 (max first, then the
//      rescaled sums);
//   5. topk_merge combines the slices in slice order and takes logf (kernels/topk.cu).
//
// The top-K epilogue, per tile, in 4 rounds of 64 ids: every warp writes 2 of its 8 n8 tiles
// (16 ids × 64 rows) into an fp32 buffer [64 ids][132] (row-contiguous, padded: conflict-free for
// the fragment writes and for the row owners' reads); after a barrier, thread t < 128 (the owner
// of row t) scans the 64 values of its row, 8 at a time: a group whose maximum is below the list's
// tail is skipped in one comparison (after the slice's first tile nearly every group), otherwise
// each value better than the tail is inserted into the row's list (shared memory [k][128], the
// entries of one rank contiguous over rows). A row's list is only ever touched by its owner.

#define LH_BM 128                                       // rows per block
#define LH_BN 256                                       // vocabulary ids per tile
#define LH_BK 32                                        // hidden values per stage
#define LH_STAGES 4
#define LH_THREADS 256                                  // 8 warps: 2 (rows) × 4 (ids)
#define LH_ROW_BYTES (LH_BK * 2)                        // one row of a stage
#define LH_STAGE_BYTES ((LH_BM + LH_BN) * LH_ROW_BYTES) // 24 KiB
#define LH_ROUND_IDS 64                                 // ids per epilogue round
#define LH_BUF_LD 132                                   // floats per buffer column (128 rows + 4)
#define LH_WN 4                                         // warp column groups
#define LH_GROUP 16                                     // row blocks per raster group
// Dynamic shared memory of the K instance: stages, the round buffer, the (row, wn) log-sum-exp
// states, the lists' values and ids. The host's `fused_smem_bytes` (backend/cuda/lm_head.rs)
// computes the same sum: 136 192 + 1 024·K bytes (144 384 at K = 8, 201 728 at K = 64).
#define LH_SMEM_BYTES(K) \
    (LH_STAGES * LH_STAGE_BYTES + LH_ROUND_IDS * LH_BUF_LD * 4 + LH_WN * LH_BM * 8 + (K) * LH_BM * 8)

// (a, ia) ranks before (b, ib): larger value, or the same value and a lower id (kernels/topk.cu's
// `better`; NaN never ranks before anything).
__device__ __forceinline__ bool lh_better(float a, u32 ia, float b, u32 ib) { return a > b || (a == b && ia < ib); }

// Byte offset of 16-byte chunk c (0..3) of row r in a stage's x or W part.
__device__ __forceinline__ u32 lh_swz(int r, int c) { return (u32)(r * LH_ROW_BYTES + ((c ^ ((r >> 1) & 3)) << 4)); }

// Copies hidden chunk kc (values kc·32 .. +32) of the block's x rows [row0, row0 + 128) and W rows
// [n0, n0 + 256) into the stage at shared address st; rows past R or N and values past H are
// zero-filled. 1 536 pieces of 16 bytes, 6 per thread: 2 of x, 4 of W.
__device__ __forceinline__ void lh_load_stage(u32 st, const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                              int R, int N, int H, int row0, int n0, int kc) {
    const int k0 = kc * LH_BK;
#pragma unroll
    for (int i = 0; i < (LH_BM + LH_BN) * 4 / LH_THREADS; ++i) {
        const int p = threadIdx.x + i * LH_THREADS;
        const int c = p & 3;
        const bool kin = k0 + c * 8 < H;
        if (i < LH_BM * 4 / LH_THREADS) {
            const int r = p >> 2;
            const bool ok = kin && row0 + r < R;
            cp_async16_s(st + lh_swz(r, c), ok ? (const void*)(x + (long long)(row0 + r) * H + k0 + c * 8) : (const void*)x,
                         ok);
        } else {
            const int r = (p >> 2) - LH_BM;
            const bool ok = kin && n0 + r < N;
            cp_async16_s(st + LH_BM * LH_ROW_BYTES + lh_swz(r, c),
                         ok ? (const void*)(w + (long long)(n0 + r) * H + k0 + c * 8) : (const void*)w, ok);
        }
    }
}

// The two m16n8k16 steps of one stage for this warp's 64 × 64 tile. a_off / b_off: this lane's
// ldmatrix row (bytes from the stage) in the x and W parts; sw = (lane >> 1) & 3 is the swizzle of
// every row a lane addresses (all of them are ≡ lane's own row mod 8).
__device__ __forceinline__ void lh_mma_stage(float (&acc)[4][8][4], u32 st, u32 a_off, u32 b_off, int lane) {
    const int sw = (lane >> 1) & 3;
#pragma unroll
    for (int kk = 0; kk < LH_BK / 16; ++kk) {
        const u32 ya = (u32)(((kk * 2 + (lane >> 4)) ^ sw) << 4);
        const u32 yb = (u32)(((kk * 2 + ((lane >> 3) & 1)) ^ sw) << 4);
        u32 a[4][4];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
            ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], st + a_off + mt * 16 * LH_ROW_BYTES + ya);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            u32 b0, b1, b2, b3;
            ldsm_x4(b0, b1, b2, b3, st + b_off + np * 16 * LH_ROW_BYTES + yb);
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                mma_bf16(acc[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                mma_bf16(acc[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
            }
        }
    }
}

// A row owner's state: its list has `cnt` entries; (tv, ti) is the entry a value must beat, the
// tail (k−1)-th once the list is full, (−inf, 0xffffffff) before (every value but NaN beats it).
struct LhOwner {
    int cnt;
    float tv;
    u32 ti;
};

// Inserts (v, id), which beats the tail, into row `row`'s sorted list (entry j at lv/li[j·128 + row]).
__device__ __forceinline__ void lh_insert(float* lv, u32* li, int row, int k, LhOwner& o, float v, u32 id) {
    int j = min(o.cnt, k - 1);  // a free slot, or the tail, which drops out
    while (j > 0) {
        const float pv = lv[(j - 1) * LH_BM + row];
        const u32 pi = li[(j - 1) * LH_BM + row];
        if (!lh_better(v, id, pv, pi)) break;
        lv[j * LH_BM + row] = pv;
        li[j * LH_BM + row] = pi;
        --j;
    }
    lv[j * LH_BM + row] = v;
    li[j * LH_BM + row] = id;
    o.cnt = min(o.cnt + 1, k);
    if (o.cnt == k) {
        o.tv = lv[(k - 1) * LH_BM + row];
        o.ti = li[(k - 1) * LH_BM + row];
    }
}

// The owner of row `row` takes the 64 values of round r from the buffer: column c holds the tile's
// id n0 + 64·(c / 16) + 16·r + c % 16 (the writers' layout below). Ids at or past n_end (the
// vocabulary's end) are not candidates.
__device__ __forceinline__ void lh_scan_round(const float* buf, float* lv, u32* li, int row, int k, LhOwner& o,
                                              u32 n0, int r, u32 n_end) {
#pragma unroll 1
    for (int c0 = 0; c0 < LH_ROUND_IDS; c0 += 8) {
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = buf[(c0 + e) * LH_BUF_LD + row];
        float gm = v[0];
#pragma unroll
        for (int e = 1; e < 8; ++e) gm = fmaxf(gm, v[e]);
        // Nothing in the group reaches the tail (a value equal to it may still win on its id).
        if (gm < o.tv) continue;
        const u32 id0 = n0 + (u32)((c0 >> 4) * 64 + 16 * r + (c0 & 15));
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const u32 id = id0 + e;
            if (id < n_end && lh_better(v[e], id, o.tv, o.ti)) lh_insert(lv, li, row, k, o, v[e], id);
        }
    }
}

template <int K>
__device__ void lm_head_topk_partial(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, int R, int N,
                                     int H, int k, int tiles_per_slice, int slices, float2* __restrict__ pms,
                                     float* __restrict__ pv, u32* __restrict__ pi) {
    extern __shared__ __align__(128) unsigned char lh_smem[];
    float* buf = (float*)(lh_smem + LH_STAGES * LH_STAGE_BYTES);
    float2* lse = (float2*)(buf + LH_ROUND_IDS * LH_BUF_LD);  // [wn][row]
    float* lv = (float*)(lse + LH_WN * LH_BM);                // [rank][row]
    u32* li = (u32*)(lv + K * LH_BM);
    const u32 st0 = smem_u32(lh_smem);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 1, wn = warp >> 1;
    const int g = lane >> 2, t = lane & 3;

    // Raster: consecutive blocks take LH_GROUP row blocks of one slice, then the next slice, so the
    // blocks resident at once share ~16 row blocks of x and ~8 slices of W in L2.
    const int row_blocks = (R + LH_BM - 1) / LH_BM;
    const int per_group = LH_GROUP * slices;
    const int grp = blockIdx.x / per_group, within = blockIdx.x % per_group;
    const int rows_in_group = min(LH_GROUP, row_blocks - grp * LH_GROUP);
    const int row0 = (grp * LH_GROUP + within % rows_in_group) * LH_BM;
    const int slice = within / rows_in_group;
    const int n_begin = slice * tiles_per_slice * LH_BN;
    const int n_end = min(N, n_begin + tiles_per_slice * LH_BN);
    const int ntiles = (n_end - n_begin + LH_BN - 1) / LH_BN;
    const int kchunks = (H + LH_BK - 1) / LH_BK;
    const int steps = ntiles * kchunks;

    LhOwner own{0, -DL_INF, 0xffffffffu};
    if (tid < LH_BM) {
        for (int j = 0; j < k; ++j) {
            lv[j * LH_BM + tid] = -DL_INF;
            li[j * LH_BM + tid] = 0xffffffffu;
        }
#pragma unroll
        for (int q = 0; q < LH_WN; ++q) lse[q * LH_BM + tid] = make_float2(-DL_INF, 0.f);
    }
    // (Ordered before any use by the main loop's first barrier.)

    const u32 a_off = (u32)((wm * 64 + (lane & 15)) * LH_ROW_BYTES);
    const u32 b_off = (u32)(LH_BM * LH_ROW_BYTES + (wn * 64 + (lane & 7) + (lane >> 4) * 8) * LH_ROW_BYTES);
    float acc[4][8][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;

#pragma unroll
    for (int s = 0; s < LH_STAGES - 1; ++s) {
        if (s < steps)
            lh_load_stage(st0 + s * LH_STAGE_BYTES, x, w, R, N, H, row0, n_begin + (s / kchunks) * LH_BN, s % kchunks);
        cp_async_commit();
    }
    int kc = 0, tile = 0;  // of step i
    for (int i = 0; i < steps; ++i) {
        cp_async_wait<LH_STAGES - 2>();  // this thread's copies of step i have landed
        __syncthreads();                 // everyone's have, and everyone is done with step i − 1's stage
        const int nx = i + LH_STAGES - 1;
        if (nx < steps)
            lh_load_stage(st0 + (nx % LH_STAGES) * LH_STAGE_BYTES, x, w, R, N, H, row0,
                          n_begin + (nx / kchunks) * LH_BN, nx % kchunks);
        cp_async_commit();
        lh_mma_stage(acc, st0 + (i % LH_STAGES) * LH_STAGE_BYTES, a_off, b_off, lane);
        if (++kc < kchunks) continue;

        // ---- Epilogue of tile `tile`: acc[mt][nt][e] is row wm·64 + 16mt + g + 8(e >> 1), id
        // n0 + wn·64 + 8nt + 2t + (e & 1).
        const int n0 = n_begin + tile * LH_BN;
        if (n0 + LH_BN > n_end) {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (n0 + wn * 64 + nt * 8 + 2 * t + (e & 1) >= n_end)
#pragma unroll
                        for (int mt = 0; mt < 4; ++mt) acc[mt][nt][e] = -DL_INF;
        }
        // Log-sum-exp: the warp's 64 ids of each row, folded into the (row, wn) state by one of the
        // row's four lanes ((mt, h) → lane t = (2mt + h) % 4), which alone ever touches it.
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float m = -DL_INF;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) m = fmaxf(m, fmaxf(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
                float s = 0.f;
                if (m != -DL_INF) {
#pragma unroll
                    for (int nt = 0; nt < 8; ++nt) s += __expf(acc[mt][nt][2 * h] - m) + __expf(acc[mt][nt][2 * h + 1] - m);
                }
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                s += __shfl_xor_sync(0xffffffffu, s, 2);
                if (t == ((2 * mt + h) & 3) && m != -DL_INF) {
                    float2* p = &lse[wn * LH_BM + wm * 64 + mt * 16 + g + 8 * h];
                    const float2 old = *p;
                    const float mm = fmaxf(old.x, m);
                    const float ss = (old.x == -DL_INF ? 0.f : old.y * expf(old.x - mm)) + s * expf(m - mm);
                    *p = make_float2(mm, ss);
                }
            }
        // Top-K: 4 rounds of 64 ids through the buffer.
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            __syncthreads();  // the owners are done with the previous round's values
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int row = wm * 64 + mt * 16 + g + 8 * h;
                        const int c = wn * 16 + j * 8 + 2 * t;
                        buf[c * LH_BUF_LD + row] = acc[mt][2 * r + j][2 * h];
                        buf[(c + 1) * LH_BUF_LD + row] = acc[mt][2 * r + j][2 * h + 1];
                    }
            __syncthreads();
            if (tid < LH_BM && row0 + tid < R) lh_scan_round(buf, lv, li, tid, k, own, (u32)n0, r, (u32)n_end);
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
        kc = 0;
        ++tile;
    }
    cp_async_wait_all();
    __syncthreads();  // every lane's log-sum-exp folds are visible to the owners

    if (tid < LH_BM && row0 + tid < R) {
        const long long at = (long long)(row0 + tid) * slices + slice;
        float mm = -DL_INF, ss = 0.f;
#pragma unroll
        for (int q = 0; q < LH_WN; ++q) mm = fmaxf(mm, lse[q * LH_BM + tid].x);
#pragma unroll
        for (int q = 0; q < LH_WN; ++q) {
            const float2 p = lse[q * LH_BM + tid];
            if (p.x != -DL_INF) ss += p.y * expf(p.x - mm);
        }
        pms[at] = make_float2(mm, ss);
        for (int j = 0; j < k; ++j) {
            pv[at * k + j] = lv[j * LH_BM + tid];
            pi[at * k + j] = li[j * LH_BM + tid];
        }
    }
}

// One block per (128 rows, vocabulary slice), 1-D grid of row_blocks × slices (raster above);
// LH_SMEM_BYTES(K) of dynamic shared memory; k ≤ K.
#define LH_ENTRY(K)                                                                                                \
    extern "C" __global__ void __launch_bounds__(LH_THREADS, 1)                                                    \
        lm_head_topk_partial_k##K(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, int R, int N, int H, \
                                  int k, int tiles_per_slice, int slices, float2* pms, float* pv, u32* pi) { dl_grid_begin(); \
        lm_head_topk_partial<K>(x, w, R, N, H, k, tiles_per_slice, slices, pms, pv, pi);                           \
    }
LH_ENTRY(8)
LH_ENTRY(16)
LH_ENTRY(32)
LH_ENTRY(64)
