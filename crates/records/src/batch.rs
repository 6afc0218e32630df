//! Evaluated drafter blocks in columnar form (`docs/metrics.md` §1).
//!
//! Length (~910 lines, of which ~320 are its unit tests): the batch type, its views and its checks
//! are the record contract that plugins, the store and the engine share, kept in one place.
//!
//! One *block* is one anchor: the drafter saw `[y_a, MASK × (B−1)]` at positions `a..a+B−1` and
//! the taps of positions `< a`. It has P = B − 1 *positions* (k = 1..P; row k predicts the token
//! at absolute position `a + k`), and every position has K *candidates* (the drafter's top-K ids
//! with their log-probabilities, best first).
//!
//! Layout: per-block columns have one entry per block; per-position columns P entries per block,
//! block after block (index = block · P + (k − 1)); per-candidate columns K entries per position
//! (index = position index · K + rank). The columns and their levels are listed once, in
//! `columns.rs` ([`crate::COLUMNS`]); slicing, concatenation and the checks below iterate it.

use crate::columns::{ColumnData, ColumnRef, Level, Presence, COLUMNS};
use std::fmt;
use std::ops::Range;

/// The batch's own operations move a column's data within that column, so its element type
/// always fits (`set_column` and `extend_from` only fail for data of another type).
const SAME_COLUMN: &str = "a column's own data keeps its element type";

/// Where an anchor lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(u8)]
pub enum Region {
    /// Inside the target's greedy continuation (what deployment drafts from).
    Completion = 0,
    /// Inside the prompt (optional anchors; training sees these when the loss mask is off).
    Prompt = 1,
}

impl Region {
    pub fn from_u8(v: u8) -> Option<Region> {
        match v {
            0 => Some(Region::Completion),
            1 => Some(Region::Prompt),
            _ => None,
        }
    }
}

/// An inconsistent batch: which column or value, and what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutError(pub String);

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LayoutError {}

/// A borrowed columnar batch (what a plugin receives; a slice of a [`RecordBatch`]). Check it with
/// [`BatchView::check`] before using the block views: they index the columns without further
/// checks beyond Rust's bounds checks.
#[derive(Clone, Copy, Debug)]
pub struct BatchView<'a> {
    /// B: anchor plus P = B−1 drafted positions.
    pub block_size: u32,
    /// K: candidates per position.
    pub top_k: u32,
    pub prompt_index: &'a [u32],
    pub anchor: &'a [u32],
    /// `Region as u8`.
    pub region: &'a [u8],
    pub target: &'a [u32],
    pub valid: &'a [u8],
    pub loss_mask: &'a [u8],
    pub draft_ids: &'a [u32],
    /// Empty when a plugin's inputs do not read log-probs.
    pub draft_logprobs: &'a [f32],
    pub target_ids: Option<&'a [u32]>,
    pub target_logprobs: Option<&'a [f32]>,
}

impl<'a> BatchView<'a> {
    /// Positions per block, P = B−1.
    pub fn positions_per_block(&self) -> usize {
        self.block_size.saturating_sub(1) as usize
    }
    pub fn num_blocks(&self) -> usize {
        self.anchor.len()
    }
    pub fn top_k(&self) -> usize {
        self.top_k as usize
    }
    /// Index into the per-position columns of position k (1-based) of block b.
    pub fn pos_index(&self, b: usize, k: usize) -> usize {
        b * self.positions_per_block() + (k - 1)
    }
    /// The drafter's top-1 at position k (1-based) of block b.
    pub fn draft_top1(&self, b: usize, k: usize) -> u32 {
        self.draft_ids[self.pos_index(b, k) * self.top_k()]
    }
    /// Whether the drafter's log-probs came with the batch.
    pub fn has_draft_logprobs(&self) -> bool {
        !self.draft_logprobs.is_empty() || self.num_blocks() == 0
    }
    /// Whether the target's own top-K (ids and log-probs) came with the batch.
    pub fn has_target_topk(&self) -> bool {
        self.target_ids.is_some() && self.target_logprobs.is_some()
    }

