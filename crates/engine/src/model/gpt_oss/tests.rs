//! gpt-oss's config keys, YaRN, routing rule and layers against their literal definitions, a
//! random gpt-oss model's forwards (cached, packed, batched decode) against each other, and a
//! backend without sinks refusing the model at load.

use super::*;
use crate::backend::cpu::{CpuBackend, CpuMatrix, CpuTensor};
use crate::backend::{AttnExtras, AttnMask, AttnShape, Rope, TopK};
use crate::generate::{greedy, greedy_batch};
use crate::model::moe::{route, route_topk_softmax};
use crate::model::random::RandomWeights;
use crate::model::{Capture, TargetModel};

/// gpt-oss-20b's config.json as published (openai/gpt-oss-20b), keys as written there.
fn gpt_oss_20b_config() -> Value {
    serde_json::json!({
        "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
        "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
        "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
        "num_experts_per_tok": 4, "num_hidden_layers": 4, "num_key_value_heads": 8,
        "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
        "quantization_config": {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4"
        },
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
        "swiglu_limit": 7.0, "tie_word_embeddings": false, "use_cache": true, "vocab_size": 201088
    })
}

fn spec_of(config: &Value) -> Result<ModelSpec> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    ModelSpec::from_hf_config(&path)
}

fn err_of(config: &Value) -> String {
    format!("{:#}", spec_of(config).unwrap_err())
}

#[test]
fn the_published_config_reads_as_transformers_reads_it() {
    let s = spec_of(&gpt_oss_20b_config()).unwrap();
    assert_eq!(s.arch, crate::model::Arch::GptOss);
    assert_eq!((s.head_dim, s.num_heads, s.num_kv_heads), (64, 64, 8));
    assert_eq!((s.rope_theta, s.rms_norm_eps), (150_000.0, 1e-5));
    assert!(s.attention_bias && !s.qk_norm && !s.tie_word_embeddings);
    let m = s.moe.as_ref().unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.num_experts_per_tok,
            m.moe_intermediate_size
        ),
        (32, 4, 2880)
    );
    assert!(m.shared_expert_intermediate_size.is_none() && m.sparse_layers == [true; 4]);
    let g = s.gpt_oss.as_ref().unwrap();
    assert_eq!(g.quant_method.as_deref(), Some("mxfp4"));
    assert_eq!(
        (g.window(0), g.window(1), g.window(2)),
        (Some(128), None, Some(128))
    );
    let y = g.yarn.as_ref().unwrap();
    assert_eq!((y.factor, y.beta_fast, y.beta_slow), (32.0, 32.0, 1.0));
    assert_eq!(
        (y.original_max_position_embeddings, y.truncate),
        (4096.0, false)
    );
    assert!((y.attention_factor - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-15);

    // GptOssConfig's defaults where keys are missing: even layers sliding, YaRN, θ 150000,
    // head_dim 64, biases on, no quantisation.
    let mut c = gpt_oss_20b_config();
    for k in [
        "layer_types",
        "rope_scaling",
        "rope_theta",
        "head_dim",
        "attention_bias",
        "quantization_config",
        "rms_norm_eps",
    ] {
        c.as_object_mut().unwrap().remove(k);
    }
    let s = spec_of(&c).unwrap();
    let g = s.gpt_oss.as_ref().unwrap();
    assert_eq!(g.layer_types[0], AttentionKind::SlidingAttention);
    assert_eq!(g.layer_types[3], AttentionKind::FullAttention);
    assert!(g.quant_method.is_none() && g.yarn.as_ref().unwrap().factor == 32.0);
    assert_eq!(
        (s.head_dim, s.rope_theta, s.rms_norm_eps),
        (64, 150_000.0, 1e-5)
    );
    assert!(s.attention_bias);
    // Other families keep theirs.
    let q = spec_of(
        &serde_json::json!({"model_type": "qwen3", "vocab_size": 8, "hidden_size": 8,
        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}),
    )
    .unwrap();
    assert_eq!(
        (q.rms_norm_eps, q.rope_theta, q.head_dim),
        (1e-6, 10000.0, 4)
    );
    assert!(q.gpt_oss.is_none());
}

