//! Device-memory estimates from a model's spec, checked before any work starts.
//!
//! A model or a prompt that does not fit must be refused (or a pack split, a decode batch
//! lowered) up front with the numbers, never discovered by an out-of-memory error half-way
//! through a run. One rule, [`MemoryModel::estimate`], says what a backend holds to greedily
//! decode `batch` prompts of up to `prompt` tokens by `new` tokens and then run the target pass
//! over `prompt + new` rows; the session's checks (`crate::session`), the pack budget and
//! `inspect` all use it. With element size `e` (2 on CUDA, whose weights and activations are
//! bf16; 4 on the CPU):
//!
//! - **weights**: [`ModelSpec::stored_params`] (every tensor the loader uploads, counted from
//!   the config) × `e`. gpt-oss's MXFP4 experts count at `e` too where they are dequantised at
//!   load (the CPU; CUDA with `DRAFTLENS_MXFP4=bf16`), and at 17 bytes per 32 parameters where
//!   the backend keeps them packed (CUDA's default: [`MemoryModel::with_mxfp4`],
//!   docs/moe-models.md); a checkpoint's vision tower or MTP head is not loaded, not counted;
//! - **workspace**: [`WORKSPACE_BYTES`] (GEMM workspaces, kernel tables, the pool's rounding);
//! - **decoding** (prompts prefilled one at a time, then decoded together): per sequence the K/V
//!   of every attention layer (`2·kvd·e` per position; gpt-oss's sliding layers keep every
//!   position) at the capacity the buffers grow to ([`kv_capacity`]: up to twice the positions),
//!   plus a Gated DeltaNet layer's recurrent state (f32 `Hv·dk·dv` and the conv's last `K − 1`
//!   inputs), plus one layer's K/V again while it is reallocated, plus one prompt's prefill;
//! - **target pass**: one forward over `prompt + new` rows capturing `taps` hidden states;
//! - total = weights + workspace + the larger of decoding and the target pass (the decode's
//!   caches are freed before the target pass runs).
//!
//! A forward's activations per row, at the peak of a layer: the residual `h` and normed `x`
//! (`2·D`), the captured states kept to the end (`(taps + 1)·D`), and the larger of the token
//! mixer's and the MLP's working set, the largest over layers:
//!
//! - attention: fused q|k|v (`q + 2·kvd`, `q` doubled by a hybrid's output gate) and its output
//!   (`qd`, plus the gate's product on a hybrid);
//! - Gated DeltaNet: its fused projection and the four parts split from it
//!   (`2·(conv_dim + value_dim + 2·Hv)`), plus the chunked core's f32 scratch
//!   (`Hv·(2·dk + dv + 64 + 3 + dk·dv/64)` floats: W, U, V, the chunk scores, gates and the
//!   per-chunk states; `backend/cuda/gdn/split.rs`);
//! - dense MLP: fused gate|up and its product (`3·I`);
//! - sparse MLP (`SparseMoe::forward_acc` routed on the device, `backend/cuda/moe.rs`): the router
//!   logits (`E + s`, s = 1 with a shared expert) and the shared expert's output (`s·D`) through
//!   the call, with the larger of the routed rows' two phases, gathered rows and gate|up
//!   (`k·D + 2·k·I`) then product and stacked outputs (`k·I + (k + s)·D`), and the shared
//!   expert's own gate|up and product (`3·S`, before); gpt-oss's block is counted by the same
//!   rule;
//!
//! with 25 % on top for temporaries the list misses, and the LM head's fp32 logits scratch
//! `min(T, 2^30 / (4·V))·V·4` bytes (≤ 1 GiB, as the CUDA `lm_head_topk` chunks it).
//!
//! These are estimates with margins, not allocations: they decide before the first kernel runs.

use crate::model::config::LayerType;
use crate::model::ModelSpec;
use serde::Serialize;

/// Fixed allowance for cuBLAS/cuBLASLt workspaces (32 MiB each), kernel tables and the pool
/// allocator's rounding.
pub const WORKSPACE_BYTES: u64 = 512 << 20;

/// Device bytes one stored weight element takes: 4 for f32 backends, 2 for bf16/f16.
pub fn element_bytes(dtype: &str) -> u64 {
    match dtype {
        "bf16" | "f16" => 2,
        _ => 4,
    }
}

