//! What `live --baseline` times (docs/verdict.md): each prompt decoded by plain greedy decoding
//! at batch 1 and by live speculative decoding, on the same backend, with the split of live
//! decoding's time into draft rounds and verify passes that the cost model
//! (`draftlens_results::speed`) reads.

use super::live::{live_decode_timed, LiveDrafter, LiveResult, LiveTimes};
use crate::backend::Backend;
use crate::model::{Capture, KvCache, TargetModel};
use anyhow::Result;
use draftlens_results::speed::PromptTiming;
use std::time::Instant;

/// Plain greedy decoding of one prompt, timed after its prefill.
#[derive(Clone, Debug, PartialEq)]
pub struct GreedyTimed {
    /// The generated ids (as [`crate::generate::greedy`] gives them).
    pub ids: Vec<u32>,
    /// Seconds from the first token (chosen by the prefill) to the last.
    pub decode_s: f64,
    /// Decode steps: one target forward over one token each.
    pub steps: u64,
    /// Seconds of each decode step (the one-token forward and its top-1), in order: what
    /// `bench-costs` takes its t_decode from (`crate::drafter::cost_bench`).
    pub step_s: Vec<f64>,
}

/// Plain greedy decoding of `prompt` at batch 1: one prefill, then one
/// [`TargetModel::forward_decode`] of one token and its top-1 per step, stopping as
/// [`crate::generate::greedy_batch`] stops (EOS, `max_new`, the context window). Its ids are
/// [`crate::generate::greedy`]'s (tested); only the decode steps are timed.
pub fn greedy_timed<B: Backend>(
    be: &B,
    model: &TargetModel<B>,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
) -> Result<GreedyTimed> {
    let mut res = GreedyTimed {
        ids: Vec::new(),
        decode_s: 0.0,
        steps: 0,
        step_s: Vec::new(),
    };
    if max_new == 0 || prompt.is_empty() {
        return Ok(res);
    }
    let mut cache: KvCache<B> = model.new_cache();
    let out = model.forward(be, prompt, &mut cache, &Capture::none())?;
    let rows = be.dims(&out.last_hidden).0;
    let last = be.slice_rows(&out.last_hidden, rows - 1, rows)?;
    let mut next = model.logits_topk(be, &last, 1)?.ids[0];
    let start = Instant::now();
    let limit = model.spec.max_position_embeddings;
    loop {
        res.ids.push(next);
        if eos.contains(&next) || res.ids.len() >= max_new || cache.len + 1 > limit {
            break;
        }
        let step_start = Instant::now();
        let hidden = model.forward_decode(be, &[next], &mut [&mut cache])?;
        next = model.logits_topk(be, &hidden, 1)?.ids[0];
        res.step_s.push(step_start.elapsed().as_secs_f64());
        res.steps += 1;
    }
    res.decode_s = start.elapsed().as_secs_f64();
    Ok(res)
}

/// One prompt decoded both ways: plain greedy first, then live.
pub struct TimedPrompt {
    pub live: LiveResult,
    pub greedy: GreedyTimed,
    pub timing: PromptTiming,
}

/// Times prompt `index` of a run (`prompt` its token ids) decoded both ways on `be`.
pub fn time_prompt<'d, B: Backend + 'd>(
    be: &B,
    target: &TargetModel<B>,
    drafter: impl Into<LiveDrafter<'d, B>>,
    index: u32,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
) -> Result<TimedPrompt> {
    let greedy = greedy_timed(be, target, prompt, max_new, eos)?;
    let mut times = LiveTimes::default();
    let live = live_decode_timed(be, target, drafter, prompt, max_new, eos, &mut times)?;
    let timing = PromptTiming {
        index,
        greedy_s: greedy.decode_s,
        greedy_steps: greedy.steps,
        live_s: times.decode_s,
        rounds: live.round_tokens.len() as u64,
        round_tokens: live.round_tokens.iter().map(|&t| t as u64).sum(),
        draft_s: times.draft_s,
        verify_s: times.verify_s,
    };
    Ok(TimedPrompt {
        live,
        greedy,
        timing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::drafter::model::DFlashDrafter;
    use crate::drafter::random::{write_random_checkpoint, RandomDrafter};
    use crate::generate::greedy;
    use crate::model::random::{qwen3_8b_spec, RandomWeights};
    use crate::model::ModelSpec;

    const PROMPT: [u32; 9] = [3, 17, 42, 8, 66, 23, 5, 91, 30];

    /// The timed greedy decoding is plain greedy decoding (the same ids for a budget, an EOS and
    /// a context window that end it), and one prompt timed both ways counts the rounds and
    /// tokens of the live decoding it ran, with its phases inside its decode time.
    #[test]
    fn timed_decodings_are_the_plain_ones() {
        let spec = ModelSpec {
            vocab_size: 96,
            hidden_size: 32,
            intermediate_size: 48,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            max_position_embeddings: 40,
            ..qwen3_8b_spec()
        };
        let weights = RandomWeights::new(&spec, 11).with_init(0.3, 0.5);
        let be = CpuBackend::new();
        let target = TargetModel::load(&be, &spec, &weights).unwrap();
        let plain = greedy(&be, &target, &PROMPT, 24, &[]).unwrap();
        let eos = [plain.ids[5]];
        for (max_new, eos) in [(24, &[][..]), (24, &eos[..]), (100, &[][..]), (1, &[][..])] {
            let timed = greedy_timed(&be, &target, &PROMPT, max_new, eos).unwrap();
            let want = greedy(&be, &target, &PROMPT, max_new, eos).unwrap();
            assert_eq!(timed.ids, want.ids, "max_new {max_new}, eos {eos:?}");
            assert_eq!(timed.steps as usize, timed.ids.len() - 1);
            assert_eq!(timed.step_s.len() as u64, timed.steps);
            assert!(timed.step_s.iter().sum::<f64>() <= timed.decode_s);
        }

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
        let t = time_prompt(&be, &target, &drafter, 7, &PROMPT, 24, &[]).unwrap();
        assert_eq!(t.live.ids, t.greedy.ids, "lossless on the CPU reference");
        let p = &t.timing;
        assert_eq!(p.index, 7);
        assert_eq!(p.rounds as usize, t.live.round_tokens.len());
        // Every token after the prefill's first is committed by a round.
        assert_eq!(p.round_tokens as usize, t.live.ids.len() - 1);
        assert_eq!(p.greedy_steps as usize, t.greedy.ids.len() - 1);
        assert!(p.draft_s > 0.0 && p.verify_s > 0.0 && p.greedy_s > 0.0);
        assert!(p.draft_s + p.verify_s <= p.live_s, "{p:?}");
    }
}
