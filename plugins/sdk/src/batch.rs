//! Typed, zero-copy views over a columnar batch (the layout of `record batch` in metric.wit).

use crate::PluginError;

/// Where a block's anchor lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// Inside the target's greedy continuation (what deployment drafts from).
    Completion = 0,
    /// Inside the prompt (optional prompt anchors, as training sees them).
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

/// A borrowed columnar batch. Build one with [`Batch::check`] before using the views: the views
/// index the columns without further checks beyond Rust's bounds checks.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// B: anchor plus P = B-1 drafted positions.
    pub block_size: u32,
    /// K: candidates per position.
    pub top_k: u32,
    pub prompt_index: &'a [u32],
    pub anchor: &'a [u32],
    pub region: &'a [u8],
    pub target: &'a [u32],
    pub valid: &'a [u8],
    pub loss_mask: &'a [u8],
    pub draft_ids: &'a [u32],
    /// Empty when the plugin's `Inputs` do not read log-probs.
    pub draft_logprobs: &'a [f32],
    pub target_ids: Option<&'a [u32]>,
    pub target_logprobs: Option<&'a [f32]>,
}

impl<'a> Batch<'a> {
    /// Positions per block, P = B-1.
    pub fn positions_per_block(&self) -> usize {
        self.block_size.saturating_sub(1) as usize
    }
    pub fn num_blocks(&self) -> usize {
        self.anchor.len()
    }
    pub fn top_k(&self) -> usize {
        self.top_k as usize
    }
    /// Whether the drafter's log-probs came with the batch (see `Inputs::draft_logprobs`).
    pub fn has_draft_logprobs(&self) -> bool {
        !self.draft_logprobs.is_empty() || self.num_blocks() == 0
    }
    /// Whether the target's own top-K (ids and log-probs) came with the batch.
    pub fn has_target_topk(&self) -> bool {
        self.target_ids.is_some() && self.target_logprobs.is_some()
    }

    /// Checks column lengths and the value ranges of the byte columns, so that the views below
    /// never index out of range.
    pub fn check(&self) -> Result<(), PluginError> {
        if self.block_size < 2 {
            return Err(PluginError::InvalidBatch(format!(
                "block-size {} < 2",
                self.block_size
            )));
        }
        if self.top_k == 0 {
            return Err(PluginError::InvalidBatch("top-k is 0".into()));
        }
        let nb = self.num_blocks();
        let np = nb * self.positions_per_block();
        let nc = np * self.top_k();
        let lens = [
            ("prompt-index", self.prompt_index.len(), nb),
            ("region", self.region.len(), nb),
            ("target", self.target.len(), np),
            ("valid", self.valid.len(), np),
            ("loss-mask", self.loss_mask.len(), np),
            ("draft-ids", self.draft_ids.len(), nc),
        ];
        for (name, got, want) in lens {
            if got != want {
                return Err(PluginError::InvalidBatch(format!(
                    "column {name} has {got} entries, expected {want}"
                )));
            }
        }
        // Log-probs may be left out (a plugin whose `inputs` do not read them).
        if !self.draft_logprobs.is_empty() && self.draft_logprobs.len() != nc {
            return Err(PluginError::InvalidBatch(format!(
                "column draft-logprobs has {} entries, expected {nc} (or none)",
                self.draft_logprobs.len()
            )));
        }
        match (self.target_ids, self.target_logprobs) {
            (None, None) => {}
            (Some(ids), Some(lps)) => {
                if ids.len() != nc || lps.len() != nc {
                    return Err(PluginError::InvalidBatch(format!(
                        "target top-K columns have {} ids and {} log-probs, expected {nc}",
                        ids.len(),
                        lps.len()
                    )));
                }
            }
            _ => {
                return Err(PluginError::InvalidBatch(
                    "target-ids and target-logprobs must come together".into(),
                ))
            }
        }
        if let Some(i) = self.region.iter().position(|&r| r > 1) {
            return Err(PluginError::InvalidBatch(format!(
                "region of block {i} is {}, expected 0 or 1",
                self.region[i]
            )));
        }
        for (name, col) in [("valid", self.valid), ("loss-mask", self.loss_mask)] {
            if let Some(i) = col.iter().position(|&v| v > 1) {
                return Err(PluginError::InvalidBatch(format!(
                    "{name}[{i}] is {}, expected 0 or 1",
                    col[i]
                )));
            }
        }
        Ok(())
    }

