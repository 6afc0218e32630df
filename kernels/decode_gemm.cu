// Batch-invariant skinny GEMM for decode steps: y[r, n] = Σ_k x[r, k] · W[n, k] for R ≤ 64 rows
// (bf16 x [R, K] and W [N, K] as stored, fp32 accumulation), output bf16 (optionally added to
// the bf16 values already in y: the residual add of matmul_acc) or fp32 (LM-head logits).
// The residual add rounds the product to bf16 first, bf16(y + bf16(sum)): exactly matmul followed
// by add_inplace, HF's two roundings, and what cuBLAS's beta = 1 epilogue was measured to give.
//
// Why a kernel of our own: cuBLAS picks algorithms by shape, so a row's bits depend on how many
// rows share the call. Here every output element is reduced in one fixed order that depends only
// on (N, K) and the launch's K split S, which the host derives from (N, K) alone, never from R:
//   1. K is cut into 32-wide chunks; split s of S owns chunks [s·per, min((s+1)·per, chunks)).
//   2. Within a split, one warp accumulates chunk after chunk in increasing order, two
//      m16n8k16 tensor-core steps per chunk, into fp32 registers.
//   3. With S > 1 each split writes its fp32 partial; the last block of the feature tile to
//      finish sums the partials in split order 0, 1, …, S-1 (whichever block that is).
//   4. Epilogue: bf16(sum), or bf16(y + bf16(sum)) for the residual add, or the fp32 sum.
// A tensor-core instruction's result for element (m, n) depends only on row m of A, column n of B
// and element (m, n) of C, so the rows sharing an n8 tile, and the zero padding of a partial
// tile, never change another row's bits. How many rows there are only selects how many n8 tiles
// each warp computes (template NT) and how many 16-feature tiles a warp owns (MT): neither
// changes any element's order of summation.
//
// Operand mapping. The weights are the M operand (16 features × 16 k per step, "row" layout)
// and the batch rows the N operand (16 k × 8 rows, "col" layout: each row's k contiguous, as x
// is stored). Because the sum over k is order-free in exact arithmetic, the physical k of a
// chunk may be assigned to the instruction's logical k slots in any fixed way, as long as A and
// B agree. Lane (g = lane/4, t = lane%4) loads 8 consecutive values (16 bytes) of W rows g and
// g+8 and of x row g at k = chunk·32 + 8t, and step s ∈ {0, 1} of the chunk uses physical
// k = 8t + 4s + {0,1} for the logical slots 2t + {0,1} and 8t + 4s + {2,3} for 2t + 8 + {0,1}.
// Every W and x load is one 16-byte vector, and each chunk reads 64 contiguous bytes per row.
//
// Block: 4 warps, each owning MT 16-feature tiles (a block covers 64·MT features) and all rows.
// Grid: (ceil(N / (64·MT)), S). `common.cuh` is prepended by the host.

#define DG_WARPS 4
// Chunks whose weight loads are in flight at once per warp: 8 with one feature tile per warp
// (2 × 8 × 16 B per lane), 4 with two (the same bytes, and registers for 8 row tiles).
#define DG_UNROLL (8 / MT)

