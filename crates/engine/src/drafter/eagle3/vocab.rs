//! The draft vocabulary of an EAGLE-3 checkpoint and its maps to the target's (docs/eagle3.md
//! §1.1): `d2t` [draft_vocab_size] I64 offsets, draft id i ↦ target id i + d2t[i] (SpecForge's
//! `pred + d2t[pred]`, vLLM's `draft_id_to_target_id`); `t2d` [vocab_size] BOOL, which target ids
//! the draft vocabulary holds (used by training only: vLLM skips it).

use crate::drafter::gguf::DrafterWeights;
use crate::formats::WeightSource;
use anyhow::{bail, Result};
use std::path::Path;

/// Draft id → target id, checked to be a one-to-one map into the target's vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VocabMap {
    pub target_of: Vec<u32>,
}

impl VocabMap {
    /// Reads `d2t` from `src` (the checkpoint's weights, `file` names it in messages) for a draft
    /// vocabulary of `draft_vocab` ids and a target of `target_vocab`. Without `d2t` the draft
    /// vocabulary must be the target's (identity map, vLLM's default).
    pub fn load(
        src: &DrafterWeights,
        file: &Path,
        draft_vocab: usize,
        target_vocab: usize,
    ) -> Result<VocabMap> {
        let f = file.display();
        if !src.contains("d2t") {
            if draft_vocab != target_vocab {
                bail!("{f}: tensor d2t is missing, and the draft vocabulary ({draft_vocab} ids, draft_vocab_size) is not the target's ({target_vocab}): draft ids cannot be mapped to target ids");
            }
            return Ok(VocabMap {
                target_of: (0..draft_vocab as u32).collect(),
            });
        }
        let (shape, d2t) = src.integers("d2t")?;
        if shape != [draft_vocab] {
            bail!(
                "{f}: tensor d2t has shape {shape:?}, expected [{draft_vocab}] (draft_vocab_size)"
            );
        }
        Self::from_offsets(&d2t, target_vocab).map_err(|e| anyhow::anyhow!("{f}: {e}"))
    }

    /// The map of offsets `d2t` into a vocabulary of `target_vocab` ids; errors name the first
    /// draft id that leaves the vocabulary or lands on a target id another draft id holds.
    pub fn from_offsets(d2t: &[i64], target_vocab: usize) -> Result<VocabMap> {
        let mut owner: Vec<Option<usize>> = vec![None; target_vocab];
        let mut target_of = Vec::with_capacity(d2t.len());
        for (i, &off) in d2t.iter().enumerate() {
            let t = i as i64 + off;
            if t < 0 || t >= target_vocab as i64 {
                bail!("d2t[{i}] = {off} maps draft id {i} to target id {t}, outside the target's vocabulary 0..{target_vocab}");
            }
            if let Some(j) = owner[t as usize] {
                bail!("d2t maps draft ids {j} and {i} to the same target id {t}: the draft vocabulary must map one to one");
            }
            owner[t as usize] = Some(i);
            target_of.push(t as u32);
        }
        Ok(VocabMap { target_of })
    }

    /// Why `t2d` (if the checkpoint has it) disagrees with this map, if it does: it must be a
    /// [target_vocab] mask whose set ids are exactly the map's image. Only training reads it, so
    /// a mismatch changes no draft, but it means the maps were not written together.
    pub fn t2d_problem(&self, src: &DrafterWeights, target_vocab: usize) -> Result<Option<String>> {
        if !src.contains("t2d") {
            return Ok(None);
        }
        let (shape, t2d) = src.integers("t2d")?;
        if shape != [target_vocab] {
            return Ok(Some(format!(
                "tensor t2d has shape {shape:?}, expected [{target_vocab}] (the target's vocabulary)"
            )));
        }
        let mut mapped = vec![false; target_vocab];
        for &t in &self.target_of {
            mapped[t as usize] = true;
        }
        let disagree = (0..target_vocab).find(|&t| (t2d[t] != 0) != mapped[t]);
        Ok(disagree.map(|t| {
            format!(
                "t2d[{t}] = {} but d2t {} target id {t}: the two maps were not written together (t2d is used only in training)",
                t2d[t] != 0,
                if mapped[t] { "maps a draft id to" } else { "maps no draft id to" }
            )
        }))
    }
}
