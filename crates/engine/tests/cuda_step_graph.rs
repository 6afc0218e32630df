//! Recorded decode steps on CUDA (docs/cuda.md, "Recorded decode steps"): a batch decoded through
//! a [`StepRecorder`] — one step captured as a CUDA graph, replayed for the next ones — gives at
//! every step the hidden states, and at the end the KV caches, bit for bit of the same batch
//! decoded step by step as usual: across recordings (more steps than one serves), across the
//! decode attention's key-chunk boundaries, when a sequence leaves the batch, on a dense Qwen3
//! and on a gpt-oss (sinks, sliding windows, YaRN, experts routed on the device); and a step that
//! cannot be recorded (experts routed on the host read the device mid-step) runs as usual with
//! the same results. The usual steps and prefills are launched one kernel after the other, the
//! recorded ones as dependent launches (docs/cuda.md, "Dependent launches"), so the same asserts
//! hold those to the same bits. Without a GPU every test prints "SKIP: CUDA unavailable: <reason>" and
//! passes (CI).
#![cfg(feature = "cuda")]

mod cuda_util;
mod golden_util;
use cuda_util::{bits, gpu};

use draftlens_engine::backend::cuda::CudaBackend;
use draftlens_engine::backend::Backend;
use draftlens_engine::model::random::RandomWeights;
use draftlens_engine::model::step_recorder::RECORDED_STEPS;
use draftlens_engine::model::{Capture, KvCache, ModelSpec, StepRecorder, TargetModel};

/// What a decode run gives: each prompt's prefill hidden-state bits, each step's, the final
/// caches' K and V bits (per sequence left, per layer), and how many steps were recorded and
/// replayed.
struct Decoded {
    prefill: Vec<Vec<u16>>,
    hidden: Vec<Vec<u16>>,
    /// Each step's greedy tokens, one per sequence in the batch.
    tokens: Vec<Vec<u32>>,
    caches: Vec<Vec<u16>>,
    recorded: usize,
    replayed: usize,
}

/// Greedy decoding of `prompts` for `steps` steps, all in one batch, sequence `leave.1` leaving it
/// after step `leave.0`; through a [`StepRecorder`] when `record`, else step by step as usual.
fn decode(
    be: &CudaBackend,
    model: &TargetModel<CudaBackend>,
    prompts: &[Vec<u32>],
    steps: usize,
    leave: (usize, usize),
    record: bool,
) -> Decoded {
    let mut prefill = Vec::new();
    let mut live: Vec<(usize, KvCache<CudaBackend>, u32)> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (cache, next, hidden) = prefilled(be, model, p);
            prefill.push(hidden);
            (i, cache, next)
        })
        .collect();
    let mut recorder = StepRecorder::new(be);
    let mut hidden = Vec::new();
    let mut tokens = Vec::new();
    for step in 0..steps {
        if step == leave.0 {
            live.remove(leave.1);
        }
        let ids: Vec<u32> = live.iter().map(|l| l.2).collect();
        let batch: Vec<usize> = live.iter().map(|l| l.0).collect();
        let mut caches: Vec<&mut KvCache<CudaBackend>> =
            live.iter_mut().map(|l| &mut l.1).collect();
        let h = if record {
            recorder.step(model, &ids, &batch, &mut caches).unwrap()
        } else {
            model.forward_decode(be, &ids, &mut caches).unwrap()
        };
        hidden.push(bits(be, &h));
        let top = model.logits_topk(be, &h, 1).unwrap().argmax();
        for (l, &next) in live.iter_mut().zip(&top) {
            l.2 = next;
        }
        tokens.push(top);
    }
    let caches = live
        .iter()
        .flat_map(|l| &l.1.layers)
        .flat_map(|layer| [layer.k.as_ref(), layer.v.as_ref()])
        .flatten()
        .map(|t| bits(be, t))
        .collect();
    Decoded {
        prefill,
        hidden,
        tokens,
        caches,
        recorded: recorder.recorded,
        replayed: recorder.replayed,
    }
}

/// `prompt` prefilled: its cache, its greedy next token and the prefill's hidden-state bits.
fn prefilled(
    be: &CudaBackend,
    model: &TargetModel<CudaBackend>,
    prompt: &[u32],
) -> (KvCache<CudaBackend>, u32, Vec<u16>) {
    let mut cache = model.new_cache();
    let out = model
        .forward(be, prompt, &mut cache, &Capture::none())
        .unwrap();
    let rows = be.dims(&out.last_hidden).0;
    let last = be.slice_rows(&out.last_hidden, rows - 1, rows).unwrap();
    let next = model.logits_topk(be, &last, 1).unwrap().ids[0];
    (cache, next, bits(be, &out.last_hidden))
}