    /// The full contract check a plugin relies on: column lengths (log-probs may be sent empty),
    /// B ≥ 2, K ≥ 1, and byte columns holding 0 or 1.
    pub fn check(&self) -> Result<(), LayoutError> {
        let err = |m: String| Err(LayoutError(m));
        if self.block_size < 2 {
            return err(format!("block-size {} < 2", self.block_size));
        }
        if self.top_k == 0 {
            return err("top-k is 0".into());
        }
        let nb = self.num_blocks();
        let nc = nb * Level::Candidate.per_block(self.block_size, self.top_k);
        for c in COLUMNS {
            let Some(got) = self.column(c).map(|col| col.len()) else {
                continue;
            };
            let want = nb * c.level.per_block(self.block_size, self.top_k);
            let name = c.wit_name();
            match c.presence {
                Presence::Required if got != want => {
                    return err(format!("column {name} has {got} entries, expected {want}"));
                }
                Presence::EmptyWhenUnread if got != 0 && got != want => {
                    return err(format!(
                        "column {name} has {got} entries, expected {want} (or none)"
                    ));
                }
                _ => {}
            }
        }
        match (self.target_ids, self.target_logprobs) {
            (None, None) => {}
            (Some(ids), Some(lps)) => {
                if ids.len() != nc || lps.len() != nc {
                    return err(format!(
                        "target top-K columns have {} ids and {} log-probs, expected {nc}",
                        ids.len(),
                        lps.len()
                    ));
                }
            }
            _ => return err("target-ids and target-logprobs must come together".into()),
        }
        for c in COLUMNS {
            let Some(ColumnRef::U8(values)) = self.column(c) else {
                continue;
            };
            if let Some(i) = values.iter().position(|&v| v > 1) {
                let (name, v) = (c.wit_name(), values[i]);
                return err(match c.level {
                    Level::Block => format!("{name} of block {i} is {v}, expected 0 or 1"),
                    _ => format!("{name}[{i}] is {v}, expected 0 or 1"),
                });
            }
        }
        Ok(())
    }

    /// Accepted length A of block `b` (`docs/metrics.md` §2): leading positions whose draft top-1
    /// equals the target token; an invalid position (past the sequence end) stops the streak.
    #[inline]
    pub fn accepted_len(&self, b: usize) -> usize {
        let p = self.positions_per_block();
        let k = self.top_k();
        let target = &self.target[b * p..(b + 1) * p];
        let valid = &self.valid[b * p..(b + 1) * p];
        let draft = &self.draft_ids[b * p * k..(b + 1) * p * k];
        let mut a = 0;
        while a < p && valid[a] != 0 && draft[a * k] == target[a] {
            a += 1;
        }
        a
    }

    /// Valid positions of block `b` (positions before the sequence end).
    pub fn valid_len(&self, b: usize) -> usize {
        let p = self.positions_per_block();
        self.valid[b * p..(b + 1) * p]
            .iter()
            .filter(|&&v| v != 0)
            .count()
    }

    /// The last position of the sequence, when block `b` is cut by it (fewer valid positions than
    /// P): anchor + valid positions (`docs/metrics.md` §3).
    pub fn cut_end(&self, b: usize) -> Option<u32> {
        let v = self.valid_len(b);
        (v < self.positions_per_block()).then(|| self.anchor[b] + v as u32)
    }

    /// Region of block `b` (anything but 0 reads as the prompt).
    #[inline]
    pub fn region_of(&self, b: usize) -> Region {
        if self.region[b] == 0 {
            Region::Completion
        } else {
            Region::Prompt
        }
    }

