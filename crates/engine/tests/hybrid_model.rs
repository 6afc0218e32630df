//! Hybrid targets (Qwen3.5 / Qwen3-Next) through every model path on the CPU backend: cached
//! incremental forward, batched greedy decoding, packed prefill, cropping for live speculative
//! decoding, the engine numeric profile, a DFlash drafter on a hybrid target, and the bad inputs
//! the loader refuses. Models: the random hybrid fixtures of golden_hybrid.rs
//! (tests/fixtures/golden/{qwen3_5,qwen3_next}) and random weights of any shape
//! (`model::random`).

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::{Backend, GdnProfile};
use draftlens_engine::drafter::live::live_decode;
use draftlens_engine::drafter::random::{write_random_checkpoint, RandomDrafter};
use draftlens_engine::drafter::DFlashDrafter;
use draftlens_engine::generate::{greedy, greedy_batch};
use draftlens_engine::model::config::HybridSpec;
use draftlens_engine::model::random::{qwen3_5_27b_spec, RandomWeights};
use draftlens_engine::model::{Capture, ModelSpec, TargetFiles, TargetModel};
use golden_util::*;
use std::path::{Path, PathBuf};

fn load(name: &str) -> (CpuBackend, TargetModel<CpuBackend>) {
    let dir = repo_root().join("tests/fixtures/golden").join(name);
    let files = TargetFiles::open(&dir).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let be = CpuBackend::new();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    (be, model)
}

