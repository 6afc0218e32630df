//! Prefill attention: the flash-attention kernels of `kernels/attention.cu` over per-query key
//! intervals (`mask.rs`), the uploaded mask cached across the layers of a forward.

use super::elementwise::QkHeads;
use super::mask::MaskKey;
use super::{derr, CudaBackend, CudaTensor};
use crate::backend::{AttnShape, QkNorm, Rope, RopeStyle, SeqStarts};
use anyhow::{bail, ensure, Result};
use cudarc::driver::{CudaSlice, LaunchConfig};

/// Device pointers and row strides (elements) of an attention's q, k, v.
pub(super) struct AttnIo {
    q: u64,
    q_ld: usize,
    k: u64,
    v: u64,
    kv_ld: usize,
    tq: usize,
    tk: usize,
    /// The q norm + RoPE flash_attention2 applies to q itself (`wq == 0`: none).
    q_norm: FaQNormArgs,
    /// gpt-oss's sink logits, one f32 per query head (0: none; flash_attention2 only).
    sinks: u64,
}

/// `FaQNorm` of kernels/attention.cu: q_norm's weight, the (cos, sin) table per query row
/// ([`CudaBackend::with_rope_cs_table`]) and the RoPE settings (`wq == 0`: q used as given).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct FaQNormArgs {
    wq: u64,
    cs: u64,
    eps: f32,
    rotary_dim: i32,
    interleaved: i32,
}

// SAFETY: plain-old-data with the C layout of FaQNorm (two pointers, float, int, int).
unsafe impl super::launch::KernelValue for FaQNormArgs {}

/// An uploaded attention mask: per-query key intervals (host copy and device copy) and, per query
/// block height (positions per block), the order in which the blocks are launched.
pub(super) struct MaskUpload {
    key: MaskKey,
    host: Vec<i32>,
    ranges: CudaSlice<i32>,
    orders: Vec<(usize, CudaSlice<i32>)>,
}

/// Query blocks of `ppb` positions sorted by the number of keys they visit, heaviest first (ties
/// in position order): the launch order of `flash_attention2`, so that the longest blocks of a
/// causal prefill start in the first wave instead of trailing at the end.
fn heaviest_first(iv: &[i32], ppb: usize) -> Vec<i32> {
    let rows = iv.len() / 4;
    let nb = rows.div_ceil(ppb);
    let mut work: Vec<(i64, usize)> = (0..nb)
        .map(|b| {
            let (mut lo1, mut hi1, mut lo2, mut hi2) = (i64::MAX, i64::MIN, i64::MAX, i64::MIN);
            for r in b * ppb..((b + 1) * ppb).min(rows) {
                let x = &iv[4 * r..4 * r + 4];
                if x[0] < x[1] {
                    lo1 = lo1.min(x[0] as i64);
                    hi1 = hi1.max(x[1] as i64);
                }
                if x[2] < x[3] {
                    lo2 = lo2.min(x[2] as i64);
                    hi2 = hi2.max(x[3] as i64);
                }
            }
            let span = |lo: i64, hi: i64| if hi > lo { hi - lo } else { 0 };
            (-(span(lo1, hi1) + span(lo2, hi2)), b)
        })
        .collect();
    work.sort_unstable();
    work.into_iter().map(|(_, b)| b as i32).collect()
}

/// `DRAFTLENS_ATTENTION_KERNEL=wgmma`: the packed causal prefill at head dim 128 runs the wgmma
/// flash attention (`kernels/attention_wgmma.cu`, sm_90a) instead of `flash_attention2_hd128`
/// (docs/cuda.md, "wgmma flash attention (opt-in)"). Off by default.
pub const ATTENTION_KERNEL_ENV: &str = "DRAFTLENS_ATTENTION_KERNEL";