/// Rows a K or V buffer can hold after a `prompt`-row prefill and `new` one-row appends: the
/// prefill's K/V become the buffer as they are, and an append that does not fit reallocates to
/// `max(rows + 1, 2·rows, 64)` rows (`CudaBackend::reserve_rows`; the CPU's vectors double
/// likewise), so decoding after a long prompt holds up to twice its positions.
pub fn kv_capacity(prompt: u64, new: u64) -> u64 {
    let (end, mut rows, mut cap) = (prompt + new, prompt, prompt);
    while rows < end {
        if rows + 1 > cap {
            cap = (rows + 1).max(2 * rows).max(64);
        }
        rows = cap.min(end); // the next reallocation comes when the buffer is full
    }
    cap
}

/// The sizes of a target the estimates need, on a backend of a given element size.
#[derive(Clone, Debug)]
pub struct MemoryModel {
    pub hidden: u64,
    pub vocab: u64,
    /// Bytes per activation / weight element on the device.
    pub elem: u64,
    /// Bytes of all weights on the device.
    pub weights: u64,
    /// How the weights are held ("bf16"; gpt-oss MXFP4: dequantised at load, or packed), for
    /// messages.
    pub weights_as: String,
    /// Activation elements per row of a layer's mixer or MLP working set, the largest layer's.
    layer_peak: u64,
    /// f32 scratch bytes per row (the Gated DeltaNet's chunked core), the largest layer's.
    f32_per_row: u64,
    /// K + V bytes per cached position of one attention layer, and the attention layers.
    kv_layer_per_position: u64,
    attention_layers: u64,
    /// Recurrent-state bytes of one sequence over every Gated DeltaNet layer.
    state_per_sequence: u64,
}

/// [`MemoryModel::weights_as`] of gpt-oss's MXFP4 experts dequantised at load.
fn dequantised_as(dtype: &str) -> String {
    format!("{dtype}; its MXFP4 experts dequantised at load")
}

impl MemoryModel {
    /// The estimates' view of `spec` on a backend computing in `dtype` (`Backend::dtype`).
    pub fn new(spec: &ModelSpec, dtype: &str) -> MemoryModel {
        let elem = element_bytes(dtype);
        let d = spec.hidden_size as u64;
        let (qd, kvd) = (
            (spec.num_heads * spec.head_dim) as u64,
            (spec.num_kv_heads * spec.head_dim) as u64,
        );
        let (mut layer_peak, mut f32_per_row) = (0u64, 0u64);
        let (mut attention_layers, mut state_per_sequence) = (0u64, 0u64);
        for l in 0..spec.num_layers {
            let gdn = spec
                .hybrid
                .as_ref()
                .filter(|h| h.layer_types[l] == LayerType::LinearAttention);
            let mixer = match gdn {
                Some(h) => {
                    let s = h.gdn_shape();
                    let (conv, value, hv) =
                        (s.conv_dim() as u64, s.value_dim() as u64, s.v_heads as u64);
                    let (dk, dv) = (s.k_dim as u64, s.v_dim as u64);
                    f32_per_row = f32_per_row.max(4 * hv * (2 * dk + dv + 64 + 3 + dk * dv / 64));
                    let kernel = h.linear_conv_kernel_dim as u64;
                    state_per_sequence +=
                        4 * s.state_len() as u64 + kernel.saturating_sub(1) * conv * elem;
                    2 * (conv + value + 2 * hv)
                }
                None => {
                    attention_layers += 1;
                    let gated = spec.hybrid.is_some();
                    let q_rows = if gated { 2 * qd } else { qd };
                    q_rows + 2 * kvd + if gated { 2 * qd } else { qd }
                }
            };
            let mlp = match &spec.moe {
                Some(m) if m.is_sparse(l) => {
                    let shared = m.shared_expert_intermediate_size.map_or(0, |s| s as u64);
                    let s = u64::from(shared > 0);
                    let (k, i) = (m.num_experts_per_tok as u64, m.moe_intermediate_size as u64);
                    let routed = (k * d + 2 * k * i).max(k * i + (k + s) * d);
                    m.num_experts as u64 + s + s * d + routed.max(3 * shared)
                }
                _ => 3 * spec.intermediate_size as u64,
            };
            layer_peak = layer_peak.max(mixer.max(mlp));
        }
        let mxfp4 = spec.gpt_oss.as_ref().is_some_and(|g| g.mxfp4());
        MemoryModel {
            hidden: d,
            vocab: spec.vocab_size as u64,
            elem,
            weights: spec.stored_params() * elem,
            weights_as: if mxfp4 {
                dequantised_as(dtype)
            } else {
                dtype.to_string()
            },
            layer_peak,
            f32_per_row,
            kv_layer_per_position: 2 * kvd * elem,
            attention_layers,
            state_per_sequence,
        }
    }

