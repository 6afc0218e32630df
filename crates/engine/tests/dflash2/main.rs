//! DFlash2 drafters (docs/dflash2.md), each checked against an independent expectation:
//!
//! (a) golden: on the CPU backend the drafter reproduces the authors' own code (PyPI
//!     dflash==0.1.0, `DFlash2DraftModel` + `CandidateSelector`, run in float32 by
//!     tools/golden/make_dflash2_golden.py) on the random Qwen3 golden target's taps: every
//!     path token exactly, every position's candidate set exactly, log q to 1e-4;
//! (b) the authors' greedy loop: draftlens' replayed chain over the same sequence commits the
//!     same tokens per round as `dflash_generate`'s acceptance lengths, so τ is equal;
//! (c) known answer: a drafter whose selector encodes the successor map, on a sequence that
//!     follows it, accepts all B − 1 drafts every round (τ = B but for the last round), exactly
//!     as the built-in oracle; this needs the path (each token's predecessor is the drafter's
//!     own previous choice);
//! (d) bad input: a DFlash2 checkpoint without its selector (all of it, or one codebook), a
//!     config without `selector_rank`, the checkpoint given to the DFlash loader, a `--top-k`
//!     over the selector's width: one error naming the file and the tensor or key, before any
//!     compute;
//! (e) live greedy decoding: lossless, live τ = the replayed τ = the authors' loop's;
//! (f) live speculative sampling at T > 0 along the selector's sampled path: lossless in
//!     distribution (chi-square against the exact marginals, with its power; `sampling_util`).

#[path = "../golden_util/mod.rs"]
mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::{Backend, TopK};
use draftlens_engine::drafter::dflash2::{check_options, DFlash2Drafter};
use draftlens_engine::drafter::eval::{
    evaluate_sequence, DraftTarget, Drafter, EvalOptions, Labels, Sequence,
};
use draftlens_engine::drafter::lint::{lint, Severity};
use draftlens_engine::drafter::{DFlashDrafter, DraftOptions};
use draftlens_engine::model::head::TargetHead;
use draftlens_engine::model::{TargetFiles, TargetModel};
use draftlens_engine::util::{write_safetensors, SafetensorsEntry};
use draftlens_results::metrics::{replay, replay_chain};
use golden_util::*;
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn golden_dir() -> PathBuf {
    repo_root().join("tests/fixtures/golden/dflash2")
}

fn qwen3_dir() -> PathBuf {
    repo_root().join("tests/fixtures/golden/qwen3")
}

fn f32_entry(name: &str, shape: Vec<usize>, values: &[f32]) -> SafetensorsEntry {
    let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    (name.to_string(), Dtype::F32, shape, bytes)
}

fn write_checkpoint(dir: &Path, config: &serde_json::Value, tensors: &[SafetensorsEntry]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    write_safetensors(&dir.join("model.safetensors"), tensors).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The golden checkpoint, rebuilt from the rule in its manifest (the weights are not committed)
// ---------------------------------------------------------------------------------------------

fn fnv1a64(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
    })
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One tensor by the manifest's rule (tools/golden/make_dflash2_golden.py, `formula`): in f64,
/// rounded once to f32.
fn formula(name: &str, shape: &[usize], kind: &str, scale: f64, seed: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let base = fnv1a64(name) ^ seed;
    (0..n as u64)
        .map(|i| {
            let u = (splitmix64(base.wrapping_add(i)) >> 11) as f64 / (1u64 << 53) as f64;
            let v = match kind {
                "mat" => (2.0 * u - 1.0) * ((3.0 / shape[shape.len() - 1] as f64).sqrt() * scale),
                "norm" => 0.5 + u,
                "sym" => (2.0 * u - 1.0) * (3f64.sqrt() * scale),
                other => panic!("unknown rule {other}"),
            };
            v as f32
        })
        .collect()
}

/// The golden checkpoint's tensors: every rule of the manifest, and the stored final norm.
fn golden_tensors() -> Vec<SafetensorsEntry> {
    let manifest = json(&golden_dir().join("manifest.json"));
    let w = &manifest["weights"];
    let seed = w["seed"].as_u64().unwrap();
    let mut out: Vec<SafetensorsEntry> = w["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let name = t["name"].as_str().unwrap();
            let shape: Vec<usize> = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            let v = formula(
                name,
                &shape,
                t["kind"].as_str().unwrap(),
                t["scale"].as_f64().unwrap(),
                seed,
            );
            f32_entry(name, shape, &v)
        })
        .collect();
    let (shape, norm) =
        Golden::open(golden_dir().join("golden.safetensors")).f32("weights.norm.weight");
    out.push(f32_entry("norm.weight", shape, &norm));
    out
}

