//! Native MTP heads (docs/mtp.md), each checked against an independent expectation:
//!
//! (a) golden: on the CPU backend, the random Qwen3.5 golden target with the head of
//!     tools/golden/make_mtp_golden.py (its float64 reference, written against the checkpoint
//!     layout around transformers' own Qwen3_5DecoderLayer) drafts every chain's ids exactly, the
//!     top-8 log-probs to 1e-4 and step 1's normed state to 1e-4 relative; our anchors share each
//!     step's forward (the `Blocks` mask) where the reference drafts each anchor alone;
//! (b) known answer: a head built to map the target's state of token u to the one of its successor
//!     π(u), on a sequence that follows π, accepts all K drafts every round, as the built-in
//!     oracle (τ = K + 1 but for the last round); fed the target's state one position late it
//!     accepts nothing;
//! (c) bad input: a target without `mtp.*` tensors, a partial head, a tensor of the wrong shape,
//!     `mtp_num_hidden_layers` 0 or 2, a dense target, K out of range: one error naming the file
//!     and the key or tensor, before anything is uploaded; `run` refuses them before a run exists;
//! (d) `run` end to end: a run of kind `mtp` with B = K + 1 whose records equal drafting the same
//!     sequences directly, read back from the records cache by a second run;
//! (e) live greedy decoding: lossless, live τ = the replayed τ;
//! (f) GGUF targets: the head written as llama.cpp's converter writes it reads back bit-equal to
//!     the safetensors head (dense and MoE) and drafts the same chains; bad GGUF heads refused;
//! (g) live speculative sampling at T > 0: lossless in distribution (chi-square against the exact
//!     marginals, with its power; `sampling_util`), and at K = 1 live τ at T = 1 = the replayed
//!     expectation within its interval.

#[path = "../golden_util/mod.rs"]
mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::{Backend, TopK};
use draftlens_engine::drafter::eval::{
    evaluate_sequence, DraftTarget, Drafter, EvalOptions, Labels, Sequence,
};
use draftlens_engine::drafter::mtp::MtpDrafter;
use draftlens_engine::drafter::run::DrafterSpec;
use draftlens_engine::model::{Capture, TargetFiles, TargetHead, TargetModel};
use draftlens_engine::util::{write_safetensors, SafetensorsEntry};
use draftlens_records::RecordBatch;
use draftlens_results::metrics::replay;
use golden_util::*;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn golden_dir() -> PathBuf {
    repo_root().join("tests/fixtures/golden/mtp")
}

fn qwen3_5_dir() -> PathBuf {
    repo_root().join("tests/fixtures/golden/qwen3_5")
}

fn read_entries(path: &Path) -> Vec<SafetensorsEntry> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<SafetensorsEntry> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| (name, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn f32_entry(name: &str, shape: Vec<usize>, values: &[f32]) -> SafetensorsEntry {
    let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    (name.to_string(), Dtype::F32, shape, bytes)
}

/// A Qwen3.5 target folder at `dir`: the qwen3_5 golden target's tensors (whose stray
/// `mtp.fc.weight` is the golden head's fc) plus the golden head's other tensors, the golden
/// config; `edit_config` / `edit_tensors` change them first.
fn write_target(
    dir: &Path,
    edit_config: impl Fn(&mut serde_json::Value),
    edit_tensors: impl Fn(&mut Vec<SafetensorsEntry>),
) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut config = json(&golden_dir().join("config.json"));
    edit_config(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors = read_entries(&qwen3_5_dir().join("model.safetensors"));
    tensors.extend(read_entries(&golden_dir().join("mtp.safetensors")));
    edit_tensors(&mut tensors);
    write_safetensors(&dir.join("model.safetensors"), &tensors).unwrap();
    dir.to_path_buf()
}

fn golden_target(dir: &Path) -> PathBuf {
    write_target(dir, |_| {}, |_| {})
}

// ---------------------------------------------------------------------------------------------
// (a) golden
// ---------------------------------------------------------------------------------------------

#[test]
fn draft_chains_match_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = golden_target(&tmp.path().join("target"));
    let be = CpuBackend::new();
    let files = TargetFiles::open(&dir).unwrap();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let manifest = json(&golden_dir().join("manifest.json"));
    let steps = manifest["steps"].as_u64().unwrap() as usize;
    let d = MtpDrafter::load(&be, &dir, &files.spec, steps).unwrap();
    assert_eq!(d.block_size(), steps + 1);
    let want = Golden::open(golden_dir().join("golden.safetensors"));
    let g = Golden::open(qwen3_5_dir().join("golden.safetensors"));
    let hidden = files.spec.hidden_size;
    let (mut worst_lp, mut worst_h, mut chains) = (0f32, 0f64, 0);
    for p in 0..2 {
        let mut ids = g.ids(&format!("p{p}.input_ids"));
        ids.extend(g.ids(&format!("p{p}.greedy_ids")));
        // The target's final-norm states over the sequence, as a run's target pass gives them.
        let out = model
            .forward(&be, &ids, &mut model.new_cache(), &Capture::none())
            .unwrap();
        let ctx = d
            .context_from_tensor(&be, &model, &out.last_hidden, &ids)
            .unwrap()
            .unwrap();
        assert_eq!(ctx.len, ids.len() - 1);
        let anchors: Vec<usize> = manifest["prompts"][format!("p{p}")]["anchors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_u64().unwrap() as usize)
            .collect();
        let top = d.draft(&be, &model, &ctx, &anchors, 8).unwrap();
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
            let (_, state) = want.f32(&format!("{label}.hidden"));
            let h1 = be
                .to_host(&be.gather_rows(&ctx.hidden, &[(a - 1) as u32]).unwrap())
                .unwrap();
            let dh = diff(&h1, &state[..hidden]);
            assert!(dh.rel < 1e-4, "{label}: step-1 state {dh:?}");
            worst_h = worst_h.max(dh.rel);
            chains += 1;
        }
    }
    assert_eq!(chains, 12);
    eprintln!(
        "mtp golden: {chains} chains of {steps} exact; top-8 log-probs worst |Δ| {worst_lp:.2e}, \
         step-1 state worst rel {worst_h:.2e}"
    );
}

