//! Drafters in GGUF as llama.cpp's `convert_hf_to_gguf.py` writes them (docs/gguf-drafters.md),
//! mapped to the Hugging Face layouts at load: a `.gguf` file given where a checkpoint folder is
//! expected reads as that folder would, through two views:
//!
//! - [`config_json`]: the file's metadata translated to the `config.json` the family's own parser
//!   reads (`dflash.target_layers` shifted back by one, `tokenizer.ggml.mask_token_id` as
//!   `dflash_config.mask_token_id`, …), so every rule of that parser applies unchanged;
//! - [`open_weights`]: the tensors under the checkpoint's names (`blk.0.attn_q.weight` →
//!   `layers.0.self_attn.q_proj.weight`), dequantised by the GGUF target reader
//!   (`crate::formats::gguf`).
//!
//! [`GgufDrafter::open`] refuses, before anything is computed, a file whose architecture is not a
//! drafter this module maps, whose keys are missing or of the wrong type, or that holds a tensor
//! with no place in the layout (one error naming the file and the key or tensor).
//! [`against::against`] compares a converted file with the checkpoint it came from (`lint
//! --against`). The per-family rules live in `dflash.rs` and `eagle3.rs`.

pub mod against;
mod dflash;
mod eagle3;

use crate::backend::raw::RawPart;
use crate::formats::gguf::GgufFile;
use crate::formats::safetensors::SafetensorsWeights;
use crate::formats::{HostTensor, TensorInfo, WeightSource};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The GGUF magic, the file's first four bytes.
const MAGIC: &[u8; 4] = b"GGUF";

/// Whether `path` is a GGUF file (a regular file that starts with the GGUF magic).
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    if !path.is_file() {
        return false;
    }
    let mut head = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && &head == MAGIC
}

/// The drafter families llama.cpp writes to GGUF that this module maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufArch {
    /// `general.architecture = dflash` (llama.cpp's `DFlashModel`).
    DFlash,
    /// `general.architecture = eagle3` (llama.cpp's `LlamaModel` in EAGLE-3 mode).
    Eagle3,
}

impl GgufArch {
    pub fn name(self) -> &'static str {
        match self {
            GgufArch::DFlash => "dflash",
            GgufArch::Eagle3 => "eagle3",
        }
    }
}

/// How a stored tensor becomes the checkpoint's tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transform {
    /// The values as stored.
    AsIs,
    /// llama.cpp's Q/K row permutation (the `llama` architectures, EAGLE-3) reversed for this
    /// many heads (docs/models.md §3.6).
    Unpermute(usize),
    /// llama.cpp stores EAGLE-3's `d2t` as absolute target ids (`d2t + arange`); the checkpoint
    /// holds offsets.
    AbsoluteToOffsets,
}

/// One stored tensor under its checkpoint name.
#[derive(Clone, Debug)]
pub(crate) struct Mapped {
    pub gguf_name: String,
    pub transform: Transform,
}

/// A GGUF drafter: the parsed file, its family, the translated `config.json` and the name map.
pub struct GgufDrafter {
    pub file: Arc<GgufFile>,
    pub arch: GgufArch,
    /// The `config.json` the family's parser reads (see the module doc).
    pub config: Value,
    /// Checkpoint name → stored tensor.
    pub(crate) tensors: BTreeMap<String, Mapped>,
}