/// The golden checkpoint written to `dir`, its config and tensors edited.
fn checkpoint(
    dir: &Path,
    edit_config: impl Fn(&mut serde_json::Value),
    edit_tensors: impl Fn(&mut Vec<SafetensorsEntry>),
) -> PathBuf {
    let mut config = json(&golden_dir().join("config.json"));
    edit_config(&mut config);
    let mut tensors = golden_tensors();
    edit_tensors(&mut tensors);
    write_checkpoint(dir, &config, &tensors);
    dir.to_path_buf()
}

fn qwen3() -> TargetFiles {
    TargetFiles::open(&qwen3_dir()).unwrap()
}

/// Prompt ++ greedy continuation of Qwen3 golden prompt `p`, its prompt length, and the taps
/// the golden drafter reads (tap ids 0, 1, 2: hs1, hs2, hs3, f16 upcast).
fn golden_sequence(g: &Golden, p: usize) -> (Vec<u32>, usize, Vec<Vec<f32>>) {
    let mut ids = g.ids(&format!("p{p}.input_ids"));
    let plen = ids.len();
    ids.extend(g.ids(&format!("p{p}.greedy_ids")));
    let taps = (1..=3).map(|k| g.f32(&format!("p{p}.hs{k}")).1).collect();
    (ids, plen, taps)
}

