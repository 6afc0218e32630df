//! Checks on the real default model (docs/fixtures.md §2), when it is installed.

use super::*;

const REAL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
);

fn real_model() -> Option<Arc<GgufFile>> {
    let p = Path::new(REAL);
    if !p.exists() {
        eprintln!(
            "SKIPPED: {} is not installed (the CI setup script installs it; see docs/fixtures.md §1)",
            p.display()
        );
        return None;
    }
    Some(Arc::new(GgufFile::open(p).unwrap()))
}

fn close(a: f32, b: f64) -> bool {
    (a as f64 - b).abs() <= 1e-7 * (1.0 + b.abs())
}

#[test]
fn real_model_header_facts() {
    let Some(f) = real_model() else { return };
    assert_eq!(f.version(), 3);
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(f.metadata().len(), 33);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset(), 1_785_664);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.get_str("tokenizer.ggml.pre"), Some("smollm"));
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(
        f.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert_eq!(f.get_bool("tokenizer.ggml.add_bos_token"), Some(false));

    let s = f.model_spec().unwrap();
    assert_eq!(s.arch, Arch::Llama);
    assert_eq!(
        (
            s.num_layers,
            s.hidden_size,
            s.intermediate_size,
            s.num_heads,
            s.num_kv_heads,
            s.head_dim,
            s.vocab_size
        ),
        (30, 576, 1536, 9, 3, 64, 49152)
    );
    assert_eq!(
        (s.rope_theta, s.rms_norm_eps, s.max_position_embeddings),
        (1e5, 1e-5, 8192)
    );
    assert!(s.tie_word_embeddings && !s.attention_bias && !s.qk_norm);
    assert_eq!(
        (s.bos_token_id, s.eos_token_ids.clone()),
        (Some(1), vec![2])
    );

    let count = |ty: GgmlType| f.tensors().iter().filter(|t| t.ty == ty).count();
    assert_eq!(
        (
            count(GgmlType::Q4_1),
            count(GgmlType::Q8_0),
            count(GgmlType::F32)
        ),
        (210, 1, 61)
    );
    assert_eq!(
        f.tensor_info("token_embd.weight").unwrap().ty,
        GgmlType::Q8_0
    );
    let params: u64 = f.tensors().iter().map(|t| t.n_elements()).sum();
    assert_eq!(params, 134_515_008);
}

#[test]
fn real_model_dequantises_like_gguf_py() {
    // Reference values from gguf-py 0.19.0 (`gguf.quants.dequantize`, numpy), an independent
    // implementation: first elements and f64 row sums of chosen rows.
    let Some(f) = real_model() else { return };
    let w = GgufWeights::new(f.clone()).unwrap();
    let embd = w.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(embd.shape, vec![49152, 576]);
    let row = |t: &draftlens_engine::formats::HostTensor, r: usize| {
        t.data[r * t.shape[1]..(r + 1) * t.shape[1]].to_vec()
    };
    let check = |got: Vec<f32>, first: [f64; 4], sum: f64, what: &str| {
        for (g, w) in got.iter().zip(first) {
            assert!(close(*g, w), "{what}: {g} vs {w}");
        }
        let s: f64 = got.iter().map(|&v| v as f64).sum();
        assert!(
            (s - sum).abs() < 1e-9 * (1.0 + sum.abs()),
            "{what}: sum {s} vs {sum}"
        );
    };
    check(
        row(&embd, 0),
        [
            -0.10654449462890625,
            0.032978057861328125,
            0.048198699951171875,
            -0.022830963134765625,
        ],
        -2.2541093826293945,
        "embd row 0",
    );
    check(
        row(&embd, 1000),
        [
            -0.1119384765625,
            -0.0739593505859375,
            0.0379791259765625,
            -0.0179901123046875,
        ],
        1.9784250259399414,
        "embd row 1000",
    );
    check(
        row(&embd, 49151),
        [
            0.011505126953125,
            0.0057525634765625,
            0.0977935791015625,
            -0.0977935791015625,
        ],
        -0.4662208557128906,
        "embd row 49151",
    );
    let total: f64 = embd.data.iter().map(|&v| v as f64).sum();
    assert!(
        (total - -15353.04449415207).abs() < 1e-6,
        "embd sum {total}"
    );
    assert!(embd.data.iter().all(|v| v.is_finite()));
    let r0 = row(&embd, 0);
    let (mean, max) = (
        r0.iter().sum::<f32>() / 576.0,
        r0.iter().fold(0f32, |m, v| m.max(v.abs())),
    );
    assert!(
        mean.abs() < 0.1 && max > 0.0 && max < 10.0,
        "row 0 stats mean {mean} max|.| {max}"
    );

    // Q4_1, un-permuted: HF q row 1 = GGUF row 2, HF q row 32 = GGUF row 1 (hd = 64).
    let q = w.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.shape, vec![576, 576]);
    check(
        row(&q, 0),
        [
            -0.0963134765625,
            0.1573486328125,
            -0.0963134765625,
            -0.73046875,
        ],
        1.00726318359375,
        "q row 0",
    );
    check(
        row(&q, 1),
        [-0.1591796875, 0.39794921875, -0.0198974609375, -1.2734375],
        4.22308349609375,
        "q row 1",
    );
    check(
        row(&q, 32),
        [
            -0.1173095703125,
            -0.1173095703125,
            -0.19281005859375,
            0.26019287109375,
        ],
        -0.71209716796875,
        "q row 32",
    );
    // k: 3 KV heads; HF k row 1 = GGUF row 2.
    let k = w.tensor("model.layers.0.self_attn.k_proj.weight").unwrap();
    assert_eq!(k.shape, vec![192, 576]);
    check(
        row(&k, 1),
        [
            0.203369140625,
            0.09136962890625,
            0.203369140625,
            -0.13262939453125,
        ],
        -0.98358154296875,
        "k row 1",
    );
    let down = w.tensor("model.layers.29.mlp.down_proj.weight").unwrap();
    assert_eq!(down.shape, vec![576, 1536]);
    check(
        row(&down, 575),
        [
            -0.22918701171875,
            -0.03912353515625,
            -0.276702880859375,
            0.2459716796875,
        ],
        -5.229949951171875,
        "down row 575",
    );
    let norm = w.tensor("model.norm.weight").unwrap();
    check(
        norm.data.clone(),
        [1.7578125, 1.8203125, 1.78125, 1.6015625],
        1038.33203125,
        "final norm",
    );
}