// ---------------------------------------------------------------------------------------------
// (b) known answer
// ---------------------------------------------------------------------------------------------

/// The cycle π the known-answer head follows: these tokens, each followed by the next.
const CYCLE: [u32; 8] = [7, 100, 33, 260, 411, 5, 198, 321];

fn successor(u: u32) -> u32 {
    let i = CYCLE.iter().position(|&c| c == u).unwrap();
    CYCLE[(i + 1) % CYCLE.len()]
}

/// Solves `a x = b` (n × n, row-major) by Gaussian elimination with partial pivoting.
fn solve(mut a: Vec<f64>, mut b: Vec<f64>, n: usize) -> Vec<f64> {
    for c in 0..n {
        let p = (c..n)
            .max_by(|&i, &j| a[i * n + c].abs().total_cmp(&a[j * n + c].abs()))
            .unwrap();
        for k in 0..n {
            a.swap(c * n + k, p * n + k);
        }
        b.swap(c, p);
        for r in c + 1..n {
            let f = a[r * n + c] / a[c * n + c];
            for k in c..n {
                a[r * n + k] -= f * a[c * n + k];
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = vec![0.0; n];
    for c in (0..n).rev() {
        let s: f64 = (c + 1..n).map(|k| a[c * n + k] * x[k]).sum();
        x[c] = (b[c] - s) / a[c * n + c];
    }
    x
}

/// The head's fc `[D, 2·D]` = `[0 │ M]` with M W_u = W_π(u) for every u of the cycle (W_u = the
/// target's LM-head row of u): M = Y (XᵀX)⁻¹ Xᵀ, X = the rows of the cycle, Y = their successors'.
fn successor_fc(lm_head: &[f32], d: usize) -> Vec<f32> {
    let m = CYCLE.len();
    let row = |u: u32| &lm_head[u as usize * d..(u as usize + 1) * d];
    let gram: Vec<f64> = (0..m * m)
        .map(|ij| {
            let (i, j) = (ij / m, ij % m);
            row(CYCLE[i])
                .iter()
                .zip(row(CYCLE[j]))
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum()
        })
        .collect();
    // C = (XᵀX)⁻¹ Xᵀ, column by column of Xᵀ: C[:, k] solves (XᵀX) c = X[k, :]ᵀ.
    let mut c = vec![0f64; m * d];
    for k in 0..d {
        let rhs: Vec<f64> = CYCLE.iter().map(|&u| row(u)[k] as f64).collect();
        let col = solve(gram.clone(), rhs, m);
        for i in 0..m {
            c[i * d + k] = col[i];
        }
    }
    let mut fc = vec![0f32; d * 2 * d];
    for r in 0..d {
        for k in 0..d {
            let v: f64 = (0..m)
                .map(|i| row(successor(CYCLE[i]))[r] as f64 * c[i * d + k])
                .sum();
            fc[r * 2 * d + d + k] = v as f32;
        }
    }
    fc
}

fn blocks_by_anchor(batch: &RecordBatch) -> HashMap<u32, usize> {
    (0..batch.num_blocks())
        .map(|b| (batch.anchor[b], b))
        .collect()
}

#[test]
fn successor_head_accepts_every_draft() {
    let steps = 4usize;
    let tmp = tempfile::tempdir().unwrap();
    let be = CpuBackend::new();
    let head_files = TargetFiles::open(&qwen3_5_dir()).unwrap();
    let (d, v) = (head_files.spec.hidden_size, head_files.spec.vocab_size);
    let lm_head = head_files.weights.tensor("lm_head.weight").unwrap().data;
    // The state of u predicts u: the LM head's row of u scores u above every other token.
    for &u in &CYCLE {
        let row = &lm_head[u as usize * d..(u as usize + 1) * d];
        let score = |t: usize| -> f32 {
            lm_head[t * d..(t + 1) * d]
                .iter()
                .zip(row)
                .map(|(a, b)| a * b)
                .sum()
        };
        assert!((0..v).all(|t| t == u as usize || score(t) < score(u as usize)));
    }
    // fc = [0 │ M]: the token plays no part; the layer adds nothing (o_proj and down_proj 0); the
    // three norms scale by 1 (zero-centred weights 0).
    let fc = successor_fc(&lm_head, d);
    let dir = write_target(
        &tmp.path().join("successor"),
        |_| {},
        |t| {
            for e in t.iter_mut() {
                let zero = e.0.ends_with("o_proj.weight")
                    || e.0.ends_with("down_proj.weight")
                    || e.0.starts_with("mtp.pre_fc_norm")
                    || e.0 == "mtp.norm.weight";
                if e.0.starts_with("mtp.") && zero {
                    *e = f32_entry(&e.0, e.2.clone(), &vec![0.0; e.2.iter().product()]);
                }
            }
            let i = t.iter().position(|e| e.0 == "mtp.fc.weight").unwrap();
            t[i] = f32_entry("mtp.fc.weight", vec![d, 2 * d], &fc);
        },
    );
    let files = TargetFiles::open(&dir).unwrap();
    let head = TargetHead::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let mtp = Drafter::Mtp(MtpDrafter::load(&be, &dir, &files.spec, steps).unwrap());
    // A sequence that follows π, and the target's "prediction" at every position: its next token.
    let (len, plen) = (29usize, 5usize);
    let ids: Vec<u32> = (0..len).map(|i| CYCLE[i % CYCLE.len()]).collect();
    let next = |t: usize| ids.get(t + 1).copied().unwrap_or(0);
    let target_topk = TopK {
        rows: len,
        k: 1,
        ids: (0..len).map(next).collect(),
        logprobs: vec![0.0; len],
    };
    // The target's state at j is W_{y_{j+1}} (what it predicts); `shift` = 1 puts the state of
    // position j + 1 there instead: an off-by-one in the state-token alignment.
    let states = |shift: usize| -> Vec<f32> {
        (0..len)
            .flat_map(|j| {
                let y = ids.get(j + 1 + shift).copied().unwrap_or(CYCLE[0]) as usize;
                lm_head[y * d..(y + 1) * d].to_vec()
            })
            .collect()
    };
    let opts = EvalOptions {
        top_k: 4,
        anchor_batch: 7,
        ..EvalOptions::default()
    };
    let target = DraftTarget::Head(&head);
    let evaluate = |drafter: &Drafter<CpuBackend>, shift: usize| -> RecordBatch {
        let mut seq = Sequence::new(0, &ids, plen, &target_topk, Labels::Target);
        if let Drafter::Mtp(m) = drafter {
            let s = states(shift);
            seq.mtp = m.context(&be, &head, s.as_slice(), &ids).unwrap();
        }
        evaluate_sequence(&be, target, drafter, &seq, &opts).unwrap()
    };
    let records = evaluate(&mtp, 0);
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
    // Reading the target's state one position late drafts two tokens ahead: nothing is accepted.
    let late = evaluate(&mtp, 1);
    assert!((0..late.num_blocks()).all(|b| late.accepted_len(b) == 0));
}

// ---------------------------------------------------------------------------------------------
// (c) bad input
// ---------------------------------------------------------------------------------------------

/// The error loading the MTP head of the target at `dir` with K = `steps`.
fn load_error(dir: &Path, steps: usize) -> String {
    let files = TargetFiles::open(dir).unwrap();
    match MtpDrafter::load(&CpuBackend::new(), dir, &files.spec, steps) {
        Ok(_) => panic!("{}: the MTP head loaded", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn targets_without_a_whole_head_are_refused_naming_the_file_and_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    // Qwen3-Next golden: no mtp.* tensor at all.
    let next = repo_root().join("tests/fixtures/golden/qwen3_next");
    let e = load_error(&next, 3);
    assert!(
        e.contains("qwen3_next") && e.contains("no mtp.* tensors"),
        "{e}"
    );
    // Qwen3.5 golden: only the stray mtp.fc.weight.
    let e = load_error(&qwen3_5_dir(), 3);
    assert!(
        e.contains("tensor mtp.pre_fc_norm_embedding.weight is missing") && e.contains("partial"),
        "{e}"
    );
    // A layer tensor missing, and one of the wrong shape.
    let no_k = write_target(
        &tmp.path().join("no-k"),
        |_| {},
        |t| t.retain(|e| e.0 != "mtp.layers.0.self_attn.k_proj.weight"),
    );
    let e = load_error(&no_k, 3);
    assert!(
        e.contains("tensor mtp.layers.0.self_attn.k_proj.weight is missing"),
        "{e}"
    );
    let bad_fc = write_target(
        &tmp.path().join("bad-fc"),
        |_| {},
        |t| {
            let i = t.iter().position(|e| e.0 == "mtp.fc.weight").unwrap();
            t[i] = f32_entry("mtp.fc.weight", vec![64, 64], &[0.0; 64 * 64]);
        },
    );
    let e = load_error(&bad_fc, 3);
    assert!(
        e.contains("tensor mtp.fc.weight") && e.contains("[64, 64]") && e.contains("[64, 128]"),
        "{e}"
    );
    // A config that declares no head, or two MTP layers.
    let set_layers = |n: u64| {
        move |c: &mut serde_json::Value| c["text_config"]["mtp_num_hidden_layers"] = n.into()
    };
    let none = write_target(&tmp.path().join("zero"), set_layers(0), |_| {});
    let e = load_error(&none, 3);
    assert!(
        e.contains("mtp_num_hidden_layers = 0") && e.contains("declares no MTP head"),
        "{e}"
    );
    let two = write_target(&tmp.path().join("two"), set_layers(2), |_| {});
    let e = load_error(&two, 3);
    assert!(
        e.contains("mtp_num_hidden_layers = 2") && e.contains("one layer"),
        "{e}"
    );
    // A dense target has no head to read.
    let qwen3 = repo_root().join("tests/fixtures/golden/qwen3");
    let e = load_error(&qwen3, 3);
    assert!(e.contains("has no native MTP head"), "{e}");
    // K out of range, on an otherwise good head.
    let good = golden_target(&tmp.path().join("good"));
    for k in [0, 1024] {
        let e = load_error(&good, k);
        assert!(e.contains(&format!("K = {k} is out of range")), "{e}");
    }
    // The names `--drafter` takes.
    let e = format!(
        "{:#}",
        DrafterSpec::builtin("target:mtp:0", 16).unwrap_err()
    );
    assert!(
        e.contains("target:mtp:0") && e.contains("out of range"),
        "{e}"
    );
    assert!(matches!(
        DrafterSpec::builtin("target:mtp", 16).unwrap(),
        Some(DrafterSpec::Mtp { steps: 3 })
    ));
}

// ---------------------------------------------------------------------------------------------
// (d) run end to end
// ---------------------------------------------------------------------------------------------

/// A word-level tokenizer of 40 words (ids 0..40) in `dir`, "w39" its end of sequence.
fn write_tokenizer(dir: &Path) {
    let mut vocab = serde_json::Map::new();
    for i in 0..40 {
        vocab.insert(format!("w{i}"), i.into());
    }
    let tok = serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"eos_token": "w39"}).to_string(),
    )
    .unwrap();
}

#[test]
fn run_stores_an_mtp_run_and_reuses_its_records() {
    use draftlens_engine::drafter::run::{run_eval, RunOptions};
    use draftlens_engine::hidden_cache::HiddenCache;
    use draftlens_engine::prompts::PromptSet;
    use draftlens_engine::session::{Session, SessionOptions};
    use draftlens_results::store::{RunFilter, RunMode, Store};
    let tmp = tempfile::tempdir().unwrap();
    let dir = golden_target(&tmp.path().join("target"));
    write_tokenizer(&dir);
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": \"a\", \"prompt\": \"w1 w2 w3 w4 w5\"}\n{\"id\": \"b\", \"prompt\": \"w7 w8\"}\n",
    )
    .unwrap();
    let set = PromptSet::load_path(&prompts).unwrap();
    let opts = RunOptions {
        name: None,
        mode: RunMode::Deployment,
        eval: Default::default(),
        max_new_tokens: 12,
        fail_after: None,
    };
    let s = Session::load(
        CpuBackend::new(),
        &dir,
        HiddenCache::open(&tmp.path().join("cache")).unwrap(),
        SessionOptions::default(),
    )
    .unwrap();
    let store = Store::open(&tmp.path().join("runs.sqlite")).unwrap();
    let spec = DrafterSpec::Mtp { steps: 3 };
    let first = run_eval(&s, &spec, &set, &opts, &store).unwrap();
    assert!(first.blocks > 0);
    assert_eq!(first.timings["records_cached"], 0);
    let eval = store.run_eval(first.run_id).unwrap().unwrap();
    assert_eq!(eval.identity_json["drafter_kind"], "mtp");
    assert_eq!(eval.identity_json["block_size"], 4);
    let run = store.run(first.run_id).unwrap().unwrap().run;
    assert_eq!(run.drafter_path, "target:mtp:3");
    // The stored records are the head's drafts of the run's sequences, drafted here directly.
    let records = store.records(first.run_id).unwrap();
    assert_eq!(records.block_size, 4);
    let be = CpuBackend::new();
    let model = TargetModel::load(&be, &s.files.spec, s.files.weights.as_ref()).unwrap();
    let d = Drafter::Mtp(MtpDrafter::load(&be, &dir, &s.files.spec, 3).unwrap());
    let stored = store.prompts(first.run_id).unwrap();
    let mut direct = RecordBatch::new(4, opts.eval.top_k as u32);
    direct.target_ids = Some(Vec::new());
    direct.target_logprobs = Some(Vec::new());
    for p in &stored {
        let ids = &p.token_ids;
        let out = model
            .forward(&be, ids, &mut model.new_cache(), &Capture::none())
            .unwrap();
        let topk = model
            .logits_topk(&be, &out.last_hidden, opts.eval.top_k)
            .unwrap();
        let mut seq = Sequence::new(p.index, ids, p.prompt_len as usize, &topk, Labels::Target);
        if let Drafter::Mtp(m) = &d {
            seq.mtp = m
                .context_from_tensor(&be, &model, &out.last_hidden, ids)
                .unwrap();
        }
        let rec = evaluate_sequence(&be, DraftTarget::Head(&model), &d, &seq, &opts.eval).unwrap();
        direct.extend(&rec);
    }
    assert_eq!(records.anchor, direct.anchor);
    assert_eq!(records.draft_ids, direct.draft_ids);
    assert_eq!(records.target, direct.target);
    // A second run reads its records back from the cache.
    let second = run_eval(&s, &spec, &set, &opts, &store).unwrap();
    assert_eq!(second.timings["records_cached"], 2);
    assert_eq!(second.metrics, first.metrics);
    // Refused before a run exists: DFlash's training leak, K out of range, a target without a
    // head (the Qwen3.5 golden GGUF, which carries no MTP blocks).
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
    let e = format!(
        "{:#}",
        run_eval(&s, &DrafterSpec::Mtp { steps: 0 }, &set, &opts, &store).unwrap_err()
    );
    assert!(e.contains("K = 0 is out of range"), "{e}");
    let gguf = Session::load(
        CpuBackend::new(),
        &qwen3_5_dir().join("model.gguf"),
        HiddenCache::open(&tmp.path().join("cache2")).unwrap(),
        SessionOptions::default(),
    )
    .unwrap();
    let e = format!(
        "{:#}",
        run_eval(&gguf, &spec, &set, &opts, &store).unwrap_err()
    );
    assert!(e.contains("model.gguf") && e.contains("MTP"), "{e}");
    assert_eq!(runs(), before);
}

// ---------------------------------------------------------------------------------------------
// (e) live decoding (docs/live.md): lossless, and live τ = replayed τ round by round
// ---------------------------------------------------------------------------------------------

#[path = "../live_util/mod.rs"]
mod live_util;

/// The golden head decoding live on its hybrid Qwen3.5 target (CPU; the verify round's crop
/// restores the recurrent state): the output is plain greedy decoding's, and the rounds are the
/// replay's over the same sequence, the head's context rows grown round by round
/// (`MtpDrafter::extend_context`) from the verify pass's final-norm states where the replay
/// computes them in one pass; for K = 1 and K = 3, and with an EOS inside the continuation.
#[test]
fn live_decoding_is_lossless_and_its_tau_is_the_replayed_tau() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = golden_target(&tmp.path().join("target"));
    let be = CpuBackend::new();
    let files = TargetFiles::open(&dir).unwrap();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let g = Golden::open(qwen3_5_dir().join("golden.safetensors"));
    let mut accepted = 0;
    for steps in [1, 3] {
        let d = Drafter::Mtp(MtpDrafter::load(&be, &dir, &files.spec, steps).unwrap());
        for p in 0..2 {
            let prompt = g.ids(&format!("p{p}.input_ids"));
            let max_new = 24;
            let label = format!("mtp K={steps} p{p}");
            let c = live_util::check_live(&be, &model, &d, &prompt, max_new, &[], &label);
            accepted += c.live.accepted.iter().sum::<u32>();
            println!(
                "{label}: {} rounds, live τ {:.4} = replayed τ {:.4}",
                c.live.round_tokens.len(),
                c.live.tau(),
                c.replayed_tau
            );
            let eos = c.live.ids[9];
            let c = live_util::check_live(
                &be,
                &model,
                &d,
                &prompt,
                max_new,
                &[eos],
                &format!("{label} eos"),
            );
            assert_eq!(c.live.ids.last(), Some(&eos));
        }
    }
    // Besides the accepted lengths, `check_live` compares every round's proposals with the
    // replay's drafts at the same anchor: the head's context rows are checked either way.
    println!("mtp: {accepted} drafts accepted");
}