#[test]
fn bad_configs_name_their_key() {
    let with = |k: &str, v: Value| {
        let mut c = gpt_oss_20b_config();
        c[k] = v;
        err_of(&c)
    };
    let e = with(
        "quantization_config",
        serde_json::json!({"quant_method": "fp8"}),
    );
    assert!(
        e.contains(
            "config.json: quantization_config.quant_method \"fp8\" is not supported for gpt_oss"
        ),
        "{e}"
    );
    let e = with("num_experts", serde_json::json!(16));
    assert!(
        e.contains("num_local_experts 32 and num_experts 16 disagree"),
        "{e}"
    );
    let e = with("num_experts_per_tok", serde_json::json!(33));
    assert!(
        e.contains("num_experts_per_tok 33 must be between 1 and num_experts (32)"),
        "{e}"
    );
    let e = with("layer_types", serde_json::json!(["full_attention"]));
    assert!(
        e.contains("layer_types has 1 entries, num_hidden_layers is 4"),
        "{e}"
    );
    let e = with(
        "layer_types",
        serde_json::json!([
            "sliding_attention",
            "linear_attention",
            "full_attention",
            "full_attention"
        ]),
    );
    assert!(e.contains("layer_types must list"), "{e}");
    let e = with("sliding_window", Value::Null);
    assert!(
        e.contains("sliding_attention layers but sliding_window is None"),
        "{e}"
    );
    let e = with(
        "rope_scaling",
        serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
    );
    assert!(
        e.contains("rope_scaling.rope_type \"llama3\" is not supported for gpt_oss"),
        "{e}"
    );
    let e = with("rope_scaling", serde_json::json!({"rope_type": "yarn"}));
    assert!(e.contains("rope_scaling.factor is missing"), "{e}");
}

