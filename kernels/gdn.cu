// Gated DeltaNet (GDN) kernels of the Qwen3.5/3.6 hybrid layers (docs/gdn-cuda.md):
//   - causal depthwise conv1d + SiLU over packed sequences with carried conv states (prefill and
//     one-token decode alike);
//   - the gates: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias);
//   - the gated delta rule with the q/k L2 norms fused in, chunked (prefill, C = 64) and
//     recurrent (decode);
//   - gated RMSNorm with the z gate, zero-centred RMSNorm, and the sigmoid output gate of the
//     full-attention layers.
//
// Two numeric profiles for the chunked delta rule (template flag ENGINE):
//   Reference: every intermediate and the state in fp32 (the transformers torch fallback);
//   Engine:    the roundings fla's Triton kernels make: L2-normed q/k, M = (I+L)^-1, W, U, the
//              new values V' and the intra-chunk scores stored bf16; the state cast to bf16 for
//              every product that reads it; the state accumulator itself stays fp32.
// In Engine every product has bf16-valued operands, so it can run on the tensor cores
// (mma.sync m16n8k16 bf16 -> fp32, template flag MMA) with the same result up to fp32
// summation order; the FMA variant of the Engine profile exists to test exactly that.
//
// The chunked delta rule exists in three layouts kept side by side for A/B measurements (fused,
// split, three-phase; docs/gdn-cuda.md "Kernel variants"), which share this file's product and
// load helpers: hence one module of more than 800 lines.

#define GDN_C 64          // chunk length (HF and fla)
#define GDN_DK 128        // key head dim
#define GDN_DV 128        // value head dim
// Value columns per block (template parameter DVS = 32 or 64): the state's columns evolve
// independently, so 128 / DVS blocks share a head without talking.
#define GDN_THREADS 256
// Odd row strides (floats) of the shared-memory tiles: column walks hit 32 different banks.
#define LD128 129
#define LD64 65

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.f + expf(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplusf_(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// ---------------------------------------------------------------------------------------------
// Products on shared-memory tiles, 256 threads: out(m, n) = sum_k A(m, k) B(k, n), handed to
// epi(m, n, value) exactly once per element. A and B are accessor lambdas (so transposes and
// on-the-fly bf16 rounding cost no copies).

// CUDA cores, fp32 FMA: each thread owns TM rows x TN columns (columns strided by N/TN so that
// neighbouring threads read neighbouring B columns).
template <int M, int N, int K, int TM, int TN, class FA, class FB, class FE>
__device__ __forceinline__ void mm_fma(FA a, FB b, FE epi) {
    constexpr int NG = N / TN;
    static_assert((M / TM) * NG == GDN_THREADS, "mm_fma: tile does not match 256 threads");
    const int nn = threadIdx.x % NG, mm = threadIdx.x / NG;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
        float av[TM], bv[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) av[i] = a(mm * TM + i, k);
#pragma unroll
        for (int j = 0; j < TN; ++j) bv[j] = b(k, nn + j * NG);
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) epi(mm * TM + i, nn + j * NG, acc[i][j]);
}

// Tensor cores: mma.sync.m16n8k16 bf16 x bf16 -> fp32, 8 warps sharing the (M/16)x(N/8) tiles.
// Operands must be bf16-valued (packing rounds them). Fragment layout (PTX ISA, m16n8k16):
// g = lane/4, t = lane%4; A regs (row g | g+8) x (cols 2t,2t+1 | 2t+8,2t+9); B regs
// (k rows 2t,2t+1 | 2t+8,2t+9) x col g; C (row g | g+8) x (cols 2t, 2t+1).
template <int M, int N, int K, class FA, class FB, class FE>
__device__ __forceinline__ void mm_mma(FA a, FB b, FE epi) {
    constexpr int NT = N / 8;
    constexpr int TILES = (M / 16) * NT;
    static_assert(TILES % 8 == 0, "mm_mma: tiles must split over 8 warps");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int w = 0; w < TILES / 8; ++w) {
        const int tile = warp + 8 * w;
        const int tm = (tile / NT) * 16, tn = (tile % NT) * 8;
        float c0 = 0.f, c1 = 0.f, c2 = 0.f, c3 = 0.f;
#pragma unroll 2
        for (int k0 = 0; k0 < K; k0 += 16) {
            const int ka = k0 + 2 * t;
            const u32 a0 = pack_bf16x2(a(tm + g, ka), a(tm + g, ka + 1));
            const u32 a1 = pack_bf16x2(a(tm + g + 8, ka), a(tm + g + 8, ka + 1));
            const u32 a2 = pack_bf16x2(a(tm + g, ka + 8), a(tm + g, ka + 9));
            const u32 a3 = pack_bf16x2(a(tm + g + 8, ka + 8), a(tm + g + 8, ka + 9));
            const u32 b0 = pack_bf16x2(b(ka, tn + g), b(ka + 1, tn + g));
            const u32 b1 = pack_bf16x2(b(ka + 8, tn + g), b(ka + 9, tn + g));
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
        epi(tm + g, tn + 2 * t, c0);
        epi(tm + g, tn + 2 * t + 1, c1);
        epi(tm + g + 8, tn + 2 * t, c2);
        epi(tm + g + 8, tn + 2 * t + 1, c3);
    }
}

template <bool MMA, int M, int N, int K, int TM, int TN, class FA, class FB, class FE>
__device__ __forceinline__ void mm(FA a, FB b, FE epi) {
    if constexpr (MMA)
        mm_mma<M, N, K>(a, b, epi);
    else
        mm_fma<M, N, K, TM, TN>(a, b, epi);
}

// ---------------------------------------------------------------------------------------------
// Chunk loads of the split kernels below (256 threads): the same arithmetic as gdn_chunk_impl's
// phases a and c, with every global load of a warp issued before its first reduction.
// (gdn_chunk_impl keeps its own copy, the code the fused kernels' timings in
// docs/benchmarks-cuda.md, "Gated DeltaNet", were taken with.)
//
// Rows row0 .. row0+63 of q and k (head hk), L2-normalised per row into Qs / Ks ([64][129]);
// rows past nc are zero. Reference: f32, q scaled by `scale` (HF: l2norm(q) * scale); Engine:
// both rounded to bf16, q unscaled (fla scales the output). Warp w handles rows w, w+8, ...; all
// its loads are issued before the first reduction.
// The L2 norm's factor of a 128-wide q or k head row held 4 values per lane of a warp
// (transformers' l2norm: x · 1/sqrt(Σx² + 1e-6)).
__device__ __forceinline__ float head_inv_norm(const float (&f)[4]) {
    return 1.f / sqrtf(warp_sum(f[0] * f[0] + f[1] * f[1] + f[2] * f[2] + f[3] * f[3]) + 1e-6f);
}

// Rows row0 + warp + 8i (i < GDN_C / 8) of head `head` of x (row stride ld), the lane's 4 values
// each as raw bf16 pairs; zeros past the chunk's nc rows. All loads issue before any is used.
__device__ __forceinline__ void fetch_head_rows(uint2 (&w)[GDN_C / (GDN_THREADS / 32)], const bf16_t* __restrict__ x,
                                                long long ld, int head, long long row0, int nc) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < GDN_C / (GDN_THREADS / 32); ++i) {
        const int r = warp + 8 * i;
        w[i] = make_uint2(0u, 0u);
        if (r < nc) w[i] = *(const uint2*)(x + (row0 + r) * ld + head * GDN_DK + lane * 4);
    }
}

template <bool ENGINE>
__device__ __forceinline__ void load_qk_rows(float* Ks, float* Qs, const bf16_t* __restrict__ q,
                                             const bf16_t* __restrict__ k, long long ld_qk, int hk,
                                             long long row0, int nc, float scale) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int PER = GDN_C / (GDN_THREADS / 32);
    uint2 kw[PER], qw[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int r = warp + 8 * i;
        kw[i] = make_uint2(0u, 0u);
        qw[i] = make_uint2(0u, 0u);
        if (r < nc) {
            kw[i] = *(const uint2*)(k + (row0 + r) * ld_qk + hk * GDN_DK + lane * 4);
            qw[i] = *(const uint2*)(q + (row0 + r) * ld_qk + hk * GDN_DK + lane * 4);
        }
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int r = warp + 8 * i;
        const float kf[4] = {lo_bf(kw[i].x), hi_bf(kw[i].x), lo_bf(kw[i].y), hi_bf(kw[i].y)};
        const float qf[4] = {lo_bf(qw[i].x), hi_bf(qw[i].x), lo_bf(qw[i].y), hi_bf(qw[i].y)};
        const float kn = head_inv_norm(kf);
        const float qn = head_inv_norm(qf);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float kv = kf[j] * kn, qv = qf[j] * qn;
            if (ENGINE) {
                kv = rb(kv);
                qv = rb(qv);
            } else {
                qv = qv * scale;
            }
            Ks[r * LD128 + lane * 4 + j] = kv;
            Qs[r * LD128 + lane * 4 + j] = qv;
        }
    }
}

// Warp 0: gam = inclusive cumsum of g over the chunk (lane holds rows 2l, 2l+1; rows past nc add
// 0, so they carry the last row's value) and beta (0 past nc).
__device__ __forceinline__ void load_chunk_gates(float* gam, float* bet, const float* __restrict__ g_in,
                                                 const float* __restrict__ beta_in, long long row0, int nc,
                                                 int hv_heads, int hv) {
    const int lane = threadIdx.x & 31;
    const int r0 = 2 * lane, r1 = 2 * lane + 1;
    const float g0 = r0 < nc ? g_in[(row0 + r0) * hv_heads + hv] : 0.f;
    const float g1 = r1 < nc ? g_in[(row0 + r1) * hv_heads + hv] : 0.f;
    const float b0 = r0 < nc ? beta_in[(row0 + r0) * hv_heads + hv] : 0.f;
    const float b1 = r1 < nc ? beta_in[(row0 + r1) * hv_heads + hv] : 0.f;
    float incl = g0 + g1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
    }
    const float before = __shfl_up_sync(0xffffffffu, incl, 1);
    const float ga = (lane > 0 ? before : 0.f) + g0;
    gam[r0] = ga;
    gam[r1] = ga + g1;
    bet[r0] = b0;
    bet[r1] = b1;
}

// M = (I + L)^-1 into Ms ([64][65]) from the strictly lower L in Ls, by forward substitution,
// one column per 4 threads: N = M - I solves N[r][c] = -L[r][c] - sum_{c<s<r} L[r][s] N[s][c].
__device__ __forceinline__ void invert_unit_lower(const float* Ls, float* Ms) {
    const int c = threadIdx.x >> 2, p = threadIdx.x & 3;
    for (int r = p; r < GDN_C; r += 4) Ms[r * LD64 + c] = r == c ? 1.f : 0.f;
    __syncwarp();
    for (int r = 1; r < GDN_C; ++r) {
        float part = 0.f;
        if (r > c)
            for (int s = c + 1 + p; s < r; s += 4) part = fmaf(Ls[r * LD64 + s], Ms[s * LD64 + c], part);
        part += __shfl_xor_sync(0xffffffffu, part, 1);
        part += __shfl_xor_sync(0xffffffffu, part, 2);
        if (r > c && p == 0) Ms[r * LD64 + c] = -(Ls[r * LD64 + c] + part);
        __syncwarp();
    }
}