/// `lint --drafter target:mtp[:K]` checks the head as `run` does before a run exists: an info
/// finding for a whole head, the loader's error (file, tensor) as an error finding otherwise.
#[test]
fn lint_checks_the_targets_head() {
    use draftlens_engine::drafter::lint::{lint, Severity};
    let tmp = tempfile::tempdir().unwrap();
    let dir = golden_target(&tmp.path().join("target"));
    let files = TargetFiles::open(&dir).unwrap();
    let found = lint(&files, Path::new("target:mtp:2")).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].severity, found[0].code), (Severity::Info, "mtp"));
    assert!(found[0].message.contains("K = 2"), "{}", found[0].message);

    let next = repo_root().join("tests/fixtures/golden/qwen3_next");
    let found = lint(&TargetFiles::open(&next).unwrap(), Path::new("target:mtp")).unwrap();
    assert_eq!(found[0].severity, Severity::Error, "{found:?}");
    assert!(
        found[0].message.contains("no mtp.* tensors"),
        "{}",
        found[0].message
    );
    // K out of range: one error before anything is read.
    assert!(lint(&files, Path::new("target:mtp:0")).is_err());
}

// ---------------------------------------------------------------------------------------------
// (f) GGUF targets: the head as llama.cpp's converter writes it (docs/mtp.md §1.3)
// ---------------------------------------------------------------------------------------------