    /// Blocks `range`, every column cut to them (a column sent empty stays empty).
    pub fn slice(&self, range: Range<usize>) -> BatchView<'a> {
        let mut out = *self;
        for c in COLUMNS {
            let entries = c.level.entries(range.clone(), self.block_size, self.top_k);
            let cut = self.column(c).map(|col| match c.presence {
                Presence::EmptyWhenUnread => col.get(entries).unwrap_or(col.slice(0..0)),
                _ => col.slice(entries),
            });
            out.set_column(c, cut).expect(SAME_COLUMN);
        }
        out
    }

    /// An owned copy of every column.
    pub fn to_batch(&self) -> RecordBatch {
        let mut out = RecordBatch::new(self.block_size, self.top_k);
        for c in COLUMNS {
            out.set_column(c, self.column(c).map(|col| col.to_data()))
                .expect(SAME_COLUMN);
        }
        out
    }

    /// Block `b` (0-based).
    pub fn block(&self, b: usize) -> Block<'a> {
        let p = self.positions_per_block();
        let k = self.top_k();
        let pos = b * p..(b + 1) * p;
        let cand = b * p * k..(b + 1) * p * k;
        Block {
            index: b,
            prompt_index: self.prompt_index[b],
            anchor: self.anchor[b],
            region: self.region_of(b),
            top_k: k,
            target: &self.target[pos.clone()],
            valid: &self.valid[pos.clone()],
            loss_mask: &self.loss_mask[pos],
            draft_ids: &self.draft_ids[cand.clone()],
            draft_logprobs: self.draft_logprobs.get(cand.clone()).unwrap_or(&[]),
            target_ids: self.target_ids.map(|c| &c[cand.clone()]),
            target_logprobs: self.target_logprobs.map(|c| &c[cand.clone()]),
        }
    }

    /// All blocks in order.
    pub fn blocks(&self) -> impl Iterator<Item = Block<'a>> + '_ {
        (0..self.num_blocks()).map(move |b| self.block(b))
    }
}

/// One block (one anchor) of a batch.
#[derive(Clone, Copy, Debug)]
pub struct Block<'a> {
    /// Index of the block within its batch.
    pub index: usize,
    pub prompt_index: u32,
    pub anchor: u32,
    pub region: Region,
    top_k: usize,
    /// Per position (P entries, k = 1..P).
    pub target: &'a [u32],
    pub valid: &'a [u8],
    pub loss_mask: &'a [u8],
    /// Per candidate (P·K entries).
    pub draft_ids: &'a [u32],
    /// Empty when the log-probs were not sent.
    pub draft_logprobs: &'a [f32],
    pub target_ids: Option<&'a [u32]>,
    pub target_logprobs: Option<&'a [f32]>,
}

impl<'a> Block<'a> {
    /// Positions in the block, P = B−1.
    pub fn len(&self) -> usize {
        self.target.len()
    }
    pub fn is_empty(&self) -> bool {
        self.target.is_empty()
    }
    /// Position k (1-based, k = 1..P).
    pub fn position(&self, k: usize) -> Position<'a> {
        let i = k - 1;
        let kk = self.top_k;
        let c = i * kk..(i + 1) * kk;
        Position {
            k,
            target: self.target[i],
            valid: self.valid[i] != 0,
            loss_mask: self.loss_mask[i] != 0,
            draft: Candidates {
                ids: &self.draft_ids[c.clone()],
                logprobs: self.draft_logprobs.get(c.clone()).unwrap_or(&[]),
            },
            target_top: match (self.target_ids, self.target_logprobs) {
                (Some(ids), Some(lps)) => Some(Candidates {
                    ids: &ids[c.clone()],
                    logprobs: &lps[c],
                }),
                _ => None,
            },
        }
    }
    /// Positions k = 1..P in order.
    pub fn positions(&self) -> impl Iterator<Item = Position<'a>> + '_ {
        (1..=self.len()).map(move |k| self.position(k))
    }
    /// The drafter's top-1 at position k (1-based).
    pub fn draft_top1(&self, k: usize) -> u32 {
        self.draft_ids[(k - 1) * self.top_k]
    }
    /// Accepted length A (same definition as [`BatchView::accepted_len`]).
    pub fn accepted_len(&self) -> usize {
        self.topk_streak(1)
    }
    /// Top-K streak A^(K): leading positions whose target token is among the drafter's best
    /// `k` candidates (`k` ≤ K). `k` = 1 gives [`Block::accepted_len`].
    pub fn topk_streak(&self, k: usize) -> usize {
        let kk = self.top_k;
        let k = k.min(kk);
        let mut a = 0;
        for i in 0..self.target.len() {
            if self.valid[i] == 0 || !self.draft_ids[i * kk..i * kk + k].contains(&self.target[i]) {
                break;
            }
            a += 1;
        }
        a
    }
    /// Number of valid positions (positions before the sequence end).
    pub fn valid_len(&self) -> usize {
        self.valid.iter().filter(|&&v| v != 0).count()
    }
}