impl GgufDrafter {
    /// Parse `path` and map it (see the module doc for what is refused).
    pub fn open(path: &Path) -> Result<GgufDrafter> {
        let file = Arc::new(GgufFile::open(path)?);
        let p = path.display();
        let arch = match file.architecture() {
            Some("dflash") => GgufArch::DFlash,
            Some("eagle3") => GgufArch::Eagle3,
            Some(other) => bail!("{p}: general.architecture is {other:?}, not a drafter llama.cpp writes (dflash, eagle3); a target model is given with --target"),
            None => bail!("{p}: metadata has no general.architecture"),
        };
        let (config, tensors) = match arch {
            GgufArch::DFlash => dflash::map(&file)?,
            GgufArch::Eagle3 => eagle3::map(&file)?,
        };
        Ok(GgufDrafter {
            file,
            arch,
            config,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The translated `config.json` as bytes (what a run's drafter identity hashes).
    pub fn config_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(&self.config).expect("a JSON value serialises")
    }
}

/// A drafter's `config.json` and the path its messages name: `<dir>/config.json` for a
/// checkpoint folder, the file itself for a GGUF drafter (its metadata translated).
pub fn config_json(path: &Path) -> Result<(PathBuf, Value)> {
    if is_gguf(path) {
        let g = GgufDrafter::open(path)?;
        return Ok((path.to_path_buf(), g.config));
    }
    let file = path.join("config.json");
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("{}: cannot read the drafter config", file.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", file.display()))?;
    Ok((file, v))
}

/// The file a drafter's weights are in: `<dir>/model.safetensors`, or the GGUF file itself.
pub fn weights_file(path: &Path) -> PathBuf {
    if is_gguf(path) {
        path.to_path_buf()
    } else {
        path.join(crate::formats::safetensors::SINGLE_FILE)
    }
}

/// A drafter's weights under the checkpoint's names, from a folder or a GGUF file.
pub enum DrafterWeights {
    Safetensors(SafetensorsWeights),
    Gguf(GgufWeightsView),
}

/// Open the weights of checkpoint folder or GGUF file `path`.
pub fn open_weights(path: &Path) -> Result<DrafterWeights> {
    Ok(if is_gguf(path) {
        DrafterWeights::Gguf(GgufWeightsView::new(GgufDrafter::open(path)?))
    } else {
        DrafterWeights::Safetensors(SafetensorsWeights::open(path)?)
    })
}

impl DrafterWeights {
    /// An integer tensor (EAGLE-3's `d2t` / `t2d`) with its shape.
    pub fn integers(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        match self {
            DrafterWeights::Safetensors(w) => w.integers(name),
            DrafterWeights::Gguf(w) => w.integers(name),
        }
    }

    /// The file the weights are in (messages name it).
    pub fn file(&self) -> PathBuf {
        match self {
            DrafterWeights::Safetensors(w) => {
                w.path().join(crate::formats::safetensors::SINGLE_FILE)
            }
            DrafterWeights::Gguf(w) => w.path().to_path_buf(),
        }
    }
}

impl WeightSource for DrafterWeights {
    fn path(&self) -> &Path {
        match self {
            DrafterWeights::Safetensors(w) => w.path(),
            DrafterWeights::Gguf(w) => w.path(),
        }
    }
    fn contains(&self, name: &str) -> bool {
        match self {
            DrafterWeights::Safetensors(w) => w.contains(name),
            DrafterWeights::Gguf(w) => w.contains(name),
        }
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        match self {
            DrafterWeights::Safetensors(w) => w.tensors(),
            DrafterWeights::Gguf(w) => w.tensors(),
        }
    }
    fn tensor(&self, name: &str) -> Result<HostTensor> {
        match self {
            DrafterWeights::Safetensors(w) => w.tensor(name),
            DrafterWeights::Gguf(w) => w.tensor(name),
        }
    }
    fn raw(&self, name: &str) -> Result<Option<RawPart<'_>>> {
        match self {
            DrafterWeights::Safetensors(w) => w.raw(name),
            DrafterWeights::Gguf(_) => Ok(None),
        }
    }
    fn release(&self, name: &str) {
        if let DrafterWeights::Safetensors(w) = self {
            w.release(name)
        }
    }
}

/// A GGUF drafter's tensors under the checkpoint's names, dequantised to f32.
pub struct GgufWeightsView {
    drafter: GgufDrafter,
}

impl GgufWeightsView {
    pub fn new(drafter: GgufDrafter) -> GgufWeightsView {
        GgufWeightsView { drafter }
    }

    pub fn drafter(&self) -> &GgufDrafter {
        &self.drafter
    }

    fn mapped(&self, name: &str) -> Result<&Mapped> {
        self.drafter.tensors.get(name).with_context(|| {
            format!(
                "{}: no tensor maps to {name}",
                self.drafter.path().display()
            )
        })
    }

    /// An integer tensor (I32 / I64) with its shape, offsets for `d2t`.
    pub fn integers(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let m = self.mapped(name)?;
        read_integers(&self.drafter.file, &m.gguf_name, m.transform)
    }
}

/// Integer tensor `gguf_name` (I32 / I64) with its shape, under `transform` (absolute `d2t`
/// ids back to offsets).
pub(crate) fn read_integers(
    file: &GgufFile,
    gguf_name: &str,
    transform: Transform,
) -> Result<(Vec<usize>, Vec<i64>)> {
    use crate::formats::dequant::GgmlType;
    let p = file.path().display();
    let t = file
        .tensor_info(gguf_name)
        .with_context(|| format!("{p}: no tensor {gguf_name}"))?;
    let bytes = file.tensor_data(t);
    let mut v: Vec<i64> = match t.ty {
        GgmlType::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
        GgmlType::I32 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
            .collect(),
        other => bail!("{p}: tensor {gguf_name} is {other}, expected an integer type (I32, I64)"),
    };
    if transform == Transform::AbsoluteToOffsets {
        for (i, x) in v.iter_mut().enumerate() {
            *x -= i as i64;
        }
    }
    Ok((t.shape(), v))
}

impl WeightSource for GgufWeightsView {
    fn path(&self) -> &Path {
        self.drafter.path()
    }

    fn contains(&self, name: &str) -> bool {
        self.drafter.tensors.contains_key(name)
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.drafter
            .tensors
            .iter()
            .map(|(name, m)| {
                let t = self
                    .drafter
                    .file
                    .tensor_info(&m.gguf_name)
                    .expect("mapped tensors exist");
                TensorInfo {
                    name: name.clone(),
                    file_name: m.gguf_name.clone(),
                    dtype: t.ty.name().to_string(),
                    shape: t.shape(),
                    bytes: t.n_bytes,
                }
            })
            .collect()
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let m = self.mapped(name)?;
        let mut t = self.drafter.file.dequantize(&m.gguf_name)?;
        match m.transform {
            Transform::AsIs => {}
            Transform::Unpermute(heads) => t = unpermute_rows(&t, heads),
            Transform::AbsoluteToOffsets => {
                for (i, x) in t.data.iter_mut().enumerate() {
                    *x -= i as f32;
                }
            }
        }
        Ok(t)
    }
}

/// Rows of a q/k projection (or a 1-D q/k vector) in Hugging Face order again (the mapping
/// checked that the rows are a whole number of heads of even size).
fn unpermute_rows(t: &HostTensor, heads: usize) -> HostTensor {
    let rows = t.shape[0];
    let row_len = t.data.len() / rows.max(1);
    let mut data = vec![0f32; t.data.len()];
    for (r, out) in data.chunks_exact_mut(row_len).enumerate() {
        let s = crate::formats::gguf::llama_unpermute_src_row(r, rows, heads);
        out.copy_from_slice(&t.data[s * row_len..(s + 1) * row_len]);
    }
    HostTensor {
        shape: t.shape.clone(),
        data,
    }
}

/// Typed access to `<arch>.*` metadata with errors that name the file and the key.
pub(crate) struct Meta<'a> {
    pub file: &'a GgufFile,
    pub arch: &'static str,
}

impl Meta<'_> {
    pub fn key(&self, k: &str) -> String {
        if k.starts_with("tokenizer.") || k.starts_with("general.") {
            k.to_string()
        } else {
            format!("{}.{k}", self.arch)
        }
    }

    fn p(&self) -> std::path::Display<'_> {
        self.file.path().display()
    }

