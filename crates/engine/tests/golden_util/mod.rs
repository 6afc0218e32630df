//! Helpers shared by the golden tests (`golden_*.rs`, `drafter_*.rs`): paths of the committed
//! fixtures, reading reference tensors out of a `golden.safetensors`, and the error statistics
//! every comparison reports.
//!
//! Not every test file uses every helper.
#![allow(dead_code)]

pub mod gguf_write;

use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// The repository root (crates/engine/ is the engine crate's manifest folder).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The default target model. Tests fail (not skip) without it: a golden test that silently skips
/// proves nothing, and `scripts/setup-fixtures.sh` installs it (the README's setup step).
pub fn default_model() -> PathBuf {
    let p = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup-fixtures.sh from the repository root first",
        p.display()
    );
    p
}

/// A committed `golden.safetensors`, read into memory once.
pub struct Golden {
    pub path: PathBuf,
    bytes: Vec<u8>,
}

impl Golden {
    pub fn open(path: PathBuf) -> Golden {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Golden { path, bytes }
    }

    fn st(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes)
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()))
    }

    /// Shape and f32 values of a F16 / F32 / BF16 tensor.
    pub fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let st = self.st();
        let t = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("{}: tensor {name}: {e}", self.path.display()));
        let d = t.data();
        let v: Vec<f32> = match t.dtype() {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => panic!(
                "{}: tensor {name} has dtype {other:?}, expected a float",
                self.path.display()
            ),
        };
        (t.shape().to_vec(), v)
    }

    /// Values of an I64 tensor as token ids.
    pub fn ids(&self, name: &str) -> Vec<u32> {
        let st = self.st();
        let t = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("{}: tensor {name}: {e}", self.path.display()));
        assert_eq!(t.dtype(), Dtype::I64, "{}: {name}", self.path.display());
        t.data()
            .chunks_exact(8)
            .map(|c| u32::try_from(i64::from_le_bytes(c.try_into().unwrap())).unwrap())
            .collect()
    }
}

/// Read and parse a JSON file.
pub fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A copy of the committed golden folder NAME's model (config.json + model.safetensors, no
/// tokenizer) in `dir`/NAME, for tests that touch, grow or hash the files.
pub fn golden_model_copy(name: &str, dir: &Path) -> PathBuf {
    let src = repo_root().join("tests/fixtures/golden").join(name);
    let dst = dir.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    dst
}

/// The spec of a committed golden's `config.json` (tests/fixtures/golden/NAME) with some keys
/// replaced: the same architecture at another size.
pub fn golden_spec_with(
    name: &str,
    overrides: &[(&str, serde_json::Value)],
) -> draftlens_engine::model::ModelSpec {
    let mut c = json(&repo_root().join(format!("tests/fixtures/golden/{name}/config.json")));
    let o = c.as_object_mut().expect("a config is a JSON object");
    for (k, v) in overrides {
        o.insert((*k).into(), v.clone());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, c.to_string()).unwrap();
    draftlens_engine::model::ModelSpec::from_hf_config(&path).unwrap()
}

/// A small gpt-oss: the committed fixture's config (YaRN, top-4, heads of 64 with sinks, a window
/// of 8) at hidden size 256 with `experts` experts of width 96 and these layer types.
pub fn small_gpt_oss_spec(
    experts: usize,
    layer_types: &[&str],
) -> draftlens_engine::model::ModelSpec {
    golden_spec_with(
        "gpt_oss",
        &[
            ("hidden_size", serde_json::json!(256)),
            ("intermediate_size", serde_json::json!(96)),
            ("num_local_experts", serde_json::json!(experts)),
            ("num_hidden_layers", serde_json::json!(layer_types.len())),
            ("layer_types", serde_json::json!(layer_types)),
        ],
    )
}

/// How far `ours` is from the reference `want`.
#[derive(Clone, Copy, Debug)]
pub struct Diff {
    /// ‖ours − ref‖ / ‖ref‖ (Frobenius).
    pub rel: f64,
    /// max |ours − ref|.
    pub max_abs: f64,
    /// cos(ours, ref) over the flattened tensors.
    pub cosine: f64,
}