/// YaRN written as `_compute_yarn_parameters` reads, in f64.
fn literal_yarn(theta: f64, dim: usize, y: &Yarn) -> Vec<f64> {
    let find = |r: f64| {
        dim as f64 * (y.original_max_position_embeddings / (r * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * theta.ln())
    };
    let (mut lo, mut hi) = (find(y.beta_fast), find(y.beta_slow));
    if y.truncate {
        (lo, hi) = (lo.floor(), hi.ceil());
    }
    let (lo, hi) = (lo.max(0.0), hi.min(dim as f64 - 1.0));
    (0..dim / 2)
        .map(|i| {
            let pf = theta.powf(2.0 * i as f64 / dim as f64);
            let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
            let extra = 1.0 - ramp;
            (1.0 / (y.factor * pf)) * (1.0 - extra) + (1.0 / pf) * extra
        })
        .collect()
}

#[test]
fn yarn_frequencies_follow_the_definition() {
    let mut y = Yarn {
        factor: 32.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        original_max_position_embeddings: 4096.0,
        truncate: false,
        attention_factor: 1.0,
    };
    for truncate in [false, true] {
        y.truncate = truncate;
        let ours = yarn_inv_freq(150_000.0, 64, &y);
        let want = literal_yarn(150_000.0, 64, &y);
        for (i, (a, b)) in ours.iter().zip(&want).enumerate() {
            assert!(
                ((*a as f64) - b).abs() <= 4e-7 * b,
                "truncate {truncate} dim {i}: {a} vs {b}"
            );
        }
        // High frequencies extrapolate (plain RoPE), low ones interpolate (divided by factor).
        assert!((ours[0] - 1.0).abs() < 1e-7);
        let last = 150_000f64.powf(-62.0 / 64.0) / 32.0;
        assert!((ours[31] as f64 - last).abs() < 1e-6 * last);
    }
    // The correction range (8.09, 17.4 untruncated; 8, 18 truncated) decides dims 9..=17.
    y.truncate = false;
    let a = yarn_inv_freq(150_000.0, 64, &y);
    y.truncate = true;
    let b = yarn_inv_freq(150_000.0, 64, &y);
    assert_eq!(a[..8], b[..8]);
    assert!(a[9..18].iter().zip(&b[9..18]).all(|(x, y)| x != y));
    assert_eq!(a[18..], b[18..]);
}

/// gpt-oss's rule as transformers' code reads, in f64.
fn literal_topk_softmax(logits: &[f32], k: usize) -> Vec<(usize, f64)> {
    let mut ranked: Vec<(usize, f64)> = logits.iter().map(|&l| l as f64).enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(k);
    let m = ranked[0].1;
    let z: f64 = ranked.iter().map(|r| (r.1 - m).exp()).sum();
    let mut out: Vec<(usize, f64)> = ranked.iter().map(|r| (r.0, (r.1 - m).exp() / z)).collect();
    out.sort_by_key(|r| r.0);
    out
}

#[test]
fn top_k_then_softmax_matches_its_definition_and_the_renormalised_qwen_rule() {
    let mut values = crate::util::host_random(64 * 200, 5)
        .into_iter()
        .map(|v| v * 6.0);
    for (e, k) in [(32, 4), (128, 4), (8, 1), (8, 8)] {
        for _ in 0..25 {
            let logits: Vec<f32> = (0..e).map(|_| values.next().unwrap()).collect();
            let ours = route_topk_softmax(&logits, k);
            let want = literal_topk_softmax(&logits, k);
            assert_eq!(ours.len(), k);
            for (a, b) in ours.iter().zip(&want) {
                assert_eq!(a.0, b.0, "E {e} k {k}: experts");
                assert!(
                    (a.1 as f64 - b.1).abs() <= 1e-6 * b.1.max(1e-3),
                    "{a:?} vs {b:?}"
                );
            }
            // Exact arithmetic makes the two rules one; f32 agrees to rounding.
            for (a, b) in ours.iter().zip(route(&logits, k, true)) {
                assert_eq!(a.0, b.0);
                assert!((a.1 - b.1).abs() < 1e-6, "{a:?} vs {b:?}");
            }
        }
    }
    // Ties go to the lower expert id; a bias shifts the ranking (the logits carry it).
    let r = route_topk_softmax(&[1.0, 3.0, 3.0, 0.0], 2);
    assert_eq!(r, vec![(1, 0.5), (2, 0.5)]);
}

/// A small gpt-oss: 4 layers alternating sliding (window 4) / full, 8 experts of width 16, top
/// 4, heads of 64 with YaRN whose ramp falls inside the head.
fn tiny_spec() -> ModelSpec {
    let mut c = gpt_oss_20b_config();
    let o = c.as_object_mut().unwrap();
    for (k, v) in [
        ("hidden_size", serde_json::json!(32)),
        ("intermediate_size", serde_json::json!(16)),
        ("num_attention_heads", serde_json::json!(4)),
        ("num_key_value_heads", serde_json::json!(2)),
        ("num_local_experts", serde_json::json!(8)),
        ("vocab_size", serde_json::json!(96)),
        ("sliding_window", serde_json::json!(4)),
        ("max_position_embeddings", serde_json::json!(256)),
        ("eos_token_id", Value::Null),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": 8.0,
            "beta_slow": 1.0, "original_max_position_embeddings": 64}),
        ),
    ] {
        o.insert(k.into(), v);
    }
    o.remove("quantization_config");
    spec_of(&c).unwrap()
}

fn host_of(be: &CpuBackend, t: &CpuTensor) -> Vec<f32> {
    be.to_host(t).unwrap()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let n = b.iter().map(|v| v * v).sum::<f32>().sqrt();
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / n.max(1e-30)
}

