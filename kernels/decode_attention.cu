// Attention of one decode step for many sequences at once, each over its own KV cache
// (crates/engine/src/backend/cuda/decode.rs `attention_decode`), module `decode_attention`.
//
// Row r of q [R, H·hd] and of the new k/v [R, Hkv·hd] (row strides ldq and ldkv elements, so they
// may be the q | k | v columns of one fused projection) is the next token of sequence r, whose
// cache holds positions 0..len_r (`tab` = k cache, v cache and len_r per sequence, caches
// [capacity ≥ len_r + 1, Hkv·hd] bf16). The table is a kernel parameter (R ≤ DA_MAX_ROWS per
// launch), not a device buffer: uploading one per layer from pageable host memory could make the
// host wait for the stream at every layer. The kernel appends the new k/v at position len_r and
// attends q over positions 0..=len_r. One warp per query head of a KV head's group.
//
// With `DaNorm::wq` set (dense models with q/k norms, host `attention_decode_packed`), q and the
// new k arrive straight from the QKV projection and the kernel applies the per-head RMSNorm and
// RoPE (at position pos_r) itself, with exactly qk_norm_rope_vec_bf16's arithmetic (attention.cu):
// each warp normalises its own query head, the block holding the last key chunk normalises the new
// key once and appends it. One launch instead of two, and no position upload.
//
// Split-KV (flash-decoding): the len_r + 1 keys of sequence r are cut into S_r = ⌈(len_r + 1) /
// C_r⌉ chunks of C_r keys (the last one shorter), C_r = da_chunk_len(len_r): the smallest
// DA_CHUNK_MIN · 2^i that makes at most DA_CHUNKS_MAX chunks (32 keys up to 4 096, 256 keys at
// 32 k; crates/engine/src/backend/cuda/decode.rs decode_attn_chunk_len). Each chunk is walked in tiles of 32
// keys staged in shared memory from a fresh running max and sum, so short chunks spread even one
// sequence's step over many blocks. The launch gives each (sequence, KV head) up to `bps` blocks,
// each walking a run of consecutive chunks (one chunk per block when a step has few sequences,
// several when it has many, so that the launch stays one wave). With S_r = 1 the block normalises
// and writes the bf16 output itself: exactly the arithmetic of the unsplit kernel. With S_r > 1
// every chunk's partial (running max m_c, sum l_c, unnormalised fp32 O_c) goes to the scratch; when
// several blocks share the sequence, each counts itself in the (sequence, KV head)'s arrival
// counter and the last to arrive merges the partials in chunk order 0, 1, …, S_r − 1 (the
// threadfence-reduction pattern, as decode_gemm.cu's split-K) and resets the counter for the next
// launch; a block that walked every chunk merges them itself. Batch invariance: S_r, C_r and the
// chunk boundaries are a function of len_r alone, the key order inside a chunk and the combine
// order are fixed, and `nchunks` (the launch's largest S) and `bps` (which do depend on the batch)
// only place the partials in the scratch and decide which block walks a chunk. So a sequence's
// result never depends on which or how many sequences share the launch.
//
// Numerics (as flash_attention2 in attention.cu): scores q·k in fp32 (one lane per key, summed in
// dimension order) scaled by log2(e)/√hd; a running max and sum in fp32, updated once per tile of 32
// keys (the tile's max and sum by xor butterflies, bitwise the same on every lane); P = exp2(S − max)
// in fp32, rounded to bf16 only as the weight of V; the sum uses the fp32 P; O accumulates in fp32
// in key order, each lane holding hd/32 consecutive dimensions, is divided by the sum at the end and
// rounded once to bf16. The combine rescales each chunk by exp2(m_c − max_c m_c) in fp32 (O and l
// alike) and sums in chunk order.