#[test]
fn real_model_unpermute_is_an_exact_row_permutation() {
    let Some(f) = real_model() else { return };
    let w = GgufWeights::new(f.clone()).unwrap();
    for layer in [0, 17, 29] {
        for (part, n_head) in [("q", 9usize), ("k", 3)] {
            let hf = w
                .tensor(&format!(
                    "model.layers.{layer}.self_attn.{part}_proj.weight"
                ))
                .unwrap();
            let raw = f
                .dequantize(&format!("blk.{layer}.attn_{part}.weight"))
                .unwrap();
            assert_eq!(hf.shape, raw.shape);
            let cols = hf.shape[1];
            let rows = hf.shape[0];
            let hd = rows / n_head;
            // Re-apply llama.cpp's permute (convert_hf_to_gguf.py `LlamaModel.permute`:
            // reshape(n_head, 2, hd/2, cols).swapaxes(1, 2)) to the HF rows: GGUF row
            // head·hd + 2i + h holds HF row head·hd + h·hd/2 + i. Must give back the file exactly.
            for head in 0..n_head {
                for i in 0..hd / 2 {
                    for h in 0..2 {
                        let g = head * hd + 2 * i + h;
                        let src = head * hd + h * hd / 2 + i;
                        assert_eq!(
                            raw.data[g * cols..(g + 1) * cols],
                            hf.data[src * cols..(src + 1) * cols],
                            "layer {layer} {part}: GGUF row {g} vs HF row {src}"
                        );
                    }
                }
            }
            // Same multiset of values (nothing duplicated or lost).
            let mut a: Vec<u32> = hf.data.iter().map(|v| v.to_bits()).collect();
            let mut b: Vec<u32> = raw.data.iter().map(|v| v.to_bits()).collect();
            a.sort_unstable();
            b.sort_unstable();
            assert!(a == b, "layer {layer} {part}: values differ as a multiset");
        }
    }
}

#[test]
fn real_model_loads_every_tensor() {
    let Some(f) = real_model() else { return };
    let w = GgufWeights::new(f).unwrap();
    let t0 = std::time::Instant::now();
    let mut n = 0usize;
    for info in w.tensors() {
        let t = w.tensor(&info.name).unwrap();
        assert_eq!(t.shape, info.shape, "{}", info.name);
        assert!(
            t.data.iter().all(|v| v.is_finite()),
            "{} has non-finite values",
            info.name
        );
        n += t.data.len();
    }
    assert_eq!(n, 134_515_008);
    // Informational only (timing is measured, never asserted).
    eprintln!(
        "dequantised all {} tensors ({n} values) in {:.3} s",
        w.tensors().len(),
        t0.elapsed().as_secs_f64()
    );
}