#[test]
fn a_random_gpt_oss_runs_the_same_cached_packed_and_decoded() {
    let spec = tiny_spec();
    let src = RandomWeights::new(&spec, 9).with_init(0.3, 0.5);
    crate::model::load::check_shapes(&spec, &src).unwrap();
    let be = CpuBackend::new();
    let model = TargetModel::load(&be, &spec, &src).unwrap();
    assert!(matches!(
        model.layers[0].mlp,
        crate::model::moe::FeedForward::GptOss(_)
    ));
    let ids: Vec<u32> = (0..13).map(|i| (i * 37 + 5) % 96).collect();
    let capture = Capture::hf_indices(vec![1, 2, 3, 4], 4).unwrap();

    let whole = model
        .forward(&be, &ids, &mut model.new_cache(), &capture)
        .unwrap();
    // In two chunks over the cache (the second chunk's queries see keys of the first within
    // the window only).
    let mut cache = model.new_cache();
    model
        .forward(&be, &ids[..6], &mut cache, &Capture::none())
        .unwrap();
    let tail = model
        .forward(&be, &ids[6..], &mut cache, &Capture::none())
        .unwrap();
    let d = spec.hidden_size;
    let whole_last = host_of(&be, &whole.last_hidden);
    assert!(max_rel(&host_of(&be, &tail.last_hidden), &whole_last[6 * d..]) < 1e-5);
    // Packed with another sequence.
    let mut packed_ids = vec![3u32, 1, 4, 1, 5, 9, 2];
    packed_ids.extend(&ids);
    let packed = model
        .forward_packed(&be, &packed_ids, &[0, 7, 20], &Capture::none())
        .unwrap();
    assert!(max_rel(&host_of(&be, &packed.last_hidden)[7 * d..], &whole_last) < 1e-5);
    // Greedy one at a time against batched decode steps (per-row windows and sinks).
    let refs: Vec<&[u32]> = vec![&ids, &packed_ids[..7]];
    let batch = greedy_batch(&be, &model, &refs, 12, &[]).unwrap();
    for (p, c) in refs.iter().zip(&batch) {
        assert_eq!(greedy(&be, &model, p, 12, &[]).unwrap().ids, c.ids);
    }
    // The window matters: layer 0's output at the last position changes when the window
    // covers the whole sequence.
    let mut wide = spec.clone();
    wide.gpt_oss.as_mut().unwrap().sliding_window = Some(64);
    let wide_model = TargetModel::load(&be, &wide, &src).unwrap();
    let w = wide_model
        .forward(&be, &ids, &mut wide_model.new_cache(), &capture)
        .unwrap();
    let (a, b) = (
        host_of(&be, whole.captured.get(1).unwrap()),
        host_of(&be, w.captured.get(1).unwrap()),
    );
    assert!(
        max_rel(&a[..4 * d], &b[..4 * d]) < 1e-7,
        "positions inside the window agree"
    );
    assert!(
        max_rel(&a[12 * d..], &b[12 * d..]) > 1e-4,
        "the last position sees more keys"
    );
}

#[test]
fn expert_layouts_map_to_gate_then_up_rows() {
    // Columns 2j are gate j, 2j + 1 up j (transformers' gate_up[..., ::2] / [..., 1::2]).
    let rows: Vec<f32> = (0..6)
        .flat_map(|r| [r as f32 * 10.0, r as f32 * 10.0 + 1.0])
        .collect();
    assert_eq!(
        layers::deinterleave(&rows, 2),
        [0., 1., 20., 21., 40., 41., 10., 11., 30., 31., 50., 51.]
    );
}

