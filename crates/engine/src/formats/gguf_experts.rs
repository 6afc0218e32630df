//! What the MoE and gpt-oss GGUF readers ([`super::gguf_moe`], [`super::gguf_gpt_oss`]) share:
//! their `{arch}.*` key reader, and [`StackedGgufWeights`], llama.cpp's stacked expert tensors
//! served under Hugging Face names (each expert a row range of its stack, dequantised on its own,
//! or handed over as MXFP4 bytes when ggml MXFP4: [`WeightSource::mxfp4`]) over an inner source
//! that serves every other name. Each reader builds one with its own names
//! and checks; the marker type `K` only gives each its own constructor.

use super::gguf::{GgufFile, GgufTensor, GgufValue};
use super::{dequant, mxfp4, HostTensor, TensorInfo, WeightSource};
use crate::backend::raw::RawPart;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

/// A reader of `{arch}.*` keys whose errors name the file and the full key.
pub(super) struct Keys<'a> {
    pub(super) file: &'a GgufFile,
    pub(super) arch: &'a str,
}

impl Keys<'_> {
    pub(super) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub(super) fn opt(&self, k: &str) -> Result<Option<usize>> {
        let full = self.key(k);
        match self.file.metadata().get(&full) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => bail!(
                    "{}: metadata {full} should be an unsigned integer, found {v:?}",
                    self.file.path().display()
                ),
            },
        }
    }
    pub(super) fn req(&self, k: &str, why: &str) -> Result<usize> {
        self.opt(k)?.with_context(|| {
            format!(
                "{}: metadata key {} is missing ({why})",
                self.file.path().display(),
                self.key(k)
            )
        })
    }
    pub(super) fn float(&self, k: &str) -> Result<Option<f64>> {
        let full = self.key(k);
        match self.file.metadata().get(&full) {
            None => Ok(None),
            Some(GgufValue::F32(v)) => Ok(Some(*v as f64)),
            Some(GgufValue::F64(v)) => Ok(Some(*v)),
            Some(v) => bail!(
                "{}: metadata {full} should be a float, found {v:?}",
                self.file.path().display()
            ),
        }
    }
}

/// The GGUF name of layer `l`'s tensor `part` (`ffn_gate_inp.weight`).
pub(super) fn blk(l: usize, part: &str) -> String {
    format!("blk.{l}.{part}")
}

/// Where an HF tensor lives in the file.
#[derive(Clone, Debug)]
struct Part {
    /// Index into the file's tensors.
    index: usize,
    /// Rows (of `ne[0]` elements) `first_row .. first_row + rows`; the whole tensor for one
    /// served whole (a router, a shared expert).
    first_row: usize,
    rows: usize,
    /// The HF shape (PyTorch order).
    shape: Vec<usize>,
}

/// Tensors of a GGUF served under HF names as row ranges of the file's tensors, over `inner`,
/// which serves every other name (see the module doc).
pub struct StackedGgufWeights<K> {
    inner: Box<dyn WeightSource>,
    file: Arc<GgufFile>,
    parts: BTreeMap<String, Part>,
    /// GGUF names served through `parts` (left out of the inner listing).
    consumed: BTreeSet<String>,
    kind: PhantomData<fn() -> K>,
}

/// The bytes of one row of `t` (GGUF rows are whole quantisation blocks).
fn row_bytes(t: &GgufTensor) -> usize {
    let total_rows = (t.n_elements() / t.row_len().max(1)) as usize;
    t.n_bytes as usize / total_rows.max(1)
}

impl<K> StackedGgufWeights<K> {
    /// Nothing served yet: every name is `inner`'s.
    pub(super) fn over(inner: Box<dyn WeightSource>, file: Arc<GgufFile>) -> Self {
        StackedGgufWeights {
            inner,
            file,
            parts: BTreeMap::new(),
            consumed: BTreeSet::new(),
            kind: PhantomData,
        }
    }