fn anchors_of(manifest: &serde_json::Value, p: usize) -> Vec<usize> {
    manifest["prompts"][format!("p{p}")]["anchors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_u64().unwrap() as usize)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// (a) golden and (b) the authors' loop
// ---------------------------------------------------------------------------------------------

#[test]
fn drafts_match_the_authors_code() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(&tmp.path().join("golden"), |_| {}, |_| {});
    let files = qwen3();
    let findings = lint(&files, &dir).unwrap();
    assert!(
        findings.iter().all(|f| f.severity != Severity::Error),
        "{findings:?}"
    );
    assert!(
        findings.iter().any(|f| f.code == "path-dependent"),
        "{findings:?}"
    );
    let be = CpuBackend::new();
    let target = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let d = DFlash2Drafter::load(&be, &dir, 128, 512).unwrap();
    let b = d.block_size();
    let manifest = json(&golden_dir().join("manifest.json"));
    assert_eq!(b, manifest["block_size"].as_u64().unwrap() as usize);
    let want = Golden::open(golden_dir().join("golden.safetensors"));
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    let (mut worst, mut rows, mut changed) = (0f32, 0usize, 0usize);
    for p in 0..2 {
        let (ids, _, taps) = golden_sequence(&g, p);
        let refs: Vec<&[f32]> = taps.iter().map(|t| t.as_slice()).collect();
        let ctx = d.backbone.context(&be, &refs, 128).unwrap();
        let anchors = anchors_of(&manifest, p);
        let toks: Vec<u32> = anchors.iter().map(|&a| ids[a]).collect();
        // All anchors of the prompt in one forward; the golden drafted them one at a time.
        let opts = DraftOptions {
            ctx_inclusive: false,
            top_k: 16,
        };
        let top = d.draft(&be, &target, &ctx, &anchors, &toks, opts).unwrap();
        assert_eq!((top.rows, top.k), (anchors.len() * (b - 1), 16));
        for (n, &a) in anchors.iter().enumerate() {
            let label = format!("p{p}.a{a}");
            let path = want.ids(&format!("{label}.path"));
            let argmax = want.ids(&format!("{label}.argmax"));
            let cands = want.ids(&format!("{label}.cand_ids"));
            let (_, logq) = want.f32(&format!("{label}.cand_logq"));
            let ours: Vec<u32> = (0..b - 1)
                .map(|r| top.row_ids(n * (b - 1) + r)[0])
                .collect();
            assert_eq!(ours, path, "{label}: the selector's path");
            for r in 0..b - 1 {
                let row = n * (b - 1) + r;
                let golden: HashMap<u32, f32> = cands[r * 16..(r + 1) * 16]
                    .iter()
                    .copied()
                    .zip(logq[r * 16..(r + 1) * 16].iter().copied())
                    .collect();
                for (id, lq) in top.row_ids(row).iter().zip(top.row_logprobs(row)) {
                    let g = golden.get(id).unwrap_or_else(|| {
                        panic!(
                            "{label} position {}: candidate {id} is not among the authors' {:?}",
                            r + 1,
                            &cands[r * 16..(r + 1) * 16]
                        )
                    });
                    worst = worst.max((lq - g).abs());
                    assert!(
                        (lq - g).abs() < 1e-4,
                        "{label} position {} token {id}: log q {lq} vs {g}",
                        r + 1
                    );
                }
                changed += (path[r] != argmax[r]) as usize;
                rows += 1;
            }
        }
    }
    // The golden is only a test of the selector where it overrode the plain argmax.
    assert!(changed >= 10, "the selector changed {changed} choices");
    println!("dflash2 golden: {rows} positions, paths and candidate sets exact ({changed} where the selector overrides the argmax), max |Δ log q| {worst:.2e}");
}

/// The target's "prediction" at every position of `ids`: its next token (top-1 of one).
fn next_token_topk(ids: &[u32]) -> TopK {
    let len = ids.len();
    TopK {
        rows: len,
        k: 1,
        ids: (0..len)
            .map(|t| ids.get(t + 1).copied().unwrap_or(0))
            .collect(),
        logprobs: vec![0.0; len],
    }
}

#[test]
fn replayed_rounds_equal_the_authors_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(&tmp.path().join("golden"), |_| {}, |_| {});
    let files = qwen3();
    let be = CpuBackend::new();
    let target = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let drafter = Drafter::DFlash2(DFlash2Drafter::load(&be, &dir, 128, 512).unwrap());
    let manifest = json(&golden_dir().join("manifest.json"));
    let want = Golden::open(golden_dir().join("golden.safetensors"));
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    for p in 0..2 {
        let (ids, plen, taps) = golden_sequence(&g, p);
        let target_topk = next_token_topk(&ids);
        let mut seq = Sequence::new(p as u32, &ids, plen, &target_topk, Labels::Target);
        let Drafter::DFlash2(d) = &drafter else {
            unreachable!()
        };
        let refs: Vec<&[f32]> = taps.iter().map(|t| t.as_slice()).collect();
        seq.ctx = Some(d.backbone.context(&be, &refs, 128).unwrap());
        let opts = EvalOptions {
            top_k: 4,
            ..EvalOptions::default()
        };
        let records =
            evaluate_sequence(&be, DraftTarget::Head(&target), &drafter, &seq, &opts).unwrap();
        // Tokens committed per round: A + 1, nothing past the end of the sequence.
        let last = ids.len() - 1;
        let ours: Vec<u64> = replay_chain(&records, None)
            .into_iter()
            .map(|(a, _, acc)| (acc as u64 + 1).min((last - a as usize) as u64))
            .collect();
        let theirs: Vec<u64> = want
            .ids(&format!("p{p}.acceptance_lengths"))
            .into_iter()
            .map(u64::from)
            .collect();
        assert_eq!(
            ours, theirs,
            "p{p}: tokens per round, draftlens replay vs dflash_generate"
        );
        let by_anchor: HashMap<u32, usize> = (0..records.num_blocks())
            .map(|b| (records.anchor[b], b))
            .collect();
        let (rounds, tokens) = replay(&records, &by_anchor, plen, ids.len()).unwrap();
        let tau = tokens as f64 / rounds as f64;
        let golden_tau = manifest["prompts"][format!("p{p}")]["tau"]
            .as_f64()
            .unwrap();
        assert!(
            (tau - golden_tau).abs() < 1e-12,
            "p{p}: τ {tau} vs the loop's {golden_tau}"
        );
        println!("p{p}: {rounds} rounds, τ {tau:.4} (dflash_generate: {golden_tau:.4})");
    }
}

// ---------------------------------------------------------------------------------------------
// (c) known answer
// ---------------------------------------------------------------------------------------------