use draftlens_engine::drafter::mtp::head::MtpWeights;
use draftlens_engine::drafter::mtp::MtpHeadConfig;
use draftlens_engine::formats::gguf::{GgufFile, GgufValue};
use draftlens_engine::formats::WeightSource;
use golden_util::gguf_write::{write_gguf, TensorOut};
use std::collections::BTreeMap;

/// GGML type ids of the stored head tensors.
const GGML_F32: u32 = 0;
const GGML_BF16: u32 = 30;

/// Where llama.cpp's converter writes a head tensor (Hugging Face name) of a target with `block`
/// decoder layers, and whether it stores it as 1 + w: `_QwenMtpMixin.filter_tensors` renames
/// `mtp.layers.0.X` to `model.layers.{block}.X` and `fc` / `pre_fc_norm_embedding` /
/// `pre_fc_norm_hidden` / `norm` to `eh_proj` / `enorm` / `hnorm` / `shared_head.norm` of that
/// layer; gguf-py's tensor map (QWEN35, QWEN35MOE) names them; `Qwen3NextModel.modify_tensors`
/// adds 1 to every renamed `*norm.weight`. Written here from those sources, independently of the
/// reader.
fn converter_name(hf: &str, block: usize) -> (String, bool) {
    let part = match hf {
        "mtp.fc.weight" => "nextn.eh_proj.weight",
        "mtp.pre_fc_norm_embedding.weight" => "nextn.enorm.weight",
        "mtp.pre_fc_norm_hidden.weight" => "nextn.hnorm.weight",
        "mtp.norm.weight" => "nextn.shared_head_norm.weight",
        _ => match hf.strip_prefix("mtp.layers.0.").unwrap() {
            "input_layernorm.weight" => "attn_norm.weight",
            "post_attention_layernorm.weight" => "post_attention_norm.weight",
            "self_attn.q_proj.weight" => "attn_q.weight",
            "self_attn.k_proj.weight" => "attn_k.weight",
            "self_attn.v_proj.weight" => "attn_v.weight",
            "self_attn.o_proj.weight" => "attn_output.weight",
            "self_attn.q_norm.weight" => "attn_q_norm.weight",
            "self_attn.k_norm.weight" => "attn_k_norm.weight",
            "mlp.gate_proj.weight" => "ffn_gate.weight",
            "mlp.up_proj.weight" => "ffn_up.weight",
            "mlp.down_proj.weight" => "ffn_down.weight",
            other => panic!("no GGUF name for {other}"),
        },
    };
    // The +1 rule reads the renamed name (`model.layers.{block}.enorm.weight`), so it covers
    // `pre_fc_norm_embedding` / `pre_fc_norm_hidden` too; every renamed norm's GGUF name ends the
    // same way.
    let gguf = format!("blk.{block}.{part}");
    let one_plus = gguf.ends_with("norm.weight");
    (gguf, one_plus)
}

