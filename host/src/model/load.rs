//! Opening a target model from disk: a GGUF file or a Hugging Face folder, with its tokenizer and
//! an identity (weights hash) used in cache keys and stored with every run.

use super::config::ModelSpec;
use super::hybrid::HybridWeights;
use crate::formats::gguf::{GgufFile, GgufWeights};
use crate::formats::safetensors::SafetensorsWeights;
use crate::formats::WeightSource;
use crate::tokenizer::TextTokenizer;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Who the target is: stored with every run and part of every cache key.
#[derive(Clone, Debug, Serialize)]
pub struct TargetIdentity {
    pub path: PathBuf,
    /// "gguf" or "safetensors".
    pub format: &'static str,
    /// sha256 over the weight files' bytes (GGUF file; safetensors files in name order).
    pub weights_sha256: String,
    pub arch: String,
}

/// A target on disk, opened but not yet uploaded to a backend.
pub struct TargetFiles {
    pub spec: ModelSpec,
    pub weights: Box<dyn WeightSource>,
    pub tokenizer: Option<TextTokenizer>,
    pub identity: TargetIdentity,
}

impl TargetFiles {
    /// Open `path`: a `.gguf` file or a folder with `config.json` and safetensors.
    pub fn open(path: &Path) -> Result<TargetFiles> {
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
        let tokenizer = TextTokenizer::from_gguf(&file, path)?;
        tokenizer.check_vocab(spec.vocab_size, path)?;
        let weights = GgufWeights::new(file)?;
        check_shapes(&spec, &weights)?;
        let identity = TargetIdentity {
            path: path.to_path_buf(),
            format: "gguf",
            weights_sha256: crate::util::sha256_file(path)?,
            arch: spec.arch.as_str().into(),
        };
        Ok(TargetFiles {
            spec,
            weights: Box::new(weights),
            tokenizer: Some(tokenizer),
            identity,
        })
    }

    fn open_hf_dir(dir: &Path) -> Result<TargetFiles> {
        let spec = ModelSpec::from_hf_config(&dir.join("config.json"))?;
        let weights: Box<dyn WeightSource> = match &spec.hybrid {
            // Qwen3.5 checkpoint prefix, vision/MTP tensors, Qwen3-Next fused projections.
            Some(hy) => Box::new(HybridWeights::new(
                Box::new(SafetensorsWeights::open(dir)?),
                hy,
            )),
            None => Box::new(SafetensorsWeights::open(dir)?),
        };
        check_shapes(&spec, weights.as_ref())?;
        let tokenizer = if dir.join("tokenizer.json").exists() {
            let t = TextTokenizer::from_hf_dir(dir)?;
            t.check_vocab(spec.vocab_size, &dir.join("tokenizer.json"))?;
            Some(t)
        } else {
            None
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("{}: cannot list folder", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        let mut joined = String::new();
        for f in &files {
            joined.push_str(&crate::util::sha256_file(f)?);
        }
        let identity = TargetIdentity {
            path: dir.to_path_buf(),
            format: "safetensors",
            weights_sha256: crate::util::sha256_bytes(joined.as_bytes()),
            arch: spec.arch.as_str().into(),
        };
        Ok(TargetFiles {
            spec,
            weights,
            tokenizer,
            identity,
        })
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

/// Refuse a model whose stored shapes disagree with its config before uploading anything.
pub fn check_shapes(spec: &ModelSpec, w: &dyn WeightSource) -> Result<()> {
    let (d, hd, i) = (spec.hidden_size, spec.head_dim, spec.intermediate_size);
    let mut want: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![spec.vocab_size, d]),
        ("model.norm.weight".into(), vec![d]),
    ];
    for l in 0..spec.num_layers {
        if let Some(hy) = &spec.hybrid {
            // Hybrids: every tensor of the layer's kind, incl. the GDN state parameters A_log and
            // dt_bias and the gated attention's doubled q_proj.
            want.extend(hy.layer_tensors(spec, l));
            continue;
        }
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
        want.push((format!("{p}.mlp.gate_proj.weight"), vec![i, d]));
        want.push((format!("{p}.mlp.up_proj.weight"), vec![i, d]));
        want.push((format!("{p}.mlp.down_proj.weight"), vec![d, i]));
    }
    let infos = w.tensors();
    for (name, shape) in want {
        match infos.iter().find(|t| t.name == name) {
            None => bail!("{}: tensor {name} is missing", w.path().display()),
            Some(t) if t.shape != shape => {
                bail!(
                    "{}: tensor {name} ({}) has shape {:?}, the config implies {:?}",
                    w.path().display(),
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