/// A DFlash2 drafter over vocabulary and hidden size `v` whose proposals follow the successor
/// map t ↦ t + 1 (mod v): every projection is zero, so each drafted row's state is the same
/// constant; the LM head gives every token the same logit, so all v tokens are candidates; the
/// selector's pairwise term is 100 exactly for (prev, prev + 1) and 0 otherwise.
fn write_successor_dflash2(dir: &Path, v: usize, block: usize) {
    let d = v;
    let config = serde_json::json!({
        "architectures": ["DFlash2DraftModel"],
        "hidden_size": d, "intermediate_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": d, "vocab_size": v,
        "rms_norm_eps": 1e-6,
        "dflash_config": {"block_size": block, "mask_token_id": 0, "target_layer_ids": [0],
            "conv_kernel_size": 2, "conv_group_size": 4, "selector_rank": v, "selector_top_k": v}
    });
    let zeros = |name: &str, shape: Vec<usize>| {
        let n = shape.iter().product();
        f32_entry(name, shape, &vec![0.0; n])
    };
    let ones = |name: &str, n: usize| f32_entry(name, vec![n], &vec![1.0; n]);
    let mut t = vec![
        zeros("fc.weight", vec![d, d]),
        ones("hidden_norm.weight", d),
        ones("norm.weight", d),
        ones("layers.0.input_layernorm.weight", d),
        ones("layers.0.post_attention_layernorm.weight", d),
        ones("layers.0.self_attn.q_norm.weight", d),
        ones("layers.0.self_attn.k_norm.weight", d),
    ];
    for name in ["q_proj", "k_proj", "v_proj", "o_proj"] {
        t.push(zeros(
            &format!("layers.0.self_attn.{name}.weight"),
            vec![d, d],
        ));
    }
    t.push(zeros("layers.0.mlp.gate_proj.weight", vec![8, d]));
    t.push(zeros("layers.0.mlp.up_proj.weight", vec![8, d]));
    t.push(zeros("layers.0.mlp.down_proj.weight", vec![d, 8]));
    for conv in ["attention_conv", "mlp_conv"] {
        t.push(zeros(
            &format!("layers.0.{conv}.base_kernel"),
            vec![2, 2, d],
        ));
        t.push(zeros(
            &format!("layers.0.{conv}.kernel_projection.weight"),
            vec![2 * 2 * (d / 4), d],
        ));
    }
    // The final state is all ones: the projection makes every rank component 1.
    t.push(f32_entry(
        "candidate_selector.hidden_projection.weight",
        vec![v, d],
        &vec![1.0 / d as f32; v * d],
    ));
    let mut pred = vec![0f32; v * v];
    let mut succ = vec![0f32; v * v];
    for tok in 0..v {
        pred[tok * v + tok] = 10.0;
        succ[((tok + 1) % v) * v + tok] = 10.0;
    }
    t.push(f32_entry(
        "candidate_selector.predecessor_codebook",
        vec![v, v],
        &pred,
    ));
    t.push(f32_entry(
        "candidate_selector.successor_codebook",
        vec![v, v],
        &succ,
    ));
    write_checkpoint(dir, &config, &t);
}

#[test]
fn successor_selector_accepts_every_draft() {
    let (v, block) = (16usize, 5usize);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("successor");
    write_successor_dflash2(&dir, v, block);
    let be = CpuBackend::new();
    let d = DFlash2Drafter::load(&be, &dir, v, v).unwrap();
    // The target's embedding and LM head: every row the same, so every logit ties.
    let head = TargetHead::<CpuBackend> {
        embed_tokens: be.matrix(&vec![1.0; v * v], v, v).unwrap(),
        lm_head: Some(be.matrix(&vec![0.5; v * v], v, v).unwrap()),
        vocab_size: v,
    };
    let (len, plen) = (31usize, 6usize);
    let mut ids = vec![7u32];
    while ids.len() < len {
        ids.push((ids.last().unwrap() + 1) % v as u32);
    }
    let target_topk = next_token_topk(&ids);
    let taps = vec![vec![0f32; len * v]];
    let opts = EvalOptions {
        top_k: 4,
        anchor_batch: 7,
        ..EvalOptions::default()
    };
    let mut seq = Sequence::new(0, &ids, plen, &target_topk, Labels::Target);
    let refs: Vec<&[f32]> = taps.iter().map(|t| t.as_slice()).collect();
    seq.ctx = Some(d.backbone.context(&be, &refs, v).unwrap());
    let drafter = Drafter::DFlash2(d);
    let records = evaluate_sequence(&be, DraftTarget::Head(&head), &drafter, &seq, &opts).unwrap();
    let oracle = evaluate_sequence(
        &be,
        DraftTarget::Vocab(v),
        &Drafter::<CpuBackend>::Oracle { block_size: block },
        &Sequence::new(0, &ids, plen, &target_topk, Labels::Target),
        &opts,
    )
    .unwrap();
    assert_eq!(records.anchor, oracle.anchor);
    for b in 0..records.num_blocks() {
        let left = len - 1 - records.anchor[b] as usize;
        assert_eq!(
            records.accepted_len(b),
            (block - 1).min(left),
            "anchor {}",
            records.anchor[b]
        );
        assert_eq!(records.accepted_len(b), oracle.accepted_len(b));
    }
    let produced = (len - plen - 1) as u64;
    let want = (produced.div_ceil(block as u64), produced);
    let by_anchor = |r: &draftlens_records::RecordBatch| -> HashMap<u32, usize> {
        (0..r.num_blocks()).map(|b| (r.anchor[b], b)).collect()
    };
    assert_eq!(
        replay(&records, &by_anchor(&records), plen, len),
        Some(want)
    );
    assert_eq!(replay(&oracle, &by_anchor(&oracle), plen, len), Some(want));
}