/// One drafted position of a block.
#[derive(Clone, Copy, Debug)]
pub struct Position<'a> {
    /// 1-based position in the block (predicts absolute position anchor + k).
    pub k: usize,
    /// The target's greedy token t_k (0 when invalid).
    pub target: u32,
    /// Whether the position exists in the evaluated sequence.
    pub valid: bool,
    /// Whether training's loss mask supervises this position.
    pub loss_mask: bool,
    /// The drafter's top-K.
    pub draft: Candidates<'a>,
    /// The target's own top-K, when stored.
    pub target_top: Option<Candidates<'a>>,
}

/// Top-K candidates of one position, best first.
#[derive(Clone, Copy, Debug)]
pub struct Candidates<'a> {
    pub ids: &'a [u32],
    /// Natural-log probabilities.
    pub logprobs: &'a [f32],
}

impl Candidates<'_> {
    /// Rank (0 = best) of `token` among the candidates.
    pub fn rank_of(&self, token: u32) -> Option<usize> {
        self.ids.iter().position(|&t| t == token)
    }
    /// Log-probability of `token` if it is a candidate.
    pub fn logprob_of(&self, token: u32) -> Option<f32> {
        self.rank_of(token).map(|r| self.logprobs[r])
    }
}

/// An owned columnar batch: what the drafter evaluation produces and the store keeps.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RecordBatch {
    /// B: anchor + B−1 drafted positions.
    pub block_size: u32,
    /// K: candidates kept per position.
    pub top_k: u32,

    // ---- per block ----
    /// Index of the prompt in the run's prompt set.
    pub prompt_index: Vec<u32>,
    /// Absolute position a of the anchor token in prompt + continuation.
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
    /// Borrow every column.
    pub fn view(&self) -> BatchView<'_> {
        BatchView {
            block_size: self.block_size,
            top_k: self.top_k,
            prompt_index: &self.prompt_index,
            anchor: &self.anchor,
            region: &self.region,
            target: &self.target,
            valid: &self.valid,
            loss_mask: &self.loss_mask,
            draft_ids: &self.draft_ids,
            draft_logprobs: &self.draft_logprobs,
            target_ids: self.target_ids.as_deref(),
            target_logprobs: self.target_logprobs.as_deref(),
        }
    }
    /// Same as [`RecordBatch::view`] (the name plugin tests use).
    pub fn as_batch(&self) -> BatchView<'_> {
        self.view()
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
    /// Accepted length A of block b ([`BatchView::accepted_len`]).
    pub fn accepted_len(&self, b: usize) -> usize {
        self.view().accepted_len(b)
    }
    /// Append all blocks of `other` (same B and K). An optional column that either lacks is
    /// dropped.
    pub fn extend(&mut self, other: &RecordBatch) {
        debug_assert_eq!(
            (self.block_size, self.top_k),
            (other.block_size, other.top_k)
        );
        for c in COLUMNS {
            let joined = match (self.take_column(c), other.column(c)) {
                (Some(mut mine), Some(more)) => {
                    mine.extend_from(more).expect(SAME_COLUMN);
                    Some(mine)
                }
                _ => None,
            };
            self.set_column(c, joined).expect(SAME_COLUMN);
        }
    }
    /// The blocks `order[0], order[1], …` of this batch, in that order (a reordering or a
    /// selection; every column follows its block).
    pub fn select(&self, order: &[usize]) -> RecordBatch {
        let (b, k) = (self.block_size, self.top_k);
        let mut out = RecordBatch::new(b, k);
        for c in COLUMNS {
            let picked = self.column(c).map(|col| {
                let mut data =
                    ColumnData::with_capacity(c.element, order.len() * c.level.per_block(b, k));
                for &i in order {
                    let block = col.slice(c.level.entries(i..i + 1, b, k));
                    data.extend_from(block).expect(SAME_COLUMN);
                }
                data
            });
            out.set_column(c, picked).expect(SAME_COLUMN);
        }
        out
    }
    /// Keeps the first `keep` candidates of every position (K becomes `keep`; more than K
    /// keeps them all): what a plugin that reads fewer candidates receives.
    pub fn keep_candidates(&mut self, keep: usize) {
        let k = self.top_k as usize;
        if keep >= k {
            return;
        }
        for c in COLUMNS.iter().filter(|c| c.level == Level::Candidate) {
            let Some(col) = self.take_column(c) else {
                continue;
            };
            let mut cut = ColumnData::with_capacity(c.element, col.len() / k * keep);
            for position in (0..col.len()).step_by(k) {
                let first = col.as_ref().slice(position..position + keep);
                cut.extend_from(first).expect(SAME_COLUMN);
            }
            self.set_column(c, Some(cut)).expect(SAME_COLUMN);
        }
        self.top_k = keep as u32;
    }
    /// Column lengths of stored records (checked before storing or sending to plugins): every
    /// column complete, log-probs included.
    pub fn check(&self) -> Result<(), String> {
        let nb = self.num_blocks();
        for c in COLUMNS {
            let Some(got) = self.column(c).map(|col| col.len()) else {
                continue;
            };
            let want = nb * c.level.per_block(self.block_size, self.top_k);
            if got != want {
                return Err(format!(
                    "record column {} has {got} entries, expected {want}",
                    c.name
                ));
            }
        }
        Ok(())
    }

    /// Append one block (test data). `positions` gives, per position k = 1..P, the target token
    /// (None = invalid), the loss-mask bit and the drafter's K candidates as (id, log-prob).
    ///
    /// Panics when the shapes do not match B and K (a bug in the test that builds the data).
    pub fn push_block(
        &mut self,
        prompt: u32,
        anchor: u32,
        region: Region,
        positions: &[PositionSpec],
    ) {
        assert_eq!(
            positions.len(),
            self.positions_per_block(),
            "one PositionSpec per drafted position"
        );
        self.prompt_index.push(prompt);
        self.anchor.push(anchor);
        self.region.push(region as u8);
        for p in positions {
            assert_eq!(
                p.draft.len(),
                self.top_k as usize,
                "K candidates per position"
            );
            self.target.push(p.target.unwrap_or(0));
            self.valid.push(p.target.is_some() as u8);
            self.loss_mask.push(p.loss_mask as u8);
            for &(id, lp) in &p.draft {
                self.draft_ids.push(id);
                self.draft_logprobs.push(lp);
            }
            if let Some(t) = &p.target_top {
                assert_eq!(
                    t.len(),
                    self.top_k as usize,
                    "K target candidates per position"
                );
                let ids = self.target_ids.get_or_insert_with(Vec::new);
                ids.extend(t.iter().map(|c| c.0));
                let lps = self.target_logprobs.get_or_insert_with(Vec::new);
                lps.extend(t.iter().map(|c| c.1));
            }
        }
    }
}

