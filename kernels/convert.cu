// Weight dtype conversion on the GPU for the raw upload path (crates/engine/src/backend/cuda/upload.rs):
// the bytes of an f16 or f32 checkpoint tensor are copied to the device as stored and turned into
// bf16 here, instead of converting (and holding) them on the host. `common.cuh` is prepended.
//
// Bit-exact with the host path `Backend::matrix` takes (f32 -> half::bf16::from_f32, and
// f16 -> f32 by half::f16::to_f32 first), NaN payloads included, so integer arithmetic is used
// instead of the hardware conversions (PTX cvt canonicalises NaNs):
//   f32 -> bf16: NaN -> (bits >> 16) | 0x0040 (quiet, sign and high payload kept); otherwise round
//                to nearest, ties to even, on the dropped 16 bits.
//   f16 -> f32:  exact; NaN -> sign | 0x7fc00000 | (mantissa << 13); subnormals normalised.

__device__ __forceinline__ bf16_t f32_bits_to_bf16(u32 x) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((x >> 16) | 0x0040u);
    const u32 round_bit = 0x00008000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) return (bf16_t)((x >> 16) + 1u);
    return (bf16_t)(x >> 16);
}

__device__ __forceinline__ u32 f16_bits_to_f32_bits(unsigned short h) {
    u32 i = h;
    if ((i & 0x7fffu) == 0u) return i << 16;  // signed zero
    u32 sign = (i & 0x8000u) << 16;
    u32 exp = i & 0x7c00u;
    u32 man = i & 0x03ffu;
    if (exp == 0x7c00u) {
        if (man == 0u) return sign | 0x7f800000u;          // infinity
        return sign | 0x7fc00000u | (man << 13);           // NaN, made quiet
    }
    if (exp == 0u) {
        // Subnormal: shift the leading 1 of the 10-bit mantissa up to the implicit bit.
        int e = __clz(man) - 22;  // leading zeros within 10 bits, counted from bit 9
        u32 e32 = (u32)(127 - 15 - e) << 23;
        u32 m32 = (man << (14 + e)) & 0x7fffffu;
        return sign | e32 | m32;
    }
    u32 e32 = (u32)(((int)(exp >> 10) - 15) + 127) << 23;
    return sign | e32 | (man << 13);
}

// n elements of little-endian f32 at `src` -> bf16 at `dst`. Grid-stride loop.
extern "C" __global__ void convert_f32_to_bf16(const u32* __restrict__ src, bf16_t* __restrict__ dst,
                                               long long n) {
    dl_grid_begin();
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = f32_bits_to_bf16(src[i]);
}

// n elements of little-endian f16 at `src` -> bf16 at `dst` (through the exact f32 value).
extern "C" __global__ void convert_f16_to_bf16(const unsigned short* __restrict__ src,
                                               bf16_t* __restrict__ dst, long long n) {
    dl_grid_begin();
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = f32_bits_to_bf16(f16_bits_to_f32_bits(src[i]));
}

// A chunk of a bf16 weight stored transposed (`[inp, out]`: gpt-oss's expert stacks, which
// transformers multiplies as x @ W), rows i0 .. i0 + rows of it at `src`, written as columns
// i0 .. of the `[out, inp]` matrix at `dst`. Stored column o becomes matrix row o, or with
// `interleaved` (gate_up's alternating gate and up columns) row o / 2 for even o and
// out / 2 + o / 2 for odd o: the rule of raw::transposed_row (crates/engine/src/backend/raw.rs).
// 32 x 32 tiles through shared memory, so that the reads (along stored rows) and the writes
// (along matrix rows) are both coalesced. Grid (ceil(out / 32), ceil(rows / 32)), block (32, 8).
extern "C" __global__ void transpose_bf16_rows(const bf16_t* __restrict__ src,
                                               bf16_t* __restrict__ dst, int rows, int out, int inp,
                                               int i0, int interleaved) {
    dl_grid_begin();
    __shared__ bf16_t tile[32][33];
    const int o0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int y = threadIdx.y; y < 32; y += 8) {
        int r = r0 + y, o = o0 + threadIdx.x;
        if (r < rows && o < out) tile[y][threadIdx.x] = src[(size_t)r * out + o];
    }
    __syncthreads();
    for (int y = threadIdx.y; y < 32; y += 8) {
        int o = o0 + y, r = r0 + threadIdx.x;
        if (o < out && r < rows) {
            int row = interleaved ? ((o & 1) ? out / 2 + o / 2 : o / 2) : o;
            dst[(size_t)row * inp + i0 + r] = tile[threadIdx.x][y];
        }
    }
}