// Not volatile: a pure function of its operands, so the compiler may hoist the next chunk's x
// loads above it (the order of the steps on one accumulator is fixed by the data dependency).
__device__ __forceinline__ void dg_mma(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weights are read once per launch: stream them past L1.
__device__ __forceinline__ uint4 dg_ld_stream(const bf16_t* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// Partial sums written by other blocks of this launch: read from L2 (L1 is not coherent).
__device__ __forceinline__ float4 dg_ld_l2(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// 8 values from k..k+8 of a row of K values, zeros past K (the tail chunk and K % 8 != 0).
__device__ __forceinline__ uint4 dg_ld_checked(const bf16_t* row, int k, int K) {
    if (((K & 7) == 0) && k + 8 <= K) return *(const uint4*)(row + k);
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 lo = (k + 2 * i < K) ? (u32)row[k + 2 * i] : 0u;
        u32 hi = (k + 2 * i + 1 < K) ? (u32)row[k + 2 * i + 1] : 0u;
        w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The two tensor-core steps of one chunk for MT feature tiles × NT row tiles. `wa`/`wb`: W rows
// g and g+8 of each feature tile; x rows are loaded here (they are L1/L2-resident: every block
// reads all of x for its K range). `kk` = this lane's first k (chunk·32 + 8t).
template <int NT, int MT>
__device__ __forceinline__ void dg_chunk(float (&acc)[MT][NT][4], const uint4 (&wa)[MT], const uint4 (&wb)[MT],
                                         const bf16_t* __restrict__ x, int R, int K, int kk, int g, bool full) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int r = 8 * j + g;
        uint4 xv = make_uint4(0u, 0u, 0u, 0u);
        if (r < R) xv = full ? *(const uint4*)(x + (long long)r * K + kk) : dg_ld_checked(x + (long long)r * K, kk, K);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            dg_mma(acc[mt][j], wa[mt].x, wb[mt].x, wa[mt].y, wb[mt].y, xv.x, xv.y);
            dg_mma(acc[mt][j], wa[mt].z, wb[mt].z, wa[mt].w, wb[mt].w, xv.z, xv.w);
        }
    }
}

// The K range of this block's split: chunks [c0, c1); chunks before full_end hold 32 values of K;
// vec: K % 8 == 0 (16-byte loads possible). A function of (K, S, s) only.
struct DgRange {
    int c0, c1, full_end;
    bool vec;
};
__device__ __forceinline__ DgRange dg_range(int K) {
    const int S = gridDim.y, s = blockIdx.y;
    const int chunks = (K + 31) >> 5;
    const int per = (chunks + S - 1) / S;
    DgRange r;
    r.c0 = min(s * per, chunks);
    r.c1 = min(r.c0 + per, chunks);
    r.full_end = min(r.c1, K >> 5);
    r.vec = (K & 7) == 0;
    return r;
}

// W rows of this lane: feature tile mt covers n0 + 16·mt .. +16; rows past N are clamped (their
// outputs are never written).
template <int MT>
__device__ __forceinline__ void dg_rows(const bf16_t* (&wra)[MT], const bf16_t* (&wrb)[MT], const bf16_t* w, int N,
                                        int K, long long n0, int g) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        long long na = min(n0 + mt * 16 + g, (long long)N - 1), nb = min(n0 + mt * 16 + g + 8, (long long)N - 1);
        wra[mt] = w + na * K;
        wrb[mt] = w + nb * K;
    }
}

template <int NT, int MT>
__device__ __forceinline__ void dg_zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;
}

// Chunks [c, c1) one at a time, in order, straight from global memory: bounds-checked past
// full_end or when K % 8 != 0 (both kernels' tail).
template <int NT, int MT>
__device__ __forceinline__ void dg_tail(float (&acc)[MT][NT][4], const bf16_t* const (&wra)[MT],
                                        const bf16_t* const (&wrb)[MT], const bf16_t* __restrict__ x, int R, int K,
                                        int g, int t, int c, const DgRange& rg) {
    for (; c < rg.c1; ++c) {
        const bool full = rg.vec && c < rg.full_end;
        const int kk = c * 32 + 8 * t;
        uint4 wa[MT], wb[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            if (full) {
                wa[mt] = dg_ld_stream(wra[mt] + kk);
                wb[mt] = dg_ld_stream(wrb[mt] + kk);
            } else {
                wa[mt] = dg_ld_checked(wra[mt], kk, K);
                wb[mt] = dg_ld_checked(wrb[mt], kk, K);
            }
        }
        dg_chunk<NT, MT>(acc, wa, wb, x, R, K, kk, g, full);
    }
}