pub fn diff(ours: &[f32], want: &[f32]) -> Diff {
    assert_eq!(ours.len(), want.len(), "length mismatch");
    let (mut dd, mut rr, mut oo, mut or, mut mx) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (&o, &r) in ours.iter().zip(want) {
        let (o, r) = (o as f64, r as f64);
        dd += (o - r) * (o - r);
        rr += r * r;
        oo += o * o;
        or += o * r;
        mx = mx.max((o - r).abs());
    }
    Diff {
        rel: (dd / rr).sqrt(),
        max_abs: mx,
        cosine: or / (oo.sqrt() * rr.sqrt()),
    }
}

/// `v` rounded to f16 and back: the reference hidden states are stored in f16, so rounding ours
/// the same way before comparing cancels the storage error wherever both round to the same value.
pub fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// Compares our top-k next-token log-probs (`got_ids`, `got_lp`, one row) with the golden's:
/// every log-prob within `tol`, and an id may differ from the golden's at the same rank only when
/// two golden log-probs are closer than `tol` (a legitimate rank swap). Returns the largest |Δ|.
pub fn check_topk(
    label: &str,
    got_ids: &[u32],
    got_lp: &[f32],
    want_ids: &[u32],
    want_lp: &[f32],
    tol: f32,
) -> f32 {
    let mut worst = 0f32;
    for j in 0..want_ids.len() {
        let d = (got_lp[j] - want_lp[j]).abs();
        worst = worst.max(d);
        assert!(
            d < tol,
            "{label} rank {j}: log-prob {} vs {} (|Δ| {d:.2e})",
            got_lp[j],
            want_lp[j]
        );
        if got_ids[j] != want_ids[j] {
            let k = want_ids
                .iter()
                .position(|&x| x == got_ids[j])
                .unwrap_or_else(|| {
                    panic!(
                        "{label}: our rank-{j} id {} is not in the golden top-k",
                        got_ids[j]
                    )
                });
            assert!(
                (want_lp[k] - want_lp[j]).abs() < tol,
                "{label}: ranks {j} and {k} swapped although their log-probs differ by {}",
                (want_lp[k] - want_lp[j]).abs()
            );
        }
    }
    worst
}

/// Compares captured hidden states (`(golden tensor name, ours)`, each `rows × hidden`) with the
/// golden ones: relative error below `rel_tol`, below `rel_tol_f16` after rounding ours to f16 as
/// the reference was stored, cosine above 0.99999. Returns the worst relative errors (plain,
/// f16-rounded) for the summary line.
pub fn check_states(
    label: &str,
    g: &Golden,
    states: &[(String, Vec<f32>)],
    rows_hidden: [usize; 2],
    rel_tol: f64,
    rel_tol_f16: f64,
) -> (f64, f64) {
    let (mut worst, mut worst16) = (0f64, 0f64);
    for (tname, ours) in states {
        let (shape, want) = g.f32(tname);
        assert_eq!(shape, rows_hidden, "{label} {tname}");
        let d = diff(ours, &want);
        let d16 = diff(&round_f16(ours), &want);
        eprintln!(
            "{label} {tname:<11} rel {:.2e}  rel(f16-rounded) {:.2e}  max|Δ| {:.2e}  1−cos {:.1e}",
            d.rel,
            d16.rel,
            d.max_abs,
            1.0 - d.cosine
        );
        assert!(
            d.rel < rel_tol,
            "{label} {tname}: relative error {:.3e}",
            d.rel
        );
        assert!(
            d16.rel < rel_tol_f16,
            "{label} {tname}: relative error after f16 rounding {:.3e}",
            d16.rel
        );
        assert!(d.cosine > 0.999_99, "{label} {tname}: cosine {}", d.cosine);
        worst = worst.max(d.rel);
        worst16 = worst16.max(d16.rel);
    }
    (worst, worst16)
}

/// Tolerances of a random-model golden test (each argued where the test defines them).
pub struct Tolerances {
    /// Relative error of a hidden state.
    pub rel: f64,
    /// The same after rounding ours to f16 as the reference was stored.
    pub rel_f16: f64,
    /// Max |Δ| of a last-position top-8 log-prob.
    pub logprob: f32,
}