// The rows' table travels as a kernel parameter (`tab`), or in device memory (`tabp`, the
// `_tabp` instances below): a recorded decode step (a CUDA graph, crates/engine/src/backend/cuda/step_graph.rs)
// replays one launch while the lengths and positions grow, rewritten in place before each replay.
#define DA_MAX_ROWS 64
struct DaTable {
    u64 k[DA_MAX_ROWS];
    u64 v[DA_MAX_ROWS];
    int len[DA_MAX_ROWS];
    int pos[DA_MAX_ROWS];  // RoPE position of the new token (with DaNorm::wq only)
};

// The q/k norm and RoPE to apply (wq == nullptr: q and k are used as given).
struct DaNorm {
    const bf16_t* wq;        // q_norm weight [hd]
    const bf16_t* wk;        // k_norm weight [hd]
    const float* inv_freq;   // [rotary_dim / 2]
    float eps;
    int rotary_dim;
    int interleaved;
};

// What gpt-oss adds (crates/engine/src/backend/gpt_oss.rs `AttnExtras`): a sliding window of
// `window` keys (0: none), the query at position len_r seeing positions len_r − window + 1 ..=
// len_r; and one sink logit per query head (null: none), unscaled, in the softmax's denominator.
// The window moves the first key lo_r = max(0, len_r + 1 − window): the chunks wholly before it
// are not walked (the chunk boundaries stay a function of len_r; which chunks run is a function
// of len_r and the layer's window), and in the chunk holding lo_r the keys before it score −inf.
// The sink starts the state of the first walked chunk (running max z·log2(e), sum 1, O = 0), so
// it joins the denominator once, through the merge like any chunk's sum.
struct DaExtras {
    const float* sinks;  // [heads]
    int window;
    int appended;  // 1: the caches already hold each row's new k/v at position len_r (a verify
                   // pass appended its rows before the launch): read, never stored again
};

template <int DPL>
__device__ __forceinline__ void da_load(const bf16_t* p, float* f) {
    if constexpr (DPL == 8) {
        unpack8(*(const uint4*)p, f);
    } else if constexpr (DPL == 4) {
        uint2 v = *(const uint2*)p;
        f[0] = lo_bf(v.x);
        f[1] = hi_bf(v.x);
        f[2] = lo_bf(v.y);
        f[3] = hi_bf(v.y);
    } else {
        u32 v = *(const u32*)p;
        f[0] = lo_bf(v);
        f[1] = hi_bf(v);
    }
}

template <int DPL>
__device__ __forceinline__ void da_copy(bf16_t* d, const bf16_t* s) {
    if constexpr (DPL == 8) {
        *(uint4*)d = *(const uint4*)s;
    } else if constexpr (DPL == 4) {
        *(uint2*)d = *(const uint2*)s;
    } else {
        *(u32*)d = *(const u32*)s;
    }
}

#define DA_CHUNK_MIN 32
#define DA_CHUNKS_MAX 128
/// Keys per chunk of a sequence whose cache holds `len` keys (len + 1 with the new one).
__device__ __forceinline__ int da_chunk_len(int len) {
    long long c = DA_CHUNK_MIN;
    while ((long long)len + 1 > DA_CHUNKS_MAX * c) c *= 2;
    return (int)c;
}
/// Number of key chunks of that sequence: ⌈(len + 1) / da_chunk_len(len)⌉.
__device__ __forceinline__ int da_chunks(int len) { return len / da_chunk_len(len) + 1; }

template <int DPL>
__device__ __forceinline__ void da_store_bf16(bf16_t* op, const float* res) {
    if constexpr (DPL == 8) {
        *(uint4*)op = pack8(res);
    } else if constexpr (DPL == 4) {
        *(uint2*)op = make_uint2(pack_bf16x2(res[0], res[1]), pack_bf16x2(res[2], res[3]));
    } else {
        *(u32*)op = pack_bf16x2(res[0], res[1]);
    }
}

