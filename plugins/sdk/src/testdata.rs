//! Synthetic batches for tests and benchmarks of plugins (deterministic, no dependencies).
//!
//! Sequences follow draftlens' record layout: prompt `p` has `prompt_len` prompt tokens followed
//! by `completion_len` completion tokens; completion anchors are a = prompt_len ..
//! prompt_len + completion_len - 1, and position k of a block is valid when a + k is inside the
//! sequence.

use crate::{Inputs, MetricValue, OwnedBatch, Region};

/// A small deterministic generator (xorshift64*), so tests need no RNG crate.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Shape of a synthetic batch.
#[derive(Clone, Debug)]
pub struct Shape {
    pub block_size: u32,
    pub top_k: u32,
    pub prompts: u32,
    pub prompt_len: u32,
    pub completion_len: u32,
    /// Also emit blocks anchored inside the prompt (positions 0..prompt_len-1).
    pub prompt_anchors: bool,
    /// Store the target's top-K too.
    pub target_topk: bool,
}

impl Shape {
    pub fn new(
        block_size: u32,
        top_k: u32,
        prompts: u32,
        prompt_len: u32,
        completion_len: u32,
    ) -> Self {
        Shape {
            block_size,
            top_k,
            prompts,
            prompt_len,
            completion_len,
            prompt_anchors: false,
            target_topk: false,
        }
    }
}

/// Sorted, decreasing log-probabilities of `k` candidates that leave some mass outside the top-K.
fn logprobs(rng: &mut Rng, k: usize) -> Vec<f32> {
    let mut w: Vec<f64> = (0..k).map(|_| 0.05 + rng.f64()).collect();
    w.sort_by(|a, b| b.partial_cmp(a).unwrap());
    // The top-K keeps 50-95 % of the mass.
    let keep = 0.5 + 0.45 * rng.f64();
    let sum: f64 = w.iter().sum();
    w.iter().map(|x| (x / sum * keep).ln() as f32).collect()
}

/// `k` distinct candidate ids from a vocabulary of `vocab`, never `avoid`, with `must.0` placed at
/// rank `must.1` when given.
fn candidates(
    rng: &mut Rng,
    k: usize,
    vocab: u32,
    must: Option<(u32, usize)>,
    avoid: Option<u32>,
) -> Vec<u32> {
    let mut ids: Vec<u32> = Vec::with_capacity(k);
    while ids.len() < k {
        let t = rng.below(vocab as u64) as u32;
        if Some(t) == must.map(|m| m.0) || Some(t) == avoid || ids.contains(&t) {
            continue;
        }
        ids.push(t);
    }
    if let Some((tok, rank)) = must {
        ids[rank] = tok;
    }
    ids
}

/// A random batch: the target token sits at rank 0 of the drafter's candidates with probability
/// `p_top1`, at a random lower rank with probability `p_topk`, and is absent otherwise. The
/// target's own top-K (when requested) has the target token at rank 0, as greedy decoding implies.
pub fn random(seed: u64, shape: &Shape, p_top1: f64, p_topk: f64) -> OwnedBatch {
    let mut rng = Rng::new(seed);
    let k = shape.top_k as usize;
    let p = shape.block_size as usize - 1;
    let vocab = 64.max(4 * shape.top_k);
    let mut out = OwnedBatch::new(shape.block_size, shape.top_k);
    for prompt in 0..shape.prompts {
        let len = shape.prompt_len + shape.completion_len;
        let tokens: Vec<u32> = (0..len).map(|_| rng.below(vocab as u64) as u32).collect();
        let first = if shape.prompt_anchors {
            0
        } else {
            shape.prompt_len
        };
        for a in first..len {
            let region = if a < shape.prompt_len {
                Region::Prompt
            } else {
                Region::Completion
            };
            out.prompt_index.push(prompt);
            out.anchor.push(a);
            out.region.push(region as u8);
            for kk in 1..=p as u32 {
                let pos = a + kk;
                let valid = pos < len;
                let t = if valid { tokens[pos as usize] } else { 0 };
                out.target.push(t);
                out.valid.push(valid as u8);
                out.loss_mask.push((valid && pos >= shape.prompt_len) as u8);
                let u = rng.f64();
                let must = if !valid {
                    None
                } else if u < p_top1 {
                    Some((t, 0))
                } else if u < p_top1 + p_topk && k > 1 {
                    Some((t, 1 + rng.below(k as u64 - 1) as usize))
                } else {
                    None
                };
                // Without `must`, the target is kept out of the candidates.
                let ids = candidates(&mut rng, k, vocab, must, valid.then_some(t));
                out.draft_ids.extend_from_slice(&ids);
                out.draft_logprobs.extend(logprobs(&mut rng, k));
                if shape.target_topk {
                    let tids = candidates(&mut rng, k, vocab, valid.then_some((t, 0)), None);
                    out.target_ids
                        .get_or_insert_with(Vec::new)
                        .extend_from_slice(&tids);
                    out.target_logprobs
                        .get_or_insert_with(Vec::new)
                        .extend(logprobs(&mut rng, k));
                }
            }
        }
    }
    out
}