    /// [`MemoryModel::new`] on a backend that keeps MXFP4 expert weights packed when
    /// `mxfp4_packed` ([`crate::backend::Backend::mxfp4_packed`]): a gpt-oss MXFP4 checkpoint's
    /// expert weights then count at their packed bytes ([`crate::backend::mxfp4::packed_bytes`],
    /// 17 per 32 parameters) instead of `e` each; everything else as [`MemoryModel::new`].
    pub fn with_mxfp4(spec: &ModelSpec, dtype: &str, mxfp4_packed: bool) -> MemoryModel {
        let mxfp4 = spec.gpt_oss.as_ref().is_some_and(|g| g.mxfp4());
        MemoryModel::with_mxfp4_experts(spec, dtype, mxfp4_packed, mxfp4)
    }

    /// [`MemoryModel::with_mxfp4`] where whether gpt-oss's experts reach the backend as MXFP4
    /// bytes is the caller's to say (`mxfp4_experts`: `TargetFiles::mxfp4_experts`, a folder's
    /// `quant_method` or a GGUF's expert stacks' ggml type), not the config's.
    pub fn with_mxfp4_experts(
        spec: &ModelSpec,
        dtype: &str,
        mxfp4_packed: bool,
        mxfp4_experts: bool,
    ) -> MemoryModel {
        let mut m = MemoryModel::new(spec, dtype);
        let mxfp4 = mxfp4_experts && spec.gpt_oss.is_some();
        if mxfp4 && !mxfp4_packed {
            m.weights_as = dequantised_as(dtype);
        }
        if let (true, true, Some(moe)) = (mxfp4_packed, mxfp4, &spec.moe) {
            let (d, i) = (spec.hidden_size, moe.moe_intermediate_size);
            let matrices = (spec.num_layers * moe.num_experts) as u64;
            // Per expert: gate|up [2I, D] and down [D, I].
            let params = matrices * (2 * i * d + d * i) as u64;
            let packed = matrices
                * (crate::backend::mxfp4::packed_bytes(2 * i, d)
                    + crate::backend::mxfp4::packed_bytes(d, i)) as u64;
            m.weights = m.weights - params * m.elem + packed;
            m.weights_as = format!("{dtype}; its MXFP4 experts kept packed");
        }
        m
    }

    /// Activation bytes per row of a forward that captures `taps` hidden states.
    fn per_row(&self, taps: u64) -> u64 {
        let live = (2 + taps + 1) * self.hidden + self.layer_peak;
        // 25 % for temporaries (splits, norms' outputs) the list misses.
        (live * self.elem + self.f32_per_row) * 5 / 4
    }

    /// The LM head's fp32 logits scratch for `rows` rows.
    fn logits(&self, rows: u64) -> u64 {
        let chunk = rows.min(((1u64 << 30) / (self.vocab * 4)).max(1));
        chunk * self.vocab * 4
    }

    /// Device bytes (beyond the weights) of one packed forward over `rows` rows capturing
    /// `taps` hidden states, then its top-K.
    pub fn forward_bytes(&self, rows: u64, taps: u64) -> u64 {
        WORKSPACE_BYTES + rows * self.per_row(taps) + self.logits(rows)
    }

    /// KV-cache and recurrent-state bytes of `batch` sequences decoded from `prompt` tokens by
    /// `new` tokens, with one layer's K/V reallocated at the time.
    fn cache_bytes(&self, batch: u64, prompt: u64, new: u64) -> u64 {
        let layer = self.kv_layer_per_position * kv_capacity(prompt, new);
        let sequence = self.attention_layers * layer + self.state_per_sequence;
        batch * sequence + if batch > 0 { layer } else { 0 }
    }

    /// Device bytes (beyond the weights) of greedily decoding `batch` prompts of at most
    /// `prompt` tokens by `max_new` tokens: the prompt's prefill (prompts are prefilled one at a
    /// time) next to every sequence's cache ([`MemoryModel::estimate`]'s decoding term).
    pub fn decode_bytes(&self, batch: u64, prompt: u64, max_new: u64) -> u64 {
        self.forward_bytes(prompt, 0) + self.cache_bytes(batch, prompt, max_new)
    }

