//! EAGLE-3 drafters (docs/eagle3.md), each checked against an independent expectation:
//!
//! (a) golden: on the CPU backend the draft chain reproduces the pure-PyTorch reference of
//!     tools/golden/make_eagle3_golden.py (float64, written against the checkpoint layout) on the
//!     random Qwen3 golden target's taps: every draft id exactly, the top-8 log-probs to 1e-4,
//!     step 1's pre-norm state to 1e-5 relative;
//! (b) many anchors in one forward (the `Blocks` mask over the context) give what one anchor
//!     gives over a context that physically holds only the rows it may see;
//! (c) known answer: a drafter that drafts the successor of its state, on a sequence that
//!     follows the successor map, accepts all K drafts every round, as the built-in oracle does
//!     (τ = K + 1 but for the last round); with the tap one position late it accepts nothing;
//! (d) bad input: d2t out of range or not one to one, a draft vocabulary that does not fit,
//!     vocab_size, taps out of range, a missing tensor: one error naming the file and the key or
//!     tensor, from `lint` (which `run` applies before anything is computed) and from the loader;
//! (e) `run` end to end on the default target: lint says what it found, the run stores the kind
//!     eagle3, its records, and a rerun reads them back from the records cache; `--mask
//!     inclusive` is refused before a run exists;
//! the dynamic draft tree (`run --eagle3-tree`) is checked in tree.rs.

mod checkpoints;
#[path = "../golden_util/mod.rs"]
mod golden_util;
mod tree;

use checkpoints::*;
use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::{Backend, TopK};
use draftlens_engine::drafter::eagle3::Eagle3Drafter;
use draftlens_engine::drafter::eval::{
    evaluate_sequence, DraftTarget, Drafter, EvalOptions, Labels, Sequence,
};
use draftlens_engine::drafter::lint::{lint, Severity};
use draftlens_engine::model::{ModelSpec, TargetFiles};
use draftlens_records::RecordBatch;
use draftlens_results::metrics::replay;
use golden_util::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn golden_dir() -> PathBuf {
    repo_root().join("tests/fixtures/golden/eagle3")
}

fn qwen3_dir() -> PathBuf {
    repo_root().join("tests/fixtures/golden/qwen3")
}

fn qwen3() -> TargetFiles {
    TargetFiles::open(&qwen3_dir()).unwrap()
}

/// Prompt ++ greedy continuation of the Qwen3 golden prompt `p`, its prompt length, and the
/// golden EAGLE-3 drafter's taps (hs1, hs2, hs3: tap ids 0, 1, 2) over it.
fn golden_sequence(g: &Golden, p: usize) -> (Vec<u32>, usize, Vec<Vec<f32>>) {
    let mut ids = g.ids(&format!("p{p}.input_ids"));
    let plen = ids.len();
    ids.extend(g.ids(&format!("p{p}.greedy_ids")));
    let taps = (1..=3).map(|k| g.f32(&format!("p{p}.hs{k}")).1).collect();
    (ids, plen, taps)
}

fn slices(taps: &[Vec<f32>], rows: usize, d: usize) -> Vec<&[f32]> {
    taps.iter().map(|t| &t[..rows * d]).collect()
}

// ---------------------------------------------------------------------------------------------
// (a) golden
// ---------------------------------------------------------------------------------------------