/// One position for [`RecordBatch::push_block`].
#[derive(Clone, Debug, Default)]
pub struct PositionSpec {
    /// Target token; None = past the sequence end.
    pub target: Option<u32>,
    pub loss_mask: bool,
    /// The drafter's candidates (id, log-prob), best first.
    pub draft: Vec<(u32, f32)>,
    /// The target's candidates, when the test wants them.
    pub target_top: Option<Vec<(u32, f32)>>,
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

    #[test]
    fn checks_name_the_column() {
        let mut b = three_blocks();
        b.draft_logprobs.pop();
        assert_eq!(
            b.check().unwrap_err(),
            "record column draft_logprobs has 11 entries, expected 12"
        );
        // The plugin-side check accepts log-probs sent empty, not short ones; and byte values.
        b.draft_logprobs.clear();
        b.region = vec![0, 1, 0];
        b.valid = vec![1; 6];
        b.loss_mask = vec![1; 6];
        b.target_ids = None;
        assert_eq!(b.view().check(), Ok(()));
        b.valid[3] = 2;
        assert_eq!(
            b.view().check().unwrap_err().0,
            "valid[3] is 2, expected 0 or 1"
        );
    }

    /// Every message of both checks, in the order they are tried.
    #[test]
    fn check_messages_are_pinned() {
        let owned = |f: &dyn Fn(&mut RecordBatch)| {
            let mut b = three_blocks();
            b.target_logprobs = Some(vec![0.5; 12]);
            f(&mut b);
            b.check().err()
        };
        assert_eq!(owned(&|_| {}), None);
        let cases: [(&dyn Fn(&mut RecordBatch), &str); 9] = [
            (
                &|b| b.prompt_index.push(0),
                "record column prompt_index has 4 entries, expected 3",
            ),
            (
                &|b| b.region.clear(),
                "record column region has 0 entries, expected 3",
            ),
            (
                &|b| b.target.push(0),
                "record column target has 7 entries, expected 6",
            ),
            (
                &|b| {
                    b.valid.pop();
                },
                "record column valid has 5 entries, expected 6",
            ),
            (
                &|b| b.loss_mask.push(0),
                "record column loss_mask has 7 entries, expected 6",
            ),
            (
                &|b| b.draft_ids.push(0),
                "record column draft_ids has 13 entries, expected 12",
            ),
            (
                &|b| b.draft_logprobs.clear(),
                "record column draft_logprobs has 0 entries, expected 12",
            ),
            (
                &|b| b.target_ids = Some(vec![]),
                "record column target_ids has 0 entries, expected 12",
            ),
            (
                &|b| b.target_logprobs = Some(vec![]),
                "record column target_logprobs has 0 entries, expected 12",
            ),
        ];
        for (f, want) in cases {
            assert_eq!(owned(f).as_deref(), Some(want));
        }
        // The first failing column is named.
        assert_eq!(
            owned(&|b| {
                b.target.clear();
                b.region.clear()
            })
            .as_deref(),
            Some("record column region has 0 entries, expected 3")
        );

        let view = |f: &dyn Fn(&mut RecordBatch)| {
            let mut b = three_blocks();
            b.region = vec![0, 1, 0];
            b.valid = vec![1; 6];
            b.loss_mask = vec![0; 6];
            b.target_logprobs = Some(vec![0.5; 12]);
            f(&mut b);
            b.view().check().err().map(|e| e.0)
        };
        assert_eq!(view(&|_| {}), None);
        assert_eq!(view(&|b| b.draft_logprobs.clear()), None);
        assert_eq!(
            view(&|b| {
                b.target_ids = None;
                b.target_logprobs = None;
            }),
            None
        );
        let cases: [(&dyn Fn(&mut RecordBatch), &str); 14] = [
            (&|b| b.block_size = 1, "block-size 1 < 2"),
            (&|b| b.top_k = 0, "top-k is 0"),
            (
                &|b| b.prompt_index.push(0),
                "column prompt-index has 4 entries, expected 3",
            ),
            (
                &|b| b.region.clear(),
                "column region has 0 entries, expected 3",
            ),
            (
                &|b| b.target.push(0),
                "column target has 7 entries, expected 6",
            ),
            (
                &|b| b.valid.push(0),
                "column valid has 7 entries, expected 6",
            ),
            (
                &|b| b.loss_mask.push(0),
                "column loss-mask has 7 entries, expected 6",
            ),
            (
                &|b| b.draft_ids.push(0),
                "column draft-ids has 13 entries, expected 12",
            ),
            (
                &|b| b.draft_logprobs.push(0.0),
                "column draft-logprobs has 13 entries, expected 12 (or none)",
            ),
            (
                &|b| b.target_ids = None,
                "target-ids and target-logprobs must come together",
            ),
            (
                &|b| b.target_logprobs = None,
                "target-ids and target-logprobs must come together",
            ),
            (
                &|b| b.target_logprobs = Some(vec![]),
                "target top-K columns have 12 ids and 0 log-probs, expected 12",
            ),
            (
                &|b| b.region[2] = 2,
                "region of block 2 is 2, expected 0 or 1",
            ),
            (
                &|b| b.loss_mask[5] = 3,
                "loss-mask[5] is 3, expected 0 or 1",
            ),
        ];
        for (f, want) in cases {
            assert_eq!(view(f).as_deref(), Some(want));
        }
    }

