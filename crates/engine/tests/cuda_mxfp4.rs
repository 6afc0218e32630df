//! MXFP4 experts kept packed on the GPU (docs/cuda.md, "MXFP4 experts kept packed";
//! `backend/cuda/mxfp4.rs`, `kernels/mxfp4.cu`):
//! - the device's dequantisation (`mxfp4_dequant_bf16`) of every byte (every pair of e2m1 codes)
//!   at every scale 0..=254 equals the CPU dequantiser's values rounded to bf16, bit for bit; and
//!   the packed grouped GEMM itself gives every weight back from identity rows (scales 2..=252,
//!   where every value is a normal finite bf16);
//! - the packed grouped GEMM is bit-identical to the bf16 grouped GEMM on the dequantised weights
//!   (the same summation order) for 1, 2, 7, 64 and 300 rows over 5 experts, two of them with no
//!   rows, at two shapes (10 and 5 chunks of 32: the unrolled loop and its tail); a row's result
//!   is the same bits whatever its batch-mates; and it agrees with the CPU reference on the
//!   dequantised weights to bf16 rounding;
//! - a gpt-oss MoE block from an MXFP4 checkpoint, packed against the same block dequantised at
//!   load (`DRAFTLENS_MXFP4=bf16`'s path, `set_mxfp4_packed(false)`), bit-identical over 1–300 rows
//!   routed on the device and routed on the host (the packed weight dequantised just in time);
//! - whole gpt-oss models, packed against bf16 mode: a random 4-layer one (hidden 256, 16 experts
//!   of width 160) and the committed MXFP4 golden (tests/fixtures/golden/gpt_oss_mxfp4, opened as
//!   the product opens it): prefill states bit-identical, greedy continuations token for token;
//!   and the packed model's batched greedy decoding bit-identical to each prompt alone.
//!
//! Without a GPU every test prints "SKIP: CUDA unavailable: <reason>" and passes (CI).
#![cfg(feature = "cuda")]

mod cuda_util;
use cuda_util::{bits, gpu};
mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::cuda::{CudaBackend, CudaMatrix};
use draftlens_engine::backend::mxfp4::dequantize;
use draftlens_engine::backend::Backend;
use draftlens_engine::formats::{HostTensor, TensorInfo, WeightSource};
use draftlens_engine::generate::greedy;
use draftlens_engine::model::gpt_oss::GptOssMoe;
use draftlens_engine::model::random::RandomWeights;
use draftlens_engine::model::{Capture, ModelSpec, TargetFiles, TargetModel};
use draftlens_engine::util::DetRng;
use golden_util::*;
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;

/// Random blocks (every byte value) and scales in `scales` for a weight `[out, inp]`.
fn random_packed(out: usize, inp: usize, scales: (u8, u8), seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut r = DetRng::new(seed);
    let blocks = (0..out * inp / 2).map(|_| r.below(256) as u8).collect();
    let span = (scales.1 - scales.0) as u64 + 1;
    let s = (0..out * inp / 32)
        .map(|_| scales.0 + r.below(span) as u8)
        .collect();
    (blocks, s)
}

/// The same weight uploaded packed and dequantised at upload (the bf16 mode).
fn both_modes(
    be: &CudaBackend,
    blocks: &[u8],
    scales: &[u8],
    out: usize,
    inp: usize,
) -> [CudaMatrix; 2] {
    be.set_mxfp4_packed(true);
    let packed = be.matrix_mxfp4(blocks, scales, out, inp).unwrap();
    be.set_mxfp4_packed(false);
    let plain = be.matrix_mxfp4(blocks, scales, out, inp).unwrap();
    be.set_mxfp4_packed(true);
    assert!(packed.is_mxfp4() && !plain.is_mxfp4());
    [packed, plain]
}

/// A bf16 weight's values, bit for bit (its rows gathered as a tensor).
fn weight_bits(be: &CudaBackend, w: &CudaMatrix) -> Vec<u16> {
    let (out, _) = be.matrix_dims(w);
    let ids: Vec<u32> = (0..out as u32).collect();
    bits(be, &be.embed(w, &ids).unwrap())
}

