// Kernels of the fused CUDA forward (crates/engine/src/backend/cuda/bench.rs `Decoder::forward_fused`),
// compiled as part of the `elementwise` module (crates/engine/src/backend/cuda/kernels.rs). Each computes
// exactly what its counterpart in elementwise.cu computes, bit for bit, with fewer instructions or
// more loads in flight.

// ---------------------------------------------------------------------------------------------
// SwiGLU on a fused gate|up GEMM output gu [rows, 2·inter]: out[r, c] = bf16(bf16(silu(gu[r, c])) ·
// gu[r, inter + c]) with silu in fp32 as x / (1 + exp(-x)) — exactly swiglu_packed_bf16's (and
// swiglu_bf16's) arithmetic. A 2-D grid (y = row, x = 8-column chunks) replaces that kernel's
// 64-bit division per thread, which costs about as many instructions as the arithmetic itself on
// this memory-bound pass (1.2 GB per Qwen3-8B layer at 16k tokens).
// Rows are walked grid-stride, SWIGLU_ROWS at a time with all their loads issued first: one row per
// thread and 16 384 rows made ~98 000 blocks of one 16-byte chunk each, whose launches and single
// round trips held a Qwen3-8B layer's pass back (docs/benchmarks-cuda.md, "Session 16").
#define SWIGLU_ROWS 4
extern "C" __global__ void swiglu_packed_rows_bf16(const bf16_t* __restrict__ gu, bf16_t* __restrict__ out,
                                                   long long rows, int inter) {
    dl_grid_begin();
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (c >= inter) return;
    if ((inter & 7) == 0) {
        const long long step = gridDim.y;
        for (long long r0 = blockIdx.y; r0 < rows; r0 += step * SWIGLU_ROWS) {
            uint4 gv[SWIGLU_ROWS], uv[SWIGLU_ROWS];
#pragma unroll
            for (int k = 0; k < SWIGLU_ROWS; ++k) {
                const long long r = r0 + k * step;
                if (r < rows) {
                    const bf16_t* g = gu + r * 2 * inter + c;
                    gv[k] = *(const uint4*)g;
                    uv[k] = *(const uint4*)(g + inter);
                }
            }
#pragma unroll
            for (int k = 0; k < SWIGLU_ROWS; ++k) {
                const long long r = r0 + k * step;
                if (r < rows) {
                    float gf[8], uf[8];
                    unpack8(gv[k], gf);
                    unpack8(uv[k], uf);
#pragma unroll
                    for (int j = 0; j < 8; ++j) gf[j] = rb(gf[j] / (1.f + expf(-gf[j]))) * uf[j];
                    *(uint4*)(out + r * inter + c) = pack8(gf);
                }
            }
        }
        return;
    }
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const bf16_t* g = gu + r * 2 * inter + c;
        bf16_t* o = out + r * inter + c;
        for (int j = 0; j < 8 && c + j < inter; ++j) {
            float gv = bf2f(g[j]);
            o[j] = f2bf(rb(gv / (1.f + expf(-gv))) * bf2f(g[inter + j]));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Row RMSNorm for rows of `cols` elements, a multiple of 8 up to 256·MAXC: rms_norm_bf16's arithmetic
// in rms_norm_bf16's order (lane l sums its 16-byte chunks l, l + 32, … in turn, then the warp
// butterfly), but every chunk of the row is loaded before the first is summed, and the
// normalisation reuses the loaded values instead of reading the row again: one pass over x with
// all of a warp's loads in flight, where rms_norm_bf16's loop waits on one load at a time.
// MAXC, the most chunks a lane holds, sizes the registers (and the many-rows kernel's shared
// weights): 16 (rows up to 4096: Qwen3-8B and smaller, gpt-oss) or 32 (up to 8192: dense Qwen3-14B and
// 32B's 5120, a 70B's 8192), two instances so that the narrow rows keep their occupancy.
#define RMS_W_GROUP 4

// How many of a row's 16-byte chunks lane `lane` holds (chunks lane, lane + 32, … below cols / 8):
// cols / 256 each when cols is a multiple of 256; otherwise the first lanes hold one more, the
// partial last round of rms_norm_bf16's loop (gpt-oss's 2880 columns: 12 for lanes 0–7, 11 after).
__device__ __forceinline__ int rms_lane_chunks(int cols, int lane) {
    const int chunks = cols >> 3;
    return lane < chunks ? (chunks - lane + 31) >> 5 : 0;
}

// A lane's k 16-byte chunks of a row (chunks lane, lane + 32, …), every load issued at once.
template <int MAXC>
__device__ __forceinline__ void rms_load_row(const bf16_t* xs, int lane, int k, uint4* v) {
#pragma unroll
    for (int c = 0; c < MAXC; ++c)
        if (c < k) v[c] = *(const uint4*)(xs + lane * 8 + c * 256);
}

// rsqrt(mean(x²) + eps) of the row whose chunks the warp's lanes hold: each lane sums its chunks
// in order, then the warp butterfly (rms_norm_bf16's order).
template <int MAXC>
__device__ __forceinline__ float rms_row_scale(const uint4* v, int k, int cols, float eps) {
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < MAXC; ++c) {
        if (c < k) {
            float f[8];
            unpack8(v[c], f);
#pragma unroll
            for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
        }
    }
    ss = warp_sum(ss);
    return rsqrtf(ss / (float)cols + eps);
}
template <int MAXC>
__device__ void rms_norm_rows(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ y,
                              long long rows, int cols, float eps) {
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;  // warp-uniform
    const int k = rms_lane_chunks(cols, lane);
    const bf16_t* xs = x + row * cols;
    bf16_t* ys = y + row * cols;
    uint4 v[MAXC];
    rms_load_row<MAXC>(xs, lane, k, v);
    // The weights are not needed before the sum of squares, but their fetch from memory starts
    // now (into L2, no registers held), so the loads below wait on L2 instead of on DRAM.
#pragma unroll
    for (int c = 0; c < MAXC; ++c)
        if (c < k) asm volatile("prefetch.global.L2 [%0];" ::"l"(w + lane * 8 + c * 256));
    const float r = rms_row_scale<MAXC>(v, k, cols, eps);
    // The weights are loaded RMS_W_GROUP chunks at a time, all before the group's first store:
    // loaded next to each use, every chunk waited on its own load (docs/benchmarks-cuda.md,
    // "Session 11", item 4).
#pragma unroll
    for (int c0 = 0; c0 < MAXC; c0 += RMS_W_GROUP) {
        uint4 wv[RMS_W_GROUP];
#pragma unroll
        for (int u = 0; u < RMS_W_GROUP; ++u)
            if (c0 + u < k) wv[u] = *(const uint4*)(w + lane * 8 + (c0 + u) * 256);
#pragma unroll
        for (int u = 0; u < RMS_W_GROUP; ++u) {
            const int c = c0 + u;
            if (c < k) {
                const int i = lane * 8 + c * 256;
                float f[8], wf[8];
                unpack8(v[c], f);
                unpack8(wv[u], wf);
#pragma unroll
                for (int j = 0; j < 8; ++j) f[j] = rb(f[j] * r) * wf[j];
                *(uint4*)(ys + i) = pack8(f);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// rms_norm_rows_bf16 for many rows (a packed prefill's 16 384): the same arithmetic in the same
// order, bit for bit, but the block stages the weights in shared memory once and its warps walk
// rows grid-stride. One row per block-warp as above read the row's weights again from L2 for
// every row — as many bytes as the row itself (docs/benchmarks-cuda.md, "Session 16").
template <int MAXC>
__device__ void rms_norm_many_rows(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                   bf16_t* __restrict__ y, long long rows, int cols, float eps) {
    __shared__ __align__(16) bf16_t ws[256 * MAXC];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k = rms_lane_chunks(cols, lane);
    for (int i = threadIdx.x; i < (cols >> 3); i += blockDim.x) *(uint4*)(ws + i * 8) = *(const uint4*)(w + i * 8);
    __syncthreads();
    for (long long row = (long long)blockIdx.x * 8 + warp; row < rows; row += (long long)gridDim.x * 8) {
        const bf16_t* xs = x + row * cols;
        bf16_t* ys = y + row * cols;
        uint4 v[MAXC];
        rms_load_row<MAXC>(xs, lane, k, v);
        const float r = rms_row_scale<MAXC>(v, k, cols, eps);
#pragma unroll
        for (int c = 0; c < MAXC; ++c) {
            if (c < k) {
                const int i = lane * 8 + c * 256;
                float f[8], wf[8];
                unpack8(v[c], f);
                unpack8(*(const uint4*)(ws + i), wf);
#pragma unroll
                for (int j = 0; j < 8; ++j) f[j] = rb(f[j] * r) * wf[j];
                *(uint4*)(ys + i) = pack8(f);
            }
        }
    }
}

// The entries: one warp per row, 8 rows a block (rows_*), and the many-rows kernel (many_rows_*),
// each for rows up to 4096 values and (wide) up to 8192.
#define RMS_ROWS_ENTRY(NAME, MAXC)                                                                            \
    extern "C" __global__ void NAME(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,               \
                                    bf16_t* __restrict__ y, long long rows, int cols, float eps) { dl_grid_begin(); \
        rms_norm_rows<MAXC>(x, w, y, rows, cols, eps);                                                        \
    }
#define RMS_MANY_ROWS_ENTRY(NAME, MAXC)                                                                       \
    extern "C" __global__ void __launch_bounds__(256) NAME(const bf16_t* __restrict__ x,                     \
                                                           const bf16_t* __restrict__ w, bf16_t* __restrict__ y, \
                                                           long long rows, int cols, float eps) { dl_grid_begin(); \
        rms_norm_many_rows<MAXC>(x, w, y, rows, cols, eps);                                                   \
    }
RMS_ROWS_ENTRY(rms_norm_rows_bf16, 16)
RMS_ROWS_ENTRY(rms_norm_rows_wide_bf16, 32)
RMS_MANY_ROWS_ENTRY(rms_norm_many_rows_bf16, 16)
RMS_MANY_ROWS_ENTRY(rms_norm_many_rows_wide_bf16, 32)