// ---------------------------------------------------------------------------------------------
// Chunked gated delta rule (prefill). One block per (value-column slice of DVS, value head,
// sequence); the block walks its sequence's chunks in order, carrying its 128 x DVS slice of the
// state in shared memory. Per chunk (r, s = 0..63; gam = chunk-local cumsum of g):
//   QK = (Q K^T) o Gamma (r >= s), L = beta_r (K K^T) o Gamma (r > s), M = (I + L)^-1,
//   W = M diag(beta e^gam) K, U = M diag(beta) V, V' = U - W S,
//   O = e^gam o (Q S) + QK V',  S <- e^gam_C S + K^T (e^(gam_C - gam) o V').
// Rows past the sequence end are zero (k = q = v = beta = g = 0), which leaves S unchanged.
//
// q, k: rows of ld_qk elements, head hk at column hk*128 of the given pointers; v: ld_v, head hv
// at hv*128; g, beta: fp32 [T, Hv]; out: bf16 [T, Hv*128]. Sequence blockIdx.z covers rows
// seq_rows[2z] .. seq_rows[2z+1]; its state (fp32 [Hv, 128 (k), 128 (v)], updated in place; a
// block reads its slice before it writes it) is at states[z].
// Shared memory: 3*64*129 + 2*64*(DVS+1) + 128*(DVS+1) + 3*64*65 + 128 floats (183,296 bytes
// for DVS = 32, 216,064 for DVS = 64).
template <bool ENGINE, bool MMA, int DVS>
__device__ __forceinline__ void gdn_chunk_impl(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                               const bf16_t* __restrict__ v, long long ld_qk, long long ld_v,
                                               const float* __restrict__ g_in, const float* __restrict__ beta_in,
                                               const long long* __restrict__ seq_rows, bf16_t* __restrict__ out,
                                               const u64* __restrict__ states, int hv_heads, int ratio, float scale) {
    constexpr int LDV = DVS + 1;
    constexpr int TMV = DVS == 32 ? 2 : 4;  // micro tiles of the 64 x DVS and 128 x DVS products
    constexpr int TNS = DVS == 32 ? 4 : 8;
    extern __shared__ float smem[];
    float* Ks = smem;                    // [64][129] K (Engine: bf16-valued)
    float* Qs = Ks + GDN_C * LD128;      // [64][129] Q, then K diag(beta e^gam)
    float* Ws = Qs + GDN_C * LD128;      // [64][129] W
    float* Vs = Ws + GDN_C * LD128;      // [64][DVS+1]  V slice, then diag(beta) V, then V'
    float* Op = Vs + GDN_C * LDV;        // [64][DVS+1]  Q S
    float* Ss = Op + GDN_C * LDV;        // [128][DVS+1] state slice (fp32)
    float* Ls = Ss + GDN_DK * LDV;       // [64][65]  L, then U, then e^(gam_C - gam) V'
    float* Ms = Ls + GDN_C * LD64;       // [64][65]  M
    float* QK = Ms + GDN_C * LD64;       // [64][65]  masked, decayed scores
    float* bet = QK + GDN_C * LD64;      // [64] beta
    float* gam = bet + GDN_C;            // [64] chunk-local cumsum of g

    const int iv = blockIdx.x, hv = blockIdx.y, n = blockIdx.z;
    const int hk = hv / ratio;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long seq0 = seq_rows[2 * n], seq1 = seq_rows[2 * n + 1];
    const long long ld_o = (long long)hv_heads * GDN_DV;
    const int vcol = hv * GDN_DV + iv * DVS;
    float* state = (float*)states[n] + (long long)hv * GDN_DK * GDN_DV + iv * DVS;

    for (int i = tid; i < GDN_DK * DVS; i += GDN_THREADS) {
        const int r = i / DVS, c = i % DVS;
        Ss[r * LDV + c] = state[r * GDN_DV + c];
    }
    // The state as the products read it: bf16-rounded in Engine (fla casts h to bf16).
    auto S_op = [&](int r, int c) { return ENGINE ? rb(Ss[r * LDV + c]) : Ss[r * LDV + c]; };

    for (long long row0 = seq0; row0 < seq1; row0 += GDN_C) {
        const int nc = (int)min((long long)GDN_C, seq1 - row0);
        // --- a. load: L2-normalise q and k rows (warp per row, 4 values per lane), V slice, gates.
        for (int r = warp; r < GDN_C; r += GDN_THREADS / 32) {
            float kf[4] = {0.f, 0.f, 0.f, 0.f}, qf[4] = {0.f, 0.f, 0.f, 0.f};
            if (r < nc) {
                const uint2 kw = *(const uint2*)(k + (row0 + r) * ld_qk + hk * GDN_DK + lane * 4);
                const uint2 qw = *(const uint2*)(q + (row0 + r) * ld_qk + hk * GDN_DK + lane * 4);
                kf[0] = lo_bf(kw.x); kf[1] = hi_bf(kw.x); kf[2] = lo_bf(kw.y); kf[3] = hi_bf(kw.y);
                qf[0] = lo_bf(qw.x); qf[1] = hi_bf(qw.x); qf[2] = lo_bf(qw.y); qf[3] = hi_bf(qw.y);
            }
            const float kn = head_inv_norm(kf);
            const float qn = head_inv_norm(qf);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float kv = kf[j] * kn, qv = qf[j] * qn;
                if (ENGINE) {
                    kv = rb(kv);
                    qv = rb(qv);  // the scale multiplies the output instead (fla)
                } else {
                    qv = qv * scale;  // HF: query = l2norm(query) * scale, fp32
                }
                Ks[r * LD128 + lane * 4 + j] = kv;
                Qs[r * LD128 + lane * 4 + j] = qv;
            }
            for (int c = lane; c < DVS; c += 32) Vs[r * LDV + c] = r < nc ? bf2f(v[(row0 + r) * ld_v + vcol + c]) : 0.f;
        }
        if (warp == 0) {
            // gam = inclusive cumsum of g over the chunk: lane holds rows 2l, 2l+1.
            const int r0 = 2 * lane, r1 = 2 * lane + 1;
            const float g0 = r0 < nc ? g_in[(row0 + r0) * hv_heads + hv] : 0.f;
            const float g1 = r1 < nc ? g_in[(row0 + r1) * hv_heads + hv] : 0.f;
            float incl = g0 + g1;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float up = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += up;
            }
            const float before = __shfl_up_sync(0xffffffffu, incl, 1);
            gam[r0] = (lane > 0 ? before : 0.f) + g0;
            gam[r1] = gam[r0] + g1;
            bet[r0] = r0 < nc ? beta_in[(row0 + r0) * hv_heads + hv] : 0.f;
            bet[r1] = r1 < nc ? beta_in[(row0 + r1) * hv_heads + hv] : 0.f;
        }
        __syncthreads();

        // --- b. scores, L and Q S (independent products).
        mm<MMA, GDN_C, GDN_C, GDN_DK, 4, 4>(
            [&](int m, int kk) { return Qs[m * LD128 + kk]; }, [&](int kk, int c) { return Ks[c * LD128 + kk]; },
            [&](int m, int c, float x) {
                float val = m >= c ? x * expf(gam[m] - gam[c]) : 0.f;
                QK[m * LD64 + c] = ENGINE ? rb(val) : val;
            });
        mm<MMA, GDN_C, GDN_C, GDN_DK, 4, 4>(
            [&](int m, int kk) { return Ks[m * LD128 + kk]; }, [&](int kk, int c) { return Ks[c * LD128 + kk]; },
            [&](int m, int c, float x) { Ls[m * LD64 + c] = m > c ? bet[m] * x * expf(gam[m] - gam[c]) : 0.f; });
        mm<MMA, GDN_C, DVS, GDN_DK, TMV, 4>(
            [&](int m, int kk) { return Qs[m * LD128 + kk]; }, S_op,
            [&](int m, int c, float x) { Op[m * LDV + c] = x; });
        __syncthreads();

        // --- c. M = (I + L)^-1 by forward substitution, one column per 4 threads:
        // N = M - I solves N[r][c] = -L[r][c] - sum_{c<s<r} L[r][s] N[s][c] (fp32).
        {
            const int c = tid >> 2, p = tid & 3;
            for (int r = p; r < GDN_C; r += 4) Ms[r * LD64 + c] = r == c ? 1.f : 0.f;
            __syncwarp();
            for (int r = 1; r < GDN_C; ++r) {
                float part = 0.f;
                if (r > c)
                    for (int s = c + 1 + p; s < r; s += 4) part = fmaf(Ls[r * LD64 + s], Ms[s * LD64 + c], part);
                part += __shfl_xor_sync(0xffffffffu, part, 1);
                part += __shfl_xor_sync(0xffffffffu, part, 2);
                if (r > c && p == 0) Ms[r * LD64 + c] = -(Ls[r * LD64 + c] + part);
                __syncwarp();
            }
        }
        __syncthreads();

        // --- d. operands of W and U: K diag(beta e^gam) (into Qs), diag(beta) V, rounded M.
        for (int i = tid; i < GDN_C * GDN_DK; i += GDN_THREADS) {
            const int r = i / GDN_DK, c = i % GDN_DK;
            const float x = Ks[r * LD128 + c] * bet[r] * expf(gam[r]);
            Qs[r * LD128 + c] = ENGINE ? rb(x) : x;
        }
        for (int i = tid; i < GDN_C * DVS; i += GDN_THREADS) {
            const int r = i / DVS, c = i % DVS;
            const float x = Vs[r * LDV + c] * bet[r];
            Vs[r * LDV + c] = ENGINE ? rb(x) : x;
        }
        if (ENGINE)
            for (int i = tid; i < GDN_C * GDN_C; i += GDN_THREADS) {
                const int r = i / GDN_C, c = i % GDN_C;
                Ms[r * LD64 + c] = rb(Ms[r * LD64 + c]);
            }
        __syncthreads();

        // --- e. W = M K diag(beta e^gam), U = M diag(beta) V (U into Ls).
        mm<MMA, GDN_C, GDN_DK, GDN_C, 4, 8>(
            [&](int m, int kk) { return Ms[m * LD64 + kk]; }, [&](int kk, int c) { return Qs[kk * LD128 + c]; },
            [&](int m, int c, float x) { Ws[m * LD128 + c] = ENGINE ? rb(x) : x; });
        mm<MMA, GDN_C, DVS, GDN_C, TMV, 4>(
            [&](int m, int kk) { return Ms[m * LD64 + kk]; }, [&](int kk, int c) { return Vs[kk * LDV + c]; },
            [&](int m, int c, float x) { Ls[m * LD64 + c] = ENGINE ? rb(x) : x; });
        __syncthreads();

        // --- f. V' = U - W S (fp32, into Vs); the decayed copy e^(gam_C - gam) V' for the state
        // update replaces U (same element, same thread).
        const float gC = gam[GDN_C - 1];
        mm<MMA, GDN_C, DVS, GDN_DK, TMV, 4>(
            [&](int m, int kk) { return Ws[m * LD128 + kk]; }, S_op,
            [&](int m, int c, float x) {
                const float vp = Ls[m * LD64 + c] - x;
                Vs[m * LDV + c] = vp;
                const float vd = vp * expf(gC - gam[m]);
                Ls[m * LD64 + c] = ENGINE ? rb(vd) : vd;
            });
        __syncthreads();

        // --- g. output rows and the state update (disjoint outputs).
        mm<MMA, GDN_C, DVS, GDN_C, TMV, 4>(
            [&](int m, int kk) { return QK[m * LD64 + kk]; },
            [&](int kk, int c) { return ENGINE ? rb(Vs[kk * LDV + c]) : Vs[kk * LDV + c]; },
            [&](int m, int c, float x) {
                if (m < nc) {
                    const float inter = Op[m * LDV + c] * expf(gam[m]);
                    const float o = ENGINE ? inter * scale + x * scale : inter + x;
                    out[(row0 + m) * ld_o + vcol + c] = f2bf(o);
                }
            });
        const float eC = expf(gC);
        mm<MMA, GDN_DK, DVS, GDN_C, 4, TNS>(
            [&](int m, int kk) { return Ks[kk * LD128 + m]; }, [&](int kk, int c) { return Ls[kk * LD64 + c]; },
            [&](int m, int c, float x) { Ss[m * LDV + c] = Ss[m * LDV + c] * eC + x; });
        __syncthreads();
    }
    for (int i = tid; i < GDN_DK * DVS; i += GDN_THREADS) {
        const int r = i / DVS, c = i % DVS;
        state[r * GDN_DV + c] = Ss[r * LDV + c];
    }
}

#define GDN_CHUNK_KERNEL(NAME, ENGINE, MMA, DVS)                                                                \
    extern "C" __global__ void __launch_bounds__(GDN_THREADS, 1)                                                \
        NAME(const bf16_t* q, const bf16_t* k, const bf16_t* v, long long ld_qk, long long ld_v, const float* g, \
             const float* beta, const long long* seq_rows, bf16_t* out, const u64* states, int hv_heads,         \
             int ratio, float scale) { dl_grid_begin();                                                         \
        gdn_chunk_impl<ENGINE, MMA, DVS>(q, k, v, ld_qk, ld_v, g, beta, seq_rows, out, states, hv_heads, ratio, \
                                         scale);                                                                \
    }
// Kernel lab only (the fused ChunkKernel variants, crates/engine/src/backend/cuda/gdn/lab.rs):
// the product never launches a gdn_chunk_* kernel.
GDN_CHUNK_KERNEL(gdn_chunk_reference, false, false, 32)
GDN_CHUNK_KERNEL(gdn_chunk_engine_fma, true, false, 32)
GDN_CHUNK_KERNEL(gdn_chunk_engine_mma, true, true, 32)
GDN_CHUNK_KERNEL(gdn_chunk_reference_v64, false, false, 64)
GDN_CHUNK_KERNEL(gdn_chunk_engine_mma_v64, true, true, 64)

// ---------------------------------------------------------------------------------------------
// Split chunked delta rule: the work that does not depend on the state runs first for every
// chunk at once (gdn_prep_*), so that the per-sequence walk over the chunks (gdn_walk_*) only does
// the four products that read or write S. Same arithmetic and roundings as gdn_chunk_impl.
//
// Scratch, indexed by absolute row t (rows past a chunk's end are never written or read):
//   Wg [T][Hv][128] W, Ug [T][Hv][128] U, Ag [T][Hv][64] (Q K^T) o Gamma (row t's scores against
//   its chunk's rows), Gg [T][Hv] gam (chunk-local cumsum of g).