// RMSNorm (weight w) then RoPE at position `pos` of one head of HD values at `hx`, the way
// qk_norm_rope_vec_bf16 (attention.cu) computes it, bit for bit: GT = next_pow2(HD / 8) lanes per
// head, lane c (mod GT) owning the 16-byte chunk c; the sum of squares per chunk in element order,
// then butterflies xor GT/2 … 1; y = bf16(bf16(x · r) · w); the rotate-half partner chunk c ^ P by a
// shuffle; cos/sin rounded to bf16. Every lane of the warp calls it (lanes ≥ GT repeat a chunk);
// returns the lane's chunk index, its 8 output values (each a bf16 value) in `y`.
// bf16-rounded cos and sin of a RoPE angle, as qk_norm_rope_vec_bf16 tabulates them. Not inlined:
// cosf and sinf carry a large slow path for big arguments, and inlined at every call of every
// instance they made this module several times as slow to compile (docs/benchmarks-cuda.md,
// "Session 12").
__device__ __noinline__ float2 da_cos_sin(float angle) { return make_float2(rb(cosf(angle)), rb(sinf(angle))); }

template <int HD>
__device__ __forceinline__ int da_norm_rope(const bf16_t* hx, const bf16_t* w, int pos, const DaNorm& nm,
                                            float y[8]) {
    constexpr int GT = HD / 8;  // HD is 64, 128 or 256: HD / 8 is already a power of two
    const int c = (threadIdx.x & 31) & (GT - 1);
    unpack8(*(const uint4*)(hx + c * 8), y);
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += y[j] * y[j];
    for (int o = GT >> 1; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / (float)HD + nm.eps);
    {
        float wf[8];
        unpack8(*(const uint4*)(w + c * 8), wf);
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = rb(qk_norm_value(y[j], r, wf[j]));
    }
    const int P = nm.rotary_dim >> 4;
    const bool rotated = c * 8 < nm.rotary_dim;
    const float p = (float)pos;
    // Pairs of elements at a time: the shuffle and both inputs are read before either is rewritten.
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        const float a0 = y[j], a1 = y[j + 1];
        const float q0 = nm.interleaved ? 0.f : __shfl_xor_sync(0xffffffffu, a0, P > 0 ? P : 1);
        const float q1 = nm.interleaved ? 0.f : __shfl_xor_sync(0xffffffffu, a1, P > 0 ? P : 1);
        if (!rotated) continue;
        if (nm.interleaved) {
            const float2 t = da_cos_sin(p * nm.inv_freq[(c * 8 + j) >> 1]);
            const float cs = t.x, sn = t.y;
            y[j] = rb(rope_pair_a(a0, a1, cs, sn));
            y[j + 1] = rb(rope_pair_b(a0, a1, cs, sn));
        } else {
            const bool first = (c & P) == 0;  // the chunk holds the "a" halves of its pairs
            const int i = (c & (P - 1)) * 8 + j;
            const float2 t0 = da_cos_sin(p * nm.inv_freq[i]), t1 = da_cos_sin(p * nm.inv_freq[i + 1]);
            const float cs0 = t0.x, sn0 = t0.y, cs1 = t1.x, sn1 = t1.y;
            y[j] = rb(first ? rope_pair_a(a0, q0, cs0, sn0) : rope_pair_b(q0, a0, cs0, sn0));
            y[j + 1] = rb(first ? rope_pair_a(a1, q1, cs1, sn1) : rope_pair_b(q1, a1, cs1, sn1));
        }
    }
    return c;
}

// Keys per tile: a chunk is walked 32 keys at a time, one key per lane for the scores.
#define DA_TILE 32

// Shared memory of one block: the tile's K rows (padded by 16 bytes, so that lanes reading
// different rows 16 bytes at a time hit different banks), its V rows, the group's q vectors in
// fp32 (read by every lane at the same address: a broadcast) and the new key (after its norm and
// RoPE). Sized for the largest group (8), one per entry function (at most 42 KiB at hd 256).
template <int HD>
struct DaShared {
    bf16_t k[DA_TILE][HD + 8];
    bf16_t v[DA_TILE][HD];
    float q[8][HD];
    bf16_t knew[HD];
};

