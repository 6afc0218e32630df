//! Mixtures of experts on CUDA (docs/moe-models.md, "On the GPU"):
//! - the sparse MLP routed on the device (`moe_route`, `moe_plan_*`, the grouped GEMMs of
//!   `kernels/moe_gemm.cu`) gives every row the same bits whatever rows share the call (1 to 200:
//!   decode steps and prefill), and agrees with the host-routed path (a download of the router
//!   logits, one GEMM per expert) to bf16 rounding, with and without a shared expert; a step's
//!   plan built by one block (`moe_plan_one_block`, ≤ 1 024 routes) and by the launches of larger
//!   steps give the same bits;
//! - greedy continuations of a random Qwen3-MoE-shaped target decoded in batches of 1, 3, 8, 32
//!   and 64 are bit-identical to each prompt decoded alone;
//! - the committed transformers goldens (tests/fixtures/golden/{qwen3_moe,qwen3_5_moe,gpt_oss}) on
//!   the CUDA backend: every hidden state within the mixture-of-experts bf16 tolerance
//!   (`parity::moe_layer_tolerance`) or 1.5× transformers' own bf16 error on the same golden
//!   (its `bf16_error.json`), whichever is larger, and the greedy continuation equal to transformers' until
//!   the first step whose reference top-1/top-2 margin is below bf16's reach;
//! - gpt-oss's mixture of experts (top-k then softmax, expert biases, clamped SwiGLU) routed on
//!   the device: rows 1–200 each bit-identical to the same rows among 200, and every row within
//!   bf16 rounding of the host-routed path; its two elementwise ops (`clamped_swiglu_packed`,
//!   `rope_freqs_inplace` with YaRN frequencies and scale) against host emulations of the
//!   kernels' arithmetic and the CPU reference, and the plain-frequency rotation bit for bit
//!   `rope_inplace`.
//!
//! Without a GPU every test prints "SKIP: CUDA unavailable: <reason>" and passes (CI).
#![cfg(feature = "cuda")]

mod cuda_util;
use cuda_util::{bits, gpu};
mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::gpt_oss::clamped_swiglu;
use draftlens_engine::backend::{Backend, Rope, RopeFreqs, RopeStyle};
use draftlens_engine::generate::greedy;
use draftlens_engine::model::gpt_oss::{rope_freqs, GptOssMoe, SWIGLU_ALPHA, SWIGLU_LIMIT};
use draftlens_engine::model::moe::{MoeSpec, SparseMoe};
use draftlens_engine::model::random::{qwen3_8b_spec, RandomWeights};
use draftlens_engine::model::{Arch, Capture, ModelSpec, TargetFiles, TargetModel};
use draftlens_engine::parity::moe_layer_tolerance;
use golden_util::*;

/// A small Qwen3-MoE-shaped model: 64 experts, top-8 (Qwen3-30B-A3B's k), expert width 96 (K
/// of the down projection not a multiple of the 32-wide chunks' 8-chunk unroll), with or without
/// a gated shared expert of width 80.
fn moe_spec(shared: bool) -> ModelSpec {
    let layers = 3;
    ModelSpec {
        arch: Arch::Qwen3Moe,
        vocab_size: 1003,
        hidden_size: 256,
        intermediate_size: 512,
        num_layers: layers,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        max_position_embeddings: 512,
        moe: Some(MoeSpec {
            num_experts: 64,
            num_experts_per_tok: 8,
            moe_intermediate_size: 96,
            norm_topk_prob: true,
            shared_expert_intermediate_size: shared.then_some(80),
            sparse_layers: vec![true; layers],
        }),
        ..qwen3_8b_spec()
    }
}

/// Row counts across the grouped GEMM's row tiles (8), its two-feature-tile switch (16 → 17), the
/// decode limit (64) and the prefill's 64-row groups (65, 130, 200).
const ROW_COUNTS: [usize; 15] = [1, 2, 3, 7, 8, 9, 16, 17, 31, 33, 63, 64, 65, 130, 200];
const MAX_ROWS: usize = 200;