// One block per (chunk, value head); chunk_rows: (start, end) pairs. Shared memory: 3*64*129 +
// 2*64*65 + 128 floats (132,864 bytes); LATE_V (the three-phase kernels' prep, gdn_prep2_*): V
// is read only once K is done with and takes K's place, 2*64*129 + 2*64*65 + 128 floats (99,840
// bytes, two blocks per SM), same arithmetic.
template <bool ENGINE, bool MMA, bool LATE_V>
__device__ __forceinline__ void gdn_prep_impl(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                              const bf16_t* __restrict__ v, long long ld_qk, long long ld_v,
                                              const float* __restrict__ g_in, const float* __restrict__ beta_in,
                                              const long long* __restrict__ chunk_rows, float* __restrict__ Wg,
                                              float* __restrict__ Ug, float* __restrict__ Ag, float* __restrict__ Gg,
                                              int hv_heads, int ratio, float scale) {
    extern __shared__ float smem[];
    float* Ks = smem;                // [64][129] K
    float* Qs = Ks + GDN_C * LD128;  // [64][129] Q, then K diag(beta e^gam)
    // [64][129] V, then diag(beta) V; LATE_V: diag(beta) V only, in Ks once K is no longer read
    float* Vs = LATE_V ? Ks : Qs + GDN_C * LD128;
    float* Ls = LATE_V ? Qs + GDN_C * LD128 : Vs + GDN_C * LD128;  // [64][65]  L
    float* Ms = Ls + GDN_C * LD64;   // [64][65]  M
    float* bet = Ms + GDN_C * LD64;
    float* gam = bet + GDN_C;
    const int ch = blockIdx.x, hv = blockIdx.y, hk = hv / ratio, tid = threadIdx.x;
    const long long row0 = chunk_rows[2 * ch];
    const int nc = (int)(chunk_rows[2 * ch + 1] - row0);
    const long long HV = hv_heads;

    load_qk_rows<ENGINE>(Ks, Qs, q, k, ld_qk, hk, row0, nc, scale);
    if (!LATE_V)
        for (int i = tid; i < GDN_C * GDN_DV; i += GDN_THREADS) {
            const int r = i / GDN_DV, c = i % GDN_DV;
            Vs[r * LD128 + c] = r < nc ? bf2f(v[(row0 + r) * ld_v + hv * GDN_DV + c]) : 0.f;
        }
    if ((tid >> 5) == 0) load_chunk_gates(gam, bet, g_in, beta_in, row0, nc, hv_heads, hv);
    __syncthreads();
    if (tid < nc) Gg[(row0 + tid) * HV + hv] = gam[tid];

    mm<MMA, GDN_C, GDN_C, GDN_DK, 4, 4>(
        [&](int m, int kk) { return Qs[m * LD128 + kk]; }, [&](int kk, int c) { return Ks[c * LD128 + kk]; },
        [&](int m, int c, float x) {
            if (m < nc) {
                const float val = m >= c ? x * expf(gam[m] - gam[c]) : 0.f;
                Ag[((row0 + m) * HV + hv) * GDN_C + c] = ENGINE ? rb(val) : val;
            }
        });
    mm<MMA, GDN_C, GDN_C, GDN_DK, 4, 4>(
        [&](int m, int kk) { return Ks[m * LD128 + kk]; }, [&](int kk, int c) { return Ks[c * LD128 + kk]; },
        [&](int m, int c, float x) { Ls[m * LD64 + c] = m > c ? bet[m] * x * expf(gam[m] - gam[c]) : 0.f; });
    __syncthreads();
    invert_unit_lower(Ls, Ms);
    __syncthreads();
    for (int i = tid; i < GDN_C * GDN_DK; i += GDN_THREADS) {
        const int r = i / GDN_DK, c = i % GDN_DK;
        const float x = Ks[r * LD128 + c] * bet[r] * expf(gam[r]);
        Qs[r * LD128 + c] = ENGINE ? rb(x) : x;
        if (!LATE_V) {
            const float y = Vs[r * LD128 + c] * bet[r];
            Vs[r * LD128 + c] = ENGINE ? rb(y) : y;
        }
    }
    if (LATE_V) {
        __syncthreads();  // K read: diag(beta) V replaces it, the same values as above
        for (int i = tid; i < GDN_C * GDN_DV; i += GDN_THREADS) {
            const int r = i / GDN_DV, c = i % GDN_DV;
            const float y = (r < nc ? bf2f(v[(row0 + r) * ld_v + hv * GDN_DV + c]) : 0.f) * bet[r];
            Vs[r * LD128 + c] = ENGINE ? rb(y) : y;
        }
    }
    if (ENGINE)
        for (int i = tid; i < GDN_C * GDN_C; i += GDN_THREADS) {
            const int r = i / GDN_C, c = i % GDN_C;
            Ms[r * LD64 + c] = rb(Ms[r * LD64 + c]);
        }
    __syncthreads();
    mm<MMA, GDN_C, GDN_DK, GDN_C, 4, 8>(
        [&](int m, int kk) { return Ms[m * LD64 + kk]; }, [&](int kk, int c) { return Qs[kk * LD128 + c]; },
        [&](int m, int c, float x) {
            if (m < nc) Wg[((row0 + m) * HV + hv) * GDN_DK + c] = ENGINE ? rb(x) : x;
        });
    mm<MMA, GDN_C, GDN_DV, GDN_C, 4, 8>(
        [&](int m, int kk) { return Ms[m * LD64 + kk]; }, [&](int kk, int c) { return Vs[kk * LD128 + c]; },
        [&](int m, int c, float x) {
            if (m < nc) Ug[((row0 + m) * HV + hv) * GDN_DV + c] = ENGINE ? rb(x) : x;
        });
}

// One block per (value-column slice of DVS, value head, sequence), walking the sequence's chunks:
//   V' = U - W S, O = e^gam o (Q S) + A V', S <- e^gam_C S + K^T (e^(gam_C - gam) o V').
// Shared memory: 3*64*129 + 64*65 + 3*64*(DVS+1) + 128*(DVS+1) + 64 floats (199,168 bytes for
// DVS = 64).
template <bool ENGINE, bool MMA, int DVS>
__device__ __forceinline__ void gdn_walk_impl(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                              long long ld_qk, const float* __restrict__ Wg,
                                              const float* __restrict__ Ug, const float* __restrict__ Ag,
                                              const float* __restrict__ Gg, const long long* __restrict__ seq_rows,
                                              bf16_t* __restrict__ out, const u64* __restrict__ states, int hv_heads,
                                              int ratio, float scale) {
    constexpr int LDV = DVS + 1;
    constexpr int TMV = DVS == 32 ? 2 : 4;
    constexpr int TNS = DVS == 32 ? 4 : 8;
    extern __shared__ float smem[];
    float* Ks = smem;                // [64][129] K
    float* Qs = Ks + GDN_C * LD128;  // [64][129] Q
    float* Ws = Qs + GDN_C * LD128;  // [64][129] W
    float* As = Ws + GDN_C * LD128;  // [64][65]  decayed scores
    float* Us = As + GDN_C * LD64;   // [64][DVS+1] U, then e^(gam_C - gam) V'
    float* Vp = Us + GDN_C * LDV;    // [64][DVS+1] V'
    float* Op = Vp + GDN_C * LDV;    // [64][DVS+1] Q S
    float* Ss = Op + GDN_C * LDV;    // [128][DVS+1] state slice
    float* gam = Ss + GDN_DK * LDV;  // [64]
    const int iv = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, hk = hv / ratio, tid = threadIdx.x;
    const long long seq0 = seq_rows[2 * n], seq1 = seq_rows[2 * n + 1];
    const long long HV = hv_heads, ld_o = HV * GDN_DV;
    const int vcol = hv * GDN_DV + iv * DVS;
    float* state = (float*)states[n] + (long long)hv * GDN_DK * GDN_DV + iv * DVS;
    for (int i = tid; i < GDN_DK * DVS; i += GDN_THREADS) {
        const int r = i / DVS, c = i % DVS;
        Ss[r * LDV + c] = state[r * GDN_DV + c];
    }
    auto S_op = [&](int r, int c) { return ENGINE ? rb(Ss[r * LDV + c]) : Ss[r * LDV + c]; };

    for (long long row0 = seq0; row0 < seq1; row0 += GDN_C) {
        const int nc = (int)min((long long)GDN_C, seq1 - row0);
        load_qk_rows<ENGINE>(Ks, Qs, q, k, ld_qk, hk, row0, nc, scale);
        for (int i = tid; i < GDN_C * (GDN_DK / 4); i += GDN_THREADS) {
            const int r = i / (GDN_DK / 4), c = (i % (GDN_DK / 4)) * 4;
            float4 w4 = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < nc) w4 = *(const float4*)(Wg + ((row0 + r) * HV + hv) * GDN_DK + c);
            Ws[r * LD128 + c] = w4.x;
            Ws[r * LD128 + c + 1] = w4.y;
            Ws[r * LD128 + c + 2] = w4.z;
            Ws[r * LD128 + c + 3] = w4.w;
        }
        for (int i = tid; i < GDN_C * GDN_C; i += GDN_THREADS) {
            const int r = i / GDN_C, c = i % GDN_C;
            As[r * LD64 + c] = r < nc ? Ag[((row0 + r) * HV + hv) * GDN_C + c] : 0.f;
        }
        for (int i = tid; i < GDN_C * DVS; i += GDN_THREADS) {
            const int r = i / DVS, c = i % DVS;
            Us[r * LDV + c] = r < nc ? Ug[((row0 + r) * HV + hv) * GDN_DV + iv * DVS + c] : 0.f;
        }
        if (tid < GDN_C) gam[tid] = Gg[(row0 + min(tid, nc - 1)) * HV + hv];
        __syncthreads();

        const float gC = gam[GDN_C - 1];
        mm<MMA, GDN_C, DVS, GDN_DK, TMV, 4>(
            [&](int m, int kk) { return Qs[m * LD128 + kk]; }, S_op,
            [&](int m, int c, float x) { Op[m * LDV + c] = x; });
        mm<MMA, GDN_C, DVS, GDN_DK, TMV, 4>(
            [&](int m, int kk) { return Ws[m * LD128 + kk]; }, S_op,
            [&](int m, int c, float x) {
                const float vp = Us[m * LDV + c] - x;
                Vp[m * LDV + c] = vp;
                const float vd = vp * expf(gC - gam[m]);
                Us[m * LDV + c] = ENGINE ? rb(vd) : vd;
            });
        __syncthreads();

        mm<MMA, GDN_C, DVS, GDN_C, TMV, 4>(
            [&](int m, int kk) { return As[m * LD64 + kk]; },
            [&](int kk, int c) { return ENGINE ? rb(Vp[kk * LDV + c]) : Vp[kk * LDV + c]; },
            [&](int m, int c, float x) {
                if (m < nc) {
                    const float inter = Op[m * LDV + c] * expf(gam[m]);
                    const float o = ENGINE ? inter * scale + x * scale : inter + x;
                    out[(row0 + m) * ld_o + vcol + c] = f2bf(o);
                }
            });
        const float eC = expf(gC);
        mm<MMA, GDN_DK, DVS, GDN_C, 4, TNS>(
            [&](int m, int kk) { return Ks[kk * LD128 + m]; }, [&](int kk, int c) { return Us[kk * LDV + c]; },
            [&](int m, int c, float x) { Ss[m * LDV + c] = Ss[m * LDV + c] * eC + x; });
        __syncthreads();
    }
    for (int i = tid; i < GDN_DK * DVS; i += GDN_THREADS) {
        const int r = i / DVS, c = i % DVS;
        state[r * GDN_DV + c] = Ss[r * LDV + c];
    }
}

#define GDN_PREP_KERNEL(NAME, ENGINE, MMA, LATE_V, BLOCKS)                                                      \
    extern "C" __global__ void __launch_bounds__(GDN_THREADS, BLOCKS)                                             \
        NAME(const bf16_t* q, const bf16_t* k, const bf16_t* v, long long ld_qk, long long ld_v, const float* g,   \
             const float* beta, const long long* chunk_rows, float* Wg, float* Ug, float* Ag, float* Gg,           \
             int hv_heads, int ratio, float scale) { dl_grid_begin();                                             \
        gdn_prep_impl<ENGINE, MMA, LATE_V>(q, k, v, ld_qk, ld_v, g, beta, chunk_rows, Wg, Ug, Ag, Gg, hv_heads,   \
                                           ratio, scale);                                                         \
    }
#define GDN_WALK_KERNEL(NAME, ENGINE, MMA, DVS)                                                                   \
    extern "C" __global__ void __launch_bounds__(GDN_THREADS, 1)                                                  \
        NAME(const bf16_t* q, const bf16_t* k, long long ld_qk, const float* Wg, const float* Ug, const float* Ag, \
             const float* Gg, const long long* seq_rows, bf16_t* out, const u64* states, int hv_heads, int ratio,  \
             float scale) { dl_grid_begin();                                                                      \
        gdn_walk_impl<ENGINE, MMA, DVS>(q, k, ld_qk, Wg, Ug, Ag, Gg, seq_rows, out, states, hv_heads, ratio,      \
                                        scale);                                                                   \
    }
// gdn_prep_reference / gdn_walk_reference and gdn_prep_engine_mma / gdn_walk_engine_fma are the
// split kernels SplitReference and SplitEngineFma, the tests' references of the three-phase
// defaults (crates/engine/src/backend/cuda/gdn.rs). The entries marked "kernel lab only" run only
// for the variants of crates/engine/src/backend/cuda/gdn/lab.rs (the kernel-lab feature).
GDN_PREP_KERNEL(gdn_prep_reference, false, false, false, 1)
GDN_PREP_KERNEL(gdn_prep_engine_mma, true, true, false, 1)
GDN_PREP_KERNEL(gdn_prep2_reference, false, false, true, 2)   // kernel lab only
GDN_PREP_KERNEL(gdn_prep2_engine_mma, true, true, true, 2)    // kernel lab only
GDN_WALK_KERNEL(gdn_walk_reference, false, false, 64)
GDN_WALK_KERNEL(gdn_walk_engine_fma, true, false, 64)
GDN_WALK_KERNEL(gdn_walk_engine_mma, true, true, 64)          // kernel lab only

// ---------------------------------------------------------------------------------------------
// Three-phase chunked delta rule (fla's layout; docs/gdn-cuda.md, "Three-phase kernels"):
//   1. gdn_prep_* (above): every chunk's W, U, decayed scores A and gam at once;
//   2. gdn_hwalk_*: per sequence, only the two products that carry the state from chunk to chunk,
//      V' = U - W S and S <- e^gam_C S + K^T (e^(gam_C - gam) o V'), over a slice of just 16 value
//      columns per block (8 blocks per head: the columns of S are independent), storing the state
//      at every chunk start (h_c) and V';
//   3. gdn_hout_*: O = e^gam o (Q h_c) + A V' for every chunk at once.
// Same products, operands, roundings and fp32 summation orders as gdn_walk_* (each output element
// an fmaf chain over k in ascending order on the FMA path), so the Reference profile's results
// equal SplitReference's; the Engine variant's phase 3 runs on the tensor cores.
//
// Scratch beyond the prep's: Vg [T][Hv][128] V' (f32; Engine rounds it to bf16 where it is read)
// and Hg [chunks][Hv][128][128] the state at every chunk start (f32; Engine: bf16, the rounding
// its only reader applies, as fla stores h).

#define GDN_LDW 132  // row stride (floats) of the float4-read tiles: 16-byte aligned rows, and the
                     // rows a warp reads at once fall on disjoint groups of 4 banks