/// Whether a backend on a device of `compute_capability` starts with the wgmma attention on:
/// [`ATTENTION_KERNEL_ENV`] is `wgmma` and the device is compute capability 9.0 (wgmma's
/// `sm_90a` code runs nowhere else).
pub(super) fn wgmma_attention_from_env(compute_capability: (i32, i32)) -> bool {
    compute_capability == (9, 0)
        && std::env::var(ATTENTION_KERNEL_ENV).is_ok_and(|v| v.trim() == "wgmma")
}

/// Dynamic shared memory of `flash_attention_wgmma_hd128`: Q and double-buffered K and V tiles
/// of 128 × 128 bf16, plus 1 KB to align them to the 128-byte swizzle's 1024-byte period.
const WGMMA_SMEM: usize = 5 * 128 * 128 * 2 + 1024;

/// Threads per block of `flash_attention2_hd{hd}` (ATT2_ENTRY in kernels/attention.cu: 4 warps ×
/// 32 rows at head dims 64 and 128, 8 warps × 16 rows at 256), `None` for head dims it lacks.
fn fa2_threads(hd: usize) -> Option<u32> {
    match hd {
        64 | 128 => Some(128),
        256 => Some(256),
        _ => None,
    }
}

impl CudaBackend {
    /// Causal attention over packed sequences (as [`Backend::attention_varlen`]) reading q, k and
    /// v straight from the columns of a fused QKV output `[T, (H + 2·Hkv)·hd]` (no split copies).
    /// Head dims 64, 128 and 256 (the `flash_attention2` head dims).
    pub fn attention_varlen_packed(
        &self,
        qkv: &CudaTensor,
        shape: AttnShape,
        seq_starts: &SeqStarts,
    ) -> Result<CudaTensor> {
        let hd = shape.head_dim;
        Self::check_qkv_cols("attention_varlen_packed", qkv, shape)?;
        ensure!(
            self.uses_fa2(hd),
            "attention_varlen_packed: needs flash_attention2 (head_dim 64, 128 or 256), got {hd}"
        );
        let io = self.packed_io(qkv, shape, FaQNormArgs::default());
        self.attention_raw(io, shape, MaskKey::varlen(seq_starts, None))
    }

    /// q, k and v of a packed prefill as the q | k | v columns of the fused QKV output.
    fn packed_io(&self, qkv: &CudaTensor, shape: AttnShape, q_norm: FaQNormArgs) -> AttnIo {
        let base = self.ptr(&qkv.buf);
        let (q_cols, k_cols) = (
            shape.heads * shape.head_dim,
            shape.kv_heads * shape.head_dim,
        );
        AttnIo {
            q: base,
            q_ld: qkv.cols,
            k: base + (q_cols * 2) as u64,
            v: base + ((q_cols + k_cols) * 2) as u64,
            kv_ld: qkv.cols,
            tq: qkv.rows,
            tk: qkv.rows,
            q_norm,
            sinks: 0,
        }
    }

    /// Whether [`CudaBackend::attention_varlen_qkv_norm_in_kernel`] covers this call: the
    /// vectorised norm's shapes, flash_attention2 at this head dim, at least 4 query heads per KV
    /// head (a block's rows of the (cos, sin) table then fit the shared-memory buffer the kernel
    /// stages them in), and the route switched on.
    pub(super) fn q_norm_in_attention_fits(
        &self,
        qkv: &CudaTensor,
        shape: AttnShape,
        norm: &QkNorm<'_, CudaTensor>,
        positions: &[u32],
        rope: &Rope,
    ) -> bool {
        self.q_norm_in_attention
            .load(std::sync::atomic::Ordering::Relaxed)
            && !self.wgmma_attention_takes(shape.head_dim)
            && self.uses_fa2(shape.head_dim)
            && shape.kv_heads > 0
            && shape.heads / shape.kv_heads >= 4
            && Self::qk_norm_in_kernel_fits(qkv, shape, norm, positions, rope)
    }

