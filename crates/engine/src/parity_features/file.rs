//! A features file (docs/parity-features.md): hidden states another pipeline computed, one
//! safetensors file, tensors named
//!
//! - `PROMPT.layerL`: decoder layer id L's output (Hugging Face `hidden_states[L+1]`) over the
//!   prompt's tokens, `[T, H]` or `[1, T, H]`, F32 / F16 / BF16 — the names `extract --out`
//!   writes;
//! - `PROMPT.input_ids` (optional): the T token ids those rows are for, `[T]` or `[1, T]`, I64 /
//!   I32. Without it the ids are draftlens's own sequence (prompt + greedy continuation).
//!
//! PROMPT is a prompt id of the prompt set (the part of the name before the last dot). Everything
//! the file itself can get wrong is checked here, from the header and the (small) token-id tensors,
//! before any model runs; the hidden states are read prompt by prompt later ([`FeaturesFile::layer`]).

use crate::formats::safetensors::SafetensorsWeights;
use crate::formats::WeightSource;
use crate::prompts::PromptSet;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// What the target and the drafter require of a features file.
pub struct Expect<'a> {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub vocab_size: usize,
    /// The drafter's taps (layer ids) and where they are configured, for the message.
    pub drafter_layers: Option<(&'a [usize], &'a str)>,
}

/// One prompt's tensors.
pub struct FeatureRecord {
    pub prompt_id: String,
    /// Its index in the prompt set.
    pub prompt_index: usize,
    /// Rows of every layer tensor.
    pub rows: usize,
    /// `PROMPT.input_ids`, when the file has it.
    pub input_ids: Option<Vec<u32>>,
}

/// A validated features file.
pub struct FeaturesFile {
    pub path: PathBuf,
    weights: SafetensorsWeights,
    /// Layer ids present for every prompt, ascending.
    pub layer_ids: Vec<usize>,
    /// One record per prompt id in the file, in prompt-set order.
    pub records: Vec<FeatureRecord>,
}

/// What a tensor name says: whose tensor it is and which.
enum Part {
    Layer(usize),
    InputIds,
}

/// `PROMPT.layerL` / `PROMPT.input_ids` → (PROMPT, part); `None` for any other name.
fn parse_name(name: &str) -> Option<(&str, Part)> {
    let (id, suffix) = name.rsplit_once('.')?;
    if id.is_empty() {
        return None;
    }
    if suffix == "input_ids" {
        return Some((id, Part::InputIds));
    }
    let digits = suffix.strip_prefix("layer")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((id, Part::Layer(digits.parse().ok()?)))
}

/// `[T, H]` or `[1, T, H]` → (T, H).
fn rows_cols(shape: &[usize]) -> Option<(usize, usize)> {
    match *shape {
        [t, h] | [1, t, h] => Some((t, h)),
        _ => None,
    }
}

/// Per prompt id while reading the header.
#[derive(Default)]
struct Seen {
    /// layer id → rows
    layers: BTreeMap<usize, usize>,
    input_ids: bool,
}

