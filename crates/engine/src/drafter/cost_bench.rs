//! `draftlens bench-costs` (docs/verdict.md §9): the cost model's three inputs measured on the
//! backend apart from live decoding, each operation timed on its own and repeated, so that the
//! estimate they give is not made of the rounds of the live decoding it is compared with.
//!
//! For each prompt:
//!
//! 1. plain greedy decoding at batch 1 ([`greedy_timed`]), every step timed: t_decode's samples,
//!    and the continuation g_0..g_{n−1} the contexts below are cut from;
//! 2. at `contexts` anchors spread evenly over the continuation's rounds (offsets 0..=n−2, as
//!    live decoding's anchors run), a KV cache of the prompt and g_0..g_{k−1} (prefilled, untimed)
//!    and the drafter's state over it ([`LiveDrafter::start`], untimed); then `warmup` untimed
//!    and `reps` timed repetitions of one round there:
//!    - the drafter's proposals for the anchor g_k ([`LiveDrafter::propose`]);
//!    - for each verify size n (ascending, the drafter's B last): one target forward over
//!      [g_k, d_1..d_{n−1}] on the cache, its top-1, and the crop to the accepted length, as live
//!      decoding verifies; the cache then goes back to the context (untimed);
//!    - the drafter's context update with B's verify pass ([`LiveDrafter::extend`]).
//!
//!    A draft round's sample is proposals + update. Each repetition starts from the same state,
//!    so it times the same work.
//!
//! Each timed phase starts and ends with the device idle ([`timed`]): a GPU's queued work is
//! inside the phase that queued it, also for the phases that do not end on a read of their own
//! (the context update; a hybrid target's crop, which runs the kept tokens again).

use super::live::{accepted_drafts, LiveDrafter};
use super::speed::greedy_timed;
use crate::backend::Backend;
use crate::model::{Capture, TargetModel};
use anyhow::{bail, Result};
use draftlens_results::cost_bench::{ContextSamples, PromptSamples};
use std::time::Instant;

/// What `bench-costs` repeats where.
#[derive(Clone, Debug, PartialEq)]
pub struct CostBenchOptions {
    /// Tokens of each prompt's greedy continuation (the run's budget).
    pub max_new: usize,
    /// Anchors per prompt, spread evenly over its continuation.
    pub contexts: usize,
    /// Untimed repetitions of a round at each anchor before the timed ones.
    pub warmup: usize,
    /// Timed repetitions of a round at each anchor.
    pub reps: usize,
    /// Tokens a verify pass to time besides the drafter's B; empty: [`default_verify_sizes`].
    pub verify_sizes: Vec<usize>,
}

/// The verify sizes timed when none are asked for: 1 (a decode step through the verify path)
/// and B / 2, so that t_verify's growth with the tokens a pass is seen next to B.
pub fn default_verify_sizes(block_size: usize) -> Vec<usize> {
    vec![1, block_size / 2]
}

impl CostBenchOptions {
    /// The sizes timed for a drafter of block size `block_size`: the asked (or default) ones
    /// below B, ascending and once each, then B. An error names a size outside 1..=B.
    pub fn sizes(&self, block_size: usize) -> Result<Vec<usize>> {
        if let Some(&n) = self
            .verify_sizes
            .iter()
            .find(|&&n| n == 0 || n > block_size)
        {
            bail!("--verify-sizes: {n} tokens a pass is outside 1..={block_size} (the drafter's block size B)");
        }
        let asked = if self.verify_sizes.is_empty() {
            default_verify_sizes(block_size)
        } else {
            self.verify_sizes.clone()
        };
        let mut sizes: Vec<usize> = asked
            .into_iter()
            .filter(|&n| n >= 1 && n < block_size)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes.push(block_size);
        Ok(sizes)
    }
}

/// Offsets k into a greedy continuation of `n` tokens of the `contexts` anchors: spread evenly
/// over 0..=n−2 (the anchors whose round commits a token: the round at g_{n−2} commits the
/// last), rounded, each once. None when the continuation has no round.
pub fn anchor_offsets(n: usize, contexts: usize) -> Vec<usize> {
    if n < 2 || contexts == 0 {
        return Vec::new();
    }
    let last = n - 2;
    let mut ks: Vec<usize> = if contexts == 1 {
        vec![0]
    } else {
        (0..contexts)
            .map(|i| ((i * last) as f64 / (contexts - 1) as f64).round() as usize)
            .collect()
    };
    ks.dedup();
    ks
}

/// Waits until the device has done everything queued so far (a read to the host synchronises
/// the backend's stream; on the CPU it costs a copy of one value).
fn settle<B: Backend>(be: &B) -> Result<()> {
    be.to_host(&be.from_host(&[0.0], 1, 1)?)?;
    Ok(())
}