    pub(super) fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The index of GGUF tensor `name`, now left out of the inner listing (its parts are served
    /// here).
    pub(super) fn consume(&mut self, name: &str) -> Result<usize> {
        let index = self
            .file
            .tensors()
            .iter()
            .position(|t| t.name == name)
            .with_context(|| format!("{}: tensor {name} is missing", self.file.path().display()))?;
        self.consumed.insert(name.to_string());
        Ok(index)
    }

    /// Serve rows `first_row .. first_row + rows` of the file's tensor `index` as `hf_name`.
    pub(super) fn serve(
        &mut self,
        hf_name: String,
        index: usize,
        first_row: usize,
        rows: usize,
        shape: Vec<usize>,
    ) {
        let part = Part {
            index,
            first_row,
            rows,
            shape,
        };
        self.parts.insert(hf_name, part);
    }

    /// The stored bytes of `part`'s rows (rows are whole quantisation blocks: GGUF rows always
    /// are).
    fn bytes(&self, part: &Part) -> &[u8] {
        let t = &self.file.tensors()[part.index];
        let row_bytes = row_bytes(t);
        &self.file.tensor_data(t)
            [part.first_row * row_bytes..(part.first_row + part.rows) * row_bytes]
    }

    /// Dequantise `part`'s rows.
    fn read(&self, part: &Part) -> Result<HostTensor> {
        let t = &self.file.tensors()[part.index];
        let src = self.bytes(part);
        let mut data = vec![0f32; part.rows * t.row_len() as usize];
        dequant::dequantize(t.ty, src, &mut data).map_err(|e| {
            anyhow::anyhow!("{}: tensor {}: {e:#}", self.file.path().display(), t.name)
        })?;
        Ok(HostTensor {
            shape: part.shape.clone(),
            data,
        })
    }
}

impl<K> WeightSource for StackedGgufWeights<K> {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn contains(&self, name: &str) -> bool {
        self.parts.contains_key(name) || self.inner.contains(name)
    }

    /// The inner listing without the tensors served here, plus one entry per HF tensor (an
    /// expert's share of its stack's bytes, `file_name` the stack), so `inspect` counts every
    /// parameter once.
    fn tensors(&self) -> Vec<TensorInfo> {
        let mut out: Vec<TensorInfo> = self
            .inner
            .tensors()
            .into_iter()
            .filter(|t| !self.consumed.contains(&t.file_name))
            .collect();
        for (name, part) in &self.parts {
            let t = &self.file.tensors()[part.index];
            out.push(TensorInfo {
                name: name.clone(),
                file_name: t.name.clone(),
                dtype: t.ty.name().to_string(),
                shape: part.shape.clone(),
                bytes: (row_bytes(t) * part.rows) as u64,
            });
        }
        out
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        match self.parts.get(name) {
            Some(part) => self.read(part),
            None => self.inner.tensor(name),
        }
    }

    /// A part stored as ggml MXFP4, its rows repacked ([`mxfp4::from_ggml`]); `None` for any
    /// other type, and for a part with an exponent of 255, which ggml reads as 2^127 but the
    /// MXFP4 path refuses (NaN in the OCP MX format): its values keep ggml's reading through
    /// [`WeightSource::tensor`].
    fn mxfp4(&self, name: &str) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let Some(part) = self.parts.get(name) else {
            return self.inner.mxfp4(name);
        };
        let t = &self.file.tensors()[part.index];
        if t.ty != dequant::GgmlType::MXFP4 {
            return Ok(None);
        }
        let (blocks, scales) = mxfp4::from_ggml(self.bytes(part)).map_err(|e| {
            anyhow::anyhow!("{}: tensor {}: {e:#}", self.file.path().display(), t.name)
        })?;
        Ok((!scales.contains(&255)).then_some((blocks, scales)))
    }

    fn raw(&self, name: &str) -> Result<Option<RawPart<'_>>> {
        if self.parts.contains_key(name) {
            return Ok(None);
        }
        self.inner.raw(name)
    }

    /// A part's rows of its tensor (every other name: the inner source's).
    fn release(&self, name: &str) {
        match self.parts.get(name) {
            Some(part) => {
                let t = &self.file.tensors()[part.index];
                let row_bytes = row_bytes(t);
                self.file.release(
                    t,
                    part.first_row * row_bytes,
                    (part.first_row + part.rows) * row_bytes,
                );
            }
            None => self.inner.release(name),
        }
    }
}