impl FeaturesFile {
    /// Opens and checks `path` against the prompt set, the target and the drafter. Errors name
    /// the file and the tensor or prompt id.
    pub fn open(path: &Path, set: &PromptSet, expect: &Expect) -> Result<FeaturesFile> {
        let p = path.display();
        if !path.is_file() {
            bail!("{p}: no such features file");
        }
        let weights = SafetensorsWeights::open(path)?;
        let index_of: HashMap<&str, usize> = set
            .prompts
            .iter()
            .enumerate()
            .map(|(i, q)| (q.id.as_str(), i))
            .collect();
        let mut seen: BTreeMap<usize, Seen> = BTreeMap::new();
        let mut tensors = weights.tensors();
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        if tensors.is_empty() {
            bail!(
                "{p}: the file holds no tensors (expected PROMPT.layerL, docs/parity-features.md)"
            );
        }
        for t in &tensors {
            let name = &t.name;
            let Some((id, part)) = parse_name(name) else {
                bail!("{p}: tensor {name}: not a features name; expected PROMPT.layerL (decoder layer id L's output) or PROMPT.input_ids (docs/parity-features.md)");
            };
            let Some(&index) = index_of.get(id) else {
                bail!(
                    "{p}: tensor {name}: prompt id {id:?} is not in the prompt set {} ({} prompts)",
                    set.source.display(),
                    set.prompts.len()
                );
            };
            let entry = seen.entry(index).or_default();
            match part {
                Part::Layer(layer) => {
                    if layer >= expect.num_layers {
                        bail!("{p}: tensor {name}: layer id {layer} is out of range: the target has {} decoder layers (ids 0..{})", expect.num_layers, expect.num_layers - 1);
                    }
                    if !matches!(t.dtype.as_str(), "F32" | "F16" | "BF16") {
                        bail!("{p}: tensor {name} has dtype {}; hidden states must be floating point (F32, F16 or BF16)", t.dtype);
                    }
                    let Some((rows, cols)) = rows_cols(&t.shape) else {
                        bail!("{p}: tensor {name} has shape {:?}; hidden states are [tokens, hidden] or [1, tokens, hidden]", t.shape);
                    };
                    if cols != expect.hidden_size {
                        bail!("{p}: tensor {name} has hidden size {cols} (shape {:?}); the target's hidden size is {}", t.shape, expect.hidden_size);
                    }
                    if rows == 0 {
                        bail!("{p}: tensor {name} has no rows");
                    }
                    entry.layers.insert(layer, rows);
                }
                Part::InputIds => {
                    if !matches!(t.dtype.as_str(), "I64" | "I32") {
                        bail!(
                            "{p}: tensor {name} has dtype {}; token ids must be I64 or I32",
                            t.dtype
                        );
                    }
                    if !matches!(t.shape[..], [_] | [1, _]) {
                        bail!(
                            "{p}: tensor {name} has shape {:?}; token ids are [tokens] or [1, tokens]",
                            t.shape
                        );
                    }
                    entry.input_ids = true;
                }
            }
        }
        let layer_ids = Self::common_layers(path, set, &seen, expect)?;
        let mut records = Vec::with_capacity(seen.len());
        for (&index, s) in &seen {
            let id = &set.prompts[index].id;
            // Every layer of a prompt covers the same tokens.
            let (&first, &rows) = s.layers.iter().next().expect("checked: one layer at least");
            if let Some((&l, &r)) = s.layers.iter().find(|(_, &r)| r != rows) {
                bail!("{p}: tensor {id}.layer{l} has {r} rows but {id}.layer{first} has {rows}; every layer of a prompt covers the same tokens");
            }
            let input_ids = if s.input_ids {
                let name = format!("{id}.input_ids");
                let (_, values) = weights.integers(&name)?;
                if values.len() != rows {
                    bail!("{p}: tensor {name} holds {} token ids but {id}.layer{first} has {rows} rows; the rows are the hidden states of those tokens", values.len());
                }
                if let Some((pos, v)) = values
                    .iter()
                    .enumerate()
                    .find(|(_, &v)| v < 0 || v as u64 >= expect.vocab_size as u64)
                {
                    bail!("{p}: tensor {name}: token id {v} at position {pos} is outside the target's vocabulary (0..{})", expect.vocab_size);
                }
                Some(values.into_iter().map(|v| v as u32).collect())
            } else {
                None
            };
            records.push(FeatureRecord {
                prompt_id: id.clone(),
                prompt_index: index,
                rows,
                input_ids,
            });
        }
        Ok(FeaturesFile {
            path: path.to_path_buf(),
            weights,
            layer_ids,
            records,
        })
    }

    /// The layer ids of the file: every prompt has at least one, the drafter's taps are there for
    /// every prompt, and every prompt has the same ones (a per-layer comparison pools prompts).
    fn common_layers(
        path: &Path,
        set: &PromptSet,
        seen: &BTreeMap<usize, Seen>,
        expect: &Expect,
    ) -> Result<Vec<usize>> {
        let p = path.display();
        for (&index, s) in seen {
            let id = &set.prompts[index].id;
            if s.layers.is_empty() {
                bail!("{p}: prompt {id:?} has {id}.input_ids but no {id}.layerL tensor");
            }
            if let Some((taps, source)) = expect.drafter_layers {
                if let Some(missing) = taps.iter().find(|l| !s.layers.contains_key(l)) {
                    bail!("{p}: prompt {id:?} has no tensor {id}.layer{missing}; the drafter reads layers {taps:?} ({source})");
                }
            }
        }
        let mut all = seen.iter();
        let (&i0, first) = all.next().expect("the file holds tensors");
        let ids: BTreeSet<usize> = first.layers.keys().copied().collect();
        for (&index, s) in all {
            let other: BTreeSet<usize> = s.layers.keys().copied().collect();
            if other != ids {
                bail!(
                    "{p}: prompt {:?} has layers {:?} but prompt {:?} has {:?}; every prompt needs the same layers",
                    set.prompts[index].id,
                    other,
                    set.prompts[i0].id,
                    ids
                );
            }
        }
        Ok(ids.into_iter().collect())
    }

    /// Layer `layer`'s rows of `rec` as f32 `[rows × hidden]`.
    pub fn layer(&self, rec: &FeatureRecord, layer: usize) -> Result<Vec<f32>> {
        let name = format!("{}.layer{layer}", rec.prompt_id);
        let t = self
            .weights
            .tensor(&name)
            .with_context(|| format!("{}: reading {name}", self.path.display()))?;
        Ok(t.data)
    }
}