    pub fn has(&self, k: &str) -> bool {
        self.file.metadata().contains_key(&self.key(k))
    }

    pub fn opt_uint(&self, k: &str) -> Result<Option<u64>> {
        let full = self.key(k);
        match self.file.metadata().get(&full) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) => Ok(Some(n)),
                None => bail!(
                    "{}: metadata key {full} should be an unsigned integer, found {}",
                    self.p(),
                    v.type_name()
                ),
            },
        }
    }

    pub fn uint(&self, k: &str) -> Result<u64> {
        self.opt_uint(k)?
            .with_context(|| format!("{}: metadata key {} is missing", self.p(), self.key(k)))
    }

    pub fn opt_float(&self, k: &str) -> Result<Option<f64>> {
        use crate::formats::gguf::GgufValue;
        let full = self.key(k);
        match self.file.metadata().get(&full) {
            None => Ok(None),
            Some(GgufValue::F32(x)) => Ok(Some(*x as f64)),
            Some(GgufValue::F64(x)) => Ok(Some(*x)),
            Some(v) => bail!(
                "{}: metadata key {full} should be a float, found {}",
                self.p(),
                v.type_name()
            ),
        }
    }

    pub fn float(&self, k: &str) -> Result<f64> {
        self.opt_float(k)?
            .with_context(|| format!("{}: metadata key {} is missing", self.p(), self.key(k)))
    }

    pub fn opt_bool(&self, k: &str) -> Result<Option<bool>> {
        let full = self.key(k);
        match self.file.metadata().get(&full) {
            None => Ok(None),
            Some(crate::formats::gguf::GgufValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => bail!(
                "{}: metadata key {full} should be a bool, found {}",
                self.p(),
                v.type_name()
            ),
        }
    }

    /// An array of non-negative integers.
    pub fn uint_array(&self, k: &str) -> Result<Vec<u64>> {
        let full = self.key(k);
        let p = self.p();
        let v = self
            .file
            .metadata()
            .get(&full)
            .with_context(|| format!("{p}: metadata key {full} is missing"))?;
        match v {
            crate::formats::gguf::GgufValue::Array(a) => a
                .iter()
                .map(|x| {
                    x.as_u64().with_context(|| {
                        format!("{p}: metadata key {full} should hold non-negative integers, found {x:?}")
                    })
                })
                .collect(),
            other => bail!(
                "{p}: metadata key {full} should be an array of integers, found {}",
                other.type_name()
            ),
        }
    }

    /// Refuse a key whose meaning the mapped layout has no place for (`why` says what it is).
    pub fn refuse(&self, k: &str, why: &str) -> Result<()> {
        if self.has(k) {
            bail!("{}: metadata key {} is set: {why}", self.p(), self.key(k));
        }
        Ok(())
    }
}