    /// Switches flash_attention2's own q norm + RoPE on (the default) or off (the separate pass
    /// normalises q and k): for A/B benchmarks and the tests that compare the two.
    pub fn set_q_norm_in_attention(&self, on: bool) {
        self.q_norm_in_attention
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// [`Backend::attention_varlen_qkv`] with q/k norms, two launches: the k heads' norm + RoPE
    /// in place (`qk_norm_rope_vec_bf16` on the k columns), then flash_attention2, which
    /// normalises and rotates its Q tile in shared memory before its first key tile
    /// (`fa2_q_norm_rope`). Both read RoPE's (cos, sin) from one table per forward. The same
    /// arithmetic as the norm pass over q and k followed by the attention, so the same bits
    /// (`crates/engine/tests/cuda_ops.rs`); the q columns of `qkv` stay unnormalised.
    pub(super) fn attention_varlen_qkv_norm_in_kernel(
        &self,
        mut qkv: CudaTensor,
        shape: AttnShape,
        norm: QkNorm<'_, CudaTensor>,
        positions: &[u32],
        rope: &Rope,
        seq_starts: &SeqStarts,
    ) -> Result<CudaTensor> {
        Self::check_qk_norm_rope(&qkv, shape, &norm, positions, rope)?;
        let q_norm = FaQNormArgs {
            wq: self.ptr(&norm.q.buf),
            cs: 0,
            eps: norm.eps,
            rotary_dim: rope.rotary_dim as i32,
            interleaved: matches!(rope.style, RopeStyle::Interleaved) as i32,
        };
        self.with_rope_cs_table(positions, rope, |cs| {
            let k_only = QkHeads::KOnly { cs };
            self.qk_norm_rope_launch(&mut qkv, shape, norm, positions, rope, k_only)?;
            let io = self.packed_io(&qkv, shape, FaQNormArgs { cs, ..q_norm });
            self.attention_raw(io, shape, MaskKey::varlen(seq_starts, None))
        })
    }

    /// Switches the wgmma flash attention (`kernels/attention_wgmma.cu`) on or off for the packed
    /// causal prefill at head dim 128 (the default comes from [`ATTENTION_KERNEL_ENV`]); with it
    /// on, the fused QKV prefill normalises q in the separate q/k pass, since the wgmma kernel has
    /// no q norm of its own. Returns whether it is on: never on a device other than compute
    /// capability 9.0.
    pub fn set_attention_wgmma(&self, on: bool) -> bool {
        let on = on && self.info.compute_capability == (9, 0);
        self.attn_wgmma
            .store(on, std::sync::atomic::Ordering::Relaxed);
        on
    }

    /// Registers and local memory of `flash_attention_wgmma_hd128` as this machine's NVRTC
    /// builds it (compiles the sm_90a module; an error on devices other than compute capability
    /// 9.0).
    pub fn attention_wgmma_resources(&self) -> Result<String> {
        self.kernels
            .resources("attention_wgmma", "flash_attention_wgmma_hd128")
    }

    /// Whether packed causal prefill attention at head dim `hd` goes to the wgmma kernel (when
    /// the call has no window, sinks or q norm: [`CudaBackend::attention_raw`] checks those).
    pub(super) fn wgmma_attention_takes(&self, hd: usize) -> bool {
        hd == 128 && self.attn_wgmma.load(std::sync::atomic::Ordering::Relaxed) && self.uses_fa2(hd)
    }

    /// Selects the attention kernel for head dims 64, 128 and 256: `flash_attention2` (the
    /// default) or, with `v1 = true`, the first kernel (64-row blocks, single-buffered) — for A/B
    /// benchmarks.
    pub fn set_attention_v1(&self, v1: bool) {
        self.attn_v1.store(v1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether prefill attention at head dim `hd` runs `flash_attention2` (which also reads
    /// strided q/k/v, so the fused QKV paths need it).
    pub(super) fn uses_fa2(&self, hd: usize) -> bool {
        fa2_threads(hd).is_some() && !self.attn_v1.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Attention of contiguous q, k, v under `key`'s mask (its window, if any) with gpt-oss's
    /// sink logits (`sinks`: one per query head).
    pub(super) fn attention_with(
        &self,
        (q, k, v): (&CudaTensor, &CudaTensor, &CudaTensor),
        shape: AttnShape,
        key: MaskKey,
        sinks: Option<&[f32]>,
    ) -> Result<CudaTensor> {
        let sinks = match sinks {
            Some(s) => self.f32_table(s)?,
            None => 0,
        };
        let io = AttnIo {
            q: self.ptr(&q.buf),
            q_ld: q.cols,
            k: self.ptr(&k.buf),
            v: self.ptr(&v.buf),
            kv_ld: k.cols,
            tq: q.rows,
            tk: k.rows,
            q_norm: FaQNormArgs::default(),
            sinks,
        };
        self.attention_raw(io, shape, key)
    }

    /// Attention over q/k/v given as device pointers with row strides (`q_ld`, `kv_ld` elements),
    /// so that they may be column slices of one fused QKV output. Output `[tq, heads·hd]`.
    pub(super) fn attention_raw(
        &self,
        io: AttnIo,
        shape: AttnShape,
        key: MaskKey,
    ) -> Result<CudaTensor> {
        let reverse = key.reverse();
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        ensure!(
            kv_heads > 0 && heads % kv_heads == 0,
            "attention: {heads} heads not divisible by {kv_heads} KV heads"
        );
        let group = heads / kv_heads;
        ensure!(
            group <= 64,
            "attention: {group} query heads per KV head (at most 64 supported)"
        );
        ensure!(
            io.tk < i32::MAX as usize && io.tq < i32::MAX as usize,
            "attention: too many rows"
        );
        let v2 = self.uses_fa2(hd);
        // The wgmma kernel's scope: one key interval per row (packed causal sequences, no
        // window: `varlen_key_intervals` leaves every second interval empty), no sinks, q as given.
        let wgmma = self.wgmma_attention_takes(hd)
            && io.sinks == 0
            && io.q_norm.wq == 0
            && matches!(key, MaskKey::Varlen { window: None, .. });
        ensure!(
            io.sinks == 0 || (v2 && hd == 64),
            "attention: sinks need flash_attention2 with heads of 64 (gpt-oss's; here {hd})"
        );
        let func = match (hd, v2) {
            (64, true) if io.sinks != 0 => "flash_attention2_sinks_hd64",
            (64, true) => "flash_attention2_hd64",
            (128, true) => "flash_attention2_hd128",
            (256, true) => "flash_attention2_hd256",
            (64, false) => "flash_attention_hd64",
            (128, false) => "flash_attention_hd128",
            (256, false) => "flash_attention_hd256",
            _ => {
                bail!("attention: head_dim {hd} is not supported by the CUDA kernel (64, 128, 256)")
            }
        };
        ensure!(
            v2 || (io.q_ld == heads * hd && io.kv_ld == kv_heads * hd),
            "attention: strided q/k/v need flash_attention2 (head_dim 64, 128 or 256)"
        );
        let mut out = self.new_tensor(io.tq, heads * hd)?;
        if io.tq == 0 {
            return Ok(out);
        }
        let mut cache = self.mask_cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.as_ref().map(|c| c.key != key).unwrap_or(true) {
            let iv = key.intervals(io.tq)?;
            ensure!(
                iv.len() == io.tq * 4,
                "attention: mask covers {} rows, q has {}",
                iv.len() / 4,
                io.tq
            );
            let ranges = self.upload(&iv)?;
            *cache = Some(MaskUpload {
                key,
                host: iv,
                ranges,
                orders: Vec::new(),
            });
        }
        let up = cache.as_mut().expect("mask cache was just filled");
        let (tq, tk, h, hkv) = (io.tq as i32, io.tk as i32, heads as i32, kv_heads as i32);
        let scale_log2 = std::f32::consts::LOG2_E / (hd as f32).sqrt();
        if v2 {
            let ppb = 128 / group;
            if !up.orders.iter().any(|(p, _)| *p == ppb) {
                let order = heaviest_first(&up.host, ppb);
                let dev = self.upload(&order)?;
                up.orders.push((ppb, dev));
            }
            let order = &up
                .orders
                .iter()
                .find(|(p, _)| *p == ppb)
                .expect("inserted above")
                .1;
            // Q (FA2_BM 128 rows) + double-buffered K and V (FA2_BN 64 rows each), bf16.
            let (module, func, smem, threads) = if wgmma {
                let f = "flash_attention_wgmma_hd128";
                ("attention_wgmma", f, WGMMA_SMEM, 256)
            } else {
                let threads = fa2_threads(hd).expect("v2 implies a flash_attention2 head dim");
                ("attention", func, (128 + 4 * 64) * hd * 2, threads)
            };
            let f = self.kernels.get_with_smem(module, func, smem)?;
            let grid = io.tq.div_ceil(ppb) * kv_heads;
            ensure!(grid < i32::MAX as usize, "attention: grid too large");
            let (q_ld, kv_ld) = (io.q_ld as i64, io.kv_ld as i64);
            let mut b = self.launch_builder(&f);
            b.arg(&io.q)
                .arg(&io.k)
                .arg(&io.v)
                .arg(&mut out.buf)
                .arg(&up.ranges)
                .arg(order)
                .arg(&tq)
                .arg(&tk)
                .arg(&h)
                .arg(&hkv)
                .arg(&q_ld)
                .arg(&kv_ld)
                .arg(&scale_log2);
            if !wgmma {
                b.arg(&io.q_norm).arg(&io.sinks);
            }
            // SAFETY: signature matches ATT2_ENTRY in kernels/attention.cu (without its last two
            // parameters: flash_attention_wgmma_hd128 in kernels/attention_wgmma.cu, only at head
            // dim 128, on sm_90, with the one-interval masks checked above); q/k/v address tq/tk
            // rows of the given strides (checked by the callers); the intervals are clipped to
            // [0, tk]; `order` is a permutation of the tq.div_ceil(ppb) query blocks; FaQNorm's
            // pointers are null or q_norm's hd weights and tq × rotary_dim / 2 (cos, sin) pairs;
            // `sinks` is null or `heads` floats (f32_table of AttnExtras::sinks, checked).
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (grid as u32, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: smem as u32,
                })
            }
            .map_err(derr(func))?;
            return Ok(out);
        }
        ensure!(
            io.q_norm.wq == 0,
            "attention: the first kernel has no q norm (set_attention_v1 with q norms in the attention)"
        );
        let smem = 3 * 64 * hd * 2;
        let f = self.kernels.get_with_smem("attention", func, smem)?;
        let ppb = 64 / group;
        let grid_x = io.tq.div_ceil(ppb);
        ensure!(
            grid_x < i32::MAX as usize && kv_heads < 65536,
            "attention: grid too large"
        );
        let rev = reverse as i32;
        let mut b = self.launch_builder(&f);
        b.arg(&io.q)
            .arg(&io.k)
            .arg(&io.v)
            .arg(&mut out.buf)
            .arg(&up.ranges)
            .arg(&tq)
            .arg(&tk)
            .arg(&h)
            .arg(&hkv)
            .arg(&scale_log2)
            .arg(&rev);
        // SAFETY: signature matches ATT_ENTRY in kernels/attention.cu; contiguous q/k/v of the
        // shapes checked above; the intervals are clipped to [0, tk].
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (grid_x as u32, kv_heads as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: smem as u32,
            })
        }
        .map_err(derr(func))?;
        Ok(out)
    }
}
