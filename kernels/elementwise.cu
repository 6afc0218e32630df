// Row-wise and elementwise kernels of the CUDA backend. Storage is bf16, arithmetic fp32, and each
// kernel rounds to bf16 exactly where Hugging Face's bf16 PyTorch graph rounds (docs/models.md §1.3), so
// the hidden states match what drafters trained on HF/SGLang targets saw. `common.cuh` is
// prepended by the host.

// ---------------------------------------------------------------------------------------------
// RMSNorm over groups of `group` columns (group = cols for a layer norm, = head_dim for q/k norm).
// One warp per group. HF order: fp32 mean of squares, y = bf16(x * rsqrt(ms + eps)), out = bf16(y * w).
extern "C" __global__ void rms_norm_bf16(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                         bf16_t* __restrict__ y, long long n_groups, int group, float eps) {
    dl_grid_begin();
    long long g = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (g >= n_groups) return;
    const bf16_t* xs = x + g * group;
    bf16_t* ys = y + g * group;
    float ss = 0.f;
    bool vec = (group & 7) == 0;
    if (vec) {
        for (int i = lane * 8; i < group; i += 256) {
            float f[8];
            unpack8(*(const uint4*)(xs + i), f);
#pragma unroll
            for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
        }
    } else {
        for (int i = lane; i < group; i += 32) {
            float f = bf2f(xs[i]);
            ss += f * f;
        }
    }
    ss = warp_sum(ss);
    float r = rsqrtf(ss / (float)group + eps);
    if (vec) {
        for (int i = lane * 8; i < group; i += 256) {
            float f[8], wf[8];
            unpack8(*(const uint4*)(xs + i), f);
            unpack8(*(const uint4*)(w + i), wf);
#pragma unroll
            for (int j = 0; j < 8; ++j) f[j] = rb(f[j] * r) * wf[j];
            *(uint4*)(ys + i) = pack8(f);
        }
    } else {
        for (int i = lane; i < group; i += 32) ys[i] = f2bf(rb(bf2f(xs[i]) * r) * bf2f(w[i]));
    }
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding in place. One thread per (row, head, pair). Angle in fp32 (position * inv_freq,
// inv_freq precomputed on the host exactly as HF does), cos/sin in fp32 with full range reduction,
// then cast to bf16 as HF's rotary module does; x*cos and rotate(x)*sin and their sum are each
// rounded to bf16 (HF evaluates `q*cos + rotate_half(q)*sin` with bf16 tensors).
// interleaved = 0: pairs (i, i + rotary_dim/2) (HF/NeoX); 1: pairs (2i, 2i+1) (GPT-J/llama.cpp).
// `scale` multiplies cos and sin in fp32 before they are cast (gpt-oss's YaRN attention_scaling,
// `GptOssRotaryEmbedding`: `cos = emb.cos() * attention_scaling`); plain RoPE passes 1, which
// multiplies exactly. Rows are `ld` values apart and the first n_heads heads of each are rotated:
// ld = n_heads · head_dim for a q or k tensor; a fused QKV row's q and k heads in one launch, v's
// columns after them untouched.
extern "C" __global__ void rope_bf16(bf16_t* __restrict__ x, const u32* __restrict__ pos,
                                     const float* __restrict__ inv_freq, int rows, int n_heads, int head_dim,
                                     int rotary_dim, int interleaved, float scale, long long ld) {
    dl_grid_begin();
    int half = rotary_dim >> 1;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)rows * n_heads * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    long long t = idx / half;
    int head = (int)(t % n_heads);
    long long row = t / n_heads;
    float angle = (float)pos[row] * inv_freq[i];
    float c = rb(__fmul_rn(cosf(angle), scale));
    float s = rb(__fmul_rn(sinf(angle), scale));
    bf16_t* hx = x + row * ld + (long long)head * head_dim;
    int ia = interleaved ? 2 * i : i;
    int ib = interleaved ? 2 * i + 1 : i + half;
    float a = bf2f(hx[ia]);
    float b = bf2f(hx[ib]);
    hx[ia] = f2bf(rope_pair_a(a, b, c, s));
    hx[ib] = f2bf(rope_pair_b(a, b, c, s));
}

// ---------------------------------------------------------------------------------------------
// out = bf16(bf16(silu(gate)) * up); silu in fp32 as x / (1 + exp(-x)) (PyTorch's CUDA formula).
extern "C" __global__ void swiglu_bf16(const bf16_t* __restrict__ gate, const bf16_t* __restrict__ up,
                                       bf16_t* __restrict__ out, long long n) {
    dl_grid_begin();
    long long i8 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i8 + 8 <= n) {
        float g[8], u[8];
        unpack8(*(const uint4*)(gate + i8), g);
        unpack8(*(const uint4*)(up + i8), u);
#pragma unroll
        for (int j = 0; j < 8; ++j) g[j] = rb(g[j] / (1.f + expf(-g[j]))) * u[j];
        *(uint4*)(out + i8) = pack8(g);
    } else {
        for (long long i = i8; i < n; ++i) {
            float g = bf2f(gate[i]);
            out[i] = f2bf(rb(g / (1.f + expf(-g))) * bf2f(up[i]));
        }
    }
}