#[test]
fn device_routed_decode_step_is_row_invariant_and_matches_host_routing() {
    let Some(be) = gpu() else { return };
    for shared in [false, true] {
        let spec = moe_spec(shared);
        let moe = spec.moe.clone().unwrap();
        let src = RandomWeights::new(&spec, 5).with_init(0.08, 0.3);
        let block =
            SparseMoe::load(&be, &src, "model.layers.0.mlp", spec.hidden_size, &moe).unwrap();
        let d = spec.hidden_size;
        let mut r = draftlens_engine::util::DetRng::new(17);
        let xs: Vec<f32> = (0..MAX_ROWS * d).map(|_| r.signed_unit()).collect();
        let hs: Vec<f32> = (0..MAX_ROWS * d).map(|_| 0.5 * r.signed_unit()).collect();
        let x_all = be.from_host(&xs, MAX_ROWS, d).unwrap();
        let h_all = be.from_host(&hs, MAX_ROWS, d).unwrap();
        let run = |rows: usize, device: bool| {
            be.set_moe_device_routing(device);
            let x = be.slice_rows(&x_all, 0, rows).unwrap();
            let mut h = be.slice_rows(&h_all, 0, rows).unwrap();
            block.forward_acc(&be, &x, &mut h).unwrap();
            h
        };
        let full = bits(&be, &run(MAX_ROWS, true));
        for rows in ROW_COUNTS {
            let got = run(rows, true);
            assert!(
                bits(&be, &got) == full[..rows * d],
                "shared {shared}: {rows} rows routed on the device differ from the same rows among {MAX_ROWS}"
            );
            // The plan of few routes built by one block, and by the launches larger steps use:
            // the same bits (only the order of rows inside an expert's group may differ).
            be.set_moe_plan_one_block(false);
            let launches = run(rows, true);
            be.set_moe_plan_one_block(true);
            assert!(
                bits(&be, &launches) == full[..rows * d],
                "shared {shared}: {rows} rows planned by the count / groups / fill launches differ"
            );
            let host = run(rows, false);
            let dd = diff(&be.to_host(&got).unwrap(), &be.to_host(&host).unwrap());
            println!(
                "shared {shared}, {rows} rows: device vs host routing rel {:.2e}",
                dd.rel
            );
            // Both sum each expert's products in fp32 and round to bf16 once; they differ in
            // the order of summation (host: the decode GEMM's K split, or cuBLAS above 64 rows;
            // device: one split) and so by bf16 roundings of the expert outputs, a small part of
            // h. A wrong expert, weight or gate: ~1.
            assert!(
                dd.rel < 1e-2,
                "shared {shared}, {rows} rows: device routing differs from host routing: rel {:.3e}",
                dd.rel
            );
        }
    }
    be.set_moe_device_routing(true);
}

#[test]
fn batched_moe_greedy_is_bit_identical_to_each_prompt_alone() {
    let Some(be) = gpu() else { return };
    for shared in [false, true] {
        let spec = moe_spec(shared);
        let src = RandomWeights::new(&spec, 23).with_init(0.08, 0.3);
        let model = TargetModel::load(&be, &spec, &src).unwrap();
        println!("shared expert {shared}:");
        cuda_util::assert_batches_match_alone(&be, &model, 16);
    }
}

/// Greedy margin below which bf16 may pick the other token: the reference's top-1/top-2 gap in
/// log-probability. The CUDA states differ from f32 by rel ~2e-2 (moe_layer_tolerance), which on
/// these random models moves a logit by a few 1e-2.
const NEAR_TIE: f32 = 0.1;