/// A fused expert stack's bytes transposed in place of their values (the loader's raw path:
/// `raw::transposed`, the default of `Backend::matrix_raw_transposed`): the same matrix as the
/// value path (transpose `[in, out]` to `[out, in]`, then de-interleave gate|up rows), for 2- and
/// 4-byte values, with and without the de-interleave, at sizes off the 32-row tile.
#[test]
fn transposing_expert_bytes_equals_the_value_path() {
    use crate::backend::raw::{self, RawDtype, RawPart};
    let (inp, out) = (37, 70);
    fn stored(dtype: RawDtype, bytes: &[u8], inp: usize, out: usize) -> RawPart<'_> {
        RawPart {
            dtype,
            rows: inp,
            cols: out,
            bytes,
            mapped: false,
        }
    }
    let values: Vec<f32> = (0..inp * out)
        .map(|i| (i * 7919 % 255) as f32 - 127.0)
        .collect();
    let transposed: Vec<f32> = (0..out)
        .flat_map(|o| {
            values
                .iter()
                .skip(o)
                .step_by(out)
                .copied()
                .collect::<Vec<_>>()
        })
        .collect();
    for interleaved in [false, true] {
        let want = if interleaved {
            layers::deinterleave(&transposed, inp)
        } else {
            transposed.clone()
        };
        // f32 bytes, then bf16 bytes (these integers are exact in bf16).
        let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got =
            raw::transposed(stored(RawDtype::F32, &f32_bytes, inp, out), interleaved).unwrap();
        let got: Vec<f32> = got
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, want, "f32, interleaved {interleaved}");
        let bf16_bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let got =
            raw::transposed(stored(RawDtype::BF16, &bf16_bytes, inp, out), interleaved).unwrap();
        let got: Vec<f32> = got
            .chunks_exact(2)
            .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect();
        assert_eq!(got, want, "bf16, interleaved {interleaved}");
    }
}

/// MXFP4 gate|up rows de-interleaved as bytes (blocks and scales: what a backend that keeps them
/// packed receives, `Backend::matrix_mxfp4`) dequantise to the dequantised rows de-interleaved.
#[test]
fn deinterleaving_mxfp4_bytes_equals_deinterleaving_their_values() {
    let cols = 64;
    let blocks: Vec<u8> = (0..6 * cols / 2).map(|i| (i * 37 % 256) as u8).collect();
    let scales: Vec<u8> = (0..6 * cols / 32).map(|i| 118 + (i % 7) as u8).collect();
    let deq = |b: &[u8], s: &[u8]| crate::backend::mxfp4::dequantize(b, s).unwrap();
    assert_eq!(
        deq(
            &layers::deinterleave(&blocks, cols / 2),
            &layers::deinterleave(&scales, cols / 32)
        ),
        layers::deinterleave(&deq(&blocks, &scales), cols)
    );
}

/// The CPU reference without its gpt-oss overrides: the trait's defaults, as a backend that has
/// not implemented them (CUDA today) runs them.
struct Defaults(CpuBackend);

impl Backend for Defaults {
    type Tensor = CpuTensor;
    type Matrix = CpuMatrix;
    type F32Buf = crate::backend::HostF32;
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn dtype(&self) -> &'static str {
        "f32"
    }
    fn to_host(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        self.0.to_host(t)
    }
    fn dims(&self, t: &CpuTensor) -> (usize, usize) {
        self.0.dims(t)
    }
    fn matrix_dims(&self, m: &CpuMatrix) -> (usize, usize) {
        self.0.matrix_dims(m)
    }
    fn from_host_impl(&self, d: &[f32], r: usize, c: usize) -> Result<CpuTensor> {
        self.0.from_host_impl(d, r, c)
    }
    fn matrix_impl(&self, d: &[f32], o: usize, i: usize) -> Result<CpuMatrix> {
        self.0.matrix_impl(d, o, i)
    }
    fn matmul_impl(&self, x: &CpuTensor, w: &CpuMatrix) -> Result<CpuTensor> {
        self.0.matmul_impl(x, w)
    }
    fn add_row_bias_impl(&self, x: &mut CpuTensor, b: &CpuTensor) -> Result<()> {
        self.0.add_row_bias_impl(x, b)
    }
    fn add_inplace_impl(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        self.0.add_inplace_impl(x, y)
    }
    fn rms_norm_impl(&self, x: &CpuTensor, w: &CpuTensor, eps: f32, g: usize) -> Result<CpuTensor> {
        self.0.rms_norm_impl(x, w, eps, g)
    }
    fn rope_inplace_impl(&self, x: &mut CpuTensor, p: &[u32], r: &Rope) -> Result<()> {
        self.0.rope_inplace_impl(x, p, r)
    }
    fn attention_impl(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        s: AttnShape,
        m: &AttnMask,
    ) -> Result<CpuTensor> {
        self.0.attention_impl(q, k, v, s, m)
    }
    fn swiglu_impl(&self, g: &CpuTensor, u: &CpuTensor) -> Result<CpuTensor> {
        self.0.swiglu_impl(g, u)
    }
    fn embed_impl(&self, t: &CpuMatrix, ids: &[u32]) -> Result<CpuTensor> {
        self.0.embed_impl(t, ids)
    }
    fn concat_rows_impl(&self, p: &[&CpuTensor]) -> Result<CpuTensor> {
        self.0.concat_rows_impl(p)
    }
    fn concat_cols_impl(&self, p: &[&CpuTensor]) -> Result<CpuTensor> {
        self.0.concat_cols_impl(p)
    }
    fn split_cols_impl(&self, x: &CpuTensor, w: &[usize]) -> Result<Vec<CpuTensor>> {
        self.0.split_cols_impl(x, w)
    }
    fn slice_rows_impl(&self, x: &CpuTensor, s: usize, e: usize) -> Result<CpuTensor> {
        self.0.slice_rows_impl(x, s, e)
    }
    fn gather_rows_impl(&self, x: &CpuTensor, r: &[u32]) -> Result<CpuTensor> {
        self.0.gather_rows_impl(x, r)
    }
    fn lm_head_topk_impl(&self, x: &CpuTensor, h: &CpuMatrix, k: usize) -> Result<TopK> {
        self.0.lm_head_topk_impl(x, h, k)
    }
}