// SwiGLU on a fused gate|up GEMM output gu [rows, 2·inter]: out[r, c] = bf16(bf16(silu(gu[r, c])) ·
// gu[r, inter + c]), the same arithmetic as swiglu_bf16.
extern "C" __global__ void swiglu_packed_bf16(const bf16_t* __restrict__ gu, bf16_t* __restrict__ out,
                                              long long rows, int inter) {
    dl_grid_begin();
    long long i8 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i8 >= rows * inter) return;
    long long r = i8 / inter;
    int c = (int)(i8 % inter);
    const bf16_t* g = gu + r * 2 * inter + c;
    if ((inter & 7) == 0) {
        float gf[8], uf[8];
        unpack8(*(const uint4*)g, gf);
        unpack8(*(const uint4*)(g + inter), uf);
#pragma unroll
        for (int j = 0; j < 8; ++j) gf[j] = rb(gf[j] / (1.f + expf(-gf[j]))) * uf[j];
        *(uint4*)(out + i8) = pack8(gf);
    } else {
        for (long long i = i8; i < i8 + 8 && i < rows * inter; ++i) {
            long long rr = i / inter;
            int cc = (int)(i % inter);
            float gv = bf2f(gu[rr * 2 * inter + cc]);
            out[i] = f2bf(rb(gv / (1.f + expf(-gv))) * bf2f(gu[rr * 2 * inter + inter + cc]));
        }
    }
}

// gpt-oss's clamped SwiGLU (`GptOssExperts._apply_gate`; host reference `clamped_swiglu` in
// crates/engine/src/backend/gpt_oss.rs) of one gate and up value, in fp32 in the host's order:
// g = min(gate, limit), u = clamp(up, -limit, limit) (a NaN stays NaN, as in torch.clamp),
// glu = g * (1 / (1 + exp(-(g * alpha)))), out = (u + 1) * glu. Every step rounded as written
// (no FMA contraction); `expf` may differ from the host's exp in the last bit.
__device__ __forceinline__ float clamped_swiglu_f32(float g, float u, float alpha, float limit) {
    g = g > limit ? limit : g;
    u = u > limit ? limit : (u < -limit ? -limit : u);
    const float glu = __fmul_rn(g, __fdiv_rn(1.f, __fadd_rn(1.f, expf(-__fmul_rn(g, alpha)))));
    return __fmul_rn(__fadd_rn(u, 1.f), glu);
}

// The clamped SwiGLU of a fused gate|up output gu [rows, 2·inter] (gate columns first): out[r, c] =
// bf16(clamped_swiglu_f32(gu[r, c], gu[r, inter + c])), one rounding at the end (the host reference
// on bf16 inputs, its result uploaded). One thread per output value.
extern "C" __global__ void clamped_swiglu_packed_bf16(const bf16_t* __restrict__ gu, bf16_t* __restrict__ out,
                                                      long long rows, int inter, float alpha, float limit) {
    dl_grid_begin();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * inter) return;
    const long long r = i / inter;
    const int c = (int)(i % inter);
    const bf16_t* row = gu + r * 2 * inter;
    out[i] = f2bf(clamped_swiglu_f32(bf2f(row[c]), bf2f(row[inter + c]), alpha, limit));
}