fn check_golden(name: &str) {
    let Some(be) = gpu() else { return };
    let dir = repo_root().join("tests/fixtures/golden").join(name);
    let manifest = json(&dir.join("manifest.json"));
    let files = TargetFiles::open(&dir).unwrap();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let cpu = CpuBackend::new();
    let reference = TargetModel::load(&cpu, &files.spec, files.weights.as_ref()).unwrap();
    let nl = files.spec.num_layers;
    let capture = Capture::hf_indices((0..=nl).collect(), nl).unwrap();
    let g = Golden::open(dir.join("golden.safetensors"));
    let prompts = manifest["prompts"].as_array().unwrap().len();
    // transformers' own bf16 error on this golden (tools/golden/measure_bf16_error.py), per
    // prompt and hidden state: CUDA computes in bf16 and may be as far from the f32 golden as
    // bf16 takes transformers itself, with half as much again for the other summation orders.
    let hf_bf16 = json(&dir.join("bf16_error.json"));
    let hf_bf16_rel = |p: usize, k: usize| hf_bf16["rel_l2"][p][k].as_f64().unwrap();
    let mut agree_total = 0;
    for p in 0..prompts {
        let prompt = g.ids(&format!("p{p}.input_ids"));
        let want = g.ids(&format!("p{p}.greedy_ids"));
        let mut ids = prompt.clone();
        ids.extend(&want);
        let out = model
            .forward(&be, &ids, &mut model.new_cache(), &capture)
            .unwrap();
        for k in 0..=nl {
            let (_, gold) = g.f32(&format!("p{p}.hs{k}"));
            let ours = be.to_host(out.captured.get(k).unwrap()).unwrap();
            let d = diff(&ours, &gold);
            let bound = moe_layer_tolerance(k)
                .max_rel_l2
                .max(1.5 * hf_bf16_rel(p, k));
            assert!(
                d.rel <= bound,
                "{name} prompt {p} hidden state {k}: rel {:.3e} over {bound:.2e} (transformers' own bf16: {:.2e})",
                d.rel,
                hf_bf16_rel(p, k)
            );
            if k == nl {
                println!(
                    "{name} prompt {p}: last hidden state rel {:.2e} (transformers' own bf16 {:.2e})",
                    d.rel,
                    hf_bf16_rel(p, k)
                );
            }
        }
        // The reference's margin at each continuation step (the CPU backend equals transformers
        // to ~1e-6: golden_moe.rs).
        let ref_out = reference
            .forward(&cpu, &ids, &mut reference.new_cache(), &Capture::none())
            .unwrap();
        let got = greedy(&be, &model, &prompt, want.len(), &[]).unwrap();
        let agree = got
            .ids
            .iter()
            .zip(&want)
            .take_while(|(a, b)| a == b)
            .count();
        agree_total += agree;
        if agree < want.len() {
            let row = prompt.len() - 1 + agree;
            let top = reference
                .logits_topk(
                    &cpu,
                    &cpu.slice_rows(&ref_out.last_hidden, row, row + 1).unwrap(),
                    2,
                )
                .unwrap();
            let margin = top.logprobs[0] - top.logprobs[1];
            println!(
                "{name} prompt {p}: CUDA greedy equals transformers for {agree} of {} tokens; step {agree} has reference margin {margin:.3}",
                want.len()
            );
            assert!(
                margin < NEAR_TIE,
                "{name} prompt {p}: CUDA greedy leaves transformers' continuation at step {agree}, where the reference margin is {margin:.3} (≥ {NEAR_TIE})"
            );
        } else {
            println!(
                "{name} prompt {p}: CUDA greedy equals transformers for all {} tokens",
                want.len()
            );
        }
    }
    println!("{name}: {agree_total} greedy tokens equal before any divergence");
}

#[test]
fn qwen3_moe_golden_on_cuda() {
    check_golden("qwen3_moe");
}

#[test]
fn qwen3_5_moe_golden_on_cuda() {
    check_golden("qwen3_5_moe");
}

