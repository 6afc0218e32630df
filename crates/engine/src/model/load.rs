//! Opening a target model from disk: a GGUF file or a Hugging Face folder, with its tokenizer and
//! an identity (weights hash) used in cache keys and stored with every run; or a `random:DIR`
//! folder whose weights are generated (`super::random_target`, docs/loading.md §7).
//!
//! Opening reads headers only (config, safetensors/GGUF headers, tokenizer): no weight byte is
//! read, so `inspect` takes well under a second for any size. The weights hash is computed on
//! first use ([`TargetIdentity::weights_sha256`]) through the identity store
//! (`crate::identity`), which remembers each file's hash by its stamp: a model is hashed once,
//! not per command (docs/loading.md). A session starts that hash on background threads as soon as
//! it opens the target ([`TargetIdentity::hash_in_background`]), so that it overlaps the upload
//! of the weights instead of preceding it.

use super::config::ModelSpec;
use super::hybrid::HybridWeights;
use super::moe::{check_checkpoint, ffn_tensors, is_ffn_tensor};
use super::random_target::{random_dir, RandomSettings, RandomTarget};
use crate::formats::gguf::{GgufFile, GgufWeights};
use crate::formats::gguf_gpt_oss::GptOssGgufWeights;
use crate::formats::gguf_hybrid::HybridGgufWeights;
use crate::formats::gguf_moe::MoeGgufWeights;
use crate::formats::safetensors::SafetensorsWeights;
use crate::formats::{TensorInfo, WeightSource};
use crate::identity::{BackgroundHash, IdentityStore};
use crate::tokenizer::TextTokenizer;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Who the target is: stored with every run and part of every cache key.
#[derive(Debug)]
pub struct TargetIdentity {
    pub path: PathBuf,
    /// "gguf", "safetensors" or "random" (weights generated: `super::random_target`).
    pub format: &'static str,
    pub arch: String,
    /// The files [`TargetIdentity::weights_sha256`] covers, in hashing order.
    pub weight_files: Vec<PathBuf>,
    /// Where file hashes are remembered (`None`: hash once per process).
    store: Option<IdentityStore>,
    sha: OnceLock<String>,
    /// The hash started by [`TargetIdentity::hash_in_background`], until the first
    /// [`TargetIdentity::weights_sha256`] joins it.
    background: Mutex<Option<BackgroundHash>>,
    /// Why that background hash gave no identity: every later call answers the same error.
    failed: OnceLock<String>,
}

impl TargetIdentity {
    fn new(path: &Path, format: &'static str, arch: &str, weight_files: Vec<PathBuf>) -> Self {
        TargetIdentity {
            path: path.to_path_buf(),
            format,
            arch: arch.into(),
            weight_files,
            store: None,
            sha: OnceLock::new(),
            background: Mutex::new(None),
            failed: OnceLock::new(),
        }
    }