// Partials: po [R, heads, nchunks, HD] fp32 (unnormalised O), pml [R, heads, nchunks] (m, l);
// cnt [R, kv_heads] arrival counters, zero between launches.
//
// Blocks per (KV head h, sequence r): nb = min(bps, S_r), block b walking the chunks
// [b·S_r/nb, (b+1)·S_r/nb) one after another, each from a fresh (m, l, O) exactly as if it had a
// block of its own. `bps` is the launch's blocks per sequence (the host sizes it so one launch is
// one wave of blocks: a step of one sequence gets a block per chunk, a 64-sequence step one or two
// blocks per (sequence, KV head) instead of ~6 waves of one-tile blocks). Which block walks a chunk
// changes no arithmetic, so `bps` does not touch a row's bits (cuda_decode asserts it).
//
// Per block, one warp per query head of the group (G warps). The chunk's keys go through shared
// memory DA_TILE at a time, copied by the whole block with cp.async (the next tile's copies are
// issued as soon as the current tile is consumed, the first tile's before the q norm); the new key
// comes from shared memory and the new value from vnew, written by plain stores. Then each warp
//   - scores the tile with one key per lane: s = (q · k) · log2(e)/√hd, the dot product summed in
//     dimension order in fp32;
//   - updates its running max m (warp max over the tile) and sum l (+ the warp sum of
//     p = exp2(s − m)), and rescales its fp32 O by exp2(m_old − m);
//   - adds bf16(p_j) · v_j for j = 0..31 in key order, each lane holding hd/32 dimensions.
// Every lane ends with the same m and l (butterfly reductions are bitwise the same on all lanes).

// The block's copies of keys t0..=min(t0 + DA_TILE − 1, je) of KV head h into the tile (rows past
// je are never read; the new key at position len is stored by da_tile_new_row).
template <int HD, int G>
__device__ __forceinline__ void da_tile_copy(DaShared<HD>& sh, const bf16_t* kc, const bf16_t* vc, long long kvd,
                                             int h, int len, int t0, int je) {
    constexpr int ROW_CHUNKS = HD / 8;
    for (int i = threadIdx.x; i < DA_TILE * ROW_CHUNKS; i += G * 32) {
        const int row = i / ROW_CHUNKS, col = (i % ROW_CHUNKS) * 8;
        const int j = t0 + row;
        if (j < len && j <= je) {
            cp_async16(&sh.k[row][col], kc + j * kvd + h * HD + col);
            cp_async16(&sh.v[row][col], vc + j * kvd + h * HD + col);
        }
    }
    cp_async_commit();
}

// The new key (normalised, from shared memory) and value as row len − t0 of the tile, when this
// tile holds position len: by the threads that would have copied that row.
template <int HD, int G>
__device__ __forceinline__ void da_tile_new_row(DaShared<HD>& sh, const bf16_t* vn, int len, int t0, int je) {
    constexpr int ROW_CHUNKS = HD / 8;
    if (je != len || len - t0 >= DA_TILE) return;
    const int row = len - t0;
    for (int i = threadIdx.x; i < DA_TILE * ROW_CHUNKS; i += G * 32) {
        if (i / ROW_CHUNKS != row) continue;
        const int col = (i % ROW_CHUNKS) * 8;
        *(uint4*)&sh.k[row][col] = *(const uint4*)&sh.knew[col];
        *(uint4*)&sh.v[row][col] = *(const uint4*)(vn + col);
    }
}