// Split-K reduction (S > 1: write this block's partial; the last block of the feature tile to
// arrive sums all partials in split order) and the epilogue. Shared by both kernel variants, so
// that they differ only in how the operands reach the registers.
template <int NT, int MT>
__device__ __forceinline__ void dg_finish(float (&acc)[MT][NT][4], void* y, int R, int N, long long ldy, int mode,
                                          float* __restrict__ ws, u32* __restrict__ cnt, long long n0, int warp,
                                          int lane, int g, int t) {
    __shared__ int s_last;
    const int S = gridDim.y, s = blockIdx.y;
    if (S > 1) {
        // Partials of this block: one float4 per (warp, mt, j, lane), coalesced.
        const long long tile = (long long)DG_WARPS * MT * NT * 32 * 4;
        float* mine = ws + ((long long)blockIdx.x * S + s) * tile;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
                *(float4*)(mine + (((warp * MT + mt) * NT + j) * 32 + lane) * 4) =
                    make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) s_last = atomicAdd(cnt + blockIdx.x, 1u) == (u32)(S - 1);
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        // The last block sums every split's partial in split order (its own included). All loads
        // of one split are issued before the first is used: one L2 round trip per split.
        const float* all = ws + (long long)blockIdx.x * S * tile + (warp * MT * NT * 32 + lane) * 4;
        for (int q = 0; q < S; ++q) {
            float4 p[MT][NT];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < NT; ++j) p[mt][j] = dg_ld_l2(all + q * tile + (mt * NT + j) * 128);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    if (q == 0) {
                        acc[mt][j][0] = p[mt][j].x;
                        acc[mt][j][1] = p[mt][j].y;
                        acc[mt][j][2] = p[mt][j].z;
                        acc[mt][j][3] = p[mt][j].w;
                    } else {
                        acc[mt][j][0] += p[mt][j].x;
                        acc[mt][j][1] += p[mt][j].y;
                        acc[mt][j][2] += p[mt][j].z;
                        acc[mt][j][3] += p[mt][j].w;
                    }
                }
        }
        if (threadIdx.x == 0) cnt[blockIdx.x] = 0u;  // ready for the next launch
    }

    // Epilogue: acc[mt][j] = D rows (features) g, g+8 × columns (batch rows) 2t, 2t+1. For the
    // residual add every old value is loaded before the first store (stores to y could alias
    // later loads, which would otherwise wait for each other one by one).
    if (mode == 1) {
        bf16_t* yb = (bf16_t*)y;
        bf16_t old[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const long long n = n0 + mt * 16 + g + ((e & 2) ? 8 : 0);
                    const int r = 8 * j + 2 * t + (e & 1);
                    old[mt][j][e] = (n < N && r < R) ? yb[(long long)r * ldy + n] : (bf16_t)0;
                }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const long long n = n0 + mt * 16 + g + ((e & 2) ? 8 : 0);
                    const int r = 8 * j + 2 * t + (e & 1);
                    if (n < N && r < R) yb[(long long)r * ldy + n] = f2bf(bf2f(old[mt][j][e]) + rb(acc[mt][j][e]));
                }
        return;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const long long n = n0 + mt * 16 + g + ((e & 2) ? 8 : 0);
                const int r = 8 * j + 2 * t + (e & 1);
                if (n >= N || r >= R) continue;
                const long long i = (long long)r * ldy + n;
                const float v = acc[mt][j][e];
                if (mode == 2) {
                    ((float*)y)[i] = v;
                } else {
                    ((bf16_t*)y)[i] = f2bf(v);
                }
            }
}

// The register kernel's accumulation of one warp's MT feature tiles × NT row tiles over this
// block's K split (`dg_range`), rows past R zero: the whole of the kernel's arithmetic before the
// split-K reduction, shared with the grouped kernel of a mixture of experts (moe_gemm.cu).
template <int NT, int MT>
__device__ __forceinline__ void dg_accumulate(float (&acc)[MT][NT][4], const bf16_t* __restrict__ x,
                                              const bf16_t* __restrict__ w, int R, int N, int K, long long n0, int g,
                                              int t) {
    const DgRange rg = dg_range(K);
    const bf16_t* wra[MT];
    const bf16_t* wrb[MT];
    dg_rows<MT>(wra, wrb, w, N, K, n0, g);
    dg_zero<NT, MT>(acc);

    int c = rg.c0;
    if (rg.vec) {
        // Main loop: the W loads of DG_UNROLL chunks in flight before the first is used.
        for (; c + DG_UNROLL <= rg.full_end; c += DG_UNROLL) {
            uint4 wa[DG_UNROLL][MT], wb[DG_UNROLL][MT];
#pragma unroll
            for (int u = 0; u < DG_UNROLL; ++u)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    wa[u][mt] = dg_ld_stream(wra[mt] + (c + u) * 32 + 8 * t);
                    wb[u][mt] = dg_ld_stream(wrb[mt] + (c + u) * 32 + 8 * t);
                }
#pragma unroll
            for (int u = 0; u < DG_UNROLL; ++u)
                dg_chunk<NT, MT>(acc, wa[u], wb[u], x, R, K, (c + u) * 32 + 8 * t, g, true);
        }
    }
    // Remaining chunks one at a time (same order).
    dg_tail<NT, MT>(acc, wra, wrb, x, R, K, g, t, c, rg);
}

// mode 0: y bf16 = sum; 1: y bf16 = bf16(y + bf16(sum)) (residual add); 2: y fp32 = sum.
// ws: fp32 partials (S > 1), cnt: one zeroed counter per feature block (S > 1).
template <int NT, int MT>
__device__ void decode_gemm(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, void* y, int R, int N,
                            int K, long long ldy, int mode, float* __restrict__ ws, u32* __restrict__ cnt) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const long long n0 = ((long long)blockIdx.x * DG_WARPS + warp) * MT * 16;
    float acc[MT][NT][4];
    dg_accumulate<NT, MT>(acc, x, w, R, N, K, n0, g, t);
    dg_finish<NT, MT>(acc, y, R, N, ldy, mode, ws, cnt, n0, warp, lane, g, t);
}