/// `f`'s result and its seconds, the clock started and stopped on an idle device.
fn timed<B: Backend, T>(be: &B, f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    settle(be)?;
    let t = Instant::now();
    let out = f()?;
    settle(be)?;
    Ok((out, t.elapsed().as_secs_f64()))
}

/// Times prompt `index` (`prompt` its token ids) on `be` as the module says.
pub fn bench_prompt<'d, B: Backend + 'd>(
    be: &B,
    target: &TargetModel<B>,
    drafter: impl Into<LiveDrafter<'d, B>>,
    index: u32,
    prompt: &[u32],
    eos: &[u32],
    opts: &CostBenchOptions,
) -> Result<PromptSamples> {
    let drafter = drafter.into();
    let b = drafter.block_size();
    let sizes = opts.sizes(b)?;
    if prompt.is_empty() {
        bail!("empty prompt");
    }
    let greedy = greedy_timed(be, target, prompt, opts.max_new, eos)?;
    let capture =
        Capture::for_layer_ids(&drafter.tap_layer_ids(&target.spec), target.spec.num_layers)?;
    let mut contexts = Vec::new();
    for k in anchor_offsets(greedy.ids.len(), opts.contexts) {
        let mut prefix = prompt.to_vec();
        prefix.extend_from_slice(&greedy.ids[..k]);
        if prefix.len() + b > target.spec.max_position_embeddings {
            // Live decoding stops before such a round too.
            continue;
        }
        let anchor = Anchor {
            prefix: &prefix,
            token: greedy.ids[k],
            capture: &capture,
            sizes: &sizes,
            eos,
        };
        let mut samples = bench_anchor(be, target, drafter, &anchor, opts)?;
        samples.prompt = index;
        contexts.push(samples);
    }
    Ok(PromptSamples {
        index,
        decode_step_s: greedy.step_s,
        contexts,
    })
}

/// One anchor: the committed tokens before it, its token (not yet in the cache), what the
/// verify passes capture for the drafter, the sizes timed.
struct Anchor<'a> {
    prefix: &'a [u32],
    token: u32,
    capture: &'a Capture,
    sizes: &'a [usize],
    eos: &'a [u32],
}