/// The oracle drafter: its top-1 always equals the target token, so every block is accepted
/// up to the end of the sequence (A = number of valid positions).
pub fn oracle(shape: &Shape) -> OwnedBatch {
    random(7, shape, 1.0, 0.0)
}

/// Split an owned batch into owned chunks of at most `n` blocks (for streaming tests).
pub fn chunks(b: &OwnedBatch, n: usize) -> Vec<OwnedBatch> {
    let view = b.view();
    let nb = view.num_blocks();
    (0..nb)
        .step_by(n.max(1))
        .map(|start| view.slice(start..(start + n).min(nb)).to_batch())
        .collect()
}

/// What the host sends a plugin that declared `inputs`: the first `inputs.candidates`
/// candidates per position, log-probs and the target's top-K only when asked for. A plugin's
/// tests can check that its declared inputs suffice: the results must not change.
pub fn project(b: &OwnedBatch, inputs: Inputs) -> OwnedBatch {
    let k = b.top_k as usize;
    let keep = if inputs.candidates == 0 {
        k
    } else {
        (inputs.candidates as usize).min(k)
    };
    let mut out = b.clone();
    out.keep_candidates(keep);
    if !inputs.draft_logprobs {
        out.draft_logprobs.clear();
    }
    if !inputs.target_topk {
        (out.target_ids, out.target_logprobs) = (None, None);
    }
    out
}

/// The value named `name` in a plugin's output (panics with the list of names when missing:
/// for tests).
pub fn metric<'a>(values: &'a [MetricValue], name: &str) -> &'a MetricValue {
    values.iter().find(|v| v.name == name).unwrap_or_else(|| {
        let names: Vec<&str> = values.iter().map(|v| v.name.as_str()).collect();
        panic!("no metric {name} among {names:?}")
    })
}

