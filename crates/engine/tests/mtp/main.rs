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
//!     sequences directly, read back from the records cache by a second run.

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