// x += y, one bf16 rounding of the fp32 sum (a bf16 PyTorch add).
extern "C" __global__ void add_bf16(bf16_t* __restrict__ x, const bf16_t* __restrict__ y, long long n) {
    dl_grid_begin();
    long long i8 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i8 + 8 <= n) {
        float a[8], b[8];
        unpack8(*(const uint4*)(x + i8), a);
        unpack8(*(const uint4*)(y + i8), b);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] += b[j];
        *(uint4*)(x + i8) = pack8(a);
    } else {
        for (long long i = i8; i < n; ++i) x[i] = f2bf(bf2f(x[i]) + bf2f(y[i]));
    }
}

// x[r, c] += bias[c].
extern "C" __global__ void add_row_bias_bf16(bf16_t* __restrict__ x, const bf16_t* __restrict__ bias,
                                             long long rows, int cols) {
    dl_grid_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    x[i] = f2bf(bf2f(x[i]) + bf2f(bias[i % cols]));
}

// ---------------------------------------------------------------------------------------------
// dst[r, dst_col0 + c] = src[idx[r], src_col0 + c] for c < cols (idx == null: identity). Covers
// embedding gather, gather_rows, the pieces of concat_cols and column splits of fused GEMM outputs.
// One block of threads per destination row. 16-byte copies when every offset is a multiple of 8
// elements, else 2-byte copies.
extern "C" __global__ void copy_rows_bf16(bf16_t* __restrict__ dst, long long dst_ld, long long dst_col0,
                                          const bf16_t* __restrict__ src, long long src_ld, long long src_col0,
                                          const u32* __restrict__ idx, long long rows, int cols) {
    dl_grid_begin();
    long long r = blockIdx.x;
    if (r >= rows) return;
    long long sr = idx ? (long long)idx[r] : r;
    const bf16_t* s = src + sr * src_ld + src_col0;
    bf16_t* d = dst + r * dst_ld + dst_col0;
    bool vec = ((cols | src_ld | dst_ld | dst_col0 | src_col0) & 7) == 0;
    if (vec) {
        for (int c = threadIdx.x * 8; c < cols; c += blockDim.x * 8) *(uint4*)(d + c) = *(const uint4*)(s + c);
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
    }
}

// ---------------------------------------------------------------------------------------------
// Random bf16 values, uniform in [-a, a) with a = std * sqrt(3) (variance std²) plus `mean`,
// from a counter-based hash: the same (seed, index) always gives the same value, on any launch shape.
extern "C" __global__ void fill_random_bf16(bf16_t* __restrict__ out, long long n, u64 seed, float std_dev,
                                            float mean) {
    dl_grid_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 h = mix64(seed ^ mix64((u64)i));
    float u = (float)(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = f2bf(mean + (2.f * u - 1.f) * std_dev * 1.7320508f);
}

// f32 <-> bf16 conversions on the device (round to nearest even).
extern "C" __global__ void f32_to_bf16(const float* __restrict__ in, bf16_t* __restrict__ out, long long n) {
    dl_grid_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2bf(in[i]);
}
extern "C" __global__ void bf16_to_f32(const bf16_t* __restrict__ in, float* __restrict__ out, long long n) {
    dl_grid_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf2f(in[i]);
}

// A recorded decode step that feeds itself (crates/engine/src/backend/cuda/step_graph.rs): its
// last kernel advances the step arena's growing words (lengths, positions) by one for the next
// replay. `words[0]` is their count, `words[1..]` their indices in `arena`.
extern "C" __global__ void step_arena_advance(u32* __restrict__ arena, const u32* __restrict__ words) {
    dl_grid_begin();
    const u32 n = words[0];
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) arena[words[1 + i]] += 1;
}