// fp32 FMA product on shared-memory tiles with 16-byte loads, 256 threads:
// out(m, n) = sum_k A[m][k] B[k][n] for m < M, n < N, each element an fmaf chain over k ascending
// from 0 (mm_fma's order, so the results are the same bits). Thread: R = M*N/1024 rows
// (m0 + i*M/R) x 4 adjacent columns; per 4 k it reads one float4 of A per row and 4 of B.
// A row-major with stride lda, B with ldb, both multiples of 4 floats; epi(m, n, value).
template <int M, int N, int K, class FE>
__device__ __forceinline__ void mm_rows4(const float* A, int lda, const float* B, int ldb, FE epi) {
    constexpr int TPR = N / 4;             // threads per row
    constexpr int RG = GDN_THREADS / TPR;  // rows per pass
    constexpr int R = M / RG;              // rows per thread
    static_assert(RG * TPR == GDN_THREADS && R * RG == M && K % 4 == 0, "mm_rows4: shape");
    const int m0 = threadIdx.x / TPR, c = (threadIdx.x % TPR) * 4;
    float acc[R][4];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
#pragma unroll 2
    for (int k = 0; k < K; k += 4) {
        float a[R][4];
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const float4 a4 = *(const float4*)(A + (m0 + i * RG) * lda + k);
            a[i][0] = a4.x;
            a[i][1] = a4.y;
            a[i][2] = a4.z;
            a[i][3] = a4.w;
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float4 b4 = *(const float4*)(B + (k + e) * ldb + c);
#pragma unroll
            for (int i = 0; i < R; ++i) {
                acc[i][0] = fmaf(a[i][e], b4.x, acc[i][0]);
                acc[i][1] = fmaf(a[i][e], b4.y, acc[i][1]);
                acc[i][2] = fmaf(a[i][e], b4.z, acc[i][2]);
                acc[i][3] = fmaf(a[i][e], b4.w, acc[i][3]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) epi(m0 + i * RG, c + j, acc[i][j]);
}

// The state walks' chunk loads (gdn_hwalk_impl, gdn_hwalk_engine_tc): the W tile (f32, row
// stride GDN_LDW) and the block's U slice (DVS columns from col0) of the chunk starting at row0 by
// cp.async (committed, not waited for), and its gam by plain loads (rows past the sequence's end
// seq1 take the last row's). Rows past the end are not loaded: phase b never keeps them.
template <int DVS>
__device__ __forceinline__ void hwalk_load_chunk(float* Ws, float* Us, float* gam, const float* __restrict__ Wg,
                                                 const float* __restrict__ Ug, const float* __restrict__ Gg,
                                                 long long row0, long long seq1, long long HV, int hv, int col0) {
    const int tid = threadIdx.x;
    const int nc = (int)min((long long)GDN_C, seq1 - row0);
    for (int i = tid; i < GDN_C * (GDN_DK / 4); i += GDN_THREADS) {
        const int r = i / (GDN_DK / 4), c = (i % (GDN_DK / 4)) * 4;
        if (r < nc) cp_async16(Ws + r * GDN_LDW + c, Wg + ((row0 + r) * HV + hv) * GDN_DK + c);
    }
    for (int i = tid; i < GDN_C * (DVS / 4); i += GDN_THREADS) {
        const int r = i / (DVS / 4), c = (i % (DVS / 4)) * 4;
        if (r < nc) cp_async16(Us + r * DVS + c, Ug + ((row0 + r) * HV + hv) * GDN_DV + col0 + c);
    }
    cp_async_commit();
    if (tid < GDN_C) gam[tid] = Gg[(row0 + min(tid, nc - 1)) * HV + hv];
}

// Phase 2. One block of 256 threads per (slice of DVS value columns, value head, sequence), DVS =
// 16 or 32 (128/DVS blocks per head). Per chunk two phases separated by barriers:
//   b. V' = U - W S_op (mm_rows4: W tile and S_op, the bf16-rounded (Engine) or plain state, in
//      shared memory); V' to Vg, the decayed e^(gam_C - gam_m) V'[m] (Engine: bf16) to Vd. Rows
//      past the chunk's end give Vd = 0. Meanwhile the chunk's k rows are loaded and
//      L2-normalised into Ks (exactly load_qk_rows' arithmetic).
//   c. thread: CR = DVS/16 state rows (cr + i*128/CR) x 8 columns in registers,
//      S <- e^gam_C S + sum_m K[m][r] Vd[m]; meanwhile the next chunk's W tile,
//      U slice and gam arrive (cp.async / plain loads).
// The state at each chunk start goes to Hg from the registers before phase b.
// Shared memory: 2*64*132 + 128*DVS + 2*64*DVS + 64 floats (84,224 bytes for DVS = 16, 100,608
// for 32): two blocks per SM.
template <bool ENGINE, int DVS>
__device__ __forceinline__ void gdn_hwalk_impl(const bf16_t* __restrict__ k, long long ld_qk,
                                               const float* __restrict__ Wg, const float* __restrict__ Ug,
                                               const float* __restrict__ Gg, const long long* __restrict__ seq_rows,
                                               const long long* __restrict__ seq_chunk0, float* __restrict__ Hg,
                                               float* __restrict__ Vg, const u64* __restrict__ states, int hv_heads,
                                               int ratio) {
    constexpr int CTPR = DVS / 8;               // phase c: threads per state row
    constexpr int CRG = GDN_THREADS / CTPR;     // state rows per pass
    constexpr int CR = GDN_DK / CRG;            // state rows per thread
    static_assert(CR * CRG == GDN_DK, "gdn_hwalk: DVS");
    extern __shared__ float smem[];
    float* Ws = smem;                  // [64][132] W of the current chunk
    float* Ks = Ws + GDN_C * GDN_LDW;  // [64][132] normalised K of the current chunk
    float* Ss = Ks + GDN_C * GDN_LDW;  // [128][DVS] the state as the products read it
    float* Vd = Ss + GDN_DK * DVS;     // [64][DVS]  e^(gam_C - gam) V'
    float* Us = Vd + GDN_C * DVS;      // [64][DVS]  U slice of the current chunk
    float* gam = Us + GDN_C * DVS;     // [64] gam of the current chunk (rows past its end: last row's)
    const int iv = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, hk = hv / ratio;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long seq0 = seq_rows[2 * n], seq1 = seq_rows[2 * n + 1];
    const long long HV = hv_heads, ch0 = seq_chunk0[n];
    const int col0 = iv * DVS;
    const int cr = tid / CTPR, cc = (tid % CTPR) * 8;  // phase c: rows cr + i*CRG, columns cc..cc+7
    float* state = (float*)states[n] + (long long)hv * GDN_DK * GDN_DV + col0 + cc;
    float s[CR][8];
#pragma unroll
    for (int i = 0; i < CR; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s[i][j] = state[(cr + i * CRG) * GDN_DV + j];
            Ss[(cr + i * CRG) * DVS + cc + j] = ENGINE ? rb(s[i][j]) : s[i][j];
        }

    auto load_w = [&](long long row0) {
        hwalk_load_chunk<DVS>(Ws, Us, gam, Wg, Ug, Gg, row0, seq1, HV, hv, col0);
    };
    load_w(seq0);  // every sequence here has rows
    cp_async_wait_all();
    __syncthreads();

    for (long long row0 = seq0, ci = ch0; row0 < seq1; row0 += GDN_C, ++ci) {
        const int nc = (int)min((long long)GDN_C, seq1 - row0);
        // h_c: the state at the chunk start; f32, Engine bf16 (the rounding its readers apply, and
        // where fla stores h).
        {
            const long long h0 = ((ci * HV + hv) * GDN_DK + cr) * GDN_DV + col0 + cc;
#pragma unroll
            for (int i = 0; i < CR; ++i) {
                if (ENGINE) {
                    *(uint4*)((bf16_t*)Hg + h0 + i * CRG * GDN_DV) = pack8(s[i]);
                } else {
                    float* h = Hg + h0 + i * CRG * GDN_DV;
                    *(float4*)h = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
                    *(float4*)(h + 4) = make_float4(s[i][4], s[i][5], s[i][6], s[i][7]);
                }
            }
        }
        // --- b. the chunk's k rows in flight (warp w: rows w, w+8, ...), then V' = U - W S_op.
        constexpr int PER = GDN_C / (GDN_THREADS / 32);
        uint2 kw[PER];
        fetch_head_rows(kw, k, ld_qk, hk, row0, nc);
        const float gC = gam[GDN_C - 1];
        mm_rows4<GDN_C, DVS, GDN_DK>(Ws, GDN_LDW, Ss, DVS, [&](int m, int c, float x) {
            float vd = 0.f;
            if (m < nc) {
                const long long vi = ((row0 + m) * HV + hv) * GDN_DV + col0 + c;
                const float vp = Us[m * DVS + c] - x;
                Vg[vi] = vp;
                const float d = vp * expf(gC - gam[m]);
                vd = ENGINE ? rb(d) : d;
            }
            Vd[m * DVS + c] = vd;
        });
        // The k rows, L2-normalised as load_qk_rows does (Engine: rounded to bf16).
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int r = warp + 8 * i;
            const float kf[4] = {lo_bf(kw[i].x), hi_bf(kw[i].x), lo_bf(kw[i].y), hi_bf(kw[i].y)};
            const float kn = head_inv_norm(kf);
            float kv[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) kv[j] = ENGINE ? rb(kf[j] * kn) : kf[j] * kn;
            *(float4*)(Ks + r * GDN_LDW + lane * 4) = make_float4(kv[0], kv[1], kv[2], kv[3]);
        }
        __syncthreads();

        // --- c. the next chunk's W and gam in flight; the state update from registers.
        const long long next = row0 + GDN_C;
        if (next < seq1) load_w(next);
        {
            float acc[CR][8];
#pragma unroll
            for (int i = 0; i < CR; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
#pragma unroll 2
            for (int m = 0; m < GDN_C; ++m) {
                const float4 d0 = *(const float4*)(Vd + m * DVS + cc);
                const float4 d1 = *(const float4*)(Vd + m * DVS + cc + 4);
                const float d[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
#pragma unroll
                for (int i = 0; i < CR; ++i) {
                    const float kv = Ks[m * GDN_LDW + cr + i * CRG];
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(kv, d[j], acc[i][j]);
                }
            }
            const float eC = expf(gC);
#pragma unroll
            for (int i = 0; i < CR; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    s[i][j] = s[i][j] * eC + acc[i][j];
                    Ss[(cr + i * CRG) * DVS + cc + j] = ENGINE ? rb(s[i][j]) : s[i][j];
                }
        }
        cp_async_wait_all();
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < CR; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) state[(cr + i * CRG) * GDN_DV + j] = s[i][j];
}

// Rows row0 .. row0+63 of q (head hk), L2-normalised into Qs (row stride ldq) exactly as
// load_qk_rows does; rows past nc are zero.
template <bool ENGINE>
__device__ __forceinline__ void load_q_rows(float* Qs, int ldq, const bf16_t* __restrict__ q, long long ld_qk,
                                            int hk, long long row0, int nc, float scale) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int PER = GDN_C / (GDN_THREADS / 32);
    uint2 qw[PER];
    fetch_head_rows(qw, q, ld_qk, hk, row0, nc);
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int r = warp + 8 * i;
        const float qf[4] = {lo_bf(qw[i].x), hi_bf(qw[i].x), lo_bf(qw[i].y), hi_bf(qw[i].y)};
        const float qn = head_inv_norm(qf);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float qv = qf[j] * qn;
            qv = ENGINE ? rb(qv) : qv * scale;
            Qs[r * ldq + lane * 4 + j] = qv;
        }
    }
}

// Phase 3. One block of 256 threads per (chunk, value head, slice of 32 value columns):
//   O = e^gam o (Q h_c) + A V' (Engine: both terms times the scale, h_c and V' bf16-rounded),
// the same products and epilogue as gdn_walk_impl's: on the tensor cores (MMA; odd strides for
// the fragments' column walks) or by mm_rows4 (16-byte loads, strides multiples of 4).
// chunk_rows: (start, end) pairs in the order gdn_hwalk numbered the chunks' states.
// Shared memory: at most 64*132 + 128*32 + 64*68 + 2*64*33 + 64 floats (84,480 bytes).
#define GDN_HO_DVS 32
template <bool ENGINE, bool MMA>
__device__ __forceinline__ void gdn_hout_impl(const bf16_t* __restrict__ q, long long ld_qk,
                                              const float* __restrict__ Hg, const float* __restrict__ Vg,
                                              const float* __restrict__ Ag, const float* __restrict__ Gg,
                                              const long long* __restrict__ chunk_rows, bf16_t* __restrict__ out,
                                              int hv_heads, int ratio, float scale) {
    constexpr int DVS = GDN_HO_DVS;
    constexpr int LDQ = MMA ? LD128 : GDN_LDW;  // Q [64][LDQ]
    constexpr int LDH = MMA ? DVS + 1 : DVS;    // h_c [128][LDH], V' [64][LDH]
    constexpr int LDA = MMA ? LD64 : 68;        // scores [64][LDA]
    constexpr int LDO = DVS + 1;                // Q h_c [64][LDO]
    extern __shared__ float smem[];
    float* Qs = smem;
    float* Hs = Qs + GDN_C * LDQ;
    float* As = Hs + GDN_DK * LDH;
    float* Vs = As + GDN_C * LDA;
    float* Op = Vs + GDN_C * LDH;
    float* gam = Op + GDN_C * LDO;
    const long long ch = blockIdx.x;
    const int hv = blockIdx.y, iv = blockIdx.z, hk = hv / ratio, tid = threadIdx.x;
    const long long row0 = chunk_rows[2 * ch];
    const int nc = (int)(chunk_rows[2 * ch + 1] - row0);
    const long long HV = hv_heads, ld_o = HV * GDN_DV;
    const int col0 = iv * DVS;

    const long long h0 = (ch * HV + hv) * GDN_DK * GDN_DV + col0;
    if (ENGINE) {  // bf16 h (gdn_hwalk stores the rounded state)
        for (int i = tid; i < GDN_DK * (DVS / 8); i += GDN_THREADS) {
            const int r = i / (DVS / 8), c = (i % (DVS / 8)) * 8;
            float x[8];
            unpack8(*(const uint4*)((const bf16_t*)Hg + h0 + r * GDN_DV + c), x);
#pragma unroll
            for (int j = 0; j < 8; ++j) Hs[r * LDH + c + j] = x[j];
        }
    } else {
        for (int i = tid; i < GDN_DK * (DVS / 4); i += GDN_THREADS) {
            const int r = i / (DVS / 4), c = (i % (DVS / 4)) * 4;
            const float4 x = *(const float4*)(Hg + h0 + r * GDN_DV + c);
            Hs[r * LDH + c] = x.x;
            Hs[r * LDH + c + 1] = x.y;
            Hs[r * LDH + c + 2] = x.z;
            Hs[r * LDH + c + 3] = x.w;
        }
    }
    for (int i = tid; i < GDN_C * (DVS / 4); i += GDN_THREADS) {
        const int r = i / (DVS / 4), c = (i % (DVS / 4)) * 4;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < nc) x = *(const float4*)(Vg + ((row0 + r) * HV + hv) * GDN_DV + col0 + c);
        Vs[r * LDH + c] = ENGINE ? rb(x.x) : x.x;
        Vs[r * LDH + c + 1] = ENGINE ? rb(x.y) : x.y;
        Vs[r * LDH + c + 2] = ENGINE ? rb(x.z) : x.z;
        Vs[r * LDH + c + 3] = ENGINE ? rb(x.w) : x.w;
    }
    for (int i = tid; i < GDN_C * (GDN_C / 4); i += GDN_THREADS) {
        const int r = i / (GDN_C / 4), c = (i % (GDN_C / 4)) * 4;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < nc) x = *(const float4*)(Ag + ((row0 + r) * HV + hv) * GDN_C + c);
        As[r * LDA + c] = x.x;
        As[r * LDA + c + 1] = x.y;
        As[r * LDA + c + 2] = x.z;
        As[r * LDA + c + 3] = x.w;
    }
    if (tid < GDN_C) gam[tid] = Gg[(row0 + min(tid, nc - 1)) * HV + hv];
    load_q_rows<ENGINE>(Qs, LDQ, q, ld_qk, hk, row0, nc, scale);
    __syncthreads();

    auto to_op = [&](int m, int c, float x) { Op[m * LDO + c] = x; };
    auto to_out = [&](int m, int c, float x) {
        if (m < nc) {
            const float inter = Op[m * LDO + c] * expf(gam[m]);
            const float o = ENGINE ? inter * scale + x * scale : inter + x;
            out[(row0 + m) * ld_o + hv * GDN_DV + col0 + c] = f2bf(o);
        }
    };
    if constexpr (MMA) {
        mm_mma<GDN_C, DVS, GDN_DK>([&](int m, int kk) { return Qs[m * LDQ + kk]; },
                                   [&](int kk, int c) { return Hs[kk * LDH + c]; }, to_op);
        __syncthreads();
        mm_mma<GDN_C, DVS, GDN_C>([&](int m, int kk) { return As[m * LDA + kk]; },
                                  [&](int kk, int c) { return Vs[kk * LDH + c]; }, to_out);
    } else {
        mm_rows4<GDN_C, DVS, GDN_DK>(Qs, LDQ, Hs, LDH, to_op);
        __syncthreads();
        mm_rows4<GDN_C, DVS, GDN_C>(As, LDA, Vs, LDH, to_out);
    }
}