    /// Accepted length A of block `b`, straight from the columns (the hot path of most
    /// metrics; same definition as [`Block::accepted_len`]).
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

    /// Region of block `b`.
    #[inline]
    pub fn region_of(&self, b: usize) -> Region {
        if self.region[b] == 0 {
            Region::Completion
        } else {
            Region::Prompt
        }
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
            region: if self.region[b] == 0 {
                Region::Completion
            } else {
                Region::Prompt
            },
            top_k: k,
            target: &self.target[pos.clone()],
            valid: &self.valid[pos.clone()],
            loss_mask: &self.loss_mask[pos],
            draft_ids: &self.draft_ids[cand.clone()],
            // Empty when the log-probs were not sent.
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
    /// Per candidate (P*K entries).
    pub draft_ids: &'a [u32],
    /// Empty when the plugin's `Inputs` do not read log-probs.
    pub draft_logprobs: &'a [f32],
    pub target_ids: Option<&'a [u32]>,
    pub target_logprobs: Option<&'a [f32]>,
}

impl<'a> Block<'a> {
    /// Positions in the block, P = B-1.
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
                // Empty when the log-probs were not sent.
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
    /// Accepted length A: the number of leading positions whose draft top-1 equals the target
    /// token. An invalid position (past the sequence end) stops the streak, as the end of the
    /// sequence stops a real decode.
    pub fn accepted_len(&self) -> usize {
        let kk = self.top_k;
        let mut a = 0;
        for i in 0..self.target.len() {
            if self.valid[i] == 0 || self.draft_ids[i * kk] != self.target[i] {
                break;
            }
            a += 1;
        }
        a
    }
    /// Top-K streak A^(K): leading positions whose target token is among the drafter's best
    /// `k` candidates (`k` <= K). `k` = 1 gives [`Block::accepted_len`].
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

impl<'a> Candidates<'a> {
    /// Rank (0 = best) of `token` among the candidates.
    pub fn rank_of(&self, token: u32) -> Option<usize> {
        self.ids.iter().position(|&t| t == token)
    }
    /// Log-probability of `token` if it is a candidate.
    pub fn logprob_of(&self, token: u32) -> Option<f32> {
        self.rank_of(token).map(|r| self.logprobs[r])
    }
}

/// An owned batch, handy for building test data (`as_batch` borrows it as a [`Batch`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OwnedBatch {
    pub block_size: u32,
    pub top_k: u32,
    pub prompt_index: Vec<u32>,
    pub anchor: Vec<u32>,
    pub region: Vec<u8>,
    pub target: Vec<u32>,
    pub valid: Vec<u8>,
    pub loss_mask: Vec<u8>,
    pub draft_ids: Vec<u32>,
    pub draft_logprobs: Vec<f32>,
    pub target_ids: Option<Vec<u32>>,
    pub target_logprobs: Option<Vec<f32>>,
}

impl OwnedBatch {
    pub fn new(block_size: u32, top_k: u32) -> Self {
        OwnedBatch {
            block_size,
            top_k,
            ..Default::default()
        }
    }
    pub fn as_batch(&self) -> Batch<'_> {
        Batch {
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
    /// Append one block. `positions` gives, per position k = 1..P, the target token (None =
    /// invalid), the loss-mask bit and the drafter's K candidates as (id, log-prob).
    pub fn push_block(
        &mut self,
        prompt: u32,
        anchor: u32,
        region: Region,
        positions: &[PositionSpec],
    ) {
        assert_eq!(
            positions.len(),
            self.block_size as usize - 1,
            "one PositionSpec per drafted position"
        );
        self.prompt_index.push(prompt);
        self.anchor.push(anchor);
        self.region.push(match region {
            Region::Completion => 0,
            Region::Prompt => 1,
        });
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

/// One position for [`OwnedBatch::push_block`].
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