fn bench_anchor<B: Backend>(
    be: &B,
    target: &TargetModel<B>,
    drafter: LiveDrafter<'_, B>,
    at: &Anchor,
    opts: &CostBenchOptions,
) -> Result<ContextSamples> {
    let a = at.prefix.len();
    let mut cache = target.new_cache();
    let prefill = target.forward(be, at.prefix, &mut cache, at.capture)?;
    let mut committed = at.prefix.to_vec();
    committed.push(at.token);
    let mut out = ContextSamples {
        context_len: a as u64,
        verify_s: at.sizes.iter().map(|&n| (n as u32, Vec::new())).collect(),
        ..ContextSamples::default()
    };
    for rep in 0..opts.warmup + opts.reps {
        let measured = rep >= opts.warmup;
        let mut state = drafter.start(be, target, &prefill.captured, at.prefix, at.token)?;
        let (drafts, propose_s) = timed(be, || drafter.propose(be, target, &state, &committed))?;
        let mut block = vec![at.token];
        block.extend_from_slice(&drafts);
        let mut last = None;
        for (i, &n) in at.sizes.iter().enumerate() {
            let ((v, post, acc), verify_s) = timed(be, || {
                let v = target.forward_verify(be, &block[..n], &mut cache, at.capture)?;
                let post = target.logits_topk(be, &v.last_hidden, 1)?.argmax();
                let acc = accepted_drafts(&drafts[..n - 1], &post, n - 1, at.eos);
                target.crop(be, &mut cache, a + acc + 1)?;
                Ok((v, post, acc))
            })?;
            // Back to the anchor's context for the next pass (untimed).
            target.crop(be, &mut cache, a)?;
            if measured {
                out.verify_s[i].1.push(verify_s);
            }
            last = Some((v, post, acc));
        }
        let (v, post, acc) = last.expect("B is among the sizes");
        // The round's committed tokens, as live decoding commits them: the accepted drafts and
        // the bonus, unless an accepted EOS ended the sequence.
        let mut new_tokens = drafts[..acc].to_vec();
        if acc == 0 || !at.eos.contains(&drafts[acc - 1]) {
            new_tokens.push(post[acc]);
        }
        let ((), update_s) = timed(be, || {
            drafter.extend(be, target, &mut state, &v.captured, acc + 1, &new_tokens)
        })?;
        if measured {
            out.draft_s.push(propose_s + update_s);
        }
        out.accepted = acc as u32;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::drafter::model::DFlashDrafter;
    use crate::drafter::random::{write_random_checkpoint, RandomDrafter};
    use crate::model::random::{qwen3_8b_spec, RandomWeights};
    use crate::model::ModelSpec;
    use draftlens_results::cost_bench::CostBench;

    /// Known answers: anchors spread over 0..=n−2, rounded, each once; none without a round.
    #[test]
    fn anchor_offsets_known_answers() {
        assert_eq!(anchor_offsets(64, 3), [0, 31, 62]);
        assert_eq!(anchor_offsets(12, 3), [0, 5, 10]);
        assert_eq!(anchor_offsets(12, 1), [0]);
        assert_eq!(anchor_offsets(3, 5), [0, 1]);
        assert_eq!(anchor_offsets(2, 3), [0]);
        assert_eq!(anchor_offsets(1, 3), Vec::<usize>::new());
        assert_eq!(anchor_offsets(10, 0), Vec::<usize>::new());
    }

    /// Verify sizes: the asked ones below B ascending and once each, then B; the default 1 and
    /// B / 2; a size of 0 or above B is one error naming it.
    #[test]
    fn verify_sizes() {
        let opts = |v: Vec<usize>| CostBenchOptions {
            max_new: 8,
            contexts: 2,
            warmup: 0,
            reps: 1,
            verify_sizes: v,
        };
        assert_eq!(opts(vec![]).sizes(16).unwrap(), [1, 8, 16]);
        assert_eq!(opts(vec![]).sizes(2).unwrap(), [1, 2]);
        assert_eq!(opts(vec![8, 2, 8, 16]).sizes(16).unwrap(), [2, 8, 16]);
        for bad in [0, 17] {
            let e = opts(vec![4, bad]).sizes(16).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{bad} tokens")) && e.contains("1..=16"),
                "{e}"
            );
        }
    }

    /// A random target and DFlash drafter on the CPU: every decode step of the continuation
    /// is a sample, each anchor has `reps` samples of each phase at the context it names, the
    /// prompt's costs summarise, and the repetitions leave the cache as they found it (the same
    /// acceptance at every repetition and the accepted count is the live decoding's at that
    /// anchor).
    #[test]
    fn samples_of_a_random_drafter() {
        let spec = ModelSpec {
            vocab_size: 96,
            hidden_size: 32,
            intermediate_size: 48,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            max_position_embeddings: 64,
            ..qwen3_8b_spec()
        };
        let weights = RandomWeights::new(&spec, 11).with_init(0.3, 0.5);
        let be = CpuBackend::new();
        let target = TargetModel::load(&be, &spec, &weights).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let r = RandomDrafter {
            layers: 1,
            block_size: 4,
            target_layer_ids: vec![0, 2],
            intermediate_size: 48,
            mask_token_id: 95,
            sliding_layers: 0,
            sliding_window: 0,
            seed: 4,
        };
        write_random_checkpoint(dir.path(), &spec, &r).unwrap();
        let drafter = DFlashDrafter::load(&be, dir.path(), spec.hidden_size).unwrap();
        let prompt = [3, 17, 42, 8, 66, 23, 5, 91, 30];
        let opts = CostBenchOptions {
            max_new: 12,
            contexts: 3,
            warmup: 1,
            reps: 2,
            verify_sizes: vec![],
        };
        let p = bench_prompt(&be, &target, &drafter, 5, &prompt, &[], &opts).unwrap();
        assert_eq!(p.index, 5);
        assert_eq!(p.decode_step_s.len(), 11);
        let lens: Vec<u64> = p.contexts.iter().map(|c| c.context_len).collect();
        assert_eq!(lens, [9, 14, 19]);
        let live =
            crate::drafter::live::live_decode(&be, &target, &drafter, &prompt, 12, &[]).unwrap();
        for c in &p.contexts {
            assert_eq!(c.prompt, 5);
            assert_eq!(c.draft_s.len(), 2);
            let sizes: Vec<u32> = c.verify_s.iter().map(|(n, _)| *n).collect();
            assert_eq!(sizes, [1, 2, 4]);
            assert!(c.verify_s.iter().all(|(_, s)| s.len() == 2));
            assert!(c
                .draft_s
                .iter()
                .chain(c.verify_s.iter().flat_map(|(_, s)| s))
                .all(|&x| x > 0.0));
            // At the first anchor live decoding's first round is this round.
            if c.context_len == 9 {
                assert_eq!(c.accepted, live.accepted[0]);
            }
        }
        let b = CostBench::of(&[p], 4).unwrap();
        assert_eq!((b.contexts, b.context_len), (3, (9, 19)));
        assert_eq!(b.t_decode.n, 11);
        assert_eq!(b.t_draft_round.n, 6);
    }
}