/// gpt-oss (sinks, windows of 8 keys on prompts of 20 and 27 tokens, YaRN, the router bias, the
/// clamped SwiGLU: tests/fixtures/golden/gpt_oss) against transformers, on the CUDA path end to end.
#[test]
fn gpt_oss_golden_on_cuda() {
    check_golden("gpt_oss");
}

/// A 4-layer gpt-oss (sliding / full alternating, window 8: the prompts of 1 to 40 tokens decode
/// across it) decoded greedily in batches is bit-identical to each prompt alone.
#[test]
fn batched_gpt_oss_greedy_is_bit_identical_to_each_prompt_alone() {
    let Some(be) = gpu() else { return };
    let spec = gpt_oss_spec(&["sliding_attention", "full_attention"].repeat(2));
    let src = RandomWeights::new(&spec, 29).with_init(0.08, 0.3);
    let model = TargetModel::load(&be, &spec, &src).unwrap();
    cuda_util::assert_batches_match_alone(&be, &model, 24);
}

/// The committed fixture's gpt-oss config with 32 experts and these layer types
/// ([`small_gpt_oss_spec`]).
fn gpt_oss_spec(layer_types: &[&str]) -> ModelSpec {
    small_gpt_oss_spec(32, layer_types)
}

/// ‖a_r − b_r‖ / ‖b_r‖ of the worst row of `cols` values, and that row.
fn worst_row_rel(a: &[f32], b: &[f32], cols: usize) -> (f64, usize) {
    a.chunks(cols)
        .zip(b.chunks(cols))
        .map(|(x, y)| diff(x, y).rel)
        .enumerate()
        .map(|(r, rel)| (rel, r))
        .fold((0.0, 0), |w, c| if c.0 > w.0 { c } else { w })
}

#[test]
fn gpt_oss_routed_on_device_is_row_invariant_and_matches_host_routing() {
    let Some(be) = gpu() else { return };
    let spec = gpt_oss_spec(&["full_attention"]);
    let g = spec.gpt_oss.clone().unwrap();
    // Weights wide enough that the clamp at ±7 bites on a good share of the gate|up values.
    let src = RandomWeights::new(&spec, 11).with_init(0.25, 0.3);
    let block = GptOssMoe::load(&be, &src, 0, &spec, &g).unwrap();
    let d = spec.hidden_size;
    let mut r = draftlens_engine::util::DetRng::new(29);
    let xs: Vec<f32> = (0..MAX_ROWS * d).map(|_| r.signed_unit()).collect();
    let hs: Vec<f32> = (0..MAX_ROWS * d).map(|_| 0.5 * r.signed_unit()).collect();
    let x_all = be.from_host(&xs, MAX_ROWS, d).unwrap();
    let h_all = be.from_host(&hs, MAX_ROWS, d).unwrap();
    let run = |rows: usize, device: bool| {
        be.set_moe_device_routing(device);
        let x = be.slice_rows(&x_all, 0, rows).unwrap();
        let mut h = be.slice_rows(&h_all, 0, rows).unwrap();
        block.forward_acc(&be, &x, &mut h).unwrap();
        h
    };
    let full = bits(&be, &run(MAX_ROWS, true));
    for rows in ROW_COUNTS {
        let got = run(rows, true);
        assert!(
            bits(&be, &got) == full[..rows * d],
            "gpt-oss: {rows} rows routed on the device differ from the same rows among {MAX_ROWS}"
        );
        let host = run(rows, false);
        let (got, host) = (be.to_host(&got).unwrap(), be.to_host(&host).unwrap());
        let (rel, row) = worst_row_rel(&got, &host, d);
        println!("gpt-oss, {rows} rows: device vs host routing, worst row {row} rel {rel:.2e}");
        // The same routing (the same bf16 logits, the same total order and tie rule), the same
        // roundings (bias adds on bf16, the activation, one bf16 rounding of the combine); the
        // GEMMs sum in other orders. A wrong expert, weight or bias in a row: ~1 for that row.
        assert!(
            rel < 1e-2,
            "gpt-oss, {rows} rows: row {row} routed on the device differs from host routing: rel {rel:.3e}"
        );
    }
    be.set_moe_device_routing(true);
}