template <int HD, int G>
__device__ void decode_attention(const bf16_t* __restrict__ q, const bf16_t* __restrict__ knew,
                                 const bf16_t* __restrict__ vnew, long long ldq, long long ldkv,
                                 bf16_t* __restrict__ out, const DaTable& tab, const DaNorm& nm,
                                 const DaExtras& ex, int heads,
                                 int kv_heads, float scale_log2, int nchunks, int bps, float* __restrict__ po,
                                 float2* __restrict__ pml, u32* __restrict__ cnt, DaShared<HD>& sh) {
    constexpr int DPL = HD / 32;
    constexpr int ROW_CHUNKS = HD / 8;  // 16-byte chunks per K/V row
    __shared__ int s_last;
    const int b = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    const int len = tab.len[r];
    const int chunk = da_chunk_len(len);
    const int nc = len / chunk + 1;
    const int lo = ex.window > 0 ? max(0, len + 1 - ex.window) : 0;  // first visible key
    const int c0 = lo / chunk;                                       // first walked chunk
    const int nv = nc - c0;
    const int nb = min(bps, nv);
    if (b >= nb) return;  // a shorter sequence than the launch's longest (block-uniform)
    const int cb = c0 + b * nv / nb, ce = c0 + (b + 1) * nv / nb;  // this block's chunks [cb, ce)
    // The block's first key: its first chunk's, or in the window's first chunk the 32-key tile
    // (chunks are whole tiles) holding lo.
    const int kb = max(cb * chunk, lo - lo % DA_TILE);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int qh = h * G + w;
    const long long kvd = (long long)kv_heads * HD, qd = (long long)heads * HD;
    bf16_t* kc = (bf16_t*)tab.k[r];
    bf16_t* vc = (bf16_t*)tab.v[r];
    const bf16_t* kn = knew + r * ldkv + h * HD;
    const bf16_t* vn = vnew + r * ldkv + h * HD;
    const bool norm = nm.wq != nullptr;
    // The first tile's copies fly while q and the new key are normalised.
    da_tile_copy<HD, G>(sh, kc, vc, kvd, h, len, kb, min(len, cb * chunk + chunk - 1));
    if (ce == nc && w == 0) {
        // The new key (normalised and rotated with DaNorm) into shared memory for the last tile,
        // and the append (positions < len are only read by the other blocks).
        if (norm) {
            float f[8];
            const int ch = da_norm_rope<HD>(kn, nm.wk, tab.pos[r], nm, f);
            if (lane < ROW_CHUNKS) {
                const uint4 packed = pack8(f);
                *(uint4*)&sh.knew[ch * 8] = packed;
                if (!ex.appended) *(uint4*)(kc + len * kvd + h * HD + ch * 8) = packed;
            }
        } else {
            const int d0 = lane * DPL;
            da_copy<DPL>(&sh.knew[d0], kn + d0);
            if (!ex.appended) da_copy<DPL>(kc + len * kvd + h * HD + d0, kn + d0);
        }
        const int d0 = lane * DPL;
        if (!ex.appended) da_copy<DPL>(vc + len * kvd + h * HD + d0, vn + d0);
    }
    if (norm) {
        float f[8];
        const int ch = da_norm_rope<HD>(q + r * ldq + qh * HD, nm.wq, tab.pos[r], nm, f);
        if (lane < ROW_CHUNKS) {
#pragma unroll
            for (int d = 0; d < 8; ++d) sh.q[w][ch * 8 + d] = f[d];
        }
    } else {
        float f[DPL];
        da_load<DPL>(q + r * ldq + qh * HD + lane * DPL, f);
#pragma unroll
        for (int d = 0; d < DPL; ++d) sh.q[w][lane * DPL + d] = f[d];
    }
    __syncthreads();  // q and the new key are in shared memory
    // The block's keys kb..=ke are whole 32-key tiles of consecutive chunks (a chunk is a multiple
    // of 32 keys): one walk over them, a chunk's state started at its first tile and its partial
    // written after its last.
    const int ke = min(len, ce * chunk - 1);
    float m = -DL_INF, l = 0.f, o[DPL] = {};
    for (int t0 = kb; t0 <= ke; t0 += DA_TILE) {
        const int jb = t0 - t0 % chunk;        // this tile's chunk: keys jb..=je
        const int je = min(len, jb + chunk - 1);
        if (t0 == jb || t0 == kb) {
            m = -DL_INF;
            l = 0.f;
            if (ex.sinks != nullptr && jb / chunk == c0) {
                m = ex.sinks[qh] * 1.4426950408889634f;  // log2(e): the scores' domain
                l = 1.f;
            }
#pragma unroll
            for (int d = 0; d < DPL; ++d) o[d] = 0.f;
        }
        da_tile_new_row<HD, G>(sh, vn, len, t0, je);
        cp_async_wait_all();
        __syncthreads();  // the tile has landed
        // Scores: lane = key.
        const int j = t0 + lane;
        float s = -DL_INF;
        if (j <= je && j >= lo) {
            float acc = 0.f;
#pragma unroll 4
            for (int d = 0; d < HD; d += 8) {
                float kf[8];
                unpack8(*(const uint4*)&sh.k[lane][d], kf);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc += sh.q[w][d + e] * kf[e];
            }
            s = acc * scale_log2;
        }
        const float mc = fmaxf(m, warp_max(s));
        const float corr = exp2f(m - mc);  // 0 at the chunk's first tile (m = -inf)
        const float p = j <= je ? exp2f(s - mc) : 0.f;
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int d = 0; d < DPL; ++d) o[d] *= corr;
        const float pb = rb(p);
        const int keys = min(DA_TILE, je - t0 + 1);
        for (int jj = 0; jj < keys; ++jj) {
            const float pj = __shfl_sync(0xffffffffu, pb, jj);
            float vf[DPL];
            da_load<DPL>(&sh.v[jj][lane * DPL], vf);
#pragma unroll
            for (int d = 0; d < DPL; ++d) o[d] += pj * vf[d];
        }
        m = mc;
        __syncthreads();  // the tile is consumed: the next one may be copied in
        const int tn = t0 + DA_TILE;
        if (tn <= ke) da_tile_copy<HD, G>(sh, kc, vc, kvd, h, len, tn, min(len, tn - tn % chunk + chunk - 1));
        if (tn <= je) continue;
        // The chunk's last tile.
        const int d0 = lane * DPL;
        if (nv == 1) {
            const float inv = 1.f / l;
            float res[DPL];
#pragma unroll
            for (int d = 0; d < DPL; ++d) res[d] = o[d] * inv;
            da_store_bf16<DPL>(out + r * qd + qh * HD + d0, res);
            return;
        }
        const long long pc = ((long long)r * heads + qh) * nchunks + t0 / chunk;
        float* dst = po + pc * HD + d0;
#pragma unroll
        for (int d = 0; d < DPL; d += 2) *(float2*)(dst + d) = make_float2(o[d], o[d + 1]);
        if (lane == 0) pml[pc] = make_float2(m, l);
    }
    if (nb > 1) {
        // The last of the (sequence, KV head)'s nb blocks merges every chunk's partial.
        __threadfence();
        __syncthreads();
        u32* count = cnt + (long long)r * kv_heads + h;
        if (threadIdx.x == 0) s_last = atomicAdd(count, 1u) == (u32)(nb - 1);
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        if (threadIdx.x == 0) *count = 0u;  // ready for the next launch
    } else {
        // One block walked every chunk: each warp reads back its own partials (lane 0's (m, l)
        // through L2, as the other blocks' would be).
        __threadfence();
        __syncwarp();
    }
    const long long p0 = ((long long)r * heads + qh) * nchunks;
    const int d0 = lane * DPL;
    // The merge: each chunk rescaled by exp2(m_c − max_c m_c) in fp32 (O and l alike), summed in
    // chunk order c0..nc−1 (L2 loads: the other blocks' partials never passed through this L1).
    // The maximum is exact in any order, so the lanes take a chunk each; the sums keep chunk
    // order, with MB chunks' loads in flight before the first is added.
    float mx = -DL_INF;
    for (int cc = c0 + lane; cc < nc; cc += 32) mx = fmaxf(mx, __ldcg(&pml[p0 + cc]).x);
    mx = warp_max(mx);
    constexpr int MB = DPL <= 4 ? 4 : 2;
    float lsum = 0.f, acc[DPL];