// ---------------------------------------------------------------------------------------------
// The pipelined variant (`decode_gemm_pipe_*`). Same operands in the same registers, the same
// tensor-core steps in the same order, the same split and epilogue: its output is bit-identical
// to decode_gemm's for every shape and row count (cuda_decode tests it). What differs is how the
// operands arrive. decode_gemm loads DG_UNROLL chunks of weights into registers, then computes
// them, so each warp alternates between waiting for memory and computing, and every warp loads
// all rows of x itself (4× the x traffic of the block, from L1/L2). Here the block's 128 threads
// copy each 32-wide chunk of its weight tile (64·MT features × 64 bytes) and of x (8·NT rows ×
// 64 bytes, rows past R zero-filled) into shared memory with cp.async, STAGES − 1 chunks ahead of
// the one being computed, so weight loads stay in flight while the tensor cores work, and x is
// read from global memory once per block.
//
// Shared layout of a stage: W [64·MT rows][32 k] then x [8·NT rows][32 k], 64 bytes per row, no
// padding: a 16-byte load of lane (g, t) reads row g (or g + 8, or 8j + g) at byte 16t, so the
// eight lanes of each quarter-warp read two whole consecutive rows, 128 contiguous bytes: no bank
// conflicts.


__device__ __forceinline__ uint4 dg_lds(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

template <int NT, int MT>
struct DgStage {
    static constexpr int W_BYTES = DG_WARPS * MT * 16 * 64;
    static constexpr int X_BYTES = NT * 8 * 64;
    static constexpr int BYTES = W_BYTES + X_BYTES;
};

// Copies chunk c of the block's weight rows (clamped to N − 1 like decode_gemm) and of x into
// the stage at shared address `st`.
template <int NT, int MT>
__device__ __forceinline__ void dg_load_stage(u32 st, const bf16_t* __restrict__ w, const bf16_t* __restrict__ x,
                                              long long nblk, int N, int R, int K, int c) {
    constexpr int W_PIECES = DG_WARPS * MT * 16 * 4;  // 16-byte pieces of the weight tile
#pragma unroll
    for (int i = 0; i < W_PIECES / (DG_WARPS * 32); ++i) {
        const int p = threadIdx.x + i * DG_WARPS * 32;
        const int row = p >> 2, q = p & 3;
        const long long n = min(nblk + row, (long long)N - 1);
        cp_async16_s(st + p * 16, w + n * K + c * 32 + q * 8, true);
    }
    constexpr int X_PIECES = NT * 8 * 4;  // up to 256: two per thread at 64 rows
#pragma unroll
    for (int p = threadIdx.x; p < X_PIECES; p += DG_WARPS * 32) {
        const int row = p >> 2, q = p & 3;
        const bool ok = row < R;
        cp_async16_s(st + DgStage<NT, MT>::W_BYTES + p * 16,
                      ok ? (const void*)(x + (long long)row * K + c * 32 + q * 8) : (const void*)x, ok);
    }
}

template <int NT, int MT, int STAGES>
__device__ void decode_gemm_pipe(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, void* y, int R, int N,
                                 int K, long long ldy, int mode, float* __restrict__ ws, u32* __restrict__ cnt) {
    extern __shared__ __align__(128) unsigned char dg_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const DgRange rg = dg_range(K);
    const int c0 = rg.c0;
    const long long nblk = (long long)blockIdx.x * DG_WARPS * MT * 16;
    const long long n0 = nblk + (long long)warp * MT * 16;
    float acc[MT][NT][4];
    dg_zero<NT, MT>(acc);

    // Chunks [c0, pe) go through shared memory; [pe, c1) (the tail, or all of them when K % 8 != 0)
    // through decode_gemm's bounds-checked path, in the same increasing order.
    const int pe = rg.vec ? max(rg.full_end, c0) : c0;
    const int np = pe - c0;
    const u32 base = smem_u32(dg_smem);
    constexpr int SB = DgStage<NT, MT>::BYTES;
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < np) dg_load_stage<NT, MT>(base + i * SB, w, x, nblk, N, R, K, c0 + i);
        cp_async_commit();
    }
    // This lane's byte offsets inside a stage.
    const u32 wa_off = (u32)((warp * MT * 16 + g) * 64 + t * 16);
    const u32 x_off = (u32)(DgStage<NT, MT>::W_BYTES + g * 64 + t * 16);
    for (int i = 0; i < np; ++i) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of chunk i have landed
        __syncthreads();           // everyone's have; and everyone is done with chunk i − 1's stage
        const int nx = i + STAGES - 1;
        if (nx < np) dg_load_stage<NT, MT>(base + (nx % STAGES) * SB, w, x, nblk, N, R, K, c0 + nx);
        cp_async_commit();
        const u32 st = base + (i % STAGES) * SB;
        uint4 wa[MT], wb[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            wa[mt] = dg_lds(st + wa_off + mt * 16 * 64);
            wb[mt] = dg_lds(st + wa_off + mt * 16 * 64 + 8 * 64);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const uint4 xv = dg_lds(st + x_off + j * 8 * 64);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                dg_mma(acc[mt][j], wa[mt].x, wb[mt].x, wa[mt].y, wb[mt].y, xv.x, xv.y);
                dg_mma(acc[mt][j], wa[mt].z, wb[mt].z, wa[mt].w, wb[mt].w, xv.z, xv.w);
            }
        }
    }
    cp_async_wait<0>();

    if (pe < rg.c1) {
        const bf16_t* wra[MT];
        const bf16_t* wrb[MT];
        dg_rows<MT>(wra, wrb, w, N, K, n0, g);
        dg_tail<NT, MT>(acc, wra, wrb, x, R, K, g, t, pe, rg);
    }
    dg_finish<NT, MT>(acc, y, R, N, ldy, mode, ws, cnt, n0, warp, lane, g, t);
}