#[test]
fn device_dequantisation_of_every_code_and_scale_equals_the_cpu_table() {
    let Some(be) = gpu() else { return };
    // Row s holds bytes 0..=255 (16 groups: every pair of codes) at scale s.
    let (out, inp) = (255, 512);
    let blocks: Vec<u8> = (0..out).flat_map(|_| 0..=255u8).collect();
    let scales: Vec<u8> = (0..out as u8).flat_map(|s| [s; 16]).collect();
    let cpu: Vec<u16> = dequantize(&blocks, &scales)
        .unwrap()
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    let [packed, plain] = both_modes(&be, &blocks, &scales, out, inp);
    let device = weight_bits(&be, &be.mxfp4_to_bf16(&packed).unwrap());
    let mut bad = 0;
    for (i, (&d, &c)) in device.iter().zip(&cpu).enumerate() {
        if d != c && bad < 10 {
            let (s, b) = (i / inp, i % inp / 2);
            println!(
                "scale {s} byte {b} ({}): device {d:#06x}, cpu {c:#06x}",
                if i % 2 == 0 { "low" } else { "high" }
            );
        }
        bad += usize::from(d != c);
    }
    assert_eq!(
        bad,
        0,
        "{bad} of {} values differ from the CPU's",
        cpu.len()
    );
    // The bf16 mode uploads the same bits.
    assert!(weight_bits(&be, &plain) == cpu);
    println!("all 16 x 16 code pairs at scales 0..=254: the CPU's bits");
}

#[test]
fn the_packed_gemm_gives_every_weight_back_from_identity_rows() {
    let Some(be) = gpu() else { return };
    // Scales 2..=252: every value a normal finite bf16 (none past f32's range, none subnormal),
    // so one product of 1 and the weight, plus zeros, is the weight itself.
    let scales_used: Vec<u8> = (2..=252).collect();
    let (out, inp) = (scales_used.len(), 512);
    let blocks: Vec<u8> = (0..out).flat_map(|_| 0..=255u8).collect();
    let scales: Vec<u8> = scales_used.iter().flat_map(|&s| [s; 16]).collect();
    let cpu = dequantize(&blocks, &scales).unwrap();
    let [packed, _] = both_modes(&be, &blocks, &scales, out, inp);
    let eye: Vec<f32> = (0..inp * inp)
        .map(|i| if i / inp == i % inp { 1.0 } else { 0.0 })
        .collect();
    let x = be.from_host(&eye, inp, inp).unwrap();
    // One expert with 512 rows: eight 64-row groups.
    let y = be
        .to_host(&be.moe_grouped_matmul(&x, &[&packed], &[inp]).unwrap())
        .unwrap();
    // y = x · Wᵀ = Wᵀ: y[k, n] = W[n, k] (±0 compare equal: a −0 weight sums to +0).
    for n in 0..out {
        for k in 0..inp {
            let (got, want) = (y[k * out + n], cpu[n * inp + k]);
            assert!(
                got == want,
                "scale {} column {k}: the GEMM read {got:e}, the CPU dequantises {want:e}",
                scales_used[n]
            );
        }
    }
}

/// Per expert, the rows of x it gets: experts 0 and 3 none.
fn expert_rows(t: usize) -> Vec<usize> {
    vec![0, t, t.div_ceil(2), 0, t.min(3)]
}

#[test]
fn packed_grouped_gemm_is_bit_identical_to_the_bf16_grouped_gemm() {
    let Some(be) = gpu() else { return };
    let cpu = CpuBackend::new();
    let max_rows: usize = expert_rows(300).iter().sum();
    for (out, inp) in [(192, 320), (96, 160)] {
        let mut r = DetRng::new(41);
        let xs: Vec<f32> = (0..max_rows * inp)
            .map(|_| half::bf16::from_f32(r.signed_unit()).to_f32())
            .collect();
        let experts: Vec<_> = (0..5)
            .map(|e| random_packed(out, inp, (118, 124), 100 + e as u64))
            .collect();
        let uploaded: Vec<[CudaMatrix; 2]> = experts
            .iter()
            .map(|(b, s)| both_modes(&be, b, s, out, inp))
            .collect();
        let packed: Vec<&CudaMatrix> = uploaded.iter().map(|m| &m[0]).collect();
        let plain: Vec<&CudaMatrix> = uploaded.iter().map(|m| &m[1]).collect();
        let mut first_row: Option<Vec<u16>> = None;
        for t in [1, 2, 7, 64, 300] {
            let rows = expert_rows(t);
            let n: usize = rows.iter().sum();
            let x = be.from_host(&xs[..n * inp], n, inp).unwrap();
            let yp = be.moe_grouped_matmul(&x, &packed, &rows).unwrap();
            let yb = be.moe_grouped_matmul(&x, &plain, &rows).unwrap();
            let (bp, bb) = (bits(&be, &yp), bits(&be, &yb));
            assert!(
                bp == bb,
                "[{out}, {inp}], {t} rows: the packed grouped GEMM differs from the bf16 one ({} of {} values)",
                bp.iter().zip(&bb).filter(|(a, b)| a != b).count(),
                bp.len()
            );
            // Expert 1's first row is x's row 0 whatever the batch: the same bits.
            let row0 = bp[..out].to_vec();
            match &first_row {
                None => first_row = Some(row0),
                Some(f) => assert!(
                    *f == row0,
                    "[{out}, {inp}]: row 0 among {n} rows differs from alone"
                ),
            }
            // Against the CPU reference on the dequantised weights, expert by expert.
            let got = be.to_host(&yp).unwrap();
            let mut row0 = 0;
            for (e, &rn) in rows.iter().enumerate() {
                if rn == 0 {
                    continue;
                }
                let (b, s) = &experts[e];
                let w = cpu.matrix(&dequantize(b, s).unwrap(), out, inp).unwrap();
                let xe = cpu
                    .from_host(&xs[row0 * inp..(row0 + rn) * inp], rn, inp)
                    .unwrap();
                let want = cpu.to_host(&cpu.matmul(&xe, &w).unwrap()).unwrap();
                let d = diff(&got[row0 * out..(row0 + rn) * out], &want);
                // bf16 rounding of each output (≤ 2^-9 relative) and f32 summation order.
                assert!(
                    d.rel < 4e-3,
                    "[{out}, {inp}], {t} rows, expert {e}: rel {:.2e} from the CPU",
                    d.rel
                );
                row0 += rn;
            }
            println!("[{out}, {inp}], {t} rows: packed == bf16 bit for bit; within bf16 rounding of the CPU");
        }
    }
}

