//! Evaluated drafter blocks in columnar form: what the drafter evaluation produces, what the store
//! keeps, and what metric plugins read (the WIT batch mirrors this layout field by field).
//!
//! One *block* is one anchor: the drafter saw `[y_a, MASK × (B−1)]` at positions `a..a+B−1`
//! and the taps of positions `< a`. It has `B − 1` *positions* (k = 1..B−1, row k predicts the
//! token at absolute position `a + k`), and every position has `K` *candidates* (the drafter's
//! top-K ids with their log-probabilities, best first).

use serde::{Deserialize, Serialize};

/// Where an anchor lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u8)]
pub enum Region {
    /// Inside the target's greedy continuation (what deployment drafts).
    Completion = 0,
    /// Inside the prompt (optional anchors; training sees these when the loss mask is off).
    Prompt = 1,
}

/// A columnar batch of evaluated blocks. Index helpers below keep the arithmetic in one place.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordBatch {
    /// B: anchor + B−1 drafted positions.
    pub block_size: u32,
    /// K: candidates kept per position.
    pub top_k: u32,

    // ---- per block ----
    /// Index of the prompt in the run's prompt set.
    pub prompt_index: Vec<u32>,
    /// Absolute position a of the anchor token in prompt+continuation.
    pub anchor: Vec<u32>,
    /// `Region as u8`.
    pub region: Vec<u8>,

    // ---- per position: (B−1) per block, k = 1..B−1 in order ----
    /// t_k: the target's own greedy token at position a+k (0 when `valid` is 0).
    pub target: Vec<u32>,
    /// 1 when position a+k exists in the evaluated sequence (blocks near the end run past it).
    pub valid: Vec<u8>,
    /// 1 when a+k is a completion position (what training's loss mask would supervise).
    pub loss_mask: Vec<u8>,

    // ---- per candidate: K per position ----
    pub draft_ids: Vec<u32>,
    pub draft_logprobs: Vec<f32>,
    /// The target's own top-K at position a+k (optional; enables sampling acceptance).
    pub target_ids: Option<Vec<u32>>,
    pub target_logprobs: Option<Vec<f32>>,
}