#pragma unroll
    for (int d = 0; d < DPL; ++d) acc[d] = 0.f;
    for (int cm = c0; cm < nc; cm += MB) {
        float2 ml[MB], v[MB][DPL / 2];
#pragma unroll
        for (int u = 0; u < MB; ++u) {
            if (cm + u >= nc) break;
            ml[u] = __ldcg(&pml[p0 + cm + u]);
            const float* src = po + (p0 + cm + u) * HD + d0;
#pragma unroll
            for (int d = 0; d < DPL; d += 2) v[u][d / 2] = __ldcg((const float2*)(src + d));
        }
#pragma unroll
        for (int u = 0; u < MB; ++u) {
            if (cm + u >= nc) break;
            const float a = exp2f(ml[u].x - mx);
            lsum += ml[u].y * a;
#pragma unroll
            for (int d = 0; d < DPL; d += 2) {
                acc[d] += v[u][d / 2].x * a;
                acc[d + 1] += v[u][d / 2].y * a;
            }
        }
    }
    const float inv = 1.f / lsum;
    float res[DPL];
#pragma unroll
    for (int d = 0; d < DPL; ++d) res[d] = acc[d] * inv;
    da_store_bf16<DPL>(out + r * qd + qh * HD + d0, res);
}

// One instance per head dim and group size (query heads per KV head, ≤ 8): the group sizes the
// block and its shared q vectors. The register cap is explicit (MINB blocks of 256 threads per
// multiprocessor): left to itself ptxas chose 64 for hd 128 and spilled once the norm and the merge
// joined the kernel, and a looser cap (76 registers: six blocks of a Qwen3-8B group per
// multiprocessor instead of eight) came with a slower 64-sequence decode step
// (docs/benchmarks-cuda.md, "Session 12"). hd 256 is held
// to five blocks by its shared memory anyway and gets the looser cap (no spill).
#define DA_GROUP_CASE(HD, G)                                                                          \
    case G:                                                                                           \
        decode_attention<HD, G>(q, knew, vnew, ldq, ldkv, out, t, nm, ex, heads, kv_heads, scale_log2,   \
                                nchunks, bps, po, pml, cnt, sh);                                           \
        break;