/// bf16 rounding (to nearest even), as the kernels' `f2bf`.
fn rb(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

/// That `got` (the device's bf16 values) equals `want` (a host emulation, rounded to bf16) bit
/// for bit in all but a few values, which differ by one bf16 ulp at most: where the device's
/// `cosf` / `sinf` / `expf` and the host's f64 or libm functions differ in the last bit of an f32,
/// the bf16 rounding of a result can fall the other way. NaNs must match NaNs.
fn assert_bf16_emulated(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    let mut off_by_one = 0;
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        if a.is_nan() || b.is_nan() {
            assert!(
                a.is_nan() && b.is_nan(),
                "{what}: value {i} is {a}, the host's {b}"
            );
            continue;
        }
        let (ua, ub) = (
            half::bf16::from_f32(a).to_bits() as i32,
            half::bf16::from_f32(b).to_bits() as i32,
        );
        if ua != ub {
            assert!(
                (ua - ub).abs() == 1 && a.signum() == b.signum(),
                "{what}: value {i} is {a}, the host's emulation {b}"
            );
            off_by_one += 1;
        }
    }
    println!(
        "{what}: {off_by_one} of {} values one bf16 ulp off",
        got.len()
    );
    assert!(
        off_by_one * 1000 <= got.len(),
        "{what}: {off_by_one} of {} values one bf16 ulp off the host emulation",
        got.len()
    );
}

#[test]
fn clamped_swiglu_on_cuda_matches_the_host_reference() {
    let Some(be) = gpu() else { return };
    let (rows, inter) = (37, 200);
    let mut r = draftlens_engine::util::DetRng::new(31);
    let mut gu: Vec<f32> = (0..rows * 2 * inter)
        .map(|_| 12.0 * r.signed_unit())
        .collect();
    // The clamps' edges (gate at and past the limit, up at and past ±limit) and NaNs in both
    // halves.
    for (i, (g, u)) in [
        (7.0, -7.0),
        (7.5, 9.0),
        (-30.0, -9.0),
        (f32::NAN, 1.0),
        (1.0, f32::NAN),
    ]
    .into_iter()
    .enumerate()
    {
        gu[i] = g;
        gu[inter + i] = u;
    }
    let x = be.from_host(&gu, rows, 2 * inter).unwrap();
    let y = be
        .clamped_swiglu_packed(&x, SWIGLU_ALPHA, SWIGLU_LIMIT)
        .unwrap();
    assert_eq!(be.dims(&y), (rows, inter));
    let got = be.to_host(&y).unwrap();
    // The host reference on the same bf16 inputs, rounded once.
    let want: Vec<f32> = clamped_swiglu(
        &be.to_host(&x).unwrap(),
        2 * inter,
        SWIGLU_ALPHA,
        SWIGLU_LIMIT,
    )
    .into_iter()
    .map(rb)
    .collect();
    assert!(got[3].is_nan() && got[4].is_nan());
    // Known answers: gate 7 at the limit and up −7: (−7 + 1) · 7 · sigmoid(1.702 · 7) =
    // −41.9997, −42 in bf16; gate 7.5 and up 9 clamped to 7: 8 · 7 · sigmoid(11.9) → 56.
    assert_eq!((got[0], got[1]), (-42.0, 56.0));
    assert_bf16_emulated("clamped_swiglu", &got, &want);
}