// ---------------------------------------------------------------------------------------------
// (d) bad input
// ---------------------------------------------------------------------------------------------

#[test]
fn a_checkpoint_without_its_selector_is_refused_naming_the_file_and_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let files = qwen3();
    let be = CpuBackend::new();
    let file = |dir: &Path| dir.join("model.safetensors").display().to_string();
    let error = |dir: &Path| -> String {
        let findings = lint(&files, dir).unwrap();
        let e = findings
            .iter()
            .find(|f| f.severity == Severity::Error)
            .expect("a lint error");
        e.message.clone()
    };

    let none = checkpoint(
        &tmp.path().join("none"),
        |_| {},
        |t| t.retain(|e| !e.0.starts_with("candidate_selector.")),
    );
    let msg = error(&none);
    assert!(
        msg.starts_with(&file(&none))
            && msg.contains("no candidate selector tensors")
            && msg.contains("candidate_selector.successor_codebook"),
        "{msg}"
    );
    let load = format!(
        "{:#}",
        DFlash2Drafter::load(&be, &none, 128, 512).err().unwrap()
    );
    assert!(
        load.starts_with(&file(&none))
            && load.contains("candidate_selector.hidden_projection.weight is missing"),
        "{load}"
    );

    let partial = checkpoint(
        &tmp.path().join("partial"),
        |_| {},
        |t| t.retain(|e| e.0 != "candidate_selector.successor_codebook"),
    );
    let msg = error(&partial);
    assert!(
        msg.contains("partial")
            && msg.contains("candidate_selector.successor_codebook")
            && !msg.contains("predecessor"),
        "{msg}"
    );
    let load = format!(
        "{:#}",
        DFlash2Drafter::load(&be, &partial, 128, 512).err().unwrap()
    );
    assert!(
        load.contains("tensor candidate_selector.successor_codebook is missing"),
        "{load}"
    );

    // A codebook saved with `.weight` (save_pretrained) is read as well.
    let renamed = checkpoint(
        &tmp.path().join("renamed"),
        |_| {},
        |t| {
            for e in t.iter_mut().filter(|e| e.0.ends_with("codebook")) {
                e.0.push_str(".weight");
            }
        },
    );
    assert!(lint(&files, &renamed)
        .unwrap()
        .iter()
        .all(|f| f.severity != Severity::Error));
    DFlash2Drafter::load(&be, &renamed, 128, 512).unwrap();

    let conv = checkpoint(
        &tmp.path().join("conv"),
        |_| {},
        |t| t.retain(|e| e.0 != "layers.1.mlp_conv.base_kernel"),
    );
    assert!(error(&conv).contains("layers.1.mlp_conv.base_kernel is missing"));

    let no_rank = checkpoint(
        &tmp.path().join("no-rank"),
        |c| {
            c["dflash_config"]
                .as_object_mut()
                .unwrap()
                .remove("selector_rank");
        },
        |_| {},
    );
    let e = format!("{:#}", lint(&files, &no_rank).unwrap_err());
    assert!(
        e.contains(&no_rank.join("config.json").display().to_string())
            && e.contains("selector_rank"),
        "{e}"
    );

    // The DFlash loader does not take a DFlash2 checkpoint (it would drop the selector).
    let golden = checkpoint(&tmp.path().join("golden"), |_| {}, |_| {});
    let e = format!(
        "{:#}",
        DFlashDrafter::load(&be, &golden, 128).err().unwrap()
    );
    assert!(e.contains("DFlash2") && e.contains("config.json"), "{e}");

    // More candidates per position than the selector scores.
    let opts = EvalOptions {
        top_k: 17,
        ..EvalOptions::default()
    };
    let e = format!("{:#}", check_options(&golden, &opts).unwrap_err());
    assert!(
        e.contains("--top-k 17") && e.contains("selector_top_k"),
        "{e}"
    );
    check_options(&golden, &EvalOptions::default()).unwrap();
}