/// The vocabulary size a converted drafter declares: the length of `tokenizer.ggml.tokens`
/// (the target's tokenizer, which the converter copies), if present.
fn tokenizer_len(file: &GgufFile) -> Option<usize> {
    match file.metadata().get("tokenizer.ggml.tokens") {
        Some(crate::formats::gguf::GgufValue::Array(a)) => Some(a.len()),
        _ => None,
    }
}

/// `lint`'s `gguf` finding for a GGUF drafter: how its metadata and tensors were read.
pub fn finding(path: &Path) -> Result<crate::drafter::lint::Finding> {
    let d = GgufDrafter::open(path)?;
    let types: std::collections::BTreeSet<&str> =
        d.file.tensors().iter().map(|t| t.ty.name()).collect();
    let types = types.into_iter().collect::<Vec<_>>().join("+");
    let n = d.file.tensors().len();
    let stored = d
        .file
        .get_i64_array(&format!("{}.target_layers", d.arch.name()))
        .unwrap_or_default();
    let message = match d.arch {
        GgufArch::DFlash => format!(
            "llama.cpp GGUF drafter (general.architecture = dflash) read as the {} layout: dflash.target_layers {stored:?} are layer inputs, read as target_layer_ids {}; mask token {} from tokenizer.ggml.mask_token_id; {n} tensors ({types})",
            if d.config["architectures"][0] == "DFlash2DraftModel" { "DFlash2 (convolutions and candidate selector mapped)" } else { "z-lab DFlash" },
            d.config["dflash_config"]["target_layer_ids"], d.config["dflash_config"]["mask_token_id"]
        ),
        GgufArch::Eagle3 => format!(
            "llama.cpp GGUF drafter (general.architecture = eagle3) read as the SpecForge / vLLM EAGLE-3 layout: eagle3.target_layers {stored:?} are layer inputs (taps = each − 1); q/k rows un-permuted, d2t's absolute target ids read as offsets, no t2d (the converter drops it); {n} tensors ({types})"
        ),
    };
    Ok(crate::drafter::lint::Finding {
        severity: crate::drafter::lint::Severity::Info,
        code: "gguf",
        message,
    })
}