/// A bf16 safetensors head tensor as the converter stores it: BF16 as is, norms F32 as 1 + w.
fn converted(entry: &SafetensorsEntry, block: usize) -> TensorOut {
    let (name, dtype, shape, bytes) = entry;
    assert_eq!(*dtype, Dtype::BF16, "{name}");
    let (gguf, one_plus) = converter_name(name, block);
    let ne = shape.iter().rev().map(|&d| d as u64).collect();
    if !one_plus {
        return TensorOut {
            name: gguf,
            ne,
            ty: GGML_BF16,
            data: bytes.clone(),
        };
    }
    let data = bytes
        .chunks_exact(2)
        .flat_map(|b| {
            let w = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            (1.0 + w).to_le_bytes()
        })
        .collect();
    TensorOut {
        name: gguf,
        ne,
        ty: GGML_F32,
        data,
    }
}

/// The safetensors entries of the golden head (the Qwen3.5 golden's stray `mtp.fc.weight` and
/// the MTP golden's other tensors).
fn golden_head_entries() -> Vec<SafetensorsEntry> {
    let mut head: Vec<SafetensorsEntry> = read_entries(&qwen3_5_dir().join("model.safetensors"))
        .into_iter()
        .filter(|e| e.0.starts_with("mtp."))
        .collect();
    head.extend(read_entries(&golden_dir().join("mtp.safetensors")));
    head
}

/// `base` (a committed GGUF target of L layers) with an MTP block L: `block_count` L + 1,
/// `nextn_predict_layers` 1, `attention.recurrent_layers` (when present) one more `false`, and
/// `head` appended; `edit` changes the metadata and tensors last.
fn write_gguf_target(
    dst: &Path,
    base: &Path,
    head: Vec<TensorOut>,
    edit: impl Fn(&mut BTreeMap<String, GgufValue>, &mut Vec<TensorOut>),
) -> PathBuf {
    let f = GgufFile::open(base).unwrap();
    let arch = f.architecture().unwrap().to_owned();
    let mut meta = f.metadata().clone();
    let layers = f.get_u64(&format!("{arch}.block_count")).unwrap() as u32;
    meta.insert(format!("{arch}.block_count"), GgufValue::U32(layers + 1));
    meta.insert(format!("{arch}.nextn_predict_layers"), GgufValue::U32(1));
    if let Some(GgufValue::Array(a)) = meta.get_mut(&format!("{arch}.attention.recurrent_layers")) {
        a.push(GgufValue::Bool(false));
    }
    let mut tensors: Vec<TensorOut> = f
        .tensors()
        .iter()
        .map(|t| TensorOut::copy(&f, t, &t.name))
        .collect();
    tensors.extend(head);
    edit(&mut meta, &mut tensors);
    write_gguf(dst, &meta, &tensors, f.alignment() as usize);
    dst.to_path_buf()
}

