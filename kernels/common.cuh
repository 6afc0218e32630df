// Shared helpers for every draftlens kernel. The host prepends this file to each kernel source
// before handing it to NVRTC, so the kernels need no CUDA headers at all (NVRTC on the device
// would otherwise need --include-path to the toolkit for cuda_bf16.h).
//
// bf16 is carried as its raw 16-bit pattern (`bf16_t`). Conversions:
//   bf16 -> f32: exact (shift into the high half of the f32 word);
//   f32 -> bf16: round to nearest, ties to even (PTX cvt.rn.bf16.f32, sm_80+), NaN stays NaN —
//   the same rounding PyTorch applies when it stores an fp32 intermediate into a bf16 tensor.

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;

#define DL_INF __int_as_float(0x7f800000)

// Programmatic dependent launch (docs/cuda.md, "Dependent launches"): the first statement of every
// kernel (tools/check_kernels.py fails a kernel that touches memory before it). The host may launch
// a kernel before the one ahead of it on the stream has finished; its blocks then wait here until
// that grid has finished and its writes are visible, so every kernel sees exactly what it would
// launched after it. Then this grid lets the next one be scheduled: its blocks take SMs as this
// grid's last blocks leave them instead of after a launch gap. Without the launch attribute, or
// below sm_90, both are no-ops.
__device__ __forceinline__ void dl_grid_begin() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float bf2f(bf16_t v) { return __uint_as_float(((u32)v) << 16); }

__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// Round an f32 to the nearest bf16 value and return it as f32 (one "bf16 op" of PyTorch).
__device__ __forceinline__ float rb(float f) { return bf2f(f2bf(f)); }

// The q/k norm's and RoPE's arithmetic, one definition for every kernel that applies them
// (elementwise.cu rope_bf16; attention.cu qk_norm_rope_bf16, qk_norm_rope_vec_bf16 and
// flash_attention2's q prologue; decode_attention.cu), so that they give the same bits as each
// other and as the CPU backend (docs/cuda.md, "Operations and the precision of every intermediate"):
//   the RMSNorm's output value: bf16(bf16(x · r) · w), r = 1/√(mean(x²) + eps) (qk_norm_value is
//   the fp32 product; the caller rounds it, by rb or by its bf16 store);
//   a RoPE pair (a, b) at an angle with bf16-rounded (cos, sin) = (c, s): each product rounded to
//   bf16, the two summed in fp32 (the caller's store rounds the sum):
//     a' = bf16(a·c) + bf16(−b·s),   b' = bf16(b·c) + bf16(a·s).
__device__ __forceinline__ float qk_norm_value(float x, float r, float w) { return rb(x * r) * w; }
__device__ __forceinline__ float rope_pair_a(float a, float b, float c, float s) { return rb(a * c) + rb(-b * s); }
__device__ __forceinline__ float rope_pair_b(float a, float b, float c, float s) { return rb(b * c) + rb(a * s); }

// Two f32 -> one 32-bit word of two bf16: `lo` in bits 0..15 (lower column), `hi` in 16..31.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float lo_bf(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// 8 bf16 (one 16-byte vector) <-> 8 f32.
__device__ __forceinline__ void unpack8(uint4 v, float* f) {
    f[0] = lo_bf(v.x); f[1] = hi_bf(v.x);
    f[2] = lo_bf(v.y); f[3] = hi_bf(v.y);
    f[4] = lo_bf(v.z); f[5] = hi_bf(v.z);
    f[6] = lo_bf(v.w); f[7] = hi_bf(v.w);
}
__device__ __forceinline__ uint4 pack8(const float* f) {
    uint4 v;
    v.x = pack_bf16x2(f[0], f[1]);
    v.y = pack_bf16x2(f[2], f[3]);
    v.z = pack_bf16x2(f[4], f[5]);
    v.w = pack_bf16x2(f[6], f[7]);
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// 64-bit mix (splitmix64 finaliser): counter-based random numbers for on-device random weights.
__device__ __forceinline__ u64 mix64(u64 z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// ---------------------------------------------------------------------------------------------
// Asynchronous copies, ldmatrix and the bf16 tensor-core step (sm_80+), shared by attention.cu,
// gdn.cu and decode_gemm.cu. A `u32` address is a shared-memory address (smem_u32); the cp.async
// copies bypass L1 (.cg).
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16_s(u32 smem, const void* gmem, bool valid) {
    int n = valid ? 16 : 0;  // 0 source bytes: the 16 destination bytes are zero-filled
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n));
}
// All 16 bytes, no source-size operand.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    ldsm_x4(r0, r1, r2, r3, smem_u32(p));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    ldsm_x4_trans(r0, r1, r2, r3, smem_u32(p));
}

// D(16×8, f32) += A(16×16, bf16, row) · B(16×8, bf16, col)
__device__ __forceinline__ void mma_bf16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