/// Prompt `p` of a random-model golden (`p{p}.*` in `g`): the forward over prompt ++ the golden's
/// greedy continuation matches every captured hidden state ([`check_states`]) and the last
/// position's top-8 ([`check_topk`]), and greedy decoding of the prompt reproduces the
/// continuation token for token (`new_tokens`, no EOS: the golden prompts were redrawn until every
/// greedy step had a top-1/top-2 gap ≥ 0.01). Returns the worst (rel, rel f16, log-prob) errors.
pub fn check_golden_prompt(
    name: &str,
    p: usize,
    g: &Golden,
    model: &draftlens_engine::model::TargetModel<draftlens_engine::backend::cpu::CpuBackend>,
    capture: &draftlens_engine::model::Capture,
    new_tokens: usize,
    tol: &Tolerances,
) -> (f64, f64, f32) {
    use draftlens_engine::backend::Backend;
    use draftlens_engine::generate::{greedy, StopReason};
    let be = draftlens_engine::backend::cpu::CpuBackend::new();
    let prompt = g.ids(&format!("p{p}.input_ids"));
    let want_greedy = g.ids(&format!("p{p}.greedy_ids"));
    assert_eq!(want_greedy.len(), new_tokens);
    let mut ids = prompt.clone();
    ids.extend(&want_greedy);

    let out = model
        .forward(&be, &ids, &mut model.new_cache(), capture)
        .unwrap();
    let mut states: Vec<(String, Vec<f32>)> = capture
        .indices
        .iter()
        .map(|&k| {
            (
                format!("p{p}.hs{k}"),
                be.to_host(out.captured.get(k).unwrap()).unwrap(),
            )
        })
        .collect();
    states.push((
        format!("p{p}.prenorm"),
        be.to_host(out.captured.prenorm.as_ref().unwrap()).unwrap(),
    ));
    let (w, w16) = check_states(
        name,
        g,
        &states,
        [ids.len(), model.spec.hidden_size],
        tol.rel,
        tol.rel_f16,
    );

    let t = ids.len();
    let top = model
        .logits_topk(&be, &be.slice_rows(&out.last_hidden, t - 1, t).unwrap(), 8)
        .unwrap();
    let want_ids = g.ids(&format!("p{p}.logits_top8_ids"));
    let (_, want_lp) = g.f32(&format!("p{p}.logits_top8_logprobs"));
    let wlp = check_topk(
        &format!("{name} prompt {p}"),
        &top.ids,
        &top.logprobs,
        &want_ids,
        &want_lp,
        tol.logprob,
    );

    let c = greedy(&be, model, &prompt, new_tokens, &model.spec.eos_token_ids).unwrap();
    assert_eq!(
        c.ids, want_greedy,
        "{name} prompt {p}: greedy continuation differs"
    );
    assert_eq!(c.stop, StopReason::Length);
    (w, w16, wlp)
}

/// The last hidden state of every prompt prefilled packed together against the same prompt
/// prefilled alone (both through `forward_packed`): the relative difference per prompt.
pub fn packed_vs_alone(
    model: &draftlens_engine::model::TargetModel<draftlens_engine::backend::cpu::CpuBackend>,
    prompts: &[Vec<u32>],
) -> Vec<f64> {
    use draftlens_engine::backend::Backend;
    use draftlens_engine::model::Capture;
    let be = draftlens_engine::backend::cpu::CpuBackend::new();
    let all: Vec<u32> = prompts.concat();
    let mut starts = vec![0];
    for p in prompts {
        starts.push(starts[starts.len() - 1] + p.len());
    }
    let packed = model
        .forward_packed(&be, &all, &starts, &Capture::none())
        .unwrap();
    let packed = be.to_host(&packed.last_hidden).unwrap();
    let d = model.spec.hidden_size;
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let alone = model
                .forward_packed(&be, p, &[0, p.len()], &Capture::none())
                .unwrap();
            diff(
                &packed[starts[i] * d..starts[i + 1] * d],
                &be.to_host(&alone.last_hidden).unwrap(),
            )
            .rel
        })
        .collect()
}
