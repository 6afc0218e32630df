//! The opt-in wgmma flash attention (`kernels/attention_wgmma.cu`, sm_90a; docs/cuda.md, "wgmma
//! flash attention (opt-in)") on the GPU: against `flash_attention2_hd128` over packed causal
//! sequences at Qwen3-8B's head shape (32 query / 8 KV heads of 128), against the CPU reference
//! attention on a small case, one-token sequences bit for bit (their output is their v row), and
//! a small Qwen3-style model's packed prefill with the switch on against off. Without a GPU every
//! test prints "SKIP: CUDA unavailable: <reason>" and returns; on a device other than compute
//! capability 9.0, "SKIP: wgmma attention needs compute capability 9.0".
//!
//! Tolerance (between the two kernels; both fp32 accumulation, P rounded to bf16, output rounded
//! to bf16, only the tensor cores' summation order differs): max |Δ| ≤ 1e-2 (about 2.5 bf16 ulps
//! at |o| ≤ 1, the range of a convex combination of v in [-1, 1)) and relative L2 ≤ 4e-3 (one bf16
//! rounding of the output is ≤ 2⁻⁹ relative); against the CPU reference, op_parity's attention
//! tolerance (relative L2 ≤ 1e-2, cosine ≥ 0.99995).
#![cfg(feature = "cuda")]

mod cuda_util;
use cuda_util::packed_last_hidden_with;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::cuda::CudaBackend;
use draftlens_engine::backend::{AttnShape, Backend, SeqStarts};
use draftlens_engine::model::random::{qwen3_8b_spec, RandomWeights};
use draftlens_engine::model::{ModelSpec, TargetModel};
use draftlens_engine::parity::{diff, OpTolerance};
use draftlens_engine::util::host_random_bf16;

/// Qwen3-8B's attention: 32 query heads, 8 KV heads, head dim 128.
const SHAPE: AttnShape = AttnShape {
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
};

/// Largest |Δ| and relative L2 accepted between the wgmma kernel and flash_attention2_hd128.
const MAX_ABS: f64 = 1e-2;
const MAX_REL_L2: f64 = 4e-3;

/// The backend with the wgmma attention available (compute capability 9.0), switch off.
fn wgmma_gpu() -> Option<CudaBackend> {
    let be = cuda_util::gpu()?;
    if !be.set_attention_wgmma(true) {
        println!(
            "SKIP: wgmma attention needs compute capability 9.0 (sm_90a), the device is {}",
            be.arch()
        );
        return None;
    }
    be.set_attention_wgmma(false);
    Some(be)
}

/// Random q | k | v columns of `t` rows as the fused QKV projection writes them.
fn random_qkv(t: usize, seed: u64) -> Vec<f32> {
    let hd = SHAPE.head_dim;
    let (qd, kvd) = (SHAPE.heads * hd, SHAPE.kv_heads * hd);
    let q = host_random_bf16(t * qd, seed, 2.0);
    let k = host_random_bf16(t * kvd, seed + 1, 2.0);
    let v = host_random_bf16(t * kvd, seed + 2, 1.0);
    let mut qkv = Vec::with_capacity(t * (qd + 2 * kvd));
    for r in 0..t {
        qkv.extend_from_slice(&q[r * qd..(r + 1) * qd]);
        qkv.extend_from_slice(&k[r * kvd..(r + 1) * kvd]);
        qkv.extend_from_slice(&v[r * kvd..(r + 1) * kvd]);
    }
    qkv
}

/// attention_varlen_packed over `qkv` with the wgmma switch at `wgmma`.
fn packed(be: &CudaBackend, qkv: &[f32], t: usize, starts: &SeqStarts, wgmma: bool) -> Vec<f32> {
    let cols = (SHAPE.heads + 2 * SHAPE.kv_heads) * SHAPE.head_dim;
    assert_eq!(be.set_attention_wgmma(wgmma), wgmma);
    let x = be.from_host(qkv, t, cols).unwrap();
    let o = be.attention_varlen_packed(&x, SHAPE, starts).unwrap();
    be.set_attention_wgmma(false);
    be.to_host(&o).unwrap()
}

/// Output row `row` of a one-token sequence is its v row, head for head through GQA, bit for bit
/// (softmax weight exactly 1).
fn assert_single_token_rows(o: &[f32], qkv: &[f32], rows: &[usize], what: &str) {
    let hd = SHAPE.head_dim;
    let (qd, kvd) = (SHAPE.heads * hd, SHAPE.kv_heads * hd);
    let cols = qd + 2 * kvd;
    let group = SHAPE.heads / SHAPE.kv_heads;
    for &row in rows {
        for h in 0..SHAPE.heads {
            let got = &o[row * qd + h * hd..row * qd + (h + 1) * hd];
            let v0 = row * cols + qd + kvd + (h / group) * hd;
            assert_eq!(
                got,
                &qkv[v0..v0 + hd],
                "{what}: row {row} head {h} is not its v row"
            );
        }
    }
}

#[test]
fn cuda_wgmma_attention_builds_without_spills() {
    let Some(be) = wgmma_gpu() else { return };
    let line = be
        .attention_wgmma_resources()
        .expect("the sm_90a module loads");
    println!("{line}");
    assert!(line.contains(" 0 B local"), "spills: {line}");
}