#[test]
fn draft_chains_match_the_reference() {
    let be = CpuBackend::new();
    let target = qwen3();
    let d = Eagle3Drafter::load(&be, &golden_dir(), &target.spec).unwrap();
    let manifest = json(&golden_dir().join("manifest.json"));
    let steps = manifest["steps"].as_u64().unwrap() as usize;
    assert_eq!(d.cfg.steps, steps);
    assert_eq!(d.cfg.tap_layer_ids, [0, 1, 2]);
    let want = Golden::open(golden_dir().join("golden.safetensors"));
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    let (mut worst_lp, mut worst_h, mut chains) = (0f32, 0f64, 0);
    for p in 0..2 {
        let (ids, _, taps) = golden_sequence(&g, p);
        let anchors: Vec<usize> = manifest["prompts"][format!("p{p}")]["anchors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_u64().unwrap() as usize)
            .collect();
        let ctx = d
            .context(&be, None, &slices(&taps, ids.len(), 128), 128, &ids)
            .unwrap()
            .unwrap();
        assert_eq!(ctx.len, ids.len() - 1);
        let top = d.draft(&be, None, &ctx, &anchors, 8).unwrap();
        assert_eq!((top.rows, top.k), (anchors.len() * steps, 8));
        for (i, &a) in anchors.iter().enumerate() {
            let label = format!("p{p}.a{a}");
            let chain = want.ids(&format!("{label}.draft_ids"));
            let top8 = want.ids(&format!("{label}.top8_ids"));
            let (_, lps) = want.f32(&format!("{label}.top8_logprobs"));
            let ours: Vec<u32> = (0..steps).map(|s| top.row_ids(i * steps + s)[0]).collect();
            assert_eq!(ours, chain, "{label}: draft chain");
            for s in 0..steps {
                let row = i * steps + s;
                worst_lp = worst_lp.max(check_topk(
                    &format!("{label} step {}", s + 1),
                    top.row_ids(row),
                    top.row_logprobs(row),
                    &top8[s * 8..(s + 1) * 8],
                    &lps[s * 8..(s + 1) * 8],
                    1e-4,
                ));
            }
            // Step 1's state is context row a − 1.
            let (_, hidden) = want.f32(&format!("{label}.hidden"));
            let h1 = be
                .to_host(&be.gather_rows(&ctx.hidden, &[(a - 1) as u32]).unwrap())
                .unwrap();
            let dh = diff(&h1, &hidden[..d.cfg.hidden_size]);
            assert!(dh.rel < 1e-5, "{label}: step-1 state {dh:?}");
            worst_h = worst_h.max(dh.rel);
            chains += 1;
        }
    }
    assert_eq!(chains, 7);
    println!("eagle3 golden: {chains} chains of {steps}, ids exact, max |Δ log-prob| {worst_lp:.2e}, step-1 state rel {worst_h:.2e}");
}

// ---------------------------------------------------------------------------------------------
// (b) batched = one anchor over a truncated context
// ---------------------------------------------------------------------------------------------

#[test]
fn batched_anchors_equal_one_anchor_over_its_own_context() {
    let be = CpuBackend::new();
    let d = Eagle3Drafter::load(&be, &golden_dir(), &qwen3().spec).unwrap();
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    let steps = d.cfg.steps;
    for p in 0..2 {
        let (ids, plen, taps) = golden_sequence(&g, p);
        let full = d
            .context(&be, None, &slices(&taps, ids.len(), 128), 128, &ids)
            .unwrap()
            .unwrap();
        let anchors: Vec<usize> = (1..ids.len() - 1).collect();
        let batched = d.draft(&be, None, &full, &anchors, 6).unwrap();
        let mut worst = 0f32;
        for (i, &a) in anchors.iter().enumerate() {
            // Positions 0..=a: context rows 0..a−1 (row j needs the token at j + 1).
            let own = d
                .context(&be, None, &slices(&taps, a + 1, 128), 128, &ids[..=a])
                .unwrap()
                .unwrap();
            assert_eq!(own.len, a);
            let single = d.draft(&be, None, &own, &[a], 6).unwrap();
            for s in 0..steps {
                let (r, b) = (s, i * steps + s);
                assert_eq!(
                    single.row_ids(r),
                    batched.row_ids(b),
                    "p{p} a{a} step {}",
                    s + 1
                );
                for (x, y) in single.row_logprobs(r).iter().zip(batched.row_logprobs(b)) {
                    worst = worst.max((x - y).abs());
                }
            }
        }
        // Float noise only (the GEMMs see other row counts); a row of the context at or after
        // the anchor changes log-probs by far more.
        assert!(worst < 1e-4, "p{p}: |Δ log-prob| {worst}");
        println!(
            "p{p} (prompt {plen}): {} anchors, batched vs single max |Δ| {worst:.2e}",
            anchors.len()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (c) known answer
// ---------------------------------------------------------------------------------------------

fn blocks_by_anchor(batch: &RecordBatch) -> HashMap<u32, usize> {
    (0..batch.num_blocks())
        .map(|b| (batch.anchor[b], b))
        .collect()
}

/// A target spec with hidden size and vocabulary `v` (the successor drafter's), 4 layers.
fn spec_of_size(v: usize) -> ModelSpec {
    let mut spec = qwen3().spec;
    spec.hidden_size = v;
    spec.vocab_size = v;
    spec
}

#[test]
fn successor_drafter_accepts_every_draft() {
    let (v, steps) = (16usize, 4usize);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("successor");
    write_successor_eagle3(&dir, v, steps);
    let be = CpuBackend::new();
    let d = Eagle3Drafter::load(&be, &dir, &spec_of_size(v)).unwrap();
    assert_eq!(d.block_size(), steps + 1);
    // A sequence that follows the successor map, and the target's "prediction" at every
    // position: its next token.
    let (len, plen) = (31usize, 6usize);
    let mut ids = vec![7u32];
    while ids.len() < len {
        ids.push(successor(*ids.last().unwrap(), v as u32));
    }
    let next = |t: usize| ids.get(t + 1).copied().unwrap_or(0);
    let target_topk = TopK {
        rows: len,
        k: 1,
        ids: (0..len).map(next).collect(),
        logprobs: vec![0.0; len],
    };
    // Tap 0 at position j is e_{y_{j+1}} (what the target's state at j predicts); `shift` = 1
    // puts the feature of position j + 1 there instead: an off-by-one in the feature-token
    // alignment.
    let taps = |shift: usize| -> Vec<Vec<f32>> {
        let mut t0 = vec![0f32; len * v];
        for j in 0..len {
            if let Some(&y) = ids.get(j + 1 + shift) {
                t0[j * v + y as usize] = 1.0;
            }
        }
        vec![t0, vec![0f32; len * v], vec![0f32; len * v]]
    };
    let opts = EvalOptions {
        top_k: 4,
        anchor_batch: 7,
        ..EvalOptions::default()
    };
    let evaluate = |drafter: &Drafter<CpuBackend>, shift: usize| -> RecordBatch {
        let mut seq = Sequence::new(0, &ids, plen, &target_topk, Labels::Target);
        if let Drafter::Eagle3(d) = drafter {
            let t = taps(shift);
            seq.eagle3 = d.context(&be, None, &slices(&t, len, v), v, &ids).unwrap();
        }
        evaluate_sequence(&be, DraftTarget::Vocab(v), drafter, &seq, &opts).unwrap()
    };
    let eagle = Drafter::Eagle3(d);
    let records = evaluate(&eagle, 0);
    let oracle = evaluate(
        &Drafter::Oracle {
            block_size: steps + 1,
        },
        0,
    );
    assert_eq!(records.anchor, oracle.anchor);
    for b in 0..records.num_blocks() {
        let left = len - 1 - records.anchor[b] as usize;
        assert_eq!(
            records.accepted_len(b),
            steps.min(left),
            "anchor {}",
            records.anchor[b]
        );
        assert_eq!(records.accepted_len(b), oracle.accepted_len(b));
    }
    // The replayed decode: N − 1 tokens after the prefill token, K + 1 per round but the last.
    let produced = (len - plen - 1) as u64;
    let want = (produced.div_ceil(steps as u64 + 1), produced);
    assert_eq!(
        replay(&records, &blocks_by_anchor(&records), plen, len),
        Some(want)
    );
    assert_eq!(
        replay(&oracle, &blocks_by_anchor(&oracle), plen, len),
        Some(want)
    );
    // Reading the feature one position late drafts two tokens ahead: nothing is accepted.
    let late = evaluate(&eagle, 1);
    assert!((0..late.num_blocks()).all(|b| late.accepted_len(b) == 0));
}

// ---------------------------------------------------------------------------------------------
// (d) bad input
// ---------------------------------------------------------------------------------------------

/// The golden checkpoint copied to `dir` with its config and tensors edited.
fn variant(
    dir: &Path,
    edit_config: impl Fn(&mut serde_json::Value),
    edit_tensors: impl Fn(&mut Vec<draftlens_engine::util::SafetensorsEntry>),
) -> PathBuf {
    let mut config = json(&golden_dir().join("config.json"));
    edit_config(&mut config);
    let mut tensors = read_entries(&golden_dir().join("model.safetensors"));
    edit_tensors(&mut tensors);
    write_checkpoint(dir, &config, &tensors);
    dir.to_path_buf()
}

fn set_d2t(tensors: &mut [draftlens_engine::util::SafetensorsEntry], f: impl Fn(&mut [i64])) {
    let e = tensors.iter_mut().find(|e| e.0 == "d2t").unwrap();
    let mut v: Vec<i64> =
        e.3.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
    f(&mut v);
    *e = i64_entry("d2t", &v);
}

#[test]
fn bad_checkpoints_are_refused_naming_the_file_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    let target = qwen3();
    let be = CpuBackend::new();
    let keep = |_: &mut serde_json::Value| {};
    let same = |_: &mut Vec<draftlens_engine::util::SafetensorsEntry>| {};
    type Case = (&'static str, PathBuf, &'static str, &'static str);
    let cases: Vec<Case> = vec![
        (
            "d2t out of range",
            variant(&tmp.path().join("a"), keep, |t| set_d2t(t, |v| v[159] = 400)),
            "vocab-map",
            "model.safetensors: d2t[159] = 400 maps draft id 159 to target id 559, outside the target's vocabulary 0..512",
        ),
        (
            "d2t not one to one",
            variant(&tmp.path().join("b"), keep, |t| set_d2t(t, |v| v[1] = v[0] - 1)),
            "vocab-map",
            "model.safetensors: d2t maps draft ids 0 and 1 to the same target id",
        ),
        (
            "draft_vocab_size that does not fit d2t",
            variant(&tmp.path().join("c"), |c| c["draft_vocab_size"] = 150.into(), same),
            "vocab-map",
            "model.safetensors: tensor d2t has shape [160], expected [150] (draft_vocab_size)",
        ),
        (
            "no d2t for a smaller draft vocabulary",
            variant(&tmp.path().join("d"), keep, |t| t.retain(|e| e.0 != "d2t")),
            "vocab-map",
            "model.safetensors: tensor d2t is missing, and the draft vocabulary (160 ids, draft_vocab_size) is not the target's (512)",
        ),
        (
            "vocab_size of another target",
            variant(&tmp.path().join("e"), |c| c["vocab_size"] = 1000.into(), same),
            "vocab-size",
            "vocab_size 1000 differs from the target's 512",
        ),
        (
            "taps out of range",
            variant(
                &tmp.path().join("f"),
                |c| c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = serde_json::json!([0, 1, 4]),
                same,
            ),
            "tap-range",
            "eagle_config.eagle_aux_hidden_state_layer_ids holds tap 4 (a decoder-layer output id), but the target has only 4 decoder layers (ids 0..3)",
        ),
        (
            "a missing tensor",
            variant(&tmp.path().join("g"), keep, |t| {
                t.retain(|e| e.0 != "midlayer.hidden_norm.weight")
            }),
            "weights",
            "model.safetensors: tensor midlayer.hidden_norm.weight is missing",
        ),
        (
            "the target's embedding at another width",
            variant(&tmp.path().join("h"), keep, |t| {
                t.retain(|e| e.0 != "embed_tokens.weight")
            }),
            "hidden-size",
            "no embed_tokens.weight, so the target's embedding would be used, but hidden_size 64 differs from the target's 128",
        ),
    ];
    for (what, dir, code, message) in &cases {
        let findings = lint(&target, dir).unwrap();
        let errors: Vec<_> = findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .collect();
        assert!(
            errors
                .iter()
                .any(|f| f.code == *code && f.message.contains(message)),
            "{what}: {errors:#?}"
        );
        // The loader refuses it too, with the file named.
        let e = format!(
            "{:#}",
            Eagle3Drafter::load(&be, dir, &target.spec).err().unwrap()
        );
        assert!(e.contains(&*dir.to_string_lossy()), "{what}: {e}");
    }
    // The golden checkpoint itself: no error, and lint says what it found.
    let findings = lint(&target, &golden_dir()).unwrap();
    assert!(
        findings.iter().all(|f| f.severity != Severity::Error),
        "{findings:#?}"
    );
    let info = findings.iter().find(|f| f.code == "eagle3").unwrap();
    assert!(
        info.message.contains("LlamaForCausalLMEagle3")
            && info
                .message
                .contains("draft vocabulary 160 of the target's 512")
            && info.message.contains("its own embedding")
            && info
                .message
                .contains("a chain of 5 steps per round (num_speculative_tokens)"),
        "{}",
        info.message
    );
    let taps = findings.iter().find(|f| f.code == "taps").unwrap();
    assert!(taps.message.contains("[0, 1, 2]") && taps.message.contains("eagle_config"));
    // t2d disagreeing with d2t is a warning: only training reads it.
    let dir = variant(&tmp.path().join("t2d"), keep, |t| {
        let e = t.iter_mut().find(|e| e.0 == "t2d").unwrap();
        e.3.iter_mut().for_each(|b| *b = 1);
    });
    let findings = lint(&target, &dir).unwrap();
    assert!(findings.iter().all(|f| f.severity != Severity::Error));
    assert!(findings
        .iter()
        .any(|f| f.code == "t2d" && f.severity == Severity::Warning));
}

// ---------------------------------------------------------------------------------------------
// (e) run end to end
// ---------------------------------------------------------------------------------------------

#[test]
fn run_stores_an_eagle3_run_and_reuses_its_records() {
    use draftlens_engine::drafter::run::{run_eval, DrafterSpec, RunOptions};
    use draftlens_engine::hidden_cache::HiddenCache;
    use draftlens_engine::prompts::PromptSet;
    use draftlens_engine::session::{Session, SessionOptions};
    use draftlens_results::store::{RunFilter, RunMode, Store};
    let tmp = tempfile::tempdir().unwrap();
    let model = default_model();
    let files = TargetFiles::open(&model).unwrap();
    let dir = tmp.path().join("eagle3-smol").join("step-10");
    write_random_eagle3(
        &dir,
        files.spec.hidden_size,
        files.spec.vocab_size,
        2000,
        3,
        7,
    );
    // lint: the engines' default taps for 30 layers, [1, 14, 26].
    let findings = lint(&files, &dir).unwrap();
    assert!(
        findings.iter().all(|f| f.severity != Severity::Error),
        "{findings:#?}"
    );
    assert!(findings
        .iter()
        .any(|f| f.code == "taps" && f.message.contains("[1, 14, 26]")));

    let prompts = tmp.path().join("p.jsonl");
    let lines: Vec<String> = ["The capital of France is", "def fibonacci(n):"]
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": format!("p{i}"), "prompt": t}).to_string())
        .collect();
    std::fs::write(&prompts, lines.join("\n")).unwrap();
    let set = PromptSet::load_path(&prompts).unwrap();
    let opts = RunOptions {
        name: None,
        mode: RunMode::Deployment,
        eval: Default::default(),
        max_new_tokens: 8,
        fail_after: None,
    };
    let s = Session::load(
        CpuBackend::new(),
        &model,
        HiddenCache::open(&tmp.path().join("cache")).unwrap(),
        SessionOptions::default(),
    )
    .unwrap();
    let store = Store::open(&tmp.path().join("runs.sqlite")).unwrap();
    let spec = DrafterSpec::Checkpoint {
        dir: dir.clone(),
        step: Some(10),
        series: "eagle3-smol".into(),
    };
    let first = run_eval(&s, &spec, &set, &opts, &store).unwrap();
    assert!(first.blocks > 0);
    assert_eq!(first.timings["records_cached"], 0);
    let eval = store.run_eval(first.run_id).unwrap().unwrap();
    assert_eq!(eval.identity_json["drafter_kind"], "eagle3");
    assert_eq!(eval.identity_json["block_size"], 4);
    let records = store.records(first.run_id).unwrap();
    assert_eq!(records.block_size, 4);
    // Every drafted id is in the draft vocabulary, mapped to the target's ids.
    let d = Eagle3Drafter::load(&CpuBackend::new(), &dir, &files.spec).unwrap();
    let vocab: std::collections::HashSet<u32> = d.vocab.target_of.iter().copied().collect();
    assert!(records.draft_ids.iter().all(|t| vocab.contains(t)));
    // A second run of the same checkpoint reads its records back from the cache.
    let second = run_eval(&s, &spec, &set, &opts, &store).unwrap();
    assert_eq!(second.timings["records_cached"], 2);
    assert_eq!(second.metrics, first.metrics);
    // DFlash's training leak has no EAGLE-3 meaning: refused before a run exists.
    let runs = || store.runs(&RunFilter::default()).unwrap().1;
    let before = runs();
    let mut leaky = opts.clone();
    leaky.mode = RunMode::TrainStyle;
    leaky.eval.ctx_inclusive = true;
    let e = format!(
        "{:#}",
        run_eval(&s, &spec, &set, &leaky, &store).unwrap_err()
    );
    assert!(e.contains("--mask inclusive"), "{e}");
    assert_eq!(runs(), before);
}

// ---------------------------------------------------------------------------------------------
// (f) live decoding (docs/live.md): lossless, and live τ = replayed τ round by round
// ---------------------------------------------------------------------------------------------

#[path = "../live_util/mod.rs"]
mod live_util;

/// The golden drafter decoding live on the random Qwen3 golden target (CPU): its output is plain
/// greedy decoding's (transformers' own continuation in the golden), and its rounds are the
/// replay's over the same sequence, with the chain's context rows grown round by round
/// (`Eagle3Drafter::extend_context`) where the replay computes them in one pass; an EOS inside
/// the continuation ends both where greedy decoding stops.
#[test]
fn live_decoding_is_lossless_and_its_tau_is_the_replayed_tau() {
    use draftlens_engine::model::TargetModel;
    let be = CpuBackend::new();
    let files = qwen3();
    let target = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let d = Drafter::Eagle3(Eagle3Drafter::load(&be, &golden_dir(), &files.spec).unwrap());
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    let mut accepted = 0;
    for p in 0..2 {
        let prompt = g.ids(&format!("p{p}.input_ids"));
        let golden = g.ids(&format!("p{p}.greedy_ids"));
        let label = format!("eagle3 p{p}");
        let c = live_util::check_live(&be, &target, &d, &prompt, golden.len(), &[], &label);
        assert_eq!(
            c.live.ids, golden,
            "{label}: transformers' greedy continuation"
        );
        accepted += c.live.accepted.iter().sum::<u32>();
        println!(
            "{label}: {} rounds, live τ {:.4} = replayed τ {:.4}",
            c.live.round_tokens.len(),
            c.live.tau(),
            c.replayed_tau
        );
        let eos = golden[9];
        let c = live_util::check_live(
            &be,
            &target,
            &d,
            &prompt,
            golden.len(),
            &[eos],
            &format!("{label} eos"),
        );
        assert_eq!(c.live.ids.last(), Some(&eos));
    }
    // The random golden drafter accepts nothing on this target: the per-round proposals compared
    // with the replay's drafts (`check_live`) are what checks its context rows here.
    println!("eagle3: {accepted} drafts accepted");
}