// Each instance comes twice with one signature: `decode_attention_hd*` reads the table from its
// parameter, `decode_attention_tabp_hd*` from `tabp` (a recorded step's arena). One kernel that
// chose between them at run time spilled (the rows' addresses held in registers instead of
// reloaded from the constant bank).
#define DA_ENTRY_AS(NAME, HD, MINB, TABLE)                                                                   \
    extern "C" __global__ void __launch_bounds__(256, MINB) NAME(                                             \
        const bf16_t* __restrict__ q, const bf16_t* __restrict__ knew, const bf16_t* __restrict__ vnew,       \
        long long ldq, long long ldkv, bf16_t* __restrict__ out, const __grid_constant__ DaTable tab,         \
        const __grid_constant__ DaNorm nm, const __grid_constant__ DaExtras ex, int heads, int kv_heads,     \
        float scale_log2, int nchunks, int bps,                                                               \
        float* __restrict__ po, float2* __restrict__ pml, u32* __restrict__ cnt,                              \
        const DaTable* __restrict__ tabp) { dl_grid_begin();                                                  \
        __shared__ __align__(16) DaShared<HD> sh;                                                             \
        const DaTable& t = TABLE;                                                                             \
        switch (heads / kv_heads) {                                                                           \
            DA_GROUP_CASE(HD, 1)                                                                              \
            DA_GROUP_CASE(HD, 2)                                                                              \
            DA_GROUP_CASE(HD, 3)                                                                              \
            DA_GROUP_CASE(HD, 4)                                                                              \
            DA_GROUP_CASE(HD, 5)                                                                              \
            DA_GROUP_CASE(HD, 6)                                                                              \
            DA_GROUP_CASE(HD, 7)                                                                              \
            DA_GROUP_CASE(HD, 8)                                                                              \
        }                                                                                                     \
    }
#define DA_ENTRY(HD, MINB)                                          \
    DA_ENTRY_AS(decode_attention_hd##HD, HD, MINB, tab)             \
    DA_ENTRY_AS(decode_attention_tabp_hd##HD, HD, MINB, *tabp)

DA_ENTRY(64, 4)
DA_ENTRY(128, 4)
DA_ENTRY(256, 3)