    #[test]
    fn extend_and_slice_keep_every_column() {
        let mut b = three_blocks();
        b.target_logprobs = Some((0..12).map(|x| x as f32).collect());
        let mut joined = b.select(&[0]);
        joined.extend(&b.select(&[1, 2]));
        assert_eq!(joined, b);
        // An optional column that one part lacks is dropped; a present one stays.
        let mut part = b.select(&[1]);
        part.target_logprobs = None;
        joined.extend(&part);
        assert_eq!(joined.target_logprobs, None);
        assert_eq!(joined.target_ids.as_ref().map(Vec::len), Some(16));
        assert_eq!(joined.num_blocks(), 4);
        assert!(joined.check().is_ok());

        let s = b.view().slice(1..3);
        assert_eq!(
            (s.prompt_index, s.anchor, s.region),
            (&[1, 2][..], &[11, 12][..], &[1, 2][..])
        );
        assert_eq!(
            (s.target, s.valid, s.loss_mask),
            (&[1, 1, 2, 2][..], &[1, 1, 1, 2][..], &[1, 1, 2, 1][..])
        );
        assert_eq!(s.draft_ids, &[1, 1, 1, 1, 2, 2, 2, 2][..]);
        assert_eq!(
            s.draft_logprobs,
            &[-1.0, -1.0, -1.0, -1.0, -2.0, -2.0, -2.0, -2.0][..]
        );
        assert_eq!(
            s.target_ids,
            Some(&[101, 101, 101, 101, 102, 102, 102, 102][..])
        );
        assert_eq!(
            s.target_logprobs,
            Some(&[4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0][..])
        );
        // Log-probs sent empty stay empty.
        let mut no_lp = b.clone();
        no_lp.draft_logprobs.clear();
        assert!(no_lp.view().slice(1..2).draft_logprobs.is_empty());
        assert_eq!(no_lp.view().slice(1..2).draft_ids, &[1, 1, 1, 1][..]);
    }