#define GDN_HWALK_KERNEL(NAME, ENGINE, DVS)                                                                      \
    extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)                                                 \
        NAME(const bf16_t* k, long long ld_qk, const float* Wg, const float* Ug, const float* Gg,                 \
             const long long* seq_rows, const long long* seq_chunk0, float* Hg, float* Vg, const u64* states,     \
             int hv_heads, int ratio) { dl_grid_begin();                                                         \
        gdn_hwalk_impl<ENGINE, DVS>(k, ld_qk, Wg, Ug, Gg, seq_rows, seq_chunk0, Hg, Vg, states, hv_heads,       \
                                    ratio);                                                                      \
    }
#define GDN_HOUT_KERNEL(NAME, ENGINE, MMA)                                                                       \
    extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)                                                 \
        NAME(const bf16_t* q, long long ld_qk, const float* Hg, const float* Vg, const float* Ag, const float* Gg, \
             const long long* chunk_rows, bf16_t* out, int hv_heads, int ratio, float scale) { dl_grid_begin();  \
        gdn_hout_impl<ENGINE, MMA>(q, ld_qk, Hg, Vg, Ag, Gg, chunk_rows, out, hv_heads, ratio, scale);          \
    }
// The reference profile's default (ThreePhaseReferenceRt) walks with gdn_hwalk_reference and
// writes with gdn_hout_reference; the entries marked "kernel lab only" run only for the variants of
// crates/engine/src/backend/cuda/gdn/lab.rs (the kernel-lab feature).
GDN_HWALK_KERNEL(gdn_hwalk_reference, false, 32)
GDN_HWALK_KERNEL(gdn_hwalk_engine, true, 32)          // kernel lab only
GDN_HWALK_KERNEL(gdn_hwalk_reference_v16, false, 16)  // kernel lab only
GDN_HWALK_KERNEL(gdn_hwalk_engine_v16, true, 16)      // kernel lab only
GDN_HOUT_KERNEL(gdn_hout_reference, false, false)
GDN_HOUT_KERNEL(gdn_hout_engine_mma, true, true)      // kernel lab only

// ---------------------------------------------------------------------------------------------
// Reference profile: the prep with register-tiled FMA products (docs/gdn-cuda.md, "Round 2").
// gdn_prep2_reference's products run mm_fma, one scalar shared load per 2 FMAs (Q Kᵀ, K Kᵀ) or
// 12 per 32 (W, U): shared-memory bound at about half the FMA rate. Here every product reads
// 16-byte vectors: Q Kᵀ and K Kᵀ by mm_nt4 (both operands row-major along k), W and U by
// mm_rows4 (M row-major along k, K diag(βe^γ) and diag(β) V along n), 8–12 vector loads per 64–128
// FMAs. Every output element is still an fmaf chain over k ascending from 0 (mm_fma's order), and
// the loads, roundings and epilogues are gdn_prep_impl's: the same bits as gdn_prep2_reference.

// out(m, n) = sum_k A[m][k] B[n][k], 256 threads, M = N = 64: thread (rg, cg) = (tid / 16,
// tid % 16) owns rows 4rg .. 4rg+3 and columns cg + 16j (neighbouring threads read neighbouring B
// rows: with a row stride of 4 mod 32 floats, 8 threads' 16-byte loads hit distinct bank quads).
// lda, ldb multiples of 4 floats; epi(m, n, value).
template <int K, class FE>
__device__ __forceinline__ void mm_nt4(const float* A, int lda, const float* B, int ldb, FE epi) {
    static_assert(K % 4 == 0, "mm_nt4: K");
    const int rg = threadIdx.x >> 4, cg = threadIdx.x & 15;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
#pragma unroll 2
    for (int k = 0; k < K; k += 4) {
        float4 a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = *(const float4*)(A + (4 * rg + i) * lda + k);
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = *(const float4*)(B + (cg + 16 * j) * ldb + k);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
                acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
                acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
                acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
            }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) epi(4 * rg + i, cg + 16 * j, acc[i][j]);
}

// M = (I + L)^-1 as invert_unit_lower, with row strides LDL (L) and LDM (M) and the inner loop
// unrolled (its loads do not depend on the running sum, so unrolled they issue ahead of the fmaf
// chain instead of one shared-load latency per step): the same fmaf sequence per element, so the
// same bits. The 63 steps are the prep's critical path once its products are fast.
template <int LDL, int LDM>
__device__ __forceinline__ void invert_unit_lower_ld(const float* Ls, float* Ms) {
    const int c = threadIdx.x >> 2, p = threadIdx.x & 3;
    for (int r = p; r < GDN_C; r += 4) Ms[r * LDM + c] = r == c ? 1.f : 0.f;
    __syncwarp();
    for (int r = 1; r < GDN_C; ++r) {
        float part = 0.f;
        if (r > c)
#pragma unroll 4
            for (int s = c + 1 + p; s < r; s += 4) part = fmaf(Ls[r * LDL + s], Ms[s * LDM + c], part);
        part += __shfl_xor_sync(0xffffffffu, part, 1);
        part += __shfl_xor_sync(0xffffffffu, part, 2);
        if (r > c && p == 0) Ms[r * LDM + c] = -(Ls[r * LDL + c] + part);
        __syncwarp();
    }
}

// gdn_prep2_reference_rt: one block per (chunk, value head), 256 threads. Shared memory: K then
// diag(β) V [64][132], Q then K diag(βe^γ) [64][132], L and M [64][68], β, γ: 2·33,792 +
// 2·17,408 + 512 = 102,912 bytes (two blocks per SM; PREP_RT_SMEM_BYTES in
// crates/engine/src/backend/cuda/gdn.rs).
#define GDN_LD68 68
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_prep2_reference_rt(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                           const bf16_t* __restrict__ v, long long ld_qk, long long ld_v,
                           const float* __restrict__ g_in, const float* __restrict__ beta_in,
                           const long long* __restrict__ chunk_rows, float* __restrict__ Wg, float* __restrict__ Ug,
                           float* __restrict__ Ag, float* __restrict__ Gg, int hv_heads, int ratio, float scale) {
    dl_grid_begin();
    extern __shared__ float smem[];
    float* Ks = smem;                   // [64][132] K, then diag(β) V
    float* Qs = Ks + GDN_C * GDN_LDW;   // [64][132] Q, then K diag(β e^γ)
    float* Ls = Qs + GDN_C * GDN_LDW;   // [64][68] L
    float* Ms = Ls + GDN_C * GDN_LD68;  // [64][68] M
    float* bet = Ms + GDN_C * GDN_LD68;
    float* gam = bet + GDN_C;
    const int ch = blockIdx.x, hv = blockIdx.y, hk = hv / ratio, tid = threadIdx.x;
    const long long row0 = chunk_rows[2 * ch];
    const int nc = (int)(chunk_rows[2 * ch + 1] - row0);
    const long long HV = hv_heads;

    // k̂ and q̂·scale exactly as load_qk_rows<false> (k times 1.0f: the same value).
    load_q_rows<false>(Ks, GDN_LDW, k, ld_qk, hk, row0, nc, 1.f);
    load_q_rows<false>(Qs, GDN_LDW, q, ld_qk, hk, row0, nc, scale);
    if ((tid >> 5) == 0) load_chunk_gates(gam, bet, g_in, beta_in, row0, nc, hv_heads, hv);
    __syncthreads();
    if (tid < nc) Gg[(row0 + tid) * HV + hv] = gam[tid];

    mm_nt4<GDN_DK>(Qs, GDN_LDW, Ks, GDN_LDW, [&](int m, int c, float x) {
        if (m < nc) Ag[((row0 + m) * HV + hv) * GDN_C + c] = m >= c ? x * expf(gam[m] - gam[c]) : 0.f;
    });
    mm_nt4<GDN_DK>(Ks, GDN_LDW, Ks, GDN_LDW, [&](int m, int c, float x) {
        Ls[m * GDN_LD68 + c] = m > c ? bet[m] * x * expf(gam[m] - gam[c]) : 0.f;
    });
    __syncthreads();
    invert_unit_lower_ld<GDN_LD68, GDN_LD68>(Ls, Ms);
    __syncthreads();
    for (int i = tid; i < GDN_C * GDN_DK; i += GDN_THREADS) {
        const int r = i / GDN_DK, c = i % GDN_DK;
        Qs[r * GDN_LDW + c] = Ks[r * GDN_LDW + c] * bet[r] * expf(gam[r]);
    }
    __syncthreads();  // K read: diag(β) V replaces it
    for (int i = tid; i < GDN_C * GDN_DV; i += GDN_THREADS) {
        const int r = i / GDN_DV, c = i % GDN_DV;
        Ks[r * GDN_LDW + c] = (r < nc ? bf2f(v[(row0 + r) * ld_v + hv * GDN_DV + c]) : 0.f) * bet[r];
    }
    __syncthreads();
    mm_rows4<GDN_C, GDN_DK, GDN_C>(Ms, GDN_LD68, Qs, GDN_LDW, [&](int m, int c, float x) {
        if (m < nc) Wg[((row0 + m) * HV + hv) * GDN_DK + c] = x;
    });
    mm_rows4<GDN_C, GDN_DV, GDN_C>(Ms, GDN_LD68, Ks, GDN_LDW, [&](int m, int c, float x) {
        if (m < nc) Ug[((row0 + m) * HV + hv) * GDN_DV + c] = x;
    });
}

// ---------------------------------------------------------------------------------------------
// Engine profile on the tensor cores with ldmatrix-fed fragments (docs/gdn-cuda.md, "Round 2:
// feeding the products"). mm_mma above builds every fragment from 12 scalar shared loads of f32
// tiles (odd strides: 2-3-way bank conflicts) and 6 conversions per mma, and runs one accumulator
// chain per warp: its products ran no faster than the FMA ones (EngineMma against EngineFma,
// SplitEngineMma against SplitEngineFma: timings in docs/gdn-cuda.md, "Round 2"). Here the operands sit in shared memory as bf16
// (rows padded by 8 elements: 16-byte aligned, and the 8 rows of an ldmatrix phase fall on
// distinct 16-byte bank groups), each warp owns a 16 x 16 output block (two 16 x 8 tiles sharing
// the A fragment), and one ldmatrix.x4 loads a whole A fragment, another the two B fragments.
//
// Same numerics, same bits: every 16 x 8 output tile is one mma chain over k ascending from a
// zero accumulator with the same bf16 operand values as mm_mma's, so the results equal mm_mma's
// bit for bit (the operands were bf16-valued there too: mm_mma's packing only re-rounds exact
// values).


// out(m, n) = sum_k A[m][k] B(k, n) on bf16 shared tiles, 256 threads (8 warps), each warp
// 16 x 16 output blocks (blocks warp, warp + 8, ...). A row-major [M][lda]; B_NMAJOR: B stored
// [N][ldb] (B(k, n) = B[n][k], e.g. K rows for Q Kᵀ), else [K][ldb] (B(k, n) = B[k][n]).
// lda, ldb: elements, multiples of 8. epi(m, n, value) once per element (mm_mma's order of
// fragments: rows g, g+8, columns 2t, 2t+1 of each 16 x 8 tile).
// One warp's 16 x 16 output block (rows tm.., columns tn..) of A·B on bf16 shared tiles: two
// 16 x 8 tiles sharing the A fragment, each one mma chain over k ascending, accumulated into c
// (c[j] = tile j's fragment: rows g, g+8, columns 2t, 2t+1). A_KMAJOR: A stored [K][lda]
// (A(m, k) = A[k][m], e.g. K rows for Kᵀ V), else [M][lda]. B_NMAJOR: B stored [N][ldb]
// (B(k, n) = B[n][k]), else [K][ldb]. lda, ldb: elements, multiples of 8.
template <int K, bool A_KMAJOR, bool B_NMAJOR>
__device__ __forceinline__ void mm_ldm_block(const bf16_t* A, int lda, const bf16_t* B, int ldb, int tm, int tn,
                                             float (&c)[2][4]) {
    const int lane = threadIdx.x & 31;
    // A: matrices (rows tm.., k0), (rows tm+8.., k0), (rows tm.., k0+8), (rows tm+8.., k0+8); row
    // major: lanes 0-15 rows tm + lane at k0, lanes 16-31 the same rows at k0 + 8; k-major: each
    // lane one k row of its matrix, transposed on the way in.
    const bf16_t* pa = A_KMAJOR ? A + ((lane & 7) + (lane >> 4) * 8) * lda + tm + ((lane >> 3) & 1) * 8
                                : A + (tm + (lane & 15)) * lda + (lane >> 4) * 8;
    // B: matrices (tile 0, k0), (tile 0, k0 + 8), (tile 1, k0), (tile 1, k0 + 8).
    const bf16_t* pb = B_NMAJOR ? B + (tn + (lane & 7) + (lane >> 4) * 8) * ldb + ((lane >> 3) & 1) * 8
                                : B + ((lane & 7) + ((lane >> 3) & 1) * 8) * ldb + tn + (lane >> 4) * 8;
#pragma unroll 4
    for (int k0 = 0; k0 < K; k0 += 16) {
        u32 a0, a1, a2, a3, b0, b1, b2, b3;
        if (A_KMAJOR)
            ldmatrix_x4_trans(a0, a1, a2, a3, pa + k0 * lda);
        else
            ldmatrix_x4(a0, a1, a2, a3, pa + k0);
        if (B_NMAJOR)
            ldmatrix_x4(b0, b1, b2, b3, pb + k0);
        else
            ldmatrix_x4_trans(b0, b1, b2, b3, pb + k0 * ldb);
        mma_bf16(c[0], a0, a1, a2, a3, b0, b1);
        mma_bf16(c[1], a0, a1, a2, a3, b2, b3);
    }
}