#[test]
fn a_backend_without_sinks_refuses_gpt_oss_at_load_and_its_defaults_agree_with_the_cpu() {
    let spec = tiny_spec();
    let src = RandomWeights::new(&spec, 9);
    let be = Defaults(CpuBackend::new());
    let err = match TargetModel::load(&be, &spec, &src) {
        Ok(_) => panic!("gpt-oss loaded on a backend without sinks"),
        Err(e) => format!("{e:#}"),
    };
    assert_eq!(
        err,
        "gpt-oss attention sinks are not implemented on the CUDA backend yet; use --backend cpu"
    );
    // The ops themselves: attention with extras refused, plain attention through the same call
    // unchanged; the host defaults of the YaRN rotation and the clamped SwiGLU equal the CPU's.
    let cpu = CpuBackend::new();
    let random = |rows: usize, cols: usize, seed: u64| CpuTensor {
        rows,
        cols,
        data: crate::util::host_random(rows * cols, seed),
    };
    let x = random(5, 128, 3);
    let shape = AttnShape {
        heads: 2,
        kv_heads: 1,
        head_dim: 64,
    };
    let kv = random(5, 64, 4);
    let mask = AttnMask::Causal { q_start: 0 };
    let sinks = [0.5f32, -1.0];
    let ext = AttnExtras {
        window: Some(2),
        sinks: Some(&sinks),
    };
    let e = be
        .attention_ext(&x, &kv, &kv, shape, &mask, ext)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("gpt-oss attention sinks are not implemented on the CUDA backend yet"),
        "{e}"
    );
    assert_eq!(
        be.attention_ext(&x, &kv, &kv, shape, &mask, AttnExtras::NONE)
            .unwrap(),
        cpu.attention(&x, &kv, &kv, shape, &mask).unwrap()
    );
    let g = spec.gpt_oss.as_ref().unwrap();
    let freqs = rope_freqs(&spec, g);
    let positions = [0u32, 3, 17, 200, 255];
    let (mut a, mut b) = (x.clone(), x.clone());
    be.rope_freqs_inplace(&mut a, &positions, &freqs).unwrap();
    cpu.rope_freqs_inplace(&mut b, &positions, &freqs).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        be.clamped_swiglu_packed(&x, SWIGLU_ALPHA, SWIGLU_LIMIT)
            .unwrap(),
        cpu.clamped_swiglu_packed(&x, SWIGLU_ALPHA, SWIGLU_LIMIT)
            .unwrap()
    );
}