    #[test]
    fn keep_candidates_cuts_every_candidate_column() {
        let mut b = three_blocks();
        b.draft_ids = (0..12).collect();
        b.target_logprobs = Some((0..12).map(|x| x as f32).collect());
        let mut top1 = b.clone();
        top1.keep_candidates(1);
        assert_eq!(top1.top_k, 1);
        assert_eq!(top1.draft_ids, vec![0, 2, 4, 6, 8, 10]);
        assert_eq!(top1.draft_logprobs, vec![0.0, 0.0, -1.0, -1.0, -2.0, -2.0]);
        assert_eq!(top1.target_ids, Some(vec![100, 100, 101, 101, 102, 102]));
        assert_eq!(
            top1.target_logprobs,
            Some(vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
        );
        assert!(top1.check().is_ok());
        assert_eq!(
            (top1.target, top1.valid),
            (b.target.clone(), b.valid.clone())
        );
        let mut all = b.clone();
        all.keep_candidates(5);
        assert_eq!(all, b);
    }

    #[test]
    fn accepted_len_stops_at_a_miss_or_the_sequence_end() {
        // B = 4 (P = 3), K = 1.
        let pos = |t: Option<u32>, d: u32| PositionSpec {
            target: t,
            loss_mask: true,
            draft: vec![(d, -0.1)],
            target_top: None,
        };
        let mut b = RecordBatch::new(4, 1);
        b.push_block(
            0,
            5,
            Region::Completion,
            &[pos(Some(1), 1), pos(Some(2), 2), pos(Some(3), 9)],
        );
        b.push_block(
            0,
            6,
            Region::Completion,
            &[pos(Some(2), 2), pos(None, 0), pos(None, 0)],
        );
        b.push_block(
            0,
            7,
            Region::Prompt,
            &[pos(Some(2), 7), pos(Some(3), 3), pos(Some(4), 4)],
        );
        let v = b.view();
        assert_eq!(
            (0..3).map(|i| v.accepted_len(i)).collect::<Vec<_>>(),
            [2, 1, 0]
        );
        assert_eq!(v.block(1).accepted_len(), 1);
        assert_eq!((v.cut_end(0), v.cut_end(1)), (None, Some(7)));
        assert_eq!(v.region_of(2), Region::Prompt);
        let s = v.slice(1..3);
        assert_eq!((s.num_blocks(), s.accepted_len(0), s.anchor[1]), (2, 1, 7));
        assert_eq!(s.block(0).position(1).draft.logprob_of(2), Some(-0.1));
    }
}