    /// sha256 over the weight files' bytes: the GGUF file's own hash; for safetensors the hash of
    /// the files' hex hashes concatenated in name order. Computed on first call (file hashes
    /// come from the identity store when their stamps match), or, when
    /// [`TargetIdentity::hash_in_background`] started it, waited for; kept for the process.
    pub fn weights_sha256(&self) -> Result<String> {
        if let Some(s) = self.sha.get() {
            return Ok(s.clone());
        }
        {
            // Held while joining: a second caller waits for this join instead of hashing again.
            let mut background = self.background.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = self.sha.get() {
                return Ok(s.clone());
            }
            if let Some(e) = self.failed.get() {
                bail!("{e}");
            }
            if let Some(started) = background.take() {
                return match started.join() {
                    Ok(hashes) => Ok(self.sha.get_or_init(|| self.combine(hashes)).clone()),
                    Err(e) => {
                        let e = format!("{e:#}");
                        let _ = self.failed.set(e.clone());
                        bail!("{e}")
                    }
                };
            }
        }
        // Hashed here, as before there was a background hash (its rayon tasks must not wait
        // behind a lock).
        use rayon::prelude::*;
        let hashes = self
            .weight_files
            .par_iter()
            .map(|f| match &self.store {
                Some(s) => s.file_sha256(f),
                None => crate::identity::hash_file(f),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.sha.get_or_init(|| self.combine(hashes)).clone())
    }

    /// Start hashing the weight files on background threads ([`BackgroundHash`]), unless the
    /// identity is known already or every file's hash is remembered (then nothing is read, as
    /// before). The first [`TargetIdentity::weights_sha256`] waits for it. A file that cannot be
    /// stat'ed now starts nothing: that call hashes on the spot and reports it.
    pub fn hash_in_background(&self) {
        if self.sha.get().is_some() || self.remembered_sha256().is_some() {
            return;
        }
        let mut background = self.background.lock().unwrap_or_else(|e| e.into_inner());
        if background.is_some() {
            return;
        }
        match BackgroundHash::start(&self.weight_files, self.store.clone()) {
            Ok(started) => *background = Some(started),
            Err(e) => tracing::debug!("weights not hashed in the background: {e:#}"),
        }
    }

    /// Whether a background hash was started and is not yet joined: the identity is not known
    /// yet, and asking for it waits for the hash.
    pub fn hashing_in_background(&self) -> bool {
        self.background
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Whether asking for the identity now would not wait for a running hash: none was started,
    /// it was joined, or its threads are done (the join then only checks the files' stamps).
    pub fn background_hash_done(&self) -> bool {
        self.background
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(BackgroundHash::is_finished)
    }

    /// The identity when every file's hash is remembered with a matching stamp; never reads a
    /// weight byte (`inspect`).
    pub fn remembered_sha256(&self) -> Option<String> {
        if let Some(s) = self.sha.get() {
            return Some(s.clone());
        }
        let store = self.store.as_ref()?;
        let hashes = self
            .weight_files
            .iter()
            .map(|f| store.remembered(f).ok().flatten())
            .collect::<Option<Vec<_>>>()?;
        Some(self.combine(hashes))
    }

    /// The identity from the weight files' sha256 hex strings, in [`TargetIdentity::weight_files`]
    /// order: a GGUF file's own hash; for safetensors the hash of them concatenated. Hashing
    /// runs the files side by side (rayon, or [`BackgroundHash`]'s threads): sha256 is sequential
    /// within a file, about 1 GB/s on one core, so a 16 GB folder of five shards took 16 s one file
    /// after another on the H200's host and takes the largest shard's time in parallel
    /// (docs/loading.md §2).
    fn combine(&self, file_hashes: Vec<String>) -> String {
        match self.format {
            "gguf" => file_hashes.concat(),
            _ => crate::util::sha256_bytes(file_hashes.concat().as_bytes()),
        }
    }

    /// `{path, format, weights_sha256, arch}`, as stored in a run's configuration.
    pub fn to_json(&self) -> Result<serde_json::Value> {
        Ok(serde_json::json!({
            "path": self.path, "format": self.format,
            "weights_sha256": self.weights_sha256()?, "arch": self.arch,
        }))
    }
}

/// A target on disk, opened but not yet uploaded to a backend.
pub struct TargetFiles {
    pub spec: ModelSpec,
    pub weights: Box<dyn WeightSource>,
    pub tokenizer: Option<TextTokenizer>,
    pub identity: TargetIdentity,
    /// How the weights are generated, for a `random:DIR` target (`None`: read from files).
    pub random: Option<RandomSettings>,
}

impl TargetFiles {
    /// Open `path`: a `.gguf` file, a folder with `config.json` and safetensors, or `random:DIR`
    /// (a folder with `config.json`, whose weights are generated).
    pub fn open(path: &Path) -> Result<TargetFiles> {
        if let Some(dir) = random_dir(path) {
            return Self::open_random(path, &dir);
        }
        if !path.exists() {
            bail!("{}: no such file or folder", path.display());
        }
        if path.is_dir() {
            Self::open_hf_dir(path)
        } else {
            Self::open_gguf(path)
        }
    }

    fn open_gguf(path: &Path) -> Result<TargetFiles> {
        let file = Arc::new(GgufFile::open(path)?);
        let spec = file.model_spec()?;
        let mut tokenizer = TextTokenizer::from_gguf(&file, path)?;
        tokenizer.check_vocab(spec.vocab_size, path)?;
        tokenizer.set_model_vocab(spec.vocab_size);
        let names: Box<dyn WeightSource> = match (&spec.hybrid, &spec.gpt_oss) {
            (Some(_), _) => Box::new(HybridGgufWeights::new(file.clone(), &spec)?),
            // gpt-oss: its own names, experts per expert (formats::gguf_gpt_oss).
            (None, Some(_)) => Box::new(GptOssGgufWeights::new(file.clone(), &spec)?),
            (None, None) => Box::new(GgufWeights::new(file.clone())?),
        };
        // Stacked experts served per expert under HF names (qwen3moe, qwen35moe, qwen3next).
        let names: Box<dyn WeightSource> = match &spec.moe {
            Some(moe) if spec.gpt_oss.is_none() => Box::new(MoeGgufWeights::new(names, file, moe)?),
            _ => names,
        };
        let weights: Box<dyn WeightSource> = match &spec.hybrid {
            // HF names and values back from llama.cpp's qwen35 / qwen3next layout; Qwen3-Next's
            // fused ssm_ba is un-grouped by HybridWeights as in a safetensors checkpoint.
            Some(hy) => Box::new(HybridWeights::new(names, hy)),
            None => names,
        };
        check_shapes(&spec, weights.as_ref())?;
        let identity = TargetIdentity::new(path, "gguf", spec.arch.as_str(), vec![path.into()]);
        Ok(TargetFiles {
            spec,
            weights,
            tokenizer: Some(tokenizer),
            identity,
            random: None,
        })
    }

    fn open_hf_dir(dir: &Path) -> Result<TargetFiles> {
        let spec = ModelSpec::from_hf_config(&dir.join("config.json"))?;
        let weights = hf_names(Box::new(SafetensorsWeights::open(dir)?), &spec);
        check_shapes(&spec, weights.as_ref())?;
        let tokenizer = hf_tokenizer(dir, &spec)?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("{}: cannot list folder", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        let identity = TargetIdentity::new(dir, "safetensors", spec.arch.as_str(), files);
        Ok(TargetFiles {
            spec,
            weights,
            tokenizer,
            identity,
            random: None,
        })
    }

    /// `random:DIR` (`path`): DIR's config and tokenizer as for a folder, the weights generated
    /// ([`RandomTarget::weights`]) and wrapped and checked as a folder's safetensors are; the
    /// identity known at once ([`RandomTarget::weights_sha256`]: nothing to hash).
    fn open_random(path: &Path, dir: &Path) -> Result<TargetFiles> {
        let target = RandomTarget::open(dir)?;
        let spec = ModelSpec::from_hf_config(&dir.join("config.json"))?;
        target.check_generatable(&spec)?;
        let random = target.weights(&spec, path);
        let sha = target.weights_sha256(&random);
        let weights = hf_names(Box::new(random), &spec);
        check_shapes(&spec, weights.as_ref())?;
        let tokenizer = hf_tokenizer(dir, &spec)?;
        let identity = TargetIdentity::new(path, "random", spec.arch.as_str(), Vec::new());
        identity
            .sha
            .set(sha)
            .expect("a new identity has no hash yet");
        Ok(TargetFiles {
            spec,
            weights,
            tokenizer,
            identity,
            random: Some(target.settings),
        })
    }

    /// Remember weight hashes in `store` (normally the cache's, [`IdentityStore::new`]).
    pub fn with_identity_store(mut self, store: IdentityStore) -> Self {
        self.identity.store = Some(store);
        self
    }

    /// Whether gpt-oss's expert weights reach the backend as MXFP4 bytes
    /// ([`crate::backend::Backend::matrix_mxfp4`], kept packed on CUDA): a folder's blocks
    /// (`quant_method` "mxfp4"), or a GGUF whose expert stacks are ggml MXFP4
    /// ([`crate::formats::gguf_gpt_oss::experts_are_mxfp4`]). What the memory estimate counts
    /// (`MemoryModel::with_mxfp4_experts`).
    pub fn mxfp4_experts(&self) -> bool {
        match &self.spec.gpt_oss {
            Some(g) if g.per_expert => {
                crate::formats::gguf_gpt_oss::experts_are_mxfp4(&self.weights.tensors())
            }
            Some(g) => g.mxfp4(),
            None => false,
        }
    }

    pub fn tokenizer(&self) -> Result<&TextTokenizer> {
        self.tokenizer.as_ref().with_context(|| {
            format!(
                "{}: no tokenizer.json next to the weights",
                self.identity.path.display()
            )
        })
    }
}

/// A Hugging Face folder's weights (`inner`) under the names the model code asks for: a hybrid's
/// Qwen3.5 checkpoint prefix, vision/MTP tensors and Qwen3-Next fused projections
/// ([`HybridWeights`]); the others as stored.
fn hf_names(inner: Box<dyn WeightSource>, spec: &ModelSpec) -> Box<dyn WeightSource> {
    match &spec.hybrid {
        Some(hy) => Box::new(HybridWeights::new(inner, hy)),
        None => inner,
    }
}

/// A Hugging Face folder's tokenizer (`tokenizer.json` and its companions), `None` without one.
fn hf_tokenizer(dir: &Path, spec: &ModelSpec) -> Result<Option<TextTokenizer>> {
    if !dir.join("tokenizer.json").exists() {
        return Ok(None);
    }
    let mut t = TextTokenizer::from_hf_dir(dir)?;
    t.check_vocab(spec.vocab_size, &dir.join("tokenizer.json"))?;
    t.set_model_vocab(spec.vocab_size);
    Ok(Some(t))
}

/// Refuse a model whose stored shapes disagree with its config before uploading anything.
pub fn check_shapes(spec: &ModelSpec, w: &dyn WeightSource) -> Result<()> {
    let (d, hd) = (spec.hidden_size, spec.head_dim);
    let mut want: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![spec.vocab_size, d]),
        ("model.norm.weight".into(), vec![d]),
    ];
    let infos = w.tensors();
    if let Some(g) = &spec.gpt_oss {
        // Expert storage, MXFP4 blocks and scales, expert counts, the router's bias.
        super::gpt_oss::check_checkpoint(spec, g, &infos, w.path())?;
        want.extend(super::gpt_oss::layer_tensors(spec, g));
        return check_present(&want, &infos, w.path());
    }
    for l in 0..spec.num_layers {
        if let Some(hy) = &spec.hybrid {
            // Hybrids: every tensor of the layer's kind, incl. the GDN state parameters A_log and
            // dt_bias and the gated attention's doubled q_proj (its MLP below).
            want.extend(
                hy.layer_tensors(spec, l)
                    .into_iter()
                    .filter(|(n, _)| !is_ffn_tensor(n)),
            );
        } else {
            let p = format!("model.layers.{l}");
            want.push((
                format!("{p}.self_attn.q_proj.weight"),
                vec![spec.num_heads * hd, d],
            ));
            want.push((
                format!("{p}.self_attn.k_proj.weight"),
                vec![spec.num_kv_heads * hd, d],
            ));
            want.push((
                format!("{p}.self_attn.v_proj.weight"),
                vec![spec.num_kv_heads * hd, d],
            ));
            want.push((
                format!("{p}.self_attn.o_proj.weight"),
                vec![d, spec.num_heads * hd],
            ));
        }
        // Dense SwiGLU, or the router, every expert and the shared expert of a sparse layer.
        want.extend(ffn_tensors(spec, l));
    }
    // Expert layout, router bias, expert ids: one message before the per-tensor checks.
    check_checkpoint(spec, &infos, w.path())?;
    check_present(&want, &infos, w.path())
}

/// Refuse a target holding a tensor of its text model (`model.*`, `lm_head.weight`) in a dtype
/// the loader cannot read: anything but [`crate::formats::dequant::SUPPORTED`] (an FP8, int8 or
/// otherwise quantised checkpoint; a GGUF type draftlens does not dequantise), gpt-oss's MXFP4
/// blocks and scales (U8) aside. One message naming the file, the tensor and its dtype. Called
/// when a command opens the target to run it (`Session::load`), before any weight is read;
/// `inspect` opens files without it, so that it can list such a file's tensors.
pub fn check_readable(w: &dyn WeightSource) -> Result<()> {
    use crate::formats::dequant::SUPPORTED;
    let readable = |dtype: &str| SUPPORTED.split(", ").any(|s| s == dtype);
    for t in w.tensors() {
        let text_model = t.name.starts_with("model.") || t.name == "lm_head.weight";
        let mxfp4 = (t.name.ends_with("_blocks") || t.name.ends_with("_scales")) && t.dtype == "U8";
        if text_model && !mxfp4 && !readable(&t.dtype) {
            bail!(
                "{}: tensor {} ({}) is stored as {}, which draftlens cannot read (it reads {SUPPORTED}, and gpt-oss's MXFP4 expert blocks): a checkpoint quantised another way is not supported; use its unquantised original",
                w.path().display(),
                t.name,
                t.file_name,
                t.dtype
            );
        }
    }
    Ok(())
}

/// Every tensor of `want` is in `infos` with that shape; errors name `path` and the tensor.
fn check_present(want: &[(String, Vec<usize>)], infos: &[TensorInfo], path: &Path) -> Result<()> {
    // By name: an MoE checkpoint has tens of thousands of tensors (Qwen3-30B-A3B: 18,867).
    let by_name: HashMap<&str, &TensorInfo> = infos.iter().map(|t| (t.name.as_str(), t)).collect();
    for (name, shape) in want {
        match by_name.get(name.as_str()) {
            None => bail!("{}: tensor {name} is missing", path.display()),
            Some(t) if t.shape != *shape => {
                bail!(
                    "{}: tensor {name} ({}) has shape {:?}, the config implies {:?}",
                    path.display(),
                    t.file_name,
                    t.shape,
                    shape
                )
            }
            _ => {}
        }
    }
    Ok(())
}