/// Lengths 1, 63, 64, 65, 200, 1024, 4113: a one-token sequence, lengths around the 64-key and
/// 128-key tiles and 32-position query blocks (GQA 4:1), a block straddling sequences, and one
/// sequence past 4096.
#[test]
fn cuda_wgmma_attention_matches_flash_attention2_hd128() {
    let Some(be) = wgmma_gpu() else { return };
    let lens = [1usize, 63, 64, 65, 200, 1024, 4096 + 17];
    let starts = SeqStarts::from_lengths(lens.iter().copied());
    let t: usize = lens.iter().sum();
    let qkv = random_qkv(t, 81);
    let fa2 = packed(&be, &qkv, t, &starts, false);
    let wg = packed(&be, &qkv, t, &starts, true);
    let d = diff(&fa2, &wg);
    println!("wgmma vs flash_attention2_hd128, lengths {lens:?}, 32/8 heads of 128: {d:?}");
    assert_eq!(d.non_finite, 0, "{d:?}");
    assert!(
        d.max_abs <= MAX_ABS && d.rel_l2 <= MAX_REL_L2,
        "outside max |Δ| {MAX_ABS}, rel L2 {MAX_REL_L2}: {d:?}"
    );
    assert_single_token_rows(&wg, &qkv, &[0], "wgmma");
    // Per sequence, so that an error confined to one (say the 4113-token one) is not averaged away.
    let qd = SHAPE.heads * SHAPE.head_dim;
    let mut s0 = 0;
    for &l in &lens {
        let ds = diff(&fa2[s0 * qd..(s0 + l) * qd], &wg[s0 * qd..(s0 + l) * qd]);
        println!("  sequence of {l}: {ds:?}");
        assert!(
            ds.max_abs <= MAX_ABS && ds.rel_l2 <= MAX_REL_L2,
            "sequence of {l}: {ds:?}"
        );
        s0 += l;
    }
}

/// Both kernels against the CPU's fp32 reference attention on a small packed case, with two
/// one-token sequences whose rows must equal their v rows exactly.
#[test]
fn cuda_wgmma_attention_matches_cpu_reference() {
    let Some(be) = wgmma_gpu() else { return };
    let lens = [1usize, 63, 1, 130, 257];
    let starts = SeqStarts::from_lengths(lens.iter().copied());
    let t: usize = lens.iter().sum();
    let qkv = random_qkv(t, 91);
    let hd = SHAPE.head_dim;
    let (qd, kvd) = (SHAPE.heads * hd, SHAPE.kv_heads * hd);
    let cols = qd + 2 * kvd;
    let want = {
        let cpu = CpuBackend::new();
        let split = |c0: usize, w: usize| -> Vec<f32> {
            (0..t)
                .flat_map(|r| qkv[r * cols + c0..r * cols + c0 + w].iter().copied())
                .collect()
        };
        let up = |x: Vec<f32>, c| cpu.from_host(&x, t, c).unwrap();
        let o = cpu
            .attention_varlen(
                &up(split(0, qd), qd),
                &up(split(qd, kvd), kvd),
                &up(split(qd + kvd, kvd), kvd),
                SHAPE,
                &starts,
            )
            .unwrap();
        cpu.to_host(&o).unwrap()
    };
    let fa2 = packed(&be, &qkv, t, &starts, false);
    let wg = packed(&be, &qkv, t, &starts, true);
    let tol = OpTolerance {
        max_rel_l2: 1e-2,
        min_cosine: 0.99995,
    };
    let (d_wg, d_fa2, d_k) = (diff(&want, &wg), diff(&want, &fa2), diff(&fa2, &wg));
    println!("small case {lens:?}: wgmma vs CPU {d_wg:?}");
    println!("  flash_attention2_hd128 vs CPU {d_fa2:?}; wgmma vs flash_attention2 {d_k:?}");
    assert!(tol.accepts(&d_wg), "wgmma vs CPU: {d_wg:?}");
    assert!(tol.accepts(&d_fa2), "flash_attention2 vs CPU: {d_fa2:?}");
    assert!(
        d_k.max_abs <= MAX_ABS && d_k.rel_l2 <= MAX_REL_L2,
        "wgmma vs flash_attention2: {d_k:?}"
    );
    assert_single_token_rows(&wg, &qkv, &[0, 64], "wgmma");
}

/// A small Qwen3-style model (q/k norms, 32/8 heads of 128, 2 layers) through the packed prefill:
/// with the switch on, the fused QKV path normalises q in the separate pass and runs the wgmma
/// kernel; its last hidden state must stay within the kernels' rounding of the default path.
#[test]
fn cuda_wgmma_attention_forward_packed_matches_default() {
    let Some(be) = wgmma_gpu() else { return };
    let spec = ModelSpec {
        vocab_size: 512,
        hidden_size: 1024,
        intermediate_size: 2048,
        num_layers: 2,
        max_position_embeddings: 4096,
        ..qwen3_8b_spec()
    };
    let src = RandomWeights::new(&spec, 37);
    let starts = [0usize, 1, 300, 301, 1500];
    let ids: Vec<u32> = (0..1500u32).map(|i| (i * 97 + 13) % 512).collect();
    let model = TargetModel::load(&be, &spec, &src).unwrap();
    let default = packed_last_hidden_with(&be, &model, &ids, &starts, |_| ());
    let wg = packed_last_hidden_with(&be, &model, &ids, &starts, |on| {
        assert!(
            be.set_attention_wgmma(on) || !on,
            "the wgmma attention did not switch on"
        );
    });
    let d = diff(&default, &wg);
    println!("forward_packed, wgmma attention vs default: {d:?}");
    // Two layers of bf16 activations downstream of attention outputs that differ by output
    // roundings: the dense-model bound cuda_attention uses between two attention kernels.
    assert!(d.non_finite == 0 && d.rel_l2 < 2.4e-2, "{d:?}");
}