/// The Qwen3.5 golden GGUF target with the golden head as block 6.
fn golden_gguf_target(
    dst: &Path,
    edit: impl Fn(&mut BTreeMap<String, GgufValue>, &mut Vec<TensorOut>),
) -> PathBuf {
    let head = golden_head_entries()
        .iter()
        .map(|e| converted(e, 6))
        .collect();
    write_gguf_target(dst, &qwen3_5_dir().join("model.gguf"), head, edit)
}

/// Every head tensor of the two targets, compared: the same names, shapes and values.
fn same_head_tensors(a: &Path, b: &Path) -> usize {
    let open = |p: &Path| {
        let files = TargetFiles::open(p).unwrap();
        MtpWeights::open(&MtpHeadConfig::read(p, &files.spec).unwrap()).unwrap()
    };
    let (wa, wb) = (open(a), open(b));
    let names = |w: &MtpWeights| {
        let mut v: Vec<(String, Vec<usize>)> =
            w.tensors().into_iter().map(|t| (t.name, t.shape)).collect();
        v.sort();
        v
    };
    assert_eq!(names(&wa), names(&wb));
    for (n, _) in names(&wa) {
        let (x, y) = (wa.tensor(&n).unwrap(), wb.tensor(&n).unwrap());
        assert_eq!(x.shape, y.shape, "{n}");
        assert!(
            x.data
                .iter()
                .zip(&y.data)
                .all(|(p, q)| p.to_bits() == q.to_bits()),
            "{n}: the GGUF head's values differ from the safetensors head's"
        );
    }
    names(&wa).len()
}