impl RecordBatch {
    pub fn new(block_size: u32, top_k: u32) -> Self {
        RecordBatch {
            block_size,
            top_k,
            ..Default::default()
        }
    }
    /// Positions per block (B−1).
    pub fn positions_per_block(&self) -> usize {
        self.block_size.saturating_sub(1) as usize
    }
    pub fn num_blocks(&self) -> usize {
        self.anchor.len()
    }
    /// Index into the per-position columns of position k (1-based) of block b.
    pub fn pos_index(&self, b: usize, k: usize) -> usize {
        b * self.positions_per_block() + (k - 1)
    }
    /// The drafter's top-1 at position k (1-based) of block b.
    pub fn draft_top1(&self, b: usize, k: usize) -> u32 {
        self.draft_ids[self.pos_index(b, k) * self.top_k as usize]
    }
    /// Accepted length A of block b: leading k with draft top-1 = target token (invalid
    /// positions stop the streak, as the end of the sequence would stop a real decode).
    pub fn accepted_len(&self, b: usize) -> usize {
        let mut a = 0;
        for k in 1..=self.positions_per_block() {
            let i = self.pos_index(b, k);
            if self.valid[i] == 0 || self.draft_top1(b, k) != self.target[i] {
                break;
            }
            a += 1;
        }
        a
    }
    /// Append all blocks of `other` (same B and K).
    pub fn extend(&mut self, other: &RecordBatch) {
        debug_assert_eq!(
            (self.block_size, self.top_k),
            (other.block_size, other.top_k)
        );
        self.prompt_index.extend_from_slice(&other.prompt_index);
        self.anchor.extend_from_slice(&other.anchor);
        self.region.extend_from_slice(&other.region);
        self.target.extend_from_slice(&other.target);
        self.valid.extend_from_slice(&other.valid);
        self.loss_mask.extend_from_slice(&other.loss_mask);
        self.draft_ids.extend_from_slice(&other.draft_ids);
        self.draft_logprobs.extend_from_slice(&other.draft_logprobs);
        match (&mut self.target_ids, &other.target_ids) {
            (Some(a), Some(b)) => a.extend_from_slice(b),
            (None, None) => {}
            _ => self.target_ids = None,
        }
        match (&mut self.target_logprobs, &other.target_logprobs) {
            (Some(a), Some(b)) => a.extend_from_slice(b),
            (None, None) => {}
            _ => self.target_logprobs = None,
        }
    }
    /// The blocks `order[0], order[1], …` of this batch, in that order (a reordering or a
    /// selection; every column follows its block).
    pub fn select(&self, order: &[usize]) -> RecordBatch {
        let p = self.positions_per_block();
        let pk = p * self.top_k as usize;
        let mut out = RecordBatch::new(self.block_size, self.top_k);
        out.target_ids = self.target_ids.as_ref().map(|_| Vec::new());
        out.target_logprobs = self.target_logprobs.as_ref().map(|_| Vec::new());
        for &i in order {
            out.prompt_index.push(self.prompt_index[i]);
            out.anchor.push(self.anchor[i]);
            out.region.push(self.region[i]);
            out.target
                .extend_from_slice(&self.target[i * p..(i + 1) * p]);
            out.valid.extend_from_slice(&self.valid[i * p..(i + 1) * p]);
            out.loss_mask
                .extend_from_slice(&self.loss_mask[i * p..(i + 1) * p]);
            out.draft_ids
                .extend_from_slice(&self.draft_ids[i * pk..(i + 1) * pk]);
            out.draft_logprobs
                .extend_from_slice(&self.draft_logprobs[i * pk..(i + 1) * pk]);
            if let (Some(o), Some(s)) = (out.target_ids.as_mut(), self.target_ids.as_ref()) {
                o.extend_from_slice(&s[i * pk..(i + 1) * pk]);
            }
            if let (Some(o), Some(s)) =
                (out.target_logprobs.as_mut(), self.target_logprobs.as_ref())
            {
                o.extend_from_slice(&s[i * pk..(i + 1) * pk]);
            }
        }
        out
    }
    /// Internal consistency of the column lengths (checked before storing or sending to plugins).
    pub fn check(&self) -> Result<(), String> {
        let nb = self.num_blocks();
        let np = nb * self.positions_per_block();
        let nc = np * self.top_k as usize;
        let lens = [
            ("prompt_index", self.prompt_index.len(), nb),
            ("region", self.region.len(), nb),
            ("target", self.target.len(), np),
            ("valid", self.valid.len(), np),
            ("loss_mask", self.loss_mask.len(), np),
            ("draft_ids", self.draft_ids.len(), nc),
            ("draft_logprobs", self.draft_logprobs.len(), nc),
        ];
        for (name, got, want) in lens {
            if got != want {
                return Err(format!(
                    "record column {name} has {got} entries, expected {want}"
                ));
            }
        }
        for (name, col) in [
            ("target_ids", self.target_ids.as_ref().map(|v| v.len())),
            (
                "target_logprobs",
                self.target_logprobs.as_ref().map(|v| v.len()),
            ),
        ] {
            if let Some(got) = col {
                if got != nc {
                    return Err(format!(
                        "record column {name} has {got} entries, expected {nc}"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three blocks (B = 3, K = 2) whose every column value encodes its block number.
    fn three_blocks() -> RecordBatch {
        let mut b = RecordBatch::new(3, 2);
        b.target_ids = Some(Vec::new());
        for i in 0..3u32 {
            b.prompt_index.push(i);
            b.anchor.push(10 + i);
            b.region.push(i as u8);
            b.target.extend([i; 2]);
            b.valid.extend([1, i as u8]);
            b.loss_mask.extend([i as u8, 1]);
            b.draft_ids.extend([i; 4]);
            b.draft_logprobs.extend([-(i as f32); 4]);
            b.target_ids.as_mut().unwrap().extend([100 + i; 4]);
        }
        b
    }

    #[test]
    fn select_moves_every_column_with_its_block() {
        let b = three_blocks();
        let s = b.select(&[2, 0]);
        assert!(s.check().is_ok());
        assert_eq!(s.prompt_index, vec![2, 0]);
        assert_eq!(s.anchor, vec![12, 10]);
        assert_eq!(s.target, vec![2, 2, 0, 0]);
        assert_eq!(s.valid, vec![1, 2, 1, 0]);
        assert_eq!(
            s.draft_logprobs,
            vec![-2.0, -2.0, -2.0, -2.0, 0.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(
            s.target_ids.as_deref(),
            Some(&[102, 102, 102, 102, 100, 100, 100, 100][..])
        );
        assert_eq!(s.target_logprobs, None);
        // Reversing twice gives the batch back.
        let r = b.select(&[2, 1, 0]).select(&[2, 1, 0]);
        assert_eq!(
            (r.draft_ids, r.loss_mask),
            (b.draft_ids.clone(), b.loss_mask.clone())
        );
    }
}