/// The rotation `rope_bf16` computes, on the host: angle `p · inv_freq` in f32, cos and sin
/// (f64, rounded to f32) times `scale` in f32, then rounded to bf16; each product rounded to bf16
/// and their sum rounded (transformers' `_apply_rotary_emb` on bf16 tensors).
fn rope_emulated(x: &[f32], cols: usize, positions: &[u32], f: &RopeFreqs) -> Vec<f32> {
    let half = f.rotary_dim / 2;
    let mut out = x.to_vec();
    for (row, &p) in out.chunks_mut(cols).zip(positions) {
        for head in row.chunks_mut(f.head_dim) {
            for (i, &inv) in f.inv_freq.iter().enumerate() {
                let angle = p as f32 * inv;
                let c = rb((angle as f64).cos() as f32 * f.attention_scaling);
                let s = rb((angle as f64).sin() as f32 * f.attention_scaling);
                let (ia, ib) = match f.style {
                    RopeStyle::RotateHalf => (i, i + half),
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                };
                let (a, b) = (head[ia], head[ib]);
                head[ia] = rb(rb(a * c) + rb(-b * s));
                head[ib] = rb(rb(b * c) + rb(a * s));
            }
        }
    }
    out
}

#[test]
fn rope_freqs_on_cuda_matches_the_host_and_plain_frequencies_match_rope_inplace() {
    let Some(be) = gpu() else { return };
    let spec = gpt_oss_spec(&["full_attention"]);
    let freqs = rope_freqs(&spec, spec.gpt_oss.as_ref().unwrap());
    assert!(
        freqs.attention_scaling > 1.0,
        "the fixture's config is YaRN"
    );
    let hd = freqs.head_dim;
    let positions: Vec<u32> = vec![0, 1, 2, 5, 63, 127, 128, 4095, 4096, 20_000, 131_071];
    let (rows, cols) = (positions.len(), 4 * hd);
    let mut r = draftlens_engine::util::DetRng::new(37);
    let xs: Vec<f32> = (0..rows * cols).map(|_| 3.0 * r.signed_unit()).collect();
    let x = be.from_host(&xs, rows, cols).unwrap();
    let x_host = be.to_host(&x).unwrap();

    // YaRN: the kernel's arithmetic emulated, and the CPU reference (f32 throughout) to bf16.
    let mut y = be.from_host(&x_host, rows, cols).unwrap();
    be.rope_freqs_inplace(&mut y, &positions, &freqs).unwrap();
    let got = be.to_host(&y).unwrap();
    assert_bf16_emulated(
        "rope_freqs (YaRN)",
        &got,
        &rope_emulated(&x_host, cols, &positions, &freqs),
    );
    let cpu = CpuBackend::new();
    let mut reference = cpu.from_host(&x_host, rows, cols).unwrap();
    cpu.rope_freqs_inplace(&mut reference, &positions, &freqs)
        .unwrap();
    let dd = diff(&got, &cpu.to_host(&reference).unwrap());
    println!("rope_freqs (YaRN) vs the CPU reference: rel {:.2e}", dd.rel);
    assert!(dd.rel < 1e-2, "rope_freqs vs the CPU: rel {:.3e}", dd.rel);

    // Plain frequencies (scale 1): bit for bit rope_inplace, both styles, full and partial.
    for (rotary_dim, style) in [
        (hd, RopeStyle::RotateHalf),
        (hd / 2, RopeStyle::RotateHalf),
        (hd, RopeStyle::Interleaved),
    ] {
        let rope = Rope {
            theta: 10_000.0,
            head_dim: hd,
            rotary_dim,
            style,
        };
        let (mut a, mut b) = (
            be.from_host(&x_host, rows, cols).unwrap(),
            be.from_host(&x_host, rows, cols).unwrap(),
        );
        be.rope_inplace(&mut a, &positions, &rope).unwrap();
        be.rope_freqs_inplace(&mut b, &positions, &RopeFreqs::of_rope(&rope))
            .unwrap();
        assert!(
            bits(&be, &a) == bits(&be, &b),
            "rope_freqs with plain frequencies differs from rope_inplace ({rotary_dim}, {style:?})"
        );
    }
}