// ---------------------------------------------------------------------------------------------
// (e) live decoding (docs/live.md): lossless, and live τ = replayed τ round by round
// ---------------------------------------------------------------------------------------------

#[path = "../live_util/mod.rs"]
mod live_util;

/// The golden drafter decoding live on the random Qwen3 golden target (CPU): its output is plain
/// greedy decoding's (transformers' continuation in the golden), its rounds are the replay's over
/// the same sequence (proposals chosen left to right by the selector from each round's y_a), and
/// its τ is the authors' own loop's (`dflash_generate`, manifest `tau`); an EOS inside the
/// continuation ends both where greedy decoding stops.
#[test]
fn live_decoding_is_lossless_and_its_tau_is_the_replayed_and_the_authors_tau() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(&tmp.path().join("golden"), |_| {}, |_| {});
    let files = qwen3();
    let be = CpuBackend::new();
    let target = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let d = Drafter::DFlash2(DFlash2Drafter::load(&be, &dir, 128, 512).unwrap());
    let manifest = json(&golden_dir().join("manifest.json"));
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    for p in 0..2 {
        let prompt = g.ids(&format!("p{p}.input_ids"));
        let golden = g.ids(&format!("p{p}.greedy_ids"));
        let label = format!("dflash2 p{p}");
        let c = live_util::check_live(&be, &target, &d, &prompt, golden.len(), &[], &label);
        assert_eq!(
            c.live.ids, golden,
            "{label}: transformers' greedy continuation"
        );
        let authors = manifest["prompts"][format!("p{p}")]["tau"]
            .as_f64()
            .unwrap();
        assert!(
            (c.live.tau() - authors).abs() < 1e-12,
            "{label}: live τ {} vs dflash_generate's {authors}",
            c.live.tau()
        );
        println!(
            "{label}: {} rounds, live τ {:.4} = replayed τ {:.4} = dflash_generate τ {authors:.4}",
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
}

// ---------------------------------------------------------------------------------------------
// (f) live speculative sampling at T > 0 (docs/dflash2.md §4): the authors' sampled path
// ---------------------------------------------------------------------------------------------

#[path = "../sampling_util/mod.rs"]
mod sampling_util;

/// The golden drafter (block size 3: two drafted positions, then the round's last token) and the
/// golden target, both cut to a vocabulary of 16 tokens (two random models of 512 tokens hardly
/// ever agree), the selector choosing among 8 candidates: speculative sampling along the
/// selector's sampled path — each position's candidate drawn from softmax(score / T) given the
/// drawn one before, the authors' `CandidateSelector.select` at temperature > 0 — gives the
/// target's distribution (chi-square per position against the exact marginals, per setting),
/// and the test's power against two wrong rules, whose sampled runs fail it.
#[test]
fn speculative_sampling_along_the_selectors_path_is_lossless() {
    use draftlens_records::sampling::{DraftSampling, SamplingParams};
    let tmp = tempfile::tempdir().unwrap();
    let v = 16usize;
    let target = sampling_util::small_vocab_copy(
        &qwen3_dir(),
        &tmp.path().join("target"),
        v,
        &["model.embed_tokens.weight", "lm_head.weight"],
        |_| {},
        |_| {},
    );
    let dir = checkpoint(
        &tmp.path().join("drafter"),
        |c| {
            c["vocab_size"] = v.into();
            c["dflash_config"]["block_size"] = 3.into();
            c["dflash_config"]["mask_token_id"] = (v - 1).into();
            c["dflash_config"]["selector_top_k"] = 8.into();
        },
        |t| {
            for e in t.iter_mut().filter(|e| e.0.contains("codebook")) {
                let row = e.3.len() / e.2[0];
                e.2[0] = v;
                e.3.truncate(v * row);
            }
        },
    );
    let be = CpuBackend::new();
    let files = TargetFiles::open(&target).unwrap();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let d = Drafter::DFlash2(DFlash2Drafter::load(&be, &dir, 128, v).unwrap());
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
    sampling_util::check_lossless("dflash2 B=3", &be, &model, &d, &prompt, &configs, 1000);
}