/// Greedy decoding of `prompts` in one batch through [`StepRecorder::greedy_step`], asserting
/// each step's tokens against `want`; returns the recorder and the sequences' (cache, next
/// token) after the last step.
fn greedy_steps<'b>(
    be: &'b CudaBackend,
    model: &TargetModel<CudaBackend>,
    prompts: &[Vec<u32>],
    want: &[Vec<u32>],
) -> (
    StepRecorder<'b, CudaBackend>,
    Vec<(KvCache<CudaBackend>, u32)>,
) {
    let mut live: Vec<(KvCache<CudaBackend>, u32)> = prompts
        .iter()
        .map(|p| {
            let (cache, next, _) = prefilled(be, model, p);
            (cache, next)
        })
        .collect();
    let batch: Vec<usize> = (0..prompts.len()).collect();
    let mut recorder = StepRecorder::new(be);
    for (step, want) in want.iter().enumerate() {
        let ids: Vec<u32> = live.iter().map(|l| l.1).collect();
        let mut caches: Vec<&mut KvCache<CudaBackend>> =
            live.iter_mut().map(|l| &mut l.0).collect();
        let got = recorder
            .greedy_step(model, &ids, &batch, &mut caches)
            .unwrap();
        assert_eq!(&got, want, "{:?}: step {step}'s tokens", model.spec.arch);
        for (l, next) in live.iter_mut().zip(got) {
            l.1 = next;
        }
    }
    (recorder, live)
}

/// Five prompts of 3 to 37 tokens (every length crosses several 32-key chunk boundaries).
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    let mut r = draftlens_engine::util::DetRng::new(7);
    [3usize, 11, 20, 29, 37]
        .iter()
        .map(|&n| (0..n).map(|_| r.below(vocab as u64) as u32).collect())
        .collect()
}

/// Recorded decoding with dependent launches and usual decoding without agree bit for bit,
/// prefill by prefill and step by step, and the recorder did replay.
fn assert_recorded_equals_usual(be: &CudaBackend, model: &TargetModel<CudaBackend>) {
    let prompts = prompts(model.spec.vocab_size as u32);
    // Past two recordings, a sequence leaving mid-way (a new batch: a usual step, then a new
    // recording).
    let steps = 2 * RECORDED_STEPS + 30;
    let leave = (RECORDED_STEPS + 10, 2);
    be.set_dependent_launches(false);
    let usual = decode(be, model, &prompts, steps, leave, false);
    be.set_dependent_launches(true);
    let recorded = decode(be, model, &prompts, steps, leave, true);
    assert_eq!(usual.recorded + usual.replayed, 0);
    assert!(
        recorded.prefill == usual.prefill,
        "the prefills' hidden states differ with dependent launches"
    );
    for (s, (r, u)) in recorded.hidden.iter().zip(&usual.hidden).enumerate() {
        assert!(
            r == u,
            "step {s}: the recorded step's hidden states differ from the usual step's"
        );
    }
    assert!(
        recorded.caches == usual.caches,
        "the KV caches differ after the steps"
    );
    println!(
        "{} steps: {} recorded, {} replayed, every step bit-identical",
        steps, recorded.recorded, recorded.replayed
    );
    // One usual step per batch, a recording per RECORDED_STEPS steps, the rest replays.
    assert!(recorded.recorded >= 3, "{} recordings", recorded.recorded);
    assert!(
        recorded.replayed >= steps - 2 - 2 * recorded.recorded,
        "{} replays of {steps} steps",
        recorded.replayed
    );
}

/// A gpt-oss-shaped model with sliding and full layers ([`golden_util::small_gpt_oss_spec`]).
fn small_gpt_oss() -> ModelSpec {
    golden_util::small_gpt_oss_spec(32, &["sliding_attention", "full_attention"].repeat(2))
}

#[test]
fn recorded_dense_steps_are_bit_identical_to_usual_steps() {
    let Some(be) = gpu() else { return };
    let spec = cuda_util::small_qwen3_spec();
    let model = TargetModel::load(&be, &spec, &RandomWeights::new(&spec, 11)).unwrap();
    assert_recorded_equals_usual(&be, &model);
}

#[test]
fn recorded_gpt_oss_steps_are_bit_identical_to_usual_steps() {
    let Some(be) = gpu() else { return };
    let spec = small_gpt_oss();
    let src = RandomWeights::new(&spec, 29).with_init(0.08, 0.3);
    let model = TargetModel::load(&be, &spec, &src).unwrap();
    assert_recorded_equals_usual(&be, &model);
}