// out(m, n) = sum_k A[m][k] B(k, n) on bf16 shared tiles, 256 threads (8 warps), each warp
// 16 x 16 output blocks (blocks warp, warp + 8, ...) by mm_ldm_block. A row-major [M][lda];
// B_NMAJOR: B stored [N][ldb] (B(k, n) = B[n][k], e.g. K rows for Q Kᵀ), else [K][ldb]
// (B(k, n) = B[k][n]). lda, ldb: elements, multiples of 8. epi(m, n, value) once per element
// (mm_mma's order of fragments: rows g, g+8, columns 2t, 2t+1 of each 16 x 8 tile).
template <int M, int N, int K, bool B_NMAJOR, class FE>
__device__ __forceinline__ void mm_ldm(const bf16_t* A, int lda, const bf16_t* B, int ldb, FE epi) {
    constexpr int NB = N / 16, BLOCKS = (M / 16) * NB;
    static_assert(BLOCKS % 8 == 0 && K % 16 == 0, "mm_ldm: shape");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int w = 0; w < BLOCKS / 8; ++w) {
        const int blk = warp + 8 * w;
        const int tm = (blk / NB) * 16, tn = (blk % NB) * 16;
        float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        mm_ldm_block<K, false, B_NMAJOR>(A, lda, B, ldb, tm, tn, c);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int n = tn + 8 * j + 2 * t;
            epi(tm + g, n, c[j][0]);
            epi(tm + g, n + 1, c[j][1]);
            epi(tm + g + 8, n, c[j][2]);
            epi(tm + g + 8, n + 1, c[j][3]);
        }
    }
}

// Rows fetched by fetch_head_rows, L2-normalised and rounded to bf16 into Xb (row stride ldx
// elements): rb(x · 1/sqrt(Σx² + 1e-6)), as load_qk_rows<true> rounds them; zero rows stay zero.
__device__ __forceinline__ void store_rows_bf16(bf16_t* Xb, int ldx, const uint2 (&xw)[GDN_C / (GDN_THREADS / 32)]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < GDN_C / (GDN_THREADS / 32); ++i) {
        const int r = warp + 8 * i;
        const float xf[4] = {lo_bf(xw[i].x), hi_bf(xw[i].x), lo_bf(xw[i].y), hi_bf(xw[i].y)};
        const float xn = head_inv_norm(xf);
        *(uint2*)(Xb + r * ldx + lane * 4) =
            make_uint2(pack_bf16x2(xf[0] * xn, xf[1] * xn), pack_bf16x2(xf[2] * xn, xf[3] * xn));
    }
}

// Rows row0 .. row0+63 of x (head hk), L2-normalised and rounded to bf16 into Xb (row stride ldx
// elements) exactly as load_qk_rows<true> does (rb(x · 1/sqrt(Σx² + 1e-6))); rows past nc are 0.
__device__ __forceinline__ void load_rows_bf16(bf16_t* Xb, int ldx, const bf16_t* __restrict__ x, long long ld_qk,
                                               int hk, long long row0, int nc) {
    uint2 xw[GDN_C / (GDN_THREADS / 32)];
    fetch_head_rows(xw, x, ld_qk, hk, row0, nc);
    store_rows_bf16(Xb, ldx, xw);
}

#define GDN_LDB128 136  // bf16 row strides of the ldmatrix tiles (elements): 272 / 144 / 80 bytes,
#define GDN_LDB64 72    // 16 mod 128 or an odd multiple of 16, so an ldmatrix phase's 8 rows hit
#define GDN_LDB32 40    // distinct 16-byte bank groups

// gdn_prep2_engine_ldm: gdn_prep_impl<ENGINE = true, MMA = true>'s arithmetic, operands and
// epilogues, with the four products on mm_ldm. One block per (chunk, value head), 256 threads.
// Shared memory: three bf16 [64][136] tiles (Q, then K diag(βe^γ) once Q Kᵀ is done; K; V, then
// diag(β) V), L and M f32 [64][65], M bf16 [64][72], β, γ: 3·17,408 + 2·16,640 + 9,216 + 512 =
// 95,232 bytes (two blocks per SM; PREP_LDM_SMEM_BYTES in crates/engine/src/backend/cuda/gdn.rs).
__device__ __forceinline__ void gdn_prep_ldm_impl(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                                  const bf16_t* __restrict__ v, long long ld_qk, long long ld_v,
                                                  const float* __restrict__ g_in, const float* __restrict__ beta_in,
                                                  const long long* __restrict__ chunk_rows, float* __restrict__ Wg,
                                                  float* __restrict__ Ug, float* __restrict__ Ag,
                                                  float* __restrict__ Gg, int hv_heads, int ratio) {
    extern __shared__ __align__(16) unsigned char smem_ldm[];
    bf16_t* Qb = (bf16_t*)smem_ldm;          // [64][136] Q, then K diag(β e^γ)
    bf16_t* Kb = Qb + GDN_C * GDN_LDB128;    // [64][136] K
    bf16_t* Vb = Kb + GDN_C * GDN_LDB128;    // [64][136] V, then diag(β) V
    float* Ls = (float*)(Vb + GDN_C * GDN_LDB128);  // [64][65] L
    float* Ms = Ls + GDN_C * LD64;           // [64][65] M (f32)
    bf16_t* Mb = (bf16_t*)(Ms + GDN_C * LD64);  // [64][72] M (bf16)
    float* bet = (float*)(Mb + GDN_C * GDN_LDB64);
    float* gam = bet + GDN_C;
    const int ch = blockIdx.x, hv = blockIdx.y, hk = hv / ratio, tid = threadIdx.x;
    const long long row0 = chunk_rows[2 * ch];
    const int nc = (int)(chunk_rows[2 * ch + 1] - row0);
    const long long HV = hv_heads;

    load_rows_bf16(Kb, GDN_LDB128, k, ld_qk, hk, row0, nc);
    load_rows_bf16(Qb, GDN_LDB128, q, ld_qk, hk, row0, nc);
    // V as read (bf16, exact); scaled by β once β is known.
    for (int i = tid; i < GDN_C * (GDN_DV / 8); i += GDN_THREADS) {
        const int r = i / (GDN_DV / 8), c = (i % (GDN_DV / 8)) * 8;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (r < nc) x = *(const uint4*)(v + (row0 + r) * ld_v + hv * GDN_DV + c);
        *(uint4*)(Vb + r * GDN_LDB128 + c) = x;
    }
    if ((tid >> 5) == 0) load_chunk_gates(gam, bet, g_in, beta_in, row0, nc, hv_heads, hv);
    __syncthreads();
    if (tid < nc) Gg[(row0 + tid) * HV + hv] = gam[tid];

    mm_ldm<GDN_C, GDN_C, GDN_DK, true>(Qb, GDN_LDB128, Kb, GDN_LDB128, [&](int m, int c, float x) {
        if (m < nc) {
            const float val = m >= c ? x * expf(gam[m] - gam[c]) : 0.f;
            Ag[((row0 + m) * HV + hv) * GDN_C + c] = rb(val);
        }
    });
    mm_ldm<GDN_C, GDN_C, GDN_DK, true>(Kb, GDN_LDB128, Kb, GDN_LDB128, [&](int m, int c, float x) {
        Ls[m * LD64 + c] = m > c ? bet[m] * x * expf(gam[m] - gam[c]) : 0.f;
    });
    __syncthreads();
    invert_unit_lower_ld<LD64, LD64>(Ls, Ms);  // invert_unit_lower's bits, loads issued ahead
    __syncthreads();
    for (int i = tid; i < GDN_C * GDN_DK; i += GDN_THREADS) {
        const int r = i / GDN_DK, c = i % GDN_DK;
        const float x = bf2f(Kb[r * GDN_LDB128 + c]) * bet[r] * expf(gam[r]);
        Qb[r * GDN_LDB128 + c] = f2bf(x);
        Vb[r * GDN_LDB128 + c] = f2bf(bf2f(Vb[r * GDN_LDB128 + c]) * bet[r]);
    }
    for (int i = tid; i < GDN_C * GDN_C; i += GDN_THREADS) {
        const int r = i / GDN_C, c = i % GDN_C;
        Mb[r * GDN_LDB64 + c] = f2bf(Ms[r * LD64 + c]);
    }
    __syncthreads();
    mm_ldm<GDN_C, GDN_DK, GDN_C, false>(Mb, GDN_LDB64, Qb, GDN_LDB128, [&](int m, int c, float x) {
        if (m < nc) Wg[((row0 + m) * HV + hv) * GDN_DK + c] = rb(x);
    });
    mm_ldm<GDN_C, GDN_DV, GDN_C, false>(Mb, GDN_LDB64, Vb, GDN_LDB128, [&](int m, int c, float x) {
        if (m < nc) Ug[((row0 + m) * HV + hv) * GDN_DV + c] = rb(x);
    });
}
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_prep2_engine_ldm(const bf16_t* q, const bf16_t* k, const bf16_t* v, long long ld_qk, long long ld_v,
                         const float* g, const float* beta, const long long* chunk_rows, float* Wg, float* Ug,
                         float* Ag, float* Gg, int hv_heads, int ratio, float scale) {
    dl_grid_begin();
    (void)scale;  // the engine profile scales the output (gdn_hout_*), as fla does
    gdn_prep_ldm_impl(q, k, v, ld_qk, ld_v, g, beta, chunk_rows, Wg, Ug, Ag, Gg, hv_heads, ratio);
}

// gdn_hout_engine_ldm: gdn_hout_impl<ENGINE = true, MMA = true> with the operands in bf16 tiles
// and the two products on mm_ldm (same values, same bits). One block per (chunk, value head,
// slice of 32 value columns). Shared memory: Q [64][136], h_c [128][40], A [64][72], V′ [64][40]
// bf16, Q·h_c f32 [64][33], γ: 17,408 + 10,240 + 9,216 + 5,120 + 8,448 + 256 = 50,688 bytes
// (HOUT_LDM_SMEM_BYTES in crates/engine/src/backend/cuda/gdn/split.rs).
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_hout_engine_ldm(const bf16_t* __restrict__ q, long long ld_qk, const float* __restrict__ Hg,
                        const float* __restrict__ Vg, const float* __restrict__ Ag, const float* __restrict__ Gg,
                        const long long* __restrict__ chunk_rows, bf16_t* __restrict__ out, int hv_heads, int ratio,
                        float scale) {
    dl_grid_begin();
    constexpr int DVS = GDN_HO_DVS, LDO = DVS + 1;
    extern __shared__ __align__(16) unsigned char smem_ldm[];
    bf16_t* Qb = (bf16_t*)smem_ldm;         // [64][136]
    bf16_t* Hb = Qb + GDN_C * GDN_LDB128;   // [128][40]
    bf16_t* Ab = Hb + GDN_DK * GDN_LDB32;   // [64][72]
    bf16_t* Vb = Ab + GDN_C * GDN_LDB64;    // [64][40]
    float* Op = (float*)(Vb + GDN_C * GDN_LDB32);  // [64][33]
    float* gam = Op + GDN_C * LDO;
    const long long ch = blockIdx.x;
    const int hv = blockIdx.y, iv = blockIdx.z, hk = hv / ratio, tid = threadIdx.x;
    const long long row0 = chunk_rows[2 * ch];
    const int nc = (int)(chunk_rows[2 * ch + 1] - row0);
    const long long HV = hv_heads, ld_o = HV * GDN_DV;
    const int col0 = iv * DVS;

    // h_c: bf16 as gdn_hwalk_engine stored it, 8 values per 16-byte copy.
    const long long h0 = (ch * HV + hv) * GDN_DK * GDN_DV + col0;
    for (int i = tid; i < GDN_DK * (DVS / 8); i += GDN_THREADS) {
        const int r = i / (DVS / 8), c = (i % (DVS / 8)) * 8;
        *(uint4*)(Hb + r * GDN_LDB32 + c) = *(const uint4*)((const bf16_t*)Hg + h0 + r * GDN_DV + c);
    }
    // V′ (f32) and the scores (f32, already bf16-valued), rounded / packed to bf16.
    for (int i = tid; i < GDN_C * (DVS / 4); i += GDN_THREADS) {
        const int r = i / (DVS / 4), c = (i % (DVS / 4)) * 4;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < nc) x = *(const float4*)(Vg + ((row0 + r) * HV + hv) * GDN_DV + col0 + c);
        *(uint2*)(Vb + r * GDN_LDB32 + c) = make_uint2(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w));
    }
    for (int i = tid; i < GDN_C * (GDN_C / 4); i += GDN_THREADS) {
        const int r = i / (GDN_C / 4), c = (i % (GDN_C / 4)) * 4;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < nc) x = *(const float4*)(Ag + ((row0 + r) * HV + hv) * GDN_C + c);
        *(uint2*)(Ab + r * GDN_LDB64 + c) = make_uint2(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w));
    }
    if (tid < GDN_C) gam[tid] = Gg[(row0 + min(tid, nc - 1)) * HV + hv];
    load_rows_bf16(Qb, GDN_LDB128, q, ld_qk, hk, row0, nc);
    __syncthreads();

    mm_ldm<GDN_C, DVS, GDN_DK, false>(Qb, GDN_LDB128, Hb, GDN_LDB32,
                                      [&](int m, int c, float x) { Op[m * LDO + c] = x; });
    __syncthreads();
    mm_ldm<GDN_C, DVS, GDN_C, false>(Ab, GDN_LDB64, Vb, GDN_LDB32, [&](int m, int c, float x) {
        if (m < nc) {
            const float inter = Op[m * LDO + c] * expf(gam[m]);
            out[(row0 + m) * ld_o + hv * GDN_DV + col0 + c] = f2bf(inter * scale + x * scale);
        }
    });
}