#define DG_ENTRY(NT, MT, MINB)                                                                                     \
    extern "C" __global__ void __launch_bounds__(DG_WARPS * 32, MINB)                                             \
        decode_gemm_n##NT##_m##MT(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, void* y, int R, \
                                  int N, int K, long long ldy, int mode, float* ws, u32* cnt) { dl_grid_begin(); \
        decode_gemm<NT, MT>(x, w, y, R, N, K, ldy, mode, ws, cnt);                                             \
    }

// Up to 16 rows one feature tile per warp, above that two (decode.rs picks). The launch bound
// asks for 3 blocks (12 warps) per multiprocessor where that costs no register spills, else 2
// (7 and 8 row tiles, and the one-tile variants with 8 chunks of loads in flight); ptxas reports
// no spills for any instance (sm_90, CUDA 13.0).
DG_ENTRY(1, 1, 2)
DG_ENTRY(2, 1, 2)
DG_ENTRY(3, 2, 3)
DG_ENTRY(4, 2, 3)
DG_ENTRY(5, 2, 3)
DG_ENTRY(6, 2, 3)
DG_ENTRY(7, 2, 2)
DG_ENTRY(8, 2, 2)

// Pipelined instances: the same (NT, MT) pairs. Stages: 8 with one feature tile per warp (a
// stage is 4 KiB of weights + ≤ 1 KiB of x), 4 with two (8 KiB + ≤ 4 KiB). The launch bound asks
// for 4 blocks per multiprocessor (≤ 128 registers) where that costs no spills, else 3 (4 and 5
// row tiles) or 2 (6 to 8: the residual epilogue holds every accumulator and old value at once);
// shared memory is at most 4 × 48 KiB. At MT = 2 that keeps 2–3 blocks × 3 stages × 8 KiB of
// weights in flight per multiprocessor, above the ~33 KiB that 4.3 TB/s × ~1 µs of latency needs.
#define DG_PIPE_ENTRY(NT, MT, STAGES, MINB)                                                                         \
    extern "C" __global__ void __launch_bounds__(DG_WARPS * 32, MINB)                                              \
        decode_gemm_pipe_n##NT##_m##MT(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, void* y, int R, \
                                       int N, int K, long long ldy, int mode, float* ws, u32* cnt) { dl_grid_begin(); \
        decode_gemm_pipe<NT, MT, STAGES>(x, w, y, R, N, K, ldy, mode, ws, cnt);                                     \
    }
DG_PIPE_ENTRY(1, 1, 8, 4)
DG_PIPE_ENTRY(2, 1, 8, 4)
DG_PIPE_ENTRY(3, 2, 4, 4)
DG_PIPE_ENTRY(4, 2, 4, 3)
DG_PIPE_ENTRY(5, 2, 4, 3)
DG_PIPE_ENTRY(6, 2, 4, 2)
DG_PIPE_ENTRY(7, 2, 4, 2)
DG_PIPE_ENTRY(8, 2, 4, 2)