/// Experts routed on the host read the router's output mid-step, which a graph cannot hold: the
/// recording does not take, and every step runs as usual with the same bits (the rows the
/// attempt counted are put back).
#[test]
fn a_step_that_cannot_be_recorded_runs_as_usual() {
    let Some(be) = gpu() else { return };
    be.set_moe_device_routing(false);
    let spec = small_gpt_oss();
    let src = RandomWeights::new(&spec, 29).with_init(0.08, 0.3);
    let model = TargetModel::load(&be, &spec, &src).unwrap();
    let prompts = prompts(spec.vocab_size as u32);
    let usual = decode(&be, &model, &prompts, 20, (usize::MAX, 0), false);
    let recorded = decode(&be, &model, &prompts, 20, (usize::MAX, 0), true);
    assert_eq!((recorded.recorded, recorded.replayed), (0, 0));
    assert!(recorded.hidden == usual.hidden && recorded.caches == usual.caches);
}

/// `DRAFTLENS_STEP_GRAPHS=off` (here: the switch it sets) turns recording off.
#[test]
fn recording_can_be_turned_off() {
    let Some(be) = gpu() else { return };
    assert!(be.records_steps());
    be.set_step_graphs(false);
    let spec = cuda_util::small_qwen3_spec();
    let model = TargetModel::load(&be, &spec, &RandomWeights::new(&spec, 11)).unwrap();
    let recorded = decode(
        &be,
        &model,
        &prompts(spec.vocab_size as u32),
        10,
        (usize::MAX, 0),
        true,
    );
    assert_eq!((recorded.recorded, recorded.replayed), (0, 0));
}

/// Dependent launches are on wherever the GPU has them (sm_90 and later) unless turned off
/// (`DRAFTLENS_DEPENDENT_LAUNCH=off` sets the same switch), and a GPU without them refuses them.
#[test]
fn dependent_launches_follow_the_gpu() {
    let Some(be) = gpu() else { return };
    let has_them = be.info().compute_capability.0 >= 9;
    if std::env::var("DRAFTLENS_DEPENDENT_LAUNCH").is_err() {
        assert_eq!(be.dependent_launches(), has_them);
    }
    be.set_dependent_launches(false);
    assert!(!be.dependent_launches());
    be.set_dependent_launches(true);
    assert_eq!(be.dependent_launches(), has_them);
}

/// Greedy steps through [`StepRecorder::greedy_step`] (recordings that feed themselves, each
/// step launched before the last one's tokens are read) give each step's tokens of the usual
/// launch-by-launch decoding, over several recordings; feeding other tokens than it returned
/// while a step is launched ahead is an error, not a wrong step.
#[test]
fn greedy_steps_that_feed_themselves_give_the_usual_tokens() {
    let Some(be) = gpu() else { return };
    let dense = cuda_util::small_qwen3_spec();
    let oss = small_gpt_oss();
    for (spec, src) in [
        (&dense, RandomWeights::new(&dense, 11)),
        (&oss, RandomWeights::new(&oss, 29).with_init(0.08, 0.3)),
    ] {
        let model = TargetModel::load(&be, spec, &src).unwrap();
        let prompts = prompts(spec.vocab_size as u32);
        let steps = 2 * RECORDED_STEPS + 30;
        be.set_dependent_launches(false);
        let usual = decode(&be, &model, &prompts, steps, (usize::MAX, 0), false);
        be.set_dependent_launches(true);
        be.set_step_feed(true);
        let (mut recorder, mut live) = greedy_steps(&be, &model, &prompts, &usual.tokens);
        assert!(recorder.recorded >= 2 && recorder.replayed >= steps - 2 - 2 * recorder.recorded);
        assert!(recorder.replays_left() > 0, "a step is launched ahead");
        println!(
            "{:?}: {steps} greedy steps, {} recorded, {} replayed, the usual tokens",
            spec.arch, recorder.recorded, recorder.replayed
        );
        // The step launched ahead was given the tokens returned last: others are refused.
        let batch: Vec<usize> = (0..prompts.len()).collect();
        let mut ids: Vec<u32> = live.iter().map(|l| l.1).collect();
        ids[0] ^= 1;
        let mut caches: Vec<&mut KvCache<CudaBackend>> =
            live.iter_mut().map(|l| &mut l.0).collect();
        let err = recorder
            .greedy_step(&model, &ids, &batch, &mut caches)
            .unwrap_err();
        assert!(format!("{err:#}").contains("launched ahead"), "{err:#}");
    }
}

/// `DRAFTLENS_STEP_FEED=off` (here: the switch it sets): greedy steps still replay recordings,
/// but read each step's tokens before launching the next, with the same tokens.
#[test]
fn greedy_steps_without_feeding_give_the_same_tokens() {
    let Some(be) = gpu() else { return };
    be.set_step_feed(false);
    let spec = cuda_util::small_qwen3_spec();
    let model = TargetModel::load(&be, &spec, &RandomWeights::new(&spec, 11)).unwrap();
    let prompts = prompts(spec.vocab_size as u32);
    let usual = decode(&be, &model, &prompts, 40, (usize::MAX, 0), false);
    let (recorder, _) = greedy_steps(&be, &model, &prompts, &usual.tokens);
    assert!(recorder.replayed >= 30, "{} replays", recorder.replayed);
}