// gdn_hwalk_engine_tc: gdn_hwalk_engine's walk (same operands and roundings, same scratch in and
// out) with both products on the tensor cores (docs/gdn-cuda.md, "Round 3"): the sequential walk
// was the largest phase of the engine delta rule, f32 FMA bound by shared loads (timings in
// docs/gdn-cuda.md, "Round 3"). Per chunk, one block of 256 threads per (slice of
// 32 value columns, value head, sequence):
//   b. V' = U - W S_op: mm_ldm on W (bf16 copy of the prep's bf16-valued f32 W) and S_op (the
//      state rounded to bf16), V' to Vg (f32), e^(gam_C - gam) V' rounded to bf16 into Vdb;
//      meanwhile the chunk's k rows, L2-normalised and rounded as gdn_hwalk_engine does, into Kb;
//   c. S <- e^gam_C S + Kᵀ Vd: each warp two 16 x 16 blocks of the state (rows (w/2)*16 and
//      64 + (w/2)*16, columns (w%2)*16), f32 in mma fragments, Kᵀ read k-major (ldmatrix .trans);
//      meanwhile the next chunk's W and U arrive by cp.async.
// Only the f32 summation order differs from gdn_hwalk_engine (tensor-core chains instead of fmaf
// chains; products of bf16 operands are exact either way): engine-profile noise, so its own cache
// tag. h_c (bf16, as fla stores h) is copied from S_op's tile with 16-byte stores.
// Shared memory: W f32 staging [64][132], U [64][32] f32, gam, then bf16 W [64][136], K [64][136],
// S_op [128][40], Vd [64][40]: 33,792 + 8,192 + 256 + 17,408 + 17,408 + 10,240 + 5,120 =
// 92,416 bytes (HWALK_TC_SMEM_BYTES in crates/engine/src/backend/cuda/gdn/split.rs): two blocks per SM.
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_hwalk_engine_tc(const bf16_t* __restrict__ k, long long ld_qk, const float* __restrict__ Wg,
                        const float* __restrict__ Ug, const float* __restrict__ Gg,
                        const long long* __restrict__ seq_rows, const long long* __restrict__ seq_chunk0,
                        float* __restrict__ Hg, float* __restrict__ Vg, const u64* __restrict__ states,
                        int hv_heads, int ratio) {
    dl_grid_begin();
    constexpr int DVS = 32;
    extern __shared__ __align__(16) unsigned char smem_tc[];
    float* Ws = (float*)smem_tc;                // [64][132] W of the next chunk, as cp.async lands it
    float* Us = Ws + GDN_C * GDN_LDW;           // [64][32]  U slice of the current chunk
    float* gam = Us + GDN_C * DVS;              // [64]
    bf16_t* Wb = (bf16_t*)(gam + GDN_C);        // [64][136] W of the current chunk
    bf16_t* Kb = Wb + GDN_C * GDN_LDB128;       // [64][136] normalised K of the current chunk
    bf16_t* Sb = Kb + GDN_C * GDN_LDB128;       // [128][40] S_op
    bf16_t* Vdb = Sb + GDN_DK * GDN_LDB32;      // [64][40]  e^(gam_C - gam) V'
    const int iv = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, hk = hv / ratio;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const long long seq0 = seq_rows[2 * n], seq1 = seq_rows[2 * n + 1];
    const long long HV = hv_heads, ch0 = seq_chunk0[n];
    const int col0 = iv * DVS;
    float* state = (float*)states[n] + (long long)hv * GDN_DK * GDN_DV + col0;
    // The state fragments: block b (0, 1) of this warp covers rows tm(b) .. +15, columns tn .. +15.
    const int tn = (warp & 1) * 16;
    auto tm = [&](int b) { return b * 64 + (warp >> 1) * 16; };
    float s[2][2][4];
    // Element (b, j, e) of the fragments sits at row tm(b) + g + 8*(e/2), column tn + 8j + 2*t4 + e%2
    // of the block's state slice (row stride GDN_DV).
    auto frag_at = [&](int b, int j, int e) {
        return (tm(b) + g + 8 * (e >> 1)) * GDN_DV + tn + 8 * j + 2 * t4 + (e & 1);
    };
#pragma unroll
    for (int f = 0; f < 16; ++f) s[f >> 3][(f >> 2) & 1][f & 3] = state[frag_at(f >> 3, (f >> 2) & 1, f & 3)];
    auto store_sop = [&]() {
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *(u32*)(Sb + (tm(b) + g + 8 * h) * GDN_LDB32 + tn + 8 * j + 2 * t4) =
                        pack_bf16x2(s[b][j][2 * h], s[b][j][2 * h + 1]);
    };
    store_sop();

    // The W tile (into its f32 staging), U slice and gam of the chunk at row0.
    auto load_w = [&](long long row0) {
        hwalk_load_chunk<DVS>(Ws, Us, gam, Wg, Ug, Gg, row0, seq1, HV, hv, col0);
    };
    // W as bf16 (its values are bf16 already: exact); rows past the chunk's end are never read
    // into a kept result (phase b masks them), but are zeroed so no NaN pattern enters an mma.
    auto convert_w = [&](long long row0) {
        const int nc = (int)min((long long)GDN_C, seq1 - row0);
        for (int i = tid; i < GDN_C * (GDN_DK / 4); i += GDN_THREADS) {
            const int r = i / (GDN_DK / 4), c = (i % (GDN_DK / 4)) * 4;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < nc) x = *(const float4*)(Ws + r * GDN_LDW + c);
            *(uint2*)(Wb + r * GDN_LDB128 + c) = make_uint2(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w));
        }
    };
    load_w(seq0);  // every sequence here has rows
    cp_async_wait_all();
    __syncthreads();
    convert_w(seq0);
    __syncthreads();

    for (long long row0 = seq0, ci = ch0; row0 < seq1; row0 += GDN_C, ++ci) {
        const int nc = (int)min((long long)GDN_C, seq1 - row0);
        // h_c: S_op's tile is exactly the bf16 state gdn_hwalk_engine stores.
        {
            const long long h0 = (ci * HV + hv) * GDN_DK * GDN_DV + col0;
            for (int i = tid; i < GDN_DK * (DVS / 8); i += GDN_THREADS) {
                const int r = i / (DVS / 8), c = (i % (DVS / 8)) * 8;
                *(uint4*)((bf16_t*)Hg + h0 + r * GDN_DV + c) = *(const uint4*)(Sb + r * GDN_LDB32 + c);
            }
        }
        // --- b. the chunk's k rows in flight (warp w: rows w, w+8, ...), then V' = U - W S_op.
        constexpr int PER = GDN_C / (GDN_THREADS / 32);
        uint2 kw[PER];
        fetch_head_rows(kw, k, ld_qk, hk, row0, nc);
        const float gC = gam[GDN_C - 1];
        mm_ldm<GDN_C, DVS, GDN_DK, false>(Wb, GDN_LDB128, Sb, GDN_LDB32, [&](int m, int c, float x) {
            float vd = 0.f;
            if (m < nc) {
                const long long vi = ((row0 + m) * HV + hv) * GDN_DV + col0 + c;
                const float vp = Us[m * DVS + c] - x;
                Vg[vi] = vp;
                vd = vp * expf(gC - gam[m]);
            }
            Vdb[m * GDN_LDB32 + c] = f2bf(vd);
        });
        // The k rows, L2-normalised and rounded as gdn_hwalk_engine does (rows past nc: zero).
        store_rows_bf16(Kb, GDN_LDB128, kw);
        __syncthreads();

        // --- c. the next chunk's W and U in flight; S <- e^gam_C S + Kᵀ Vd on the fragments.
        const long long next = row0 + GDN_C;
        if (next < seq1) load_w(next);
        {
            const float eC = expf(gC);
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
                mm_ldm_block<GDN_C, true, false>(Kb, GDN_LDB128, Vdb, GDN_LDB32, tm(b), tn, acc);
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[b][j][e] = s[b][j][e] * eC + acc[j][e];
            }
        }
        store_sop();  // Sb's readers (the h_c copy, phase b) are behind the barrier above
        cp_async_wait_all();
        __syncthreads();
        if (next < seq1) {
            convert_w(next);
            __syncthreads();
        }
    }
#pragma unroll
    for (int f = 0; f < 16; ++f) state[frag_at(f >> 3, (f >> 2) & 1, f & 3)] = s[f >> 3][(f >> 2) & 1][f & 3];
}

// ---------------------------------------------------------------------------------------------
// Recurrent gated delta rule: one block of 256 threads per (value head, sequence); the thread
// pair (2j, 2j+1) owns column j of the state, each thread 64 of its 128 rows in registers (one
// thread per column needs more than 255 registers), and the block walks the sequence's rows:
//   S <- e^g S; m = S^T k; S <- S + k (beta (v - m))^T; o = S^T q (q, k L2-normed, q scaled).
// All fp32 (HF's torch_recurrent_gated_delta_rule and fla's fused_recurrent agree on that), so
// one kernel serves both profiles. Decode is the case of one row per sequence.
// Sequence blockIdx.y covers rows seq_rows[2y] .. seq_rows[2y+1]; its state, fp32
// [Hv, 128, 128], is at states[y] and updated in place.
#define GDN_RHALF (GDN_DK / 2)
extern "C" __global__ void __launch_bounds__(256, 2) gdn_recurrent(
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v, long long ld_qk,
    long long ld_v, const float* __restrict__ g_in, const float* __restrict__ beta_in,
    const long long* __restrict__ seq_rows, bf16_t* __restrict__ out, const u64* __restrict__ states,
    int hv_heads, int ratio, float scale) {
    dl_grid_begin();
    __shared__ float qs[GDN_DK], ks[GDN_DK], red[8];
    const int hv = blockIdx.x, n = blockIdx.y, tid = threadIdx.x, hk = hv / ratio;
    const int j = tid >> 1, half = tid & 1, warp = tid >> 5, lane = tid & 31;
    const long long row0 = seq_rows[2 * n], row1 = seq_rows[2 * n + 1];
    // Warps 0-3 normalise q, warps 4-7 k (one value per thread).
    const int e = tid & (GDN_DK - 1);
    const bf16_t* src = tid < GDN_DK ? q : k;
    // A row's inputs (this thread's q or k value, g, beta, its v value) are requested one row
    // ahead: the first row's before the state, so that in a decode step (one row) their latency
    // overlaps the state's load instead of following it.
    float x = 0.f, g = 0.f, b = 0.f, vv = 0.f;
    auto fetch = [&](long long row) {
        x = bf2f(src[row * ld_qk + hk * GDN_DK + e]);
        g = g_in[row * hv_heads + hv];
        b = beta_in[row * hv_heads + hv];
        vv = bf2f(v[row * ld_v + hv * GDN_DV + j]);
    };
    if (row0 < row1) fetch(row0);
    float* state = (float*)states[n] + (long long)hv * GDN_DK * GDN_DV + half * GDN_RHALF * GDN_DV + j;
    float s[GDN_RHALF];
#pragma unroll
    for (int i = 0; i < GDN_RHALF; ++i) s[i] = state[i * GDN_DV];
    for (long long row = row0; row < row1; ++row) {
        const float xr = x, gr = g, br = b, vr = vv;
        if (row + 1 < row1) fetch(row + 1);
        const float ss = warp_sum(xr * xr);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        const int w0 = tid < GDN_DK ? 0 : 4;
        const float inv = 1.f / sqrtf(red[w0] + red[w0 + 1] + red[w0 + 2] + red[w0 + 3] + 1e-6f);
        if (tid < GDN_DK)
            qs[e] = xr * inv * scale;
        else
            ks[e] = xr * inv;
        __syncthreads();
        const float alpha = expf(gr), beta = br;
        const float* kh = ks + half * GDN_RHALF;
        const float* qh = qs + half * GDN_RHALF;
        float m = 0.f;
#pragma unroll
        for (int i = 0; i < GDN_RHALF; ++i) {
            s[i] *= alpha;
            m = fmaf(s[i], kh[i], m);
        }
        m += __shfl_xor_sync(0xffffffffu, m, 1);
        const float delta = (vr - m) * beta;
        float o = 0.f;
        // k is read from shared memory again (volatile) rather than kept in 64 registers since
        // the first loop: with it, the kernel needs 169 registers and one block per
        // multiprocessor, and a decode step waited on each block's state load in turn.
        const volatile float* kv = kh;
#pragma unroll
        for (int i = 0; i < GDN_RHALF; ++i) {
            s[i] = fmaf(kv[i], delta, s[i]);
            o = fmaf(s[i], qh[i], o);
        }
        o += __shfl_xor_sync(0xffffffffu, o, 1);
        if (half == 0) out[row * (long long)hv_heads * GDN_DV + hv * GDN_DV + j] = f2bf(o);
        __syncthreads();  // qs/ks and red are rewritten by the next row
    }
#pragma unroll
    for (int i = 0; i < GDN_RHALF; ++i) state[i * GDN_DV] = s[i];
}

// ---------------------------------------------------------------------------------------------
// Causal depthwise conv1d + SiLU over packed sequences: y[t, c] = silu(sum_j w[c, j] in[t-(kc-1)+j, c])
// with fp32 accumulation and one rounding, where `in` is sequence n's carried conv state (its
// previous kc-1 inputs, oldest first: bf16 [kc-1, ch] at states[n]) followed by its rows.
// x: [T, ld_x] (the first `ch` columns are the channels); w: bf16 [ch, kc]; y: bf16 [T, ch];
// row_seq: the sequence of each row; seq_rows: (start, end) row pairs per sequence.
extern "C" __global__ void gdn_conv_silu(const bf16_t* __restrict__ x, long long ld_x, const bf16_t* __restrict__ w,
                                         bf16_t* __restrict__ y, const int* __restrict__ row_seq,
                                         const long long* __restrict__ seq_rows, const u64* __restrict__ states,
                                         long long rows, int ch, int kc) {
    dl_grid_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    const int hist = kc - 1;
    for (long long t = blockIdx.y; t < rows; t += gridDim.y) {
        const int n = row_seq[t];
        const long long start = seq_rows[2 * n];
        const bf16_t* st = (const bf16_t*)states[n];
        float acc = 0.f;
        for (int j = 0; j < kc; ++j) {
            const long long src = t - hist + j;
            const float xv = src >= start ? bf2f(x[src * ld_x + c]) : bf2f(st[(hist - (start - src)) * ch + c]);
            acc = fmaf(bf2f(w[c * kc + j]), xv, acc);
        }
        y[t * ch + c] = f2bf(siluf_(acc));
    }
}