/// The chains of both heads over the same target states (every anchor of `ids`), top-8 each:
/// ids and log-probabilities bit for bit.
fn same_drafts(
    be: &CpuBackend,
    model: &TargetModel<CpuBackend>,
    heads: [&MtpDrafter<CpuBackend>; 2],
    ids: &[u32],
) -> usize {
    let out = model
        .forward(be, ids, &mut model.new_cache(), &Capture::none())
        .unwrap();
    let drafts = heads.map(|h| {
        let ctx = h
            .context_from_tensor(be, model, &out.last_hidden, ids)
            .unwrap()
            .unwrap();
        let anchors: Vec<usize> = (1..=ctx.len).collect();
        h.draft(be, model, &ctx, &anchors, 8).unwrap()
    });
    assert_eq!(drafts[0].ids, drafts[1].ids);
    assert!(drafts[0]
        .logprobs
        .iter()
        .zip(&drafts[1].logprobs)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    drafts[0].rows
}

#[test]
fn gguf_head_drafts_equal_the_safetensors_head() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = golden_target(&tmp.path().join("target"));
    let gguf = golden_gguf_target(&tmp.path().join("mtp.gguf"), |_, _| {});
    let be = CpuBackend::new();
    let st = TargetFiles::open(&dir).unwrap();
    let gg = TargetFiles::open(&gguf).unwrap();
    // Block 6 is the head, not a seventh decoder layer.
    assert_eq!(gg.spec, st.spec);
    let n = same_head_tensors(&dir, &gguf);
    assert_eq!(n, 15);
    let steps = 4;
    let st_head = MtpDrafter::load(&be, &dir, &st.spec, steps).unwrap();
    let gg_head = MtpDrafter::load(&be, &gguf, &gg.spec, steps).unwrap();
    let model = TargetModel::load(&be, &st.spec, st.weights.as_ref()).unwrap();
    let g = Golden::open(qwen3_5_dir().join("golden.safetensors"));
    let mut rows = 0;
    for p in 0..2 {
        let mut ids = g.ids(&format!("p{p}.input_ids"));
        ids.extend(g.ids(&format!("p{p}.greedy_ids")));
        rows += same_drafts(&be, &model, [&st_head, &gg_head], &ids);
    }
    // The GGUF file end to end (its target pass, its head): the reference's chains.
    let gg_model = TargetModel::load(&be, &gg.spec, gg.weights.as_ref()).unwrap();
    let manifest = json(&golden_dir().join("manifest.json"));
    let want = Golden::open(golden_dir().join("golden.safetensors"));
    let mut worst = 0f32;
    for p in 0..2 {
        let mut ids = g.ids(&format!("p{p}.input_ids"));
        ids.extend(g.ids(&format!("p{p}.greedy_ids")));
        let out = gg_model
            .forward(&be, &ids, &mut gg_model.new_cache(), &Capture::none())
            .unwrap();
        let ctx = gg_head
            .context_from_tensor(&be, &gg_model, &out.last_hidden, &ids)
            .unwrap()
            .unwrap();
        let anchors: Vec<usize> = manifest["prompts"][format!("p{p}")]["anchors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_u64().unwrap() as usize)
            .collect();
        let top = gg_head.draft(&be, &gg_model, &ctx, &anchors, 8).unwrap();
        for (i, &a) in anchors.iter().enumerate() {
            let label = format!("gguf p{p}.a{a}");
            let chain = want.ids(&format!("p{p}.a{a}.draft_ids"));
            let top8 = want.ids(&format!("p{p}.a{a}.top8_ids"));
            let (_, lps) = want.f32(&format!("p{p}.a{a}.top8_logprobs"));
            let ours: Vec<u32> = (0..steps).map(|s| top.row_ids(i * steps + s)[0]).collect();
            assert_eq!(ours, chain, "{label}: draft chain");
            for s in 0..steps {
                worst = worst.max(check_topk(
                    &format!("{label} step {}", s + 1),
                    top.row_ids(i * steps + s),
                    top.row_logprobs(i * steps + s),
                    &top8[s * 8..(s + 1) * 8],
                    &lps[s * 8..(s + 1) * 8],
                    1e-4,
                ));
            }
        }
    }
    // `lint --drafter target:mtp` reads the GGUF head as `run` does.
    let found = draftlens_engine::drafter::lint::lint(&gg, Path::new("target:mtp:2")).unwrap();
    assert_eq!(
        found[0].severity,
        draftlens_engine::drafter::lint::Severity::Info,
        "{found:?}"
    );
    eprintln!(
        "mtp gguf: {n} head tensors bit-equal to the safetensors head; {rows} chain steps over the \
         same states bit-equal; the GGUF target + head reproduce the reference's 12 chains (top-8 \
         log-probs worst |Δ| {worst:.2e})"
    );
}

/// A Qwen3.5-MoE head: layer 2 of the MoE golden (full attention, sparse MLP: router, 16 experts,
/// shared expert) as `mtp.layers.0`, the MoE golden's stray `mtp.fc.weight` and the golden head's
/// norms; in a safetensors folder and as block 3 of the committed converter-written MoE GGUF
/// (its stacked expert tensors copied from blk.2). Both heads draft the same chains, bit for bit.
#[test]
fn gguf_moe_head_drafts_equal_the_safetensors_head() {
    let tmp = tempfile::tempdir().unwrap();
    let moe = repo_root().join("tests/fixtures/golden/qwen3_5_moe");
    let norms: Vec<SafetensorsEntry> = read_entries(&golden_dir().join("mtp.safetensors"))
        .into_iter()
        .filter(|e| !e.0.starts_with("mtp.layers."))
        .collect();
    // Safetensors: the MoE golden, its layer 2 copied as the head's layer.
    let dir = tmp.path().join("moe");
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = json(&moe.join("config.json"));
    config["text_config"]["mtp_num_hidden_layers"] = 1.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors = read_entries(&moe.join("model.safetensors"));
    let layer: Vec<SafetensorsEntry> = tensors
        .iter()
        .filter_map(|e| {
            let rest = e.0.strip_prefix("model.language_model.layers.2.")?;
            Some((
                format!("mtp.layers.0.{rest}"),
                e.1,
                e.2.clone(),
                e.3.clone(),
            ))
        })
        .collect();
    let fc = tensors
        .iter()
        .find(|e| e.0 == "mtp.fc.weight")
        .unwrap()
        .clone();
    tensors.extend(layer);
    tensors.extend(norms.iter().cloned());
    write_safetensors(&dir.join("model.safetensors"), &tensors).unwrap();
    // GGUF: blk.2 copied as blk.3, the nextn tensors converted.
    let base = repo_root().join("tests/fixtures/golden/moe_gguf/qwen3_5_moe-bf16.gguf");
    let f = GgufFile::open(&base).unwrap();
    let mut head: Vec<TensorOut> = f
        .tensors()
        .iter()
        .filter_map(|t| {
            let rest = t.name.strip_prefix("blk.2.")?;
            Some(TensorOut::copy(&f, t, &format!("blk.3.{rest}")))
        })
        .collect();
    head.extend(norms.iter().chain([&fc]).map(|e| converted(e, 3)));
    let gguf = write_gguf_target(&tmp.path().join("moe.gguf"), &base, head, |_, _| {});

    let n = same_head_tensors(&dir, &gguf);
    let be = CpuBackend::new();
    let st = TargetFiles::open(&dir).unwrap();
    let gg = TargetFiles::open(&gguf).unwrap();
    let st_head = MtpDrafter::load(&be, &dir, &st.spec, 3).unwrap();
    let gg_head = MtpDrafter::load(&be, &gguf, &gg.spec, 3).unwrap();
    let model = TargetModel::load(&be, &st.spec, st.weights.as_ref()).unwrap();
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 256).collect();
    let rows = same_drafts(&be, &model, [&st_head, &gg_head], &ids);
    eprintln!("mtp gguf (MoE): {n} head tensors and {rows} chain steps bit-equal");

    // Bad input in the MoE block: the router missing, named by its GGUF name.
    let no_router = write_gguf_target(
        &tmp.path().join("no-router.gguf"),
        &gguf,
        vec![],
        |meta, t| {
            // `gguf` already has the head: undo the extra block the writer added.
            meta.insert("qwen35moe.block_count".into(), GgufValue::U32(4));
            if let Some(GgufValue::Array(a)) = meta.get_mut("qwen35moe.attention.recurrent_layers")
            {
                a.pop();
            }
            t.retain(|x| x.name != "blk.3.ffn_gate_inp.weight");
        },
    );
    let e = load_error(&no_router, 3);
    assert!(e.contains("blk.3.ffn_gate_inp.weight"), "{e}");
}

