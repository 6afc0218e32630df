//! The cache keys of a session's entries: what identifies the target (weights, tokenizer), the
//! backend and the numerics that computed an entry. A change to any key string orphans every
//! cached entry; tests/cache_key_pins.rs pins them byte for byte.

use super::Session;
use crate::backend::{Backend, GdnProfile};
use crate::hidden_cache::CacheKey;
use crate::model::Capture;
use anyhow::Result;

/// Bumped whenever model code or kernels change numerics, so cached entries are recomputed.
/// 3: CUDA GEMMs of ≤ 64 rows and decode attention on the batch-invariant decode kernels.
/// 4: CUDA decode attention splits caches of ≥ 512 keys into chunks (split-KV, another order).
/// 5: CUDA decode attention splits caches of ≥ 64 keys into chunks of 64 (doubling from 4 096).
/// 6: CUDA decode GEMMs on pinned cuBLASLt algorithms; decode attention in 32-key tiles (another
///    order of the scores and the softmax sums).
/// 7: CUDA top-K of ≤ 64 rows in slices of 4 096 logits (another order of the log-sum-exp).
/// 8: CUDA top-K scans its logits in float4 groups of 16 (another order of the log-sum-exp).
/// 9: CUDA top-K's float4 groups end at a warp-uniform count (a row's last groups fold one value
///    at a time: another order of the log-sum-exp near the end of a row).
pub const MODEL_CODE_VERSION: &str = "9";

impl<B: Backend> Session<B> {
    /// The cache keys' `kernel_version`: backend, dtype and [`MODEL_CODE_VERSION`], and for a
    /// hybrid target the GDN profile with the backend's tag of the kernels computing it
    /// ([`Backend::gdn_cache_tag`]).
    fn kernel_version(&self) -> String {
        let v = format!(
            "{}-{}-v{MODEL_CODE_VERSION}",
            self.be.name(),
            self.be.dtype()
        );
        // Dense targets have no GDN, and the reference profile keeps the keys it always had
        // (no profile name; its tag is "" on every backend today).
        let profile = self.opts.gdn_profile;
        match (self.files.spec.hybrid.is_some(), profile) {
            (false, _) => v,
            (true, GdnProfile::Reference) => format!("{v}{}", self.be.gdn_cache_tag(profile)),
            (true, GdnProfile::Engine) => {
                format!("{v}-gdn-engine{}", self.be.gdn_cache_tag(profile))
            }
        }
    }

    /// A key of this target, backend and numerics for an entry of `kind` over `token_ids`.
    pub(super) fn key(
        &self,
        kind: &str,
        token_ids: &[u32],
        layers: Vec<usize>,
        extra: String,
    ) -> Result<CacheKey> {
        Ok(CacheKey {
            kind: kind.into(),
            weights: self.files.identity.weights_sha256()?,
            tokenizer: self.files.tokenizer()?.fingerprint(),
            token_ids: token_ids.to_vec(),
            layers,
            backend: self.be.name().into(),
            dtype: self.be.dtype().into(),
            kernel_version: self.kernel_version(),
            extra,
        })
    }

    /// The cache key of an entry derived from the target's outputs over `ids` (a drafter's
    /// records): the target's identity, backend and code version, plus `kind` and `extra`.
    pub fn derived_key(
        &self,
        kind: &str,
        ids: &[u32],
        layers: Vec<usize>,
        extra: String,
    ) -> Result<CacheKey> {
        self.key(kind, ids, layers, extra)
    }

    /// The key of a target pass over `ids` capturing `capture` with the target's top-`k`.
    pub(super) fn pass_key(&self, ids: &[u32], capture: &Capture, k: usize) -> Result<CacheKey> {
        self.key("taps", ids, capture.indices.clone(), format!("topk={k}"))
    }
}