    /// What the device holds to decode `batch` prompts of up to `prompt` tokens by `new` tokens
    /// and then run the target pass over them capturing `taps` states (the module doc's rule).
    /// `batch` 0: the weights and workspace alone, before any prompt.
    pub fn estimate(&self, batch: u64, prompt: u64, new: u64, taps: u64) -> Estimate {
        let (kv, prefill, pass) = if batch == 0 {
            (0, 0, 0)
        } else {
            (
                self.cache_bytes(batch, prompt, new),
                self.forward_bytes(prompt, 0) - WORKSPACE_BYTES,
                self.forward_bytes(prompt + new, taps) - WORKSPACE_BYTES,
            )
        };
        Estimate {
            batch,
            prompt_tokens: prompt,
            new_tokens: new,
            taps,
            weights_as: self.weights_as.clone(),
            weights_bytes: self.weights,
            workspace_bytes: WORKSPACE_BYTES,
            kv_state_bytes: kv,
            prefill_bytes: prefill,
            target_pass_bytes: pass,
            total_bytes: self.weights + WORKSPACE_BYTES + (kv + prefill).max(pass),
        }
    }

    /// The most rows one forward capturing `taps` states may have within `available` bytes
    /// (0 when not even the fixed part fits).
    pub fn max_rows(&self, available: u64, taps: u64) -> u64 {
        // forward_bytes is increasing in rows: binary search the largest fitting count.
        let (mut lo, mut hi) = (0u64, 1u64 << 32);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.forward_bytes(mid, taps) <= available {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

/// [`MemoryModel::estimate`]'s answer, term by term (`inspect --json`'s `cuda_memory`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// Sequences decoded together; 0: the weights and workspace alone.
    pub batch: u64,
    pub prompt_tokens: u64,
    pub new_tokens: u64,
    /// Hidden states the target pass captures.
    pub taps: u64,
    /// How the weights are held ("bf16", "f32"; gpt-oss MXFP4 experts dequantised at load, or
    /// kept packed).
    pub weights_as: String,
    pub weights_bytes: u64,
    pub workspace_bytes: u64,
    /// Decoding: every sequence's KV cache and recurrent state.
    pub kv_state_bytes: u64,
    /// Decoding: one prompt's prefill activations.
    pub prefill_bytes: u64,
    /// The target pass's activations.
    pub target_pass_bytes: u64,
    /// weights + workspace + max(kv_state + prefill, target pass).
    pub total_bytes: u64,
}

impl Estimate {
    /// `≈ 235.20 GiB at batch 64, prompt 1024 + 128 new tokens = weights … + workspace … + the
    /// larger of decoding (…) and the target pass (…)`: every term in GiB.
    pub fn describe(&self) -> String {
        let head = format!(
            "≈ {} = weights {} ({}) + workspace {}",
            gib(self.total_bytes),
            gib(self.weights_bytes),
            self.weights_as,
            gib(self.workspace_bytes)
        );
        if self.batch == 0 {
            return head;
        }
        format!(
            "≈ {} at batch {}, prompt {} + {} new tokens = weights {} ({}) + workspace {} + the larger of decoding (KV cache and recurrent state {} + prefill {}) and the target pass ({})",
            gib(self.total_bytes),
            self.batch,
            self.prompt_tokens,
            self.new_tokens,
            gib(self.weights_bytes),
            self.weights_as,
            gib(self.workspace_bytes),
            gib(self.kv_state_bytes),
            gib(self.prefill_bytes),
            gib(self.target_pass_bytes)
        )
    }

    /// Whether even the weights and the workspace exceed `free` bytes: no batch, prompt or pack
    /// size could make this model fit.
    pub fn weights_exceed(&self, free: u64) -> bool {
        self.weights_bytes + self.workspace_bytes > free
    }
}

/// The one-line refusal of a model that does not fit: `model` (its name and architecture) needs
/// `est` on `backend`, which has `free` bytes free.
pub fn does_not_fit(model: &str, backend: &str, est: &Estimate, free: u64) -> String {
    format!(
        "{model} does not fit in the {} free on {backend}: it needs {}; its weights and workspace alone take {}. Nothing was loaded or computed",
        gib(free),
        est.describe(),
        gib(est.weights_bytes + est.workspace_bytes)
    )
}

/// Bytes as GiB with two decimals, for messages.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_capacity_follows_the_reallocation_rule() {
        // Not decoded: the prefill's rows exactly.
        assert_eq!(kv_capacity(1000, 0), 1000);
        // One append doubles a long prompt's buffer, which then holds 1000 more rows.
        assert_eq!(kv_capacity(1000, 1), 2000);
        assert_eq!(kv_capacity(1000, 1000), 2000);
        assert_eq!(kv_capacity(1000, 1001), 4000);
        // Short buffers grow to 64 rows first.
        assert_eq!(kv_capacity(10, 5), 64);
        assert_eq!(kv_capacity(0, 3), 64);
        assert_eq!(kv_capacity(40, 100), 160);
    }
}