// gdn_conv_silu_v8: gdn_conv_silu with 8 channels per thread (16-byte loads and stores instead of
// 2-byte ones, the weights in registers): the same fmaf chain over the taps per channel and the
// same rounding, so the same bits (docs/gdn-cuda.md, "Round 2"). Needs ch and ld_x multiples of 8
// and kc <= 4 (the host checks; otherwise gdn_conv_silu runs).
#define GDN_CONV_V8_MAX_K 4
extern "C" __global__ void gdn_conv_silu_v8(const bf16_t* __restrict__ x, long long ld_x, const bf16_t* __restrict__ w,
                                            bf16_t* __restrict__ y, const int* __restrict__ row_seq,
                                            const long long* __restrict__ seq_rows, const u64* __restrict__ states,
                                            long long rows, int ch, int kc) {
    dl_grid_begin();
    const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (c0 >= ch) return;
    const int hist = kc - 1;
    float wv[8][GDN_CONV_V8_MAX_K];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < GDN_CONV_V8_MAX_K; ++j) wv[i][j] = j < kc ? bf2f(w[(c0 + i) * kc + j]) : 0.f;
    for (long long t = blockIdx.y; t < rows; t += gridDim.y) {
        const int n = row_seq[t];
        const long long start = seq_rows[2 * n];
        const bf16_t* st = (const bf16_t*)states[n];
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll
        for (int j = 0; j < GDN_CONV_V8_MAX_K; ++j) {
            if (j < kc) {
                const long long src = t - hist + j;
                const uint4 raw = src >= start ? *(const uint4*)(x + src * ld_x + c0)
                                               : *(const uint4*)(st + (hist - (start - src)) * ch + c0);
                float xv[8];
                unpack8(raw, xv);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[i] = fmaf(wv[i][j], xv[i], acc[i]);
            }
        }
        u32 o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            o[i] = (u32)f2bf(siluf_(acc[2 * i])) | ((u32)f2bf(siluf_(acc[2 * i + 1])) << 16);
        *(uint4*)(y + t * ch + c0) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

// gdn_conv_silu_rows4: gdn_conv_silu_v8's 8 channels per thread, for kc = 4 taps (every released
// checkpoint), over a run of GDN_CONV_ROWS consecutive rows per thread with the last 3 inputs kept
// in registers (a sliding window): every input row is read once instead of 4 times, and a block
// writes GDN_CONV_ROWS rows instead of one (the one-row kernels ran a [16 k, 10240] conv far from
// its memory floor: a million tiny blocks, each behind a chain of dependent index loads; timings
// in docs/gdn-cuda.md, "Round 3", and docs/benchmarks-cuda.md, "Session 9"). Per output: the same fmaf chain over the taps (oldest first, from zero)
// and the same rounding as gdn_conv_silu, so the same bits. Needs ch and ld_x multiples of 8 (the
// host checks). A sequence starting inside a run resets the window from that sequence's state.
#define GDN_CONV_ROWS 16
extern "C" __global__ void gdn_conv_silu_rows4(const bf16_t* __restrict__ x, long long ld_x,
                                               const bf16_t* __restrict__ w, bf16_t* __restrict__ y,
                                               const int* __restrict__ row_seq,
                                               const long long* __restrict__ seq_rows,
                                               const u64* __restrict__ states, long long rows, int ch) {
    dl_grid_begin();
    constexpr int KC = 4, HIST = KC - 1;
    const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (c0 >= ch) return;
    const long long t0 = (long long)blockIdx.y * GDN_CONV_ROWS;
    if (t0 >= rows) return;
    const long long t1 = t0 + GDN_CONV_ROWS < rows ? t0 + GDN_CONV_ROWS : rows;
    float wv[KC][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < KC; ++j) wv[j][i] = bf2f(w[(c0 + i) * KC + j]);
    // win[j] = in(t - HIST + j) for the row t about to be computed.
    float win[HIST][8];
    int n = row_seq[t0];
    {
        const long long start = seq_rows[2 * n];
        const bf16_t* st = (const bf16_t*)states[n];
#pragma unroll
        for (int j = 0; j < HIST; ++j) {
            const long long src = t0 - HIST + j;
            const uint4 raw = src >= start ? *(const uint4*)(x + src * ld_x + c0)
                                           : *(const uint4*)(st + (HIST - (start - src)) * ch + c0);
            unpack8(raw, win[j]);
        }
    }
    // Two rows in flight ahead of the one being computed (bandwidth needs loads in flight).
    uint4 next = *(const uint4*)(x + t0 * ld_x + c0), next2 = next;
    if (t0 + 1 < t1) next2 = *(const uint4*)(x + (t0 + 1) * ld_x + c0);
    for (long long t = t0; t < t1; ++t) {
        const uint4 raw = next;
        next = next2;
        if (t + 2 < t1) next2 = *(const uint4*)(x + (t + 2) * ld_x + c0);
        const int m = row_seq[t];
        if (m != n) {
            // Row t starts sequence m (sequences are contiguous): its window is its state.
            n = m;
            const bf16_t* st = (const bf16_t*)states[n];
#pragma unroll
            for (int j = 0; j < HIST; ++j) unpack8(*(const uint4*)(st + j * ch + c0), win[j]);
        }
        float cur[8];
        unpack8(raw, cur);
        u32 o[4];
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
            float acc0 = 0.f, acc1 = 0.f;
#pragma unroll
            for (int j = 0; j < HIST; ++j) {
                acc0 = fmaf(wv[j][i], win[j][i], acc0);
                acc1 = fmaf(wv[j][i + 1], win[j][i + 1], acc1);
            }
            acc0 = fmaf(wv[HIST][i], cur[i], acc0);
            acc1 = fmaf(wv[HIST][i + 1], cur[i + 1], acc1);
            o[i / 2] = (u32)f2bf(siluf_(acc0)) | ((u32)f2bf(siluf_(acc1)) << 16);
        }
        *(uint4*)(y + t * ch + c0) = make_uint4(o[0], o[1], o[2], o[3]);
        // Slide: the oldest input leaves, row t enters.
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
            for (int j = 0; j + 1 < HIST; ++j) win[j][i] = win[j + 1][i];
            win[HIST - 1][i] = cur[i];
        }
    }
}

// The conv states after gdn_conv_silu (same stream, so after it): per (sequence, channel) the last
// kc-1 entries of state ++ rows. Each thread reads its whole column before writing it, in place.
#define GDN_MAX_HIST 8
extern "C" __global__ void gdn_conv_state(const bf16_t* __restrict__ x, long long ld_x,
                                          const long long* __restrict__ seq_rows, const u64* __restrict__ states,
                                          int nseq, int ch, int kc) {
    dl_grid_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, n = blockIdx.y;
    if (c >= ch || n >= nseq) return;
    const int hist = kc - 1;
    const long long start = seq_rows[2 * n], end = seq_rows[2 * n + 1];
    bf16_t* st = (bf16_t*)states[n];
    bf16_t vals[GDN_MAX_HIST];
#pragma unroll
    for (int i = 0; i < GDN_MAX_HIST; ++i)
        if (i < hist) {
            const long long src = end - hist + i;  // absolute row of slot i
            vals[i] = src >= start ? x[src * ld_x + c] : st[(hist - (start - src)) * ch + c];
        }
#pragma unroll
    for (int i = 0; i < GDN_MAX_HIST; ++i)
        if (i < hist) st[i * ch + c] = vals[i];
}

// ---------------------------------------------------------------------------------------------
// Gates: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), fp32 outputs [T, Hv].
// a, b: bf16 rows (ld_a, ld_b). round_beta (Engine profile): beta rounded to bf16, as fla
// receives it (HF computes sigmoid on the bf16 b).
extern "C" __global__ void gdn_gates(const bf16_t* __restrict__ a, long long ld_a, const bf16_t* __restrict__ b,
                                     long long ld_b, const float* __restrict__ a_log,
                                     const float* __restrict__ dt_bias, float* __restrict__ g,
                                     float* __restrict__ beta, long long rows, int hv_heads, int round_beta) {
    dl_grid_begin();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * hv_heads) return;
    const long long t = i / hv_heads;
    const int h = (int)(i % hv_heads);
    const float bb = sigmoidf_(bf2f(b[t * ld_b + h]));
    beta[i] = round_beta ? rb(bb) : bb;
    g[i] = -expf(a_log[h]) * softplusf_(bf2f(a[t * ld_a + h]) + dt_bias[h]);
}

// ---------------------------------------------------------------------------------------------
// Gated RMSNorm (Qwen3_5RMSNormGated) per head of hd (multiple of 32, <= 256) columns:
//   y = w o (x rsqrt(mean(x^2) + eps)) o silu(z), fp32 throughout, one rounding (fla's fused
// kernel; HF's torch module rounds twice more, see docs/gdn-cuda.md). One warp per (row, head).
extern "C" __global__ void gdn_gated_rms_norm(const bf16_t* __restrict__ x, const bf16_t* __restrict__ z,
                                              const bf16_t* __restrict__ w, bf16_t* __restrict__ y, long long rows,
                                              int cols, int hd, float eps) {
    dl_grid_begin();
    const long long wid = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31, heads = cols / hd;
    if (wid >= rows * heads) return;  // warp-uniform
    const long long base = wid * hd;  // row r, head h start at r*cols + h*hd = wid*hd
    const int per = hd / 32;
    float f[8], ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (i < per) {
            f[i] = bf2f(x[base + lane + 32 * i]);
            ss += f[i] * f[i];
        }
    const float rs = 1.f / sqrtf(warp_sum(ss) / (float)hd + eps);
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (i < per) {
            const int c = lane + 32 * i;
            const float gate = siluf_(bf2f(z[base + c]));
            y[base + c] = f2bf(bf2f(w[c]) * (f[i] * rs) * gate);
        }
}

// ---------------------------------------------------------------------------------------------
// Zero-centred RMSNorm (Qwen3_5RMSNorm) over groups of `group` columns:
//   y = x rsqrt(mean(x^2) + eps) (1 + w), statistic and 1 + w in fp32, one rounding.
// One block of 256 threads per (row, group); any group size (groups of at most 256 columns go to
// gdn_rms_norm_zc_heads, the same sums per warp). The loops are unrolled so that a thread's loads
// are in flight together (a row of 5 120 columns is 20 values per thread); the order of each
// thread's sum is unchanged.
extern "C" __global__ void gdn_rms_norm_zc(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                           bf16_t* __restrict__ y, long long groups, int group, float eps) {
    dl_grid_begin();
    __shared__ float red[8];
    const long long base = (long long)blockIdx.x * group;
    float ss = 0.f;
#pragma unroll 4
    for (int c = threadIdx.x; c < group; c += blockDim.x) {
        const float v = bf2f(x[base + c]);
        ss += v * v;
    }
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += red[i];
    const float rs = 1.f / sqrtf(ss / (float)group + eps);
#pragma unroll 4
    for (int c = threadIdx.x; c < group; c += blockDim.x)
        y[base + c] = f2bf(bf2f(x[base + c]) * rs * (1.f + bf2f(w[c])));
}

// gdn_rms_norm_zc for groups of at most 256 columns (the gated attention's per-head q/k norms:
// 24 heads of 256 per row, hundreds of thousands of groups), one warp per group instead of a block
// of 256 threads holding one value each, bit for bit the same: lane l stands for the block's
// threads l, 32 + l, …, 224 + l (virtual warp k = the block's warp k), each holding the square of
// its one value (0 past the group), each virtual warp's butterfly is the block's warp_sum, and the
// eight warp sums are added in warp order from 0, as the block adds its shared red[0..7].
extern "C" __global__ void gdn_rms_norm_zc_heads(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                                 bf16_t* __restrict__ y, long long groups, int group, float eps) {
    dl_grid_begin();
    const long long gi = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (gi >= groups) return;  // warp-uniform
    const long long base = gi * group;
    float v[8], wf[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int c = 32 * k + lane;
        v[k] = c < group ? bf2f(x[base + c]) : 0.f;
        wf[k] = c < group ? bf2f(w[c]) : 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        float part = 0.f;
        part += v[k] * v[k];  // the block thread's sum of its one value
        ss += warp_sum(part);
    }
    const float rs = 1.f / sqrtf(ss / (float)group + eps);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int c = 32 * k + lane;
        if (c < group) y[base + c] = f2bf(v[k] * rs * (1.f + wf[k]));
    }
}

// ---------------------------------------------------------------------------------------------
// x <- x * sigmoid(gate) elementwise (the gated attention's output gate), fp32, one rounding.
__device__ __forceinline__ float gdn_sigmoid_gate_value(float x, float gate) { return x * sigmoidf_(gate); }
extern "C" __global__ void gdn_sigmoid_gate(bf16_t* x, const bf16_t* __restrict__ gate, long long n) {
    dl_grid_begin();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = f2bf(gdn_sigmoid_gate_value(bf2f(x[i]), bf2f(gate[i])));
}
// The same, 8 values per thread with 16-byte loads and stores (n a multiple of 8; the host checks).
extern "C" __global__ void gdn_sigmoid_gate_v8(bf16_t* x, const bf16_t* __restrict__ gate, long long n8) {
    dl_grid_begin();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    float xf[8], gf[8];
    unpack8(((const uint4*)x)[i], xf);
    unpack8(((const uint4*)gate)[i], gf);
#pragma unroll
    for (int j = 0; j < 8; ++j) xf[j] = gdn_sigmoid_gate_value(xf[j], gf[j]);
    ((uint4*)x)[i] = pack8(xf);
}
