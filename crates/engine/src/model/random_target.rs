//! `--target random:DIR`: a target whose weights are generated at load instead of read from
//! files (docs/loading.md §7), for models the GPU machine's 64 GiB disk cannot hold
//! (Qwen3.5-35B-A3B's 70 GB of bf16, gpt-oss-120b's 65 GB of MXFP4) and for a too-large model's
//! refusal. DIR holds what a Hugging Face folder holds but the weights: `config.json`, the
//! tokenizer files, and optionally `random.json`
//!
//! ```json
//! {"seed": 0, "init": {"matrix_std": 0.02, "norm_spread": 0.1}}
//! ```
//!
//! (both keys optional: seed 0 and [`RandomWeights`]' default ranges, matrices uniform in
//! ±0.0346, norm weights in 1 ± 0.1). The weights are a [`RandomWeights`] served as a bf16
//! checkpoint ([`RandomWeights::as_bf16_checkpoint`]; gpt-oss's experts as MXFP4 blocks and
//! scales when its config says `quant_method` "mxfp4"), wrapped by `TargetFiles::open` exactly
//! as a folder's safetensors are, so that the loader, the upload, the memory estimate and the
//! forward are a real folder's. Their identity is not a file hash: [`RandomTarget::weights_sha256`].

use super::config::ModelSpec;
use super::random::RandomWeights;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What a target path starts with to name a folder whose weights are generated.
pub const PREFIX: &str = "random:";

/// The first bytes hashed into a random target's identity: the generator's version. A change to
/// the values generated for some (config, seed, init) must change it, so that cache entries of
/// the old values are never taken for the new ones.
pub const IDENTITY_VERSION: &str = "draftlens random weights v1";

/// The optional settings file in DIR.
pub const SETTINGS_FILE: &str = "random.json";

/// `DIR` of a `random:DIR` target path; `None` for any other path.
pub fn random_dir(target: &Path) -> Option<PathBuf> {
    target.to_str()?.strip_prefix(PREFIX).map(PathBuf::from)
}

/// Whether `target` names something `TargetFiles::open` can open: an existing file or folder, or
/// `random:DIR` with DIR an existing folder (commands that check a stored or given target path
/// before opening it).
pub fn target_exists(target: &Path) -> bool {
    match random_dir(target) {
        Some(dir) => dir.is_dir(),
        None => target.exists(),
    }
}

/// `random.json`'s `init`: the matrices' standard deviation (uniform values in ±√3·std) and the
/// norm weights' spread around 1 ([`RandomWeights::with_init`]).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Init {
    pub matrix_std: f32,
    pub norm_spread: f32,
}

/// `random.json` as read (every key optional).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RandomSettings {
    #[serde(default)]
    pub seed: u64,
    /// `None`: [`RandomWeights`]' default ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<Init>,
}

impl RandomSettings {
    /// The matrices' half-width and the norm weights' spread these settings give
    /// ([`RandomWeights::with_init`], or its defaults).
    pub fn ranges(&self) -> (f32, f32) {
        match self.init {
            Some(i) => (i.matrix_std * 3f32.sqrt(), i.norm_spread),
            None => (
                super::random::DEFAULT_MATRIX_HALF_WIDTH,
                super::random::DEFAULT_NORM_SPREAD,
            ),
        }
    }
}

/// A `random:DIR` target's folder, opened: its settings and its config's bytes (hashed into the
/// identity).
pub struct RandomTarget {
    pub dir: PathBuf,
    pub settings: RandomSettings,
    config: Vec<u8>,
}