// ---- gpt-oss from an MXFP4 checkpoint ----

/// The MXFP4 golden's config (YaRN, top-4, heads of 64 with sinks, window 8, quantization_config
/// mxfp4) at hidden 256 with 16 experts of width 160 and these layer types.
fn mxfp4_spec(layer_types: &[&str]) -> ModelSpec {
    let spec = golden_spec_with(
        "gpt_oss_mxfp4",
        &[
            ("hidden_size", serde_json::json!(256)),
            ("intermediate_size", serde_json::json!(160)),
            ("num_local_experts", serde_json::json!(16)),
            ("num_hidden_layers", serde_json::json!(layer_types.len())),
            ("layer_types", serde_json::json!(layer_types)),
        ],
    );
    assert!(spec.gpt_oss.as_ref().unwrap().mxfp4());
    spec
}

/// Random weights with the experts as MXFP4 blocks and scales in a folder's model.safetensors
/// (where the loader reads them), the other tensors from [`RandomWeights`].
struct Mxfp4Folder {
    dir: tempfile::TempDir,
    rest: RandomWeights,
}

impl Mxfp4Folder {
    fn new(spec: &ModelSpec, seed: u64) -> Mxfp4Folder {
        let dir = tempfile::tempdir().unwrap();
        let moe = spec.moe.as_ref().unwrap();
        let (d, i, e) = (spec.hidden_size, moe.moe_intermediate_size, moe.num_experts);
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for l in 0..spec.num_layers {
            // gate_up [E, 2I, D] (rows alternating gate and up), down [E, D, I]. Scales of
            // 2^-5..2^-2 put some gate|up pre-activations (unit-scale inputs, 256 of them) past
            // the clamp of 7; the down projection's keep the outputs near unit scale.
            for (proj, out, inp, scales) in [
                ("gate_up_proj", 2 * i, d, (122, 125)),
                ("down_proj", d, i, (119, 122)),
            ] {
                let (blocks, s) =
                    random_packed(e * out, inp, scales, seed + 10 * l as u64 + out as u64);
                let base = format!("model.layers.{l}.mlp.experts.{proj}");
                tensors.push((format!("{base}_blocks"), vec![e, out, inp / 32, 16], blocks));
                tensors.push((format!("{base}_scales"), vec![e, out, inp / 32], s));
            }
        }
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, shape, b)| {
                (
                    n.clone(),
                    TensorView::new(Dtype::U8, shape.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
        Mxfp4Folder {
            dir,
            rest: RandomWeights::new(spec, seed).with_init(0.08, 0.3),
        }
    }
}

impl WeightSource for Mxfp4Folder {
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn contains(&self, name: &str) -> bool {
        self.rest.contains(name)
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.rest.tensors()
    }
    fn tensor(&self, name: &str) -> anyhow::Result<HostTensor> {
        self.rest.tensor(name)
    }
}

/// Row counts of one call: decode steps (1, 2, 7, 64) and a prefill of several 64-row groups.
const LAYER_ROWS: [usize; 5] = [1, 2, 7, 64, 300];

#[test]
fn packed_gpt_oss_moe_block_is_bit_identical_to_bf16_mode() {
    let Some(be) = gpu() else { return };
    let spec = mxfp4_spec(&["full_attention"]);
    let g = spec.gpt_oss.clone().unwrap();
    let src = Mxfp4Folder::new(&spec, 7);
    be.set_mxfp4_packed(true);
    let packed = GptOssMoe::load(&be, &src, 0, &spec, &g).unwrap();
    be.set_mxfp4_packed(false);
    let plain = GptOssMoe::load(&be, &src, 0, &spec, &g).unwrap();
    be.set_mxfp4_packed(true);
    assert!(packed
        .experts
        .iter()
        .all(|x| x.gate_up.is_mxfp4() && x.down.is_mxfp4()));
    assert!(plain
        .experts
        .iter()
        .all(|x| !x.gate_up.is_mxfp4() && !x.down.is_mxfp4()));
    let d = spec.hidden_size;
    let max = *LAYER_ROWS.iter().max().unwrap();
    let mut r = DetRng::new(29);
    let xs: Vec<f32> = (0..max * d).map(|_| r.signed_unit()).collect();
    let hs: Vec<f32> = (0..max * d).map(|_| 0.5 * r.signed_unit()).collect();
    for device in [true, false] {
        be.set_moe_device_routing(device);
        for rows in LAYER_ROWS {
            let x = be.from_host(&xs[..rows * d], rows, d).unwrap();
            let run = |block: &GptOssMoe<CudaBackend>| {
                let mut h = be.from_host(&hs[..rows * d], rows, d).unwrap();
                block.forward_acc(&be, &x, &mut h).unwrap();
                bits(&be, &h)
            };
            let (p, b) = (run(&packed), run(&plain));
            let moved = p
                .iter()
                .zip(&bits(&be, &be.from_host(&hs[..rows * d], rows, d).unwrap()))
                .filter(|(a, b)| a != b)
                .count();
            assert!(
                moved > rows * d / 4,
                "the block hardly changed h ({moved} values)"
            );
            assert!(
                p == b,
                "routed on the {}: {rows} rows, packed experts differ from bf16 mode ({} values)",
                if device { "device" } else { "host" },
                p.iter().zip(&b).filter(|(x, y)| x != y).count()
            );
        }
        println!(
            "routed on the {}: rows {LAYER_ROWS:?} bit-identical packed and bf16",
            if device { "device" } else { "host" }
        );
    }
    be.set_moe_device_routing(true);
}

/// Prefill states and greedy continuations of `model_p` (packed) and `model_b` (bf16 mode).
fn assert_same_model(
    be: &CudaBackend,
    model_p: &TargetModel<CudaBackend>,
    model_b: &TargetModel<CudaBackend>,
    prompts: &[Vec<u32>],
    max_new: usize,
) {
    for (i, p) in prompts.iter().enumerate() {
        let last = |m: &TargetModel<CudaBackend>| {
            let mut cache = m.new_cache();
            let out = m.forward(be, p, &mut cache, &Capture::none()).unwrap();
            bits(be, &out.last_hidden)
        };
        assert!(
            last(model_p) == last(model_b),
            "prompt {i}: prefill states differ"
        );
        let (a, b) = (
            greedy(be, model_p, p, max_new, &[]).unwrap(),
            greedy(be, model_b, p, max_new, &[]).unwrap(),
        );
        assert_eq!(a.ids, b.ids, "prompt {i}: greedy continuations differ");
        println!(
            "prompt {i} ({} tokens): {max_new} greedy tokens equal, e.g. {:?}",
            p.len(),
            &a.ids[..8]
        );
    }
}

#[test]
fn random_gpt_oss_greedy_packed_equals_bf16_mode_and_batches_match_alone() {
    let Some(be) = gpu() else { return };
    let spec = mxfp4_spec(&["sliding_attention", "full_attention"].repeat(2));
    let src = Mxfp4Folder::new(&spec, 13);
    be.set_mxfp4_packed(false);
    let plain = TargetModel::load(&be, &spec, &src).unwrap();
    be.set_mxfp4_packed(true);
    let packed = TargetModel::load(&be, &spec, &src).unwrap();
    let mut r = DetRng::new(3);
    let prompts: Vec<Vec<u32>> = [1usize, 5, 19, 33]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| r.below(spec.vocab_size as u64) as u32)
                .collect()
        })
        .collect();
    assert_same_model(&be, &packed, &plain, &prompts, 24);
    cuda_util::assert_batches_match_alone(&be, &packed, 16);
}

#[test]
fn mxfp4_golden_checkpoint_packed_equals_bf16_mode() {
    let Some(be) = gpu() else { return };
    let dir = repo_root().join("tests/fixtures/golden/gpt_oss_mxfp4");
    let files = TargetFiles::open(&dir).unwrap();
    be.set_mxfp4_packed(false);
    let plain = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    be.set_mxfp4_packed(true);
    let packed = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let g = Golden::open(repo_root().join("tests/fixtures/golden/gpt_oss/golden.safetensors"));
    let prompts: Vec<Vec<u32>> = (0..2).map(|p| g.ids(&format!("p{p}.input_ids"))).collect();
    assert_same_model(&be, &packed, &plain, &prompts, 32);
}