#[test]
fn gguf_targets_without_a_whole_head_are_refused_naming_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    // The committed Qwen3.5 GGUF: no MTP block declared.
    let e = load_error(&qwen3_5_dir().join("model.gguf"), 3);
    assert!(
        e.contains("qwen35.nextn_predict_layers is absent or 0") && e.contains("no MTP head"),
        "{e}"
    );
    // Declared, but no tensor of block 6.
    let empty = write_gguf_target(
        &tmp.path().join("empty.gguf"),
        &qwen3_5_dir().join("model.gguf"),
        vec![],
        |_, _| {},
    );
    let e = load_error(&empty, 3);
    assert!(e.contains("no tensor of block blk.6.*"), "{e}");
    let drop = |name: &'static str| {
        move |_: &mut BTreeMap<String, GgufValue>, t: &mut Vec<TensorOut>| {
            t.retain(|x| x.name != name)
        }
    };
    // Partial heads: one of the head's own tensors, one of its layer's.
    let p = golden_gguf_target(
        &tmp.path().join("no-hnorm.gguf"),
        drop("blk.6.nextn.hnorm.weight"),
    );
    let e = load_error(&p, 3);
    assert!(
        e.contains(
            "tensor mtp.pre_fc_norm_hidden.weight (GGUF blk.6.nextn.hnorm.weight) is missing"
        ) && e.contains("partial")
            && e.contains("no-hnorm.gguf"),
        "{e}"
    );
    let p = golden_gguf_target(&tmp.path().join("no-q.gguf"), drop("blk.6.attn_q.weight"));
    let e = load_error(&p, 3);
    assert!(
        e.contains("tensor mtp.layers.0.self_attn.q_proj.weight (GGUF block blk.6.*) is missing"),
        "{e}"
    );
    // Wrong shapes: fc, and a layer tensor.
    let reshape = |name: &'static str, ne: Vec<u64>| {
        move |_: &mut BTreeMap<String, GgufValue>, t: &mut Vec<TensorOut>| {
            let x = t.iter_mut().find(|x| x.name == name).unwrap();
            let n: u64 = ne.iter().product();
            x.data.truncate(n as usize * 2);
            x.ne = ne.clone();
        }
    };
    let p = golden_gguf_target(
        &tmp.path().join("bad-fc.gguf"),
        reshape("blk.6.nextn.eh_proj.weight", vec![64, 64]),
    );
    let e = load_error(&p, 3);
    assert!(
        e.contains("tensor mtp.fc.weight (blk.6.nextn.eh_proj.weight) has shape [64, 64]")
            && e.contains("[64, 128]"),
        "{e}"
    );
    let p = golden_gguf_target(
        &tmp.path().join("bad-k.gguf"),
        reshape("blk.6.attn_k.weight", vec![64, 32]),
    );
    let e = load_error(&p, 3);
    assert!(
        e.contains("mtp.layers.0.self_attn.k_proj.weight (blk.6.attn_k.weight) has shape [32, 64]")
            && e.contains("[64, 64]"),
        "{e}"
    );
    // Two MTP blocks declared.
    let p = golden_gguf_target(&tmp.path().join("two.gguf"), |meta, _| {
        meta.insert("qwen35.block_count".into(), GgufValue::U32(8));
        meta.insert("qwen35.nextn_predict_layers".into(), GgufValue::U32(2));
    });
    let e = load_error(&p, 3);
    assert!(
        e.contains("qwen35.nextn_predict_layers = 2") && e.contains("one layer"),
        "{e}"
    );
    // A dedicated embedding (llama.cpp would read it; no Hugging Face head has one).
    let p = golden_gguf_target(&tmp.path().join("own-embd.gguf"), |_, t| {
        let embd = t.iter().find(|x| x.name == "token_embd.weight").unwrap();
        let copy = TensorOut {
            name: "blk.6.nextn.embed_tokens.weight".into(),
            ne: embd.ne.clone(),
            ty: embd.ty,
            data: embd.data.clone(),
        };
        t.push(copy);
    });
    let e = load_error(&p, 3);
    assert!(
        e.contains("tensor blk.6.nextn.embed_tokens.weight is a dedicated MTP embedding"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// (g) live speculative sampling at T > 0 (docs/live.md §5): lossless in distribution, and live τ
//     at T = 1 against the replayed expectation where the replay is exact (K = 1)
// ---------------------------------------------------------------------------------------------

#[path = "../sampling_util/mod.rs"]
mod sampling_util;

use draftlens_records::sampling::{DraftSampling, SamplingParams};

/// The golden target and head with a vocabulary of 16 (the first 16 rows of the embedding and
/// LM head): random models of 512 tokens hardly ever agree, so too few drafts would be accepted
/// for the test to see the accept path.
fn small_vocab_target(dir: &Path) -> PathBuf {
    let full = golden_target(&dir.join("full"));
    sampling_util::small_vocab_copy(
        &full,
        &dir.join("v16"),
        16,
        &["model.language_model.embed_tokens.weight", "lm_head.weight"],
        |_| {},
        |_| {},
    )
}

/// The golden head (K = 2: two drafted positions and the bonus in the tested depth) on its
/// target: the first DEPTH + 1 tokens over many seeds against the target's exact marginals, per
/// sampling setting, and the test's power against two wrong rules.
#[test]
fn speculative_sampling_with_the_head_is_lossless() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_vocab_target(tmp.path());
    let be = CpuBackend::new();
    let files = TargetFiles::open(&dir).unwrap();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let d = Drafter::Mtp(MtpDrafter::load(&be, &dir, &files.spec, 2).unwrap());
    let prompt = [3u32, 11, 7, 2, 14, 5];
    let params = |t, k, p, draft| SamplingParams::new(t, Some(k), p, draft).unwrap();
    let configs = [
        (
            "T=1 top-k=8, sampled drafts",
            params(1.0, 8, 1.0, DraftSampling::Sampled),
            1500,
        ),
        (
            "T=0.7 top-k=6 top-p=0.9, sampled drafts",
            params(0.7, 6, 0.9, DraftSampling::Sampled),
            1000,
        ),
        (
            "T=1 top-k=8, greedy drafts",
            params(1.0, 8, 1.0, DraftSampling::Greedy),
            1000,
        ),
    ];
    sampling_util::check_lossless("mtp K=2", &be, &model, &d, &prompt, &configs, 1000);
}

/// K = 1: step 1's q depends on the context only, so the replayed expectation is exact on the
/// drafter's side (docs/metrics.md §7.3); live τ over 200 prompts agrees with it within the 99%
/// intervals of the paired differences.
#[test]
fn live_tau_at_t1_agrees_with_the_replayed_expectation() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_vocab_target(tmp.path());
    let be = CpuBackend::new();
    let files = TargetFiles::open(&dir).unwrap();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let d = Drafter::Mtp(MtpDrafter::load(&be, &dir, &files.spec, 1).unwrap());
    let t = std::time::Instant::now();
    let a = sampling_util::tau_agreement(&be, &model, &d, 200, 32, 16, DraftSampling::Sampled);
    eprintln!(
        "mtp K=1, 200 prompts of 32 tokens, T = 1 (top-k 16: every token): live τ macro {:.4} vs expected {:.4} (paired gap {:+.4} ± {:.4}, 99%); rounds per prompt {:+.3} ± {:.3} ({:.1} s)",
        a.live_macro, a.expected_macro, a.gap.0, a.gap.1, a.round_gap.0, a.round_gap.1,
        t.elapsed().as_secs_f64()
    );
    assert!(
        a.expected_macro > 1.1,
        "too few drafts accepted: {}",
        a.expected_macro
    );
    assert!(a.gap.0.abs() < a.gap.1, "τ: live − expected = {:?}", a.gap);
    assert!(
        a.round_gap.0.abs() < a.round_gap.1,
        "rounds: live − expected = {:?}",
        a.round_gap
    );
}