/// Deterministic ids in `0..vocab`.
fn ids(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// Every hidden state (0..=L) and the final hidden state of `forward` over `ids` fed in `pieces`
/// (lengths) through one cache, rows concatenated.
fn states_in_pieces(
    be: &CpuBackend,
    m: &TargetModel<CpuBackend>,
    ids: &[u32],
    pieces: &[usize],
) -> Vec<Vec<f32>> {
    let nl = m.spec.num_layers;
    let cap = Capture::hf_indices((0..=nl).collect(), nl).unwrap();
    let mut cache = m.new_cache();
    let mut out = vec![Vec::new(); nl + 2];
    let mut at = 0;
    for &p in pieces {
        let o = m.forward(be, &ids[at..at + p], &mut cache, &cap).unwrap();
        for (k, slot) in out.iter_mut().enumerate().take(nl + 1) {
            slot.extend(be.to_host(o.captured.get(k).unwrap()).unwrap());
        }
        out[nl + 1].extend(be.to_host(&o.last_hidden).unwrap());
        at += p;
    }
    assert_eq!(at, ids.len());
    out
}

#[test]
fn a_cached_incremental_forward_equals_one_forward() {
    for name in ["qwen3_5", "qwen3_next"] {
        let (be, m) = load(name);
        let seq = ids(150, 5, m.spec.vocab_size);
        let whole = states_in_pieces(&be, &m, &seq, &[150]);
        // Prefill across a chunk boundary, a multi-token continuation that starts mid-chunk with a
        // carried state (chunked form with an initial state), then single tokens (recurrent form).
        let parts = states_in_pieces(&be, &m, &seq, &[70, 37, 1, 1, 40, 1]);
        for (k, (a, b)) in whole.iter().zip(&parts).enumerate() {
            let d = diff(b, a);
            // The same maths summed in other orders (chunk splits, recurrent vs chunked): f32
            // noise, measured ≤ ~1e-6. A state not carried between calls gives ~1e-1.
            assert!(d.rel < 1e-5, "{name} state {k}: rel {:.2e}", d.rel);
        }
    }
}

#[test]
fn batched_greedy_is_bit_identical_to_each_prompt_alone() {
    for name in ["qwen3_5", "qwen3_next"] {
        let (be, m) = load(name);
        let v = m.spec.vocab_size;
        let prompts = [ids(9, 1, v), ids(70, 2, v), ids(1, 3, v), ids(33, 4, v)];
        let refs: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
        let batch = greedy_batch(&be, &m, &refs, 20, &[]).unwrap();
        for (p, got) in prompts.iter().zip(&batch) {
            let alone = greedy(&be, &m, p, 20, &[]).unwrap();
            assert_eq!(got.ids, alone.ids, "{name}: prompt of {} tokens", p.len());
        }
        // The decode step itself: each row's hidden state equals the row decoded alone, bit for bit.
        let (mut c0, mut c1) = (m.new_cache(), m.new_cache());
        m.forward(&be, &prompts[0], &mut c0, &Capture::none())
            .unwrap();
        m.forward(&be, &prompts[1], &mut c1, &Capture::none())
            .unwrap();
        let mut a0 = m.new_cache();
        m.forward(&be, &prompts[0], &mut a0, &Capture::none())
            .unwrap();
        let both = m
            .forward_decode(&be, &[7, 8], &mut [&mut c0, &mut c1])
            .unwrap();
        let alone = m.forward_decode(&be, &[7], &mut [&mut a0]).unwrap();
        let h = be.to_host(&both).unwrap();
        assert_eq!(
            &h[..m.spec.hidden_size],
            be.to_host(&alone).unwrap().as_slice()
        );
    }
}

#[test]
fn packed_prefill_equals_each_sequence_alone() {
    for name in ["qwen3_5", "qwen3_next"] {
        let (be, m) = load(name);
        let v = m.spec.vocab_size;
        let seqs = [ids(70, 11, v), ids(5, 12, v), ids(1, 13, v), ids(64, 14, v)];
        let mut all = Vec::new();
        let mut starts = vec![0];
        for s in &seqs {
            all.extend(s);
            starts.push(all.len());
        }
        let nl = m.spec.num_layers;
        let cap = Capture::hf_indices((0..=nl).collect(), nl).unwrap();
        let packed = m.forward_packed(&be, &all, &starts, &cap).unwrap();
        for (i, s) in seqs.iter().enumerate() {
            let alone = m.forward(&be, s, &mut m.new_cache(), &cap).unwrap();
            for k in 0..=nl {
                let p = be
                    .slice_rows(packed.captured.get(k).unwrap(), starts[i], starts[i + 1])
                    .unwrap();
                let d = diff(
                    &be.to_host(&p).unwrap(),
                    &be.to_host(alone.captured.get(k).unwrap()).unwrap(),
                );
                // Row for row the same operations; only GEMM blocking over more rows may reorder
                // sums. A state leaking from the previous sequence gives errors ~1e-1.
                assert!(d.rel < 1e-5, "{name} seq {i} state {k}: rel {:.2e}", d.rel);
            }
        }
    }
}

#[test]
fn crop_then_forward_equals_an_uncropped_history() {
    let (be, m) = load("qwen3_5");
    let v = m.spec.vocab_size;
    let prompt = ids(20, 21, v);
    let verify = ids(6, 22, v);
    let next = ids(3, 23, v);
    let nl = m.spec.num_layers;
    let cap = Capture::hf_indices((0..=nl).collect(), nl).unwrap();
    for keep in [0, 1, 4, 6] {
        // Speculative: prompt, a verify block of 6, crop to the accepted `keep`, continue.
        let mut spec_cache = m.new_cache();
        m.forward(&be, &prompt, &mut spec_cache, &Capture::none())
            .unwrap();
        m.forward(&be, &verify, &mut spec_cache, &Capture::none())
            .unwrap();
        m.crop(&be, &mut spec_cache, prompt.len() + keep).unwrap();
        assert_eq!(spec_cache.len, prompt.len() + keep);
        let a = m.forward(&be, &next, &mut spec_cache, &cap).unwrap();
        // Plain: prompt, the accepted tokens, continue.
        let mut plain = m.new_cache();
        m.forward(&be, &prompt, &mut plain, &Capture::none())
            .unwrap();
        if keep > 0 {
            m.forward(&be, &verify[..keep], &mut plain, &Capture::none())
                .unwrap();
        }
        let b = m.forward(&be, &next, &mut plain, &cap).unwrap();
        for k in 0..=nl {
            assert_eq!(
                be.to_host(a.captured.get(k).unwrap()).unwrap(),
                be.to_host(b.captured.get(k).unwrap()).unwrap(),
                "keep {keep}: hidden state {k} differs"
            );
        }
    }
    // Cropping back past the last forward's start cannot restore a recurrent state: an error, as
    // is slicing the cache alone.
    let mut c = m.new_cache();
    m.forward(&be, &prompt, &mut c, &Capture::none()).unwrap();
    m.forward(&be, &verify, &mut c, &Capture::none()).unwrap();
    let e = m.crop(&be, &mut c, 10).unwrap_err().to_string();
    assert!(
        e.contains("recurrent state") && e.contains("position 20"),
        "{e}"
    );
    let e = c.crop(&be, 22).unwrap_err().to_string();
    assert!(e.contains("TargetModel::crop"), "{e}");
}

#[test]
fn the_engine_profile_runs_close_to_the_reference() {
    let (be, mut m) = load("qwen3_next");
    let seq = ids(90, 31, m.spec.vocab_size);
    let reference = states_in_pieces(&be, &m, &seq, &[90]);
    m.set_gdn_profile(GdnProfile::Engine);
    let engine = states_in_pieces(&be, &m, &seq, &[90]);
    let nl = m.spec.num_layers;
    let d = diff(&engine[nl], &reference[nl]);
    // bf16 roundings inside every GDN core (8 significant bits: 2⁻⁹ relative each) compound over
    // 4 GDN layers: visible, but a few percent at most (measured 3.1e-2 on this model).
    assert!(
        d.rel > 1e-4 && d.rel < 5e-2,
        "engine vs reference: rel {:.2e}",
        d.rel
    );
    eprintln!(
        "engine vs reference profile, final hidden state: rel {:.2e}",
        d.rel
    );
}

/// A tiny hybrid with the 27B's layer schedule (64 layers, every 4th full attention).
fn tiny_64_layer_hybrid() -> ModelSpec {
    let big = qwen3_5_27b_spec();
    ModelSpec {
        vocab_size: 96,
        hidden_size: 32,
        intermediate_size: 48,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        max_position_embeddings: 512,
        hybrid: Some(HybridSpec {
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 8,
            linear_value_head_dim: 8,
            rotary_dim: 4,
            ..big.hybrid.clone().unwrap()
        }),
        ..big
    }
}

#[test]
fn a_dflash_drafter_on_a_hybrid_target_drafts_and_live_decoding_is_lossless() {
    let spec = tiny_64_layer_hybrid();
    assert_eq!(spec.num_layers, 64);
    let be = CpuBackend::new();
    let target = TargetModel::load(&be, &spec, &RandomWeights::new(&spec, 5)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let r = RandomDrafter {
        layers: 2,
        block_size: 8,
        // The 27B drafter's taps: evenly spaced decoder-layer outputs over [1, L−3].
        target_layer_ids: vec![1, 16, 31, 46, 61],
        intermediate_size: 64,
        mask_token_id: 95,
        sliding_layers: 0,
        sliding_window: 0,
        seed: 9,
    };
    write_random_checkpoint(dir.path(), &spec, &r).unwrap();
    let drafter = DFlashDrafter::load(&be, dir.path(), spec.hidden_size).unwrap();
    let prompt = ids(17, 41, spec.vocab_size);
    let live = live_decode(&be, &target, &drafter, &prompt, 40, &[]).unwrap();
    // Every round crops the verify pass back to the accepted tokens (snapshot + replay of the
    // recurrent state); lossless decoding must give exactly the plain greedy continuation.
    let plain = greedy(&be, &target, &prompt, 40, &[]).unwrap();
    assert_eq!(live.ids, plain.ids);
    assert!(!live.round_tokens.is_empty());
}

// ---- bad inputs: one clear error naming the key or tensor, before any compute ----

/// A copy of fixture `name` in a temp dir with config.json edited by `edit`.
fn fixture_copy(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let src = repo_root().join("tests/fixtures/golden").join(name);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut c = json(&src.join("config.json"));
    edit(&mut c);
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    dir
}

fn open_err(dir: &Path) -> String {
    match TargetFiles::open(dir) {
        Ok(_) => panic!("{}: accepted", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn bad_hybrid_configs_are_one_clear_error_naming_the_key() {
    let tc = |c: &mut serde_json::Value| c["text_config"].as_object_mut().unwrap().clone();
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        (
            "qwen3_5",
            // Mixture-of-experts keys (docs/moe-models.md; missing experts: moe_checkpoint.rs).
            Box::new(|c| {
                c["model_type"] = "qwen3_5_moe".into();
                c["text_config"]["shared_expert_intermediate_size"] = 0.into();
            }),
            &["shared_expert_intermediate_size is 0"],
        ),
        (
            "qwen3_5",
            Box::new(|c| {
                c["model_type"] = "qwen3_5_moe".into();
                c["text_config"]["num_experts_per_tok"] = 300.into();
            }),
            &["num_experts_per_tok 300 must be between 1 and num_experts (256)"],
        ),
        (
            "qwen3_next",
            // transformers' default: 512 experts.
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("num_experts");
                c["decoder_sparse_step"] = 0.into();
            }),
            &["decoder_sparse_step is 0"],
        ),
        (
            "qwen3_5",
            Box::new(|c| c["text_config"]["linear_num_value_heads"] = 3.into()),
            &["linear_num_value_heads 3", "linear_num_key_heads 2"],
        ),
        (
            "qwen3_5",
            Box::new(|c| c["text_config"]["layer_types"][4] = "sliding_attention".into()),
            &["layer_types[4]", "sliding_attention"],
        ),
        (
            "qwen3_5",
            Box::new(move |c| {
                let mut t = tc(c);
                t["layer_types"].as_array_mut().unwrap().pop();
                c["text_config"] = t.into();
            }),
            &["layer_types has 5 entries", "num_hidden_layers is 6"],
        ),
        (
            "qwen3_next",
            Box::new(|c| c["linear_key_head_dim"] = 0.into()),
            &["linear_key_head_dim is 0"],
        ),
    ];
    for (name, edit, want) in cases {
        let dir = fixture_copy(name, edit);
        let e = open_err(dir.path());
        for w in want {
            assert!(e.contains(w), "{name}: {e:?} should mention {w:?}");
        }
        assert!(e.contains("config.json"), "{e}");
    }
}

/// Rewrite `dir/model.safetensors` without tensor `drop` (or with it truncated by one row when
/// `shrink`).
fn rewrite_weights(dir: &Path, drop: &str, shrink: bool) -> PathBuf {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (n, t) in st.tensors() {
        let (mut shape, mut data) = (t.shape().to_vec(), t.data().to_vec());
        if n == drop {
            if !shrink {
                continue;
            }
            let row = data.len() / shape[0];
            shape[0] -= 1;
            data.truncate(data.len() - row);
        }
        owned.push((n, t.dtype(), shape, data));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
    path
}

#[test]
fn missing_or_misshapen_hybrid_tensors_are_named() {
    let dir = fixture_copy("qwen3_5", |_| {});
    rewrite_weights(
        dir.path(),
        "model.language_model.layers.1.linear_attn.A_log",
        false,
    );
    let e = open_err(dir.path());
    assert!(
        e.contains("model.layers.1.linear_attn.A_log is missing"),
        "{e}"
    );

    let dir = fixture_copy("qwen3_next", |_| {});
    rewrite_weights(
        dir.path(),
        "model.layers.0.linear_attn.in_proj_qkvz.weight",
        true,
    );
    let e = open_err(dir.path());
    assert!(
        e.contains("in_proj_qkvz.weight") && e.contains("shape"),
        "the fused tensor is named: {e}"
    );

    let dir = fixture_copy("qwen3_next", |_| {});
    rewrite_weights(dir.path(), "model.layers.2.self_attn.q_proj.weight", true);
    let e = open_err(dir.path());
    assert!(e.contains("model.layers.2.self_attn.q_proj.weight"), "{e}");
}

/// A Qwen3.5 folder's weights reach the backend as their stored bytes (`WeightSource::raw`: no
/// host f32 copy, the memory map's pages released after the upload), as a dense model's do; only
/// the splits of Qwen3-Next's fused grouped projections are gathered on the host.
#[test]
fn hybrid_weights_go_to_the_backend_without_a_host_copy() {
    let files = TargetFiles::open(&repo_root().join("tests/fixtures/golden/qwen3_5")).unwrap();
    let w = files.weights.as_ref();
    for name in [
        "model.layers.0.linear_attn.in_proj_qkv.weight",
        "model.layers.0.linear_attn.out_proj.weight",
        "model.layers.2.self_attn.q_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "lm_head.weight",
    ] {
        let raw = w
            .raw(name)
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: no raw view"));
        let host = w.tensor(name).unwrap();
        assert_eq!([raw.rows, raw.cols], host.shape[..], "{name}");
    }
    let next = TargetFiles::open(&repo_root().join("tests/fixtures/golden/qwen3_next")).unwrap();
    let fused_split = "model.layers.0.linear_attn.in_proj_qkv.weight";
    assert!(next.weights.raw(fused_split).unwrap().is_none());
    assert!(next.weights.tensor(fused_split).is_ok());
}