impl RandomTarget {
    /// Read DIR's `config.json` (required) and `random.json` (optional); errors name the file
    /// and the key.
    pub fn open(dir: &Path) -> Result<RandomTarget> {
        if !dir.is_dir() {
            bail!(
                "{}: no such folder ({PREFIX}DIR names a folder holding the config.json and tokenizer of the model whose weights are generated)",
                dir.display()
            );
        }
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            bail!(
                "{}: missing: a {PREFIX} target's folder holds the config.json of the model to generate (and its tokenizer files); tools/bench/make_random_target.py --no-weights writes one",
                config_path.display()
            );
        }
        let config = std::fs::read(&config_path)
            .with_context(|| format!("{}: cannot read", config_path.display()))?;
        let path = dir.join(SETTINGS_FILE);
        let settings = if path.exists() {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("{}: cannot read", path.display()))?;
            let s: RandomSettings = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{}: expected {{\"seed\": N, \"init\": {{\"matrix_std\": S, \"norm_spread\": R}}}} (both keys optional)",
                    path.display()
                )
            })?;
            if let Some(i) = &s.init {
                if !(i.matrix_std.is_finite() && i.matrix_std > 0.0) {
                    bail!(
                        "{}: init.matrix_std must be a positive number, found {}",
                        path.display(),
                        i.matrix_std
                    );
                }
                if !(i.norm_spread.is_finite() && i.norm_spread >= 0.0) {
                    bail!(
                        "{}: init.norm_spread must be a number ≥ 0, found {}",
                        path.display(),
                        i.norm_spread
                    );
                }
            }
            s
        } else {
            RandomSettings::default()
        };
        Ok(RandomTarget {
            dir: dir.to_path_buf(),
            settings,
            config,
        })
    }

    /// Refuse a config whose weights these random ones would misrepresent: a
    /// `quantization_config` other than gpt-oss's MXFP4 experts (the generated weights are bf16;
    /// `ModelSpec::from_hf_config` ignores the key for the other families, where a real folder's
    /// quantised tensors are refused by `check_readable`). Call after the spec is read (which
    /// names an unknown architecture or a bad key itself).
    pub fn check_generatable(&self, spec: &ModelSpec) -> Result<()> {
        let path = self.dir.join("config.json");
        let raw: serde_json::Value = serde_json::from_slice(&self.config)
            .with_context(|| format!("{}: not a valid config.json", path.display()))?;
        let quantization = [Some(&raw), raw.get("text_config")]
            .into_iter()
            .flatten()
            .find_map(|c| c.get("quantization_config").filter(|q| !q.is_null()));
        let mxfp4_experts = spec.gpt_oss.as_ref().is_some_and(|g| g.mxfp4());
        if let (Some(q), false) = (quantization, mxfp4_experts) {
            let method = q
                .get("quant_method")
                .map_or("(no quant_method)".to_string(), |m| m.to_string());
            bail!(
                "{}: quantization_config (quant_method {method}) cannot be generated: a {PREFIX} target's weights are bf16 (gpt_oss's experts MXFP4 blocks); remove the key to generate the unquantised {} model",
                path.display(),
                spec.arch.as_str()
            );
        }
        Ok(())
    }

    /// The weights of `spec` (read from this folder's config), served as a bf16 checkpoint
    /// under `target` (the `random:DIR` path, shown in every error about them).
    pub fn weights(&self, spec: &ModelSpec, target: &Path) -> RandomWeights {
        let w = RandomWeights::new(spec, self.settings.seed);
        let w = match self.settings.init {
            Some(i) => w.with_init(i.matrix_std, i.norm_spread),
            None => w,
        };
        w.as_bf16_checkpoint(spec, target.to_path_buf())
    }

    /// The identity stored with runs and cache entries in place of a file hash (docs/loading.md
    /// §7): sha256 of [`IDENTITY_VERSION`], a newline, config.json's bytes as stored, a newline,
    /// and `seed N matrix_half_width H norm_spread S` (H and S the f32 bit patterns in 8 hex
    /// digits): what decides every value. It never equals a hash of weight files.
    pub fn weights_sha256(&self, weights: &RandomWeights) -> String {
        let (seed, half_width, spread) = weights.init();
        let mut bytes = Vec::with_capacity(self.config.len() + 128);
        bytes.extend_from_slice(IDENTITY_VERSION.as_bytes());
        bytes.push(b'\n');
        bytes.extend_from_slice(&self.config);
        bytes.push(b'\n');
        bytes.extend_from_slice(
            format!(
                "seed {seed} matrix_half_width {:08x} norm_spread {:08x}",
                half_width.to_bits(),
                spread.to_bits()
            )
            .as_bytes(),
        );
        crate::util::sha256_bytes(&bytes)
    }
}