/// The per-position (or histogram) values of metric `name`.
pub fn series<'a>(values: &'a [MetricValue], name: &str) -> &'a [f64] {
    &metric(values, name)
        .series
        .as_ref()
        .unwrap_or_else(|| panic!("metric {name} has no series"))
        .values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_batches_are_consistent() {
        let mut shape = Shape::new(8, 4, 3, 5, 20);
        shape.prompt_anchors = true;
        shape.target_topk = true;
        let b = random(1, &shape, 0.6, 0.3);
        let v = b.as_batch();
        v.check().unwrap();
        assert_eq!(v.num_blocks(), 3 * 25);
        for block in v.blocks() {
            for pos in block.positions() {
                let mut ids = pos.draft.ids.to_vec();
                ids.sort();
                ids.dedup();
                assert_eq!(ids.len(), 4, "distinct candidates");
                assert!(pos.draft.logprobs.windows(2).all(|w| w[0] >= w[1]));
                if pos.valid {
                    assert_eq!(pos.target_top.unwrap().ids[0], pos.target);
                }
            }
        }
    }

    #[test]
    fn oracle_accepts_to_the_sequence_end() {
        let shape = Shape::new(16, 2, 2, 3, 40);
        let b = oracle(&shape);
        let v = b.as_batch();
        for block in v.blocks() {
            let len = 3 + 40;
            let want = 15.min(len - 1 - block.anchor as usize);
            assert_eq!(block.accepted_len(), want);
            assert_eq!(v.accepted_len(block.index), want);
        }
    }

    #[test]
    fn projection_keeps_what_was_asked_for() {
        let mut shape = Shape::new(5, 4, 2, 3, 10);
        shape.target_topk = true;
        let b = random(4, &shape, 0.5, 0.3);
        let p = project(&b, Inputs::TOP1);
        let v = p.as_batch();
        v.check().unwrap();
        assert_eq!(
            (v.top_k, v.draft_logprobs.len(), v.target_ids.is_none()),
            (1, 0, true)
        );
        assert!(!v.has_draft_logprobs());
        let full = b.as_batch();
        for (pb, fb) in v.blocks().zip(full.blocks()) {
            assert_eq!(pb.accepted_len(), fb.accepted_len());
            assert!(pb.position(1).draft.logprobs.is_empty());
        }
        let two = project(
            &b,
            Inputs {
                candidates: 2,
                draft_logprobs: true,
                target_topk: true,
            },
        );
        assert_eq!(two.draft_ids.len(), b.draft_ids.len() / 2);
        two.as_batch().check().unwrap();
        assert_eq!(project(&b, Inputs::ALL), b);
    }

    /// FNV-1a (64 bit) over every column of `b`, little-endian, with its length and presence.
    fn digest(b: &OwnedBatch) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &x in bytes {
                h = (h ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        eat(&b.block_size.to_le_bytes());
        eat(&b.top_k.to_le_bytes());
        let u32s = |v: &[u32]| -> Vec<u8> {
            let mut out = (v.len() as u64).to_le_bytes().to_vec();
            out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            out
        };
        let f32s = |v: &[f32]| -> Vec<u8> {
            let mut out = (v.len() as u64).to_le_bytes().to_vec();
            out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            out
        };
        let u8s = |v: &[u8]| -> Vec<u8> {
            let mut out = (v.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(v);
            out
        };
        eat(&u32s(&b.prompt_index));
        eat(&u32s(&b.anchor));
        eat(&u8s(&b.region));
        eat(&u32s(&b.target));
        eat(&u8s(&b.valid));
        eat(&u8s(&b.loss_mask));
        eat(&u32s(&b.draft_ids));
        eat(&f32s(&b.draft_logprobs));
        for v in [&b.target_ids] {
            eat(&v.as_deref().map_or(vec![0xff], u32s));
        }
        for v in [&b.target_logprobs] {
            eat(&v.as_deref().map_or(vec![0xff], f32s));
        }
        h
    }

    /// The test data (random batches, their chunks and projections) is pinned: plugin tests
    /// that compare against fixed numbers keep seeing the same batches.
    #[test]
    fn test_data_is_pinned() {
        let mut shape = Shape::new(5, 4, 2, 3, 10);
        shape.target_topk = true;
        shape.prompt_anchors = true;
        let b = random(4, &shape, 0.5, 0.3);
        let two = Inputs {
            candidates: 2,
            draft_logprobs: true,
            target_topk: false,
        };
        let got: Vec<u64> = [b.clone(), project(&b, Inputs::TOP1), project(&b, two)]
            .iter()
            .chain(&chunks(&b, 4))
            .map(digest)
            .collect();
        assert_eq!(got.len(), 3 + 7);
        assert_eq!(
            format!("{got:x?}"),
            "[f4efcb0547eac8a2, 153eac355444fa39, bee70395847e0eb7, c1191c04432bd455, \
             29f3364fa5b46d52, aaca601e5ee652dd, 50362c6c82b47ca6, e442fb2af5306b56, \
             340ecbea5505437f, 61cfa69cda60b357]"
        );
    }

    #[test]
    fn chunks_cover_the_batch() {
        let b = random(3, &Shape::new(4, 2, 2, 2, 9), 0.5, 0.2);
        let parts = chunks(&b, 4);
        let mut joined = parts[0].clone();
        for c in &parts[1..] {
            joined.extend(c);
        }
        assert_eq!(joined, b);
    }
}
