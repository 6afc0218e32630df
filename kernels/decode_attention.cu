// Attention of one decode step for many sequences at once, each over its own KV cache
// (host/src/backend/cuda/decode.rs `attention_decode`), compiled with decode_gemm.cu.
//
// Row r of q [R, H·hd] and of the new k/v [R, Hkv·hd] is the next token of sequence r, whose
// cache holds positions 0..len_r (`tab` = k cache, v cache and len_r per sequence, caches
// [capacity ≥ len_r + 1, Hkv·hd] bf16). The table is a kernel parameter (R ≤ DA_MAX_ROWS per
// launch), not a device buffer: uploading one per layer from pageable host memory could make the
// host wait for the stream at every layer. The kernel appends the new k/v at position len_r and
// attends q over positions 0..=len_r. One block per (sequence, KV head), one warp per query head
// of that group, so a sequence's result never depends on which sequences share the launch.
//
// Numerics (as flash_attention2 in attention.cu): scores q·k in fp32 scaled by log2(e)/√hd; a
// running max and sum in fp32, updated once per chunk of DA_UNROLL keys in key order;
// P = exp2(S − max) in fp32, rounded to bf16 only as the weight of V; the sum uses the fp32 P; O
// accumulates in fp32, is divided by the sum at the end and rounded once to bf16. Every lane
// holds hd/32 consecutive dimensions; the dot products are reduced with the xor butterfly, whose
// result is bitwise the same on every lane (fp32 addition is commutative).

#define DA_MAX_ROWS 64
struct DaTable {
    u64 k[DA_MAX_ROWS];
    u64 v[DA_MAX_ROWS];
    int len[DA_MAX_ROWS];
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

template <int HD, int UNR>
__device__ void decode_attention(const bf16_t* __restrict__ q, const bf16_t* __restrict__ knew,
                                 const bf16_t* __restrict__ vnew, bf16_t* __restrict__ out, const DaTable& tab,
                                 int heads, int kv_heads, float scale_log2) {
    constexpr int DPL = HD / 32;
    const int r = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int group = heads / kv_heads;
    const int qh = h * group + w;
    const long long kvd = (long long)kv_heads * HD, qd = (long long)heads * HD;
    bf16_t* kc = (bf16_t*)tab.k[r];
    bf16_t* vc = (bf16_t*)tab.v[r];
    const int len = tab.len[r];
    const int d0 = lane * DPL;
    const bf16_t* kn = knew + r * kvd + h * HD + d0;
    const bf16_t* vn = vnew + r * kvd + h * HD + d0;
    if (w == 0) {
        // Append (positions < len are only read, the new one is read from knew/vnew).
        da_copy<DPL>(kc + len * kvd + h * HD + d0, kn);
        da_copy<DPL>(vc + len * kvd + h * HD + d0, vn);
    }
    float qf[DPL];
    da_load<DPL>(q + r * qd + qh * HD + d0, qf);
    float m = -DL_INF, l = 0.f, o[DPL];
#pragma unroll
    for (int d = 0; d < DPL; ++d) o[d] = 0.f;
    const bf16_t* kbase = kc + h * HD + d0;
    const bf16_t* vbase = vc + h * HD + d0;
    for (int j0 = 0; j0 <= len; j0 += UNR) {
        float kf[UNR][DPL], vf[UNR][DPL], s[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
            const int j = j0 + u;
            if (j < len) {
                da_load<DPL>(kbase + j * kvd, kf[u]);
                da_load<DPL>(vbase + j * kvd, vf[u]);
            } else if (j == len) {
                da_load<DPL>(kn, kf[u]);
                da_load<DPL>(vn, vf[u]);
            } else {
#pragma unroll
                for (int d = 0; d < DPL; ++d) kf[u][d] = vf[u][d] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
            float p = 0.f;
#pragma unroll
            for (int d = 0; d < DPL; ++d) p += qf[d] * kf[u][d];
            s[u] = warp_sum(p) * scale_log2;
        }
        float mc = m;
#pragma unroll
        for (int u = 0; u < UNR; ++u)
            if (j0 + u <= len) mc = fmaxf(mc, s[u]);
        const float corr = exp2f(m - mc);  // 0 at the first chunk (m = -inf)
        l *= corr;
#pragma unroll
        for (int d = 0; d < DPL; ++d) o[d] *= corr;
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
            if (j0 + u <= len) {
                const float p = exp2f(s[u] - mc);
                l += p;
                const float pb = rb(p);
#pragma unroll
                for (int d = 0; d < DPL; ++d) o[d] += pb * vf[u][d];
            }
        }
        m = mc;
    }
    const float inv = 1.f / l;
    bf16_t* op = out + r * qd + qh * HD + d0;
    float res[8];
#pragma unroll
    for (int d = 0; d < DPL; ++d) res[d] = o[d] * inv;
    if constexpr (DPL == 8) {
        *(uint4*)op = pack8(res);
    } else if constexpr (DPL == 4) {
        *(uint2*)op = make_uint2(pack_bf16x2(res[0], res[1]), pack_bf16x2(res[2], res[3]));
    } else {
        *(u32*)op = pack_bf16x2(res[0], res[1]);
    }
}

#define DA_ENTRY(HD, UNR)                                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                                          \
        decode_attention_hd##HD(const bf16_t* __restrict__ q, const bf16_t* __restrict__ knew,                 \
                                const bf16_t* __restrict__ vnew, bf16_t* __restrict__ out,                      \
                                const __grid_constant__ DaTable tab, int heads, int kv_heads, float scale_log2) { \
        decode_attention<HD, UNR>(q, knew, vnew, out, tab, heads, kv_heads, scale_log2);                        \
    }

DA_ENTRY(64, 8)
DA_ENTRY(128, 8)
DA_ENTRY(256, 4)
