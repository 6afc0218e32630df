//! CUDA backend tests: per-op and whole-forward parity with the CPU reference backend, kernel
//! compilation, clean errors. On a machine without CUDA every test that needs the GPU prints
//! "SKIP: CUDA unavailable: <reason>" and returns (CI has no GPU); on the GPU machine they run
//! for real (see docs/cuda.md for the command).
#![cfg(feature = "cuda")]

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::cuda::{compile_kernels_offline, CudaBackend};
use draftlens_engine::backend::{
    AttnMask, AttnShape, Backend, BackendError, HostRows, HostRowsRef, SeqStarts,
};
use draftlens_engine::drafter::random::{write_random_checkpoint, RandomDrafter};
use draftlens_engine::drafter::{DFlashDrafter, DraftOptions};
use draftlens_engine::model::random::{qwen3_8b_spec, RandomWeights};
use draftlens_engine::model::{Arch, Capture, ModelSpec, TargetModel};
use draftlens_engine::parity::{format_checks, forward_parity, op_parity};
use draftlens_engine::util::{host_random, packed_positions, round_bf16};

mod f32_only;
use f32_only::F32Only;

/// A small dense model of `arch` (Qwen3 by default: q/k norms, untied head).
fn small_spec(
    vocab: usize,
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: (usize, usize, usize),
    eps: f32,
    theta: f32,
) -> ModelSpec {
    ModelSpec {
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: inter,
        num_layers: layers,
        num_heads: heads.0,
        num_kv_heads: heads.1,
        head_dim: heads.2,
        rms_norm_eps: eps,
        rope_theta: theta,
        max_position_embeddings: 4096,
        ..qwen3_8b_spec()
    }
}

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => {
            let i = b.info();
            println!(
                "device {}: {} (sm_{}{}, {} SMs, {:.1} GiB, driver {}), kernels for {}",
                i.ordinal,
                i.name,
                i.compute_capability.0,
                i.compute_capability.1,
                i.multiprocessors,
                i.total_mem_bytes as f64 / (1u64 << 30) as f64,
                i.driver_version,
                b.arch()
            );
            Some(b)
        }
        Err(e) => {
            println!("SKIP: {e}");
            None
        }
    }
}

#[test]
fn cuda_unavailable_is_a_clean_error_not_a_panic() {
    match CudaBackend::new(0) {
        Ok(b) => println!("CUDA available: {}", b.info().name),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                BackendError::is_cuda_unavailable(&e) && msg.starts_with("CUDA unavailable: "),
                "unexpected error: {msg}"
            );
            println!("SKIP: {msg}");
        }
    }
    // An ordinal past the last device is an error on every machine.
    let e = CudaBackend::new(1 << 20)
        .err()
        .expect("device 2^20 cannot exist");
    assert!(BackendError::is_cuda_unavailable(&e), "{e}");
}

#[test]
fn cuda_kernels_compile_with_nvrtc() {
    match compile_kernels_offline("compute_90") {
        Ok(mods) => {
            let names: Vec<&str> = mods.iter().map(|(n, _)| n.as_str()).collect();
            for want in [
                "elementwise",
                "attention",
                "topk",
                "gdn",
                "convert",
                "decode",
            ] {
                assert!(
                    names.contains(&want),
                    "module {want} missing from {names:?}"
                );
            }
            for (name, bytes) in mods {
                assert!(bytes > 1000, "{name}: PTX of {bytes} bytes");
                println!("kernels/{name}.cu: {bytes} bytes of PTX for compute_90");
            }
        }
        Err(e) => {
            assert!(BackendError::is_cuda_unavailable(&e), "{e:#}");
            println!("SKIP: {e}");
        }
    }
}

#[test]
fn cuda_every_op_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    for line in gpu.kernel_report().expect("kernel report") {
        println!("  {line}");
    }
    println!(
        "NVRTC compile + module load: {:.2} s",
        gpu.kernel_compile_secs()
    );
    let checks = op_parity(&CpuBackend::new(), &gpu, 1).expect("op parity runs");
    println!(
        "{}",
        format_checks(
            "CUDA vs CPU, per op (inputs exactly representable in bf16)",
            &checks
        )
    );
    let failed: Vec<_> = checks
        .iter()
        .filter(|c| !c.pass)
        .map(|c| c.name.clone())
        .collect();
    assert!(failed.is_empty(), "ops outside tolerance: {failed:?}");
}

#[test]
fn cuda_forward_matches_cpu_at_every_layer() {
    let Some(gpu) = gpu() else { return };
    // head_dim 128 with GQA 4:1 (Qwen3) and head_dim 64 with GQA 3:1 (SmolLM2-like).
    for spec in [
        small_spec(2000, 256, 768, 4, (8, 2, 128), 1e-6, 1e6),
        ModelSpec {
            arch: Arch::Llama,
            qk_norm: false,
            ..small_spec(1500, 192, 512, 3, (9, 3, 64), 1e-5, 1e4)
        },
    ] {
        let p = forward_parity(&CpuBackend::new(), &gpu, &spec, 5, &[150, 1, 97, 260])
            .expect("forward parity runs");
        println!(
            "{}",
            format_checks(
                &format!(
                    "CUDA vs CPU TargetModel::forward_packed, {} tokens in 4 packed sequences, {spec:?}",
                    p.tokens
                ),
                &p.layers
            )
        );
        println!(
            "greedy agreement: {}/{} rows with top-1 margin > {} nats; {:.3} over all rows",
            p.greedy_agree, p.greedy_rows, p.greedy_margin, p.greedy_agree_all
        );
        assert!(
            p.layers.iter().all(|c| c.pass),
            "hidden states outside tolerance"
        );
        assert!(
            p.greedy_rows > 20,
            "too few decisive rows to judge ({})",
            p.greedy_rows
        );
        assert!(
            p.greedy_agree as f64 >= 0.97 * p.greedy_rows as f64,
            "greedy tokens disagree: {}/{}",
            p.greedy_agree,
            p.greedy_rows
        );
    }
}

#[test]
fn cuda_drafter_blocks_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let cpu = CpuBackend::new();
    // The product's drafter (`DFlashDrafter`, loaded from a random z-lab checkpoint) over the
    // product's target (its embedding and LM head), with one sliding-window layer so that both
    // layer kinds and the window run on the GPU.
    let spec = small_spec(1200, 256, 512, 4, (8, 2, 128), 1e-6, 1e6);
    let (block, t) = (16usize, 180usize);
    let dir = tempfile::tempdir().unwrap();
    write_random_checkpoint(
        dir.path(),
        &spec,
        &RandomDrafter {
            layers: 2,
            block_size: block,
            target_layer_ids: vec![0, 1, 3],
            intermediate_size: 512,
            mask_token_id: 5,
            sliding_layers: 1,
            sliding_window: 64,
            seed: 21,
        },
    )
    .unwrap();
    let weights = RandomWeights::new(&spec, 21)
        .with_init(0.05, 0.3)
        .bf16_exact();
    let n_taps = 3;
    let mut taps: Vec<Vec<f32>> = (0..n_taps)
        .map(|j| {
            host_random(t * spec.hidden_size, 23 + j as u64)
                .into_iter()
                .map(|v| v * 2.0)
                .collect()
        })
        .collect();
    for tap in &mut taps {
        round_bf16(tap);
    }
    let anchors: Vec<usize> = vec![1, 17, 60, 100, 150, 179];
    let toks: Vec<u32> = anchors
        .iter()
        .map(|&a| (a * 7 % spec.vocab_size) as u32)
        .collect();
    let run = |be_cpu: bool| -> draftlens_engine::backend::TopK {
        macro_rules! go {
            ($be:expr) => {{
                let be = $be;
                let target = TargetModel::load(be, &spec, &weights).unwrap();
                let d = DFlashDrafter::load(be, dir.path(), spec.hidden_size).unwrap();
                let refs: Vec<&[f32]> = taps.iter().map(Vec::as_slice).collect();
                let ctx = d.context(be, &refs, spec.hidden_size).unwrap();
                d.draft(
                    be,
                    &target,
                    &ctx,
                    &anchors,
                    &toks,
                    DraftOptions {
                        ctx_inclusive: false,
                        top_k: 4,
                    },
                )
                .unwrap()
            }};
        }
        if be_cpu {
            go!(&cpu)
        } else {
            go!(&gpu)
        }
    };
    let (a, b) = (run(true), run(false));
    assert_eq!(a.rows, anchors.len() * (block - 1));
    let (mut decisive, mut agree) = (0, 0);
    for r in 0..a.rows {
        if a.row_logprobs(r)[0] - a.row_logprobs(r)[1] > 0.1 {
            decisive += 1;
            agree += (a.row_ids(r)[0] == b.row_ids(r)[0]) as usize;
        }
    }
    let d = draftlens_engine::parity::diff(&a.logprobs, &b.logprobs);
    println!("drafter top-4: {agree}/{decisive} decisive rows agree on top-1; log-prob diff {d:?}");
    assert!(
        decisive >= 10 && agree as f64 >= 0.95 * decisive as f64,
        "drafter top-1 disagrees: {agree}/{decisive}"
    );
    assert!(
        d.max_abs < 0.25,
        "drafter log-probs differ by {}",
        d.max_abs
    );
}

#[test]
fn cuda_bad_inputs_are_errors() {
    let Some(gpu) = gpu() else { return };
    let table = gpu.matrix(&[0.5; 40], 10, 4).unwrap();
    assert!(gpu.embed(&table, &[10]).is_err());
    let x = gpu.from_host(&[1.0; 12], 3, 4).unwrap();
    assert!(gpu
        .matmul(&x, &gpu.matrix(&[1.0; 10], 2, 5).unwrap())
        .is_err());
    assert!(gpu.slice_rows(&x, 2, 4).is_err());
    assert!(gpu.gather_rows(&x, &[3]).is_err());
    let q = gpu.from_host(&vec![0.1; 2 * 96], 2, 96).unwrap();
    let err = gpu
        .attention(
            &q,
            &q,
            &q,
            AttnShape {
                heads: 1,
                kv_heads: 1,
                head_dim: 96,
            },
            &AttnMask::Causal { q_start: 0 },
        )
        .err()
        .expect("head_dim 96 is unsupported");
    assert!(err.to_string().contains("head_dim 96"), "{err}");
    let q = gpu.from_host(&vec![0.1; 2 * 128], 2, 128).unwrap();
    assert!(gpu
        .attention(
            &q,
            &q,
            &q,
            AttnShape {
                heads: 1,
                kv_heads: 1,
                head_dim: 128
            },
            &AttnMask::Causal { q_start: 1 }
        )
        .is_err());
    let head = gpu.matrix(&vec![0.25; 400], 100, 4).unwrap();
    assert!(
        gpu.lm_head_topk(&x, &head, 65).is_err(),
        "k above 64 must be refused"
    );
    assert_eq!(gpu.lm_head_topk(&x, &head, 3).unwrap().ids.len(), 9);
}

#[test]
fn cuda_fused_forward_matches_unfused() {
    let Some(gpu) = gpu() else { return };
    // Split and concat are exact copies.
    let x = gpu.random_tensor(37, 24 + 40 + 8, 1.0, 0.0, 3).unwrap();
    let parts = gpu.split_cols(&x, &[24, 40, 8]).unwrap();
    let back = gpu.concat_cols(&[&parts[0], &parts[1], &parts[2]]).unwrap();
    assert_eq!(gpu.to_host(&x).unwrap(), gpu.to_host(&back).unwrap());
    // The packed prefill (fused QKV and gate|up GEMMs, epilogue residual adds, q/k norm + RoPE in
    // place on the QKV output read directly by attention) gives the hidden states of the cached
    // per-sequence forward (split q/k/v, separate norm, RoPE and attention calls) up to one bf16
    // rounding of each residual add.
    let spec = small_spec(1000, 256, 768, 3, (8, 2, 128), 1e-6, 1e6);
    let weights = RandomWeights::new(&spec, 9)
        .with_init(0.05, 0.3)
        .bf16_exact();
    let m = TargetModel::load(&gpu, &spec, &weights).unwrap();
    let starts = [0usize, 100, 230];
    let ids: Vec<u32> = (0..230u32).map(|i| (i * 37) % 1000).collect();
    let capture = Capture::hf_indices(vec![1, 2, 3], 3).unwrap();
    let packed = m.forward_packed(&gpu, &ids, &starts, &capture).unwrap();
    for i in [1usize, 2, 3] {
        let mut cached = Vec::new();
        for w in starts.windows(2) {
            let o = m
                .forward(&gpu, &ids[w[0]..w[1]], &mut m.new_cache(), &capture)
                .unwrap();
            cached.extend(gpu.to_host(o.captured.get(i).unwrap()).unwrap());
        }
        let d = draftlens_engine::parity::diff(
            &cached,
            &gpu.to_host(packed.captured.get(i).unwrap()).unwrap(),
        );
        println!("packed fused vs cached per-sequence, hidden_states[{i}]: {d:?}");
        assert!(
            d.rel_l2 < 6e-3 && d.non_finite == 0,
            "hidden_states[{i}]: {d:?}"
        );
    }
}

/// Inputs of the fused-op parity test: bf16-representable values, shared by both backends.
struct FusedInputs {
    x: Vec<f32>,
    w: Vec<f32>,
    acc: Vec<f32>,
    gu: Vec<f32>,
    hidden: Vec<f32>,
    norm_w: Vec<f32>,
    qkv: Vec<f32>,
    qn: Vec<f32>,
    kn: Vec<f32>,
}

const FUSED_T: usize = 230;
const FUSED_STARTS: [usize; 4] = [0, 100, 101, 230];
fn fused_starts() -> SeqStarts {
    SeqStarts::new(FUSED_STARTS.to_vec()).unwrap()
}

fn bf16_random(n: usize, seed: u64, scale: f32, offset: f32) -> Vec<f32> {
    let mut v: Vec<f32> = host_random(n, seed)
        .into_iter()
        .map(|x| offset + x * scale)
        .collect();
    round_bf16(&mut v);
    v
}

/// The fused trait methods (`split_cols`, `matmul_acc`, `swiglu_packed`, row `rms_norm`,
/// `attention_varlen_qkv` with and without q/k norms) on one backend, as host vectors.
fn fused_trait_ops<B: Backend>(be: &B, i: &FusedInputs, shape: AttnShape) -> Vec<Vec<f32>> {
    use draftlens_engine::backend::{QkNorm, Rope, RopeStyle};
    let t = FUSED_T;
    let mut out = Vec::new();
    let x = be.from_host(&i.x, t, 256).unwrap();
    for p in be.split_cols(&x, &[64, 128, 64]).unwrap() {
        out.push(be.to_host(&p).unwrap());
    }
    let w = be.matrix(&i.w, 96, 256).unwrap();
    let mut acc = be.from_host(&i.acc, t, 96).unwrap();
    be.matmul_acc(&x, &w, &mut acc).unwrap();
    out.push(be.to_host(&acc).unwrap());
    let gu = be.from_host(&i.gu, t, 2 * 320).unwrap();
    out.push(be.to_host(&be.swiglu_packed(&gu).unwrap()).unwrap());
    let h = be.from_host(&i.hidden, t, 512).unwrap();
    let nw = be.from_host(&i.norm_w, 1, 512).unwrap();
    out.push(
        be.to_host(&be.rms_norm(&h, &nw, 1e-6, 512).unwrap())
            .unwrap(),
    );
    let hd = shape.head_dim;
    let cols = (shape.heads + 2 * shape.kv_heads) * hd;
    let rope = Rope {
        theta: 1e6,
        head_dim: hd,
        rotary_dim: hd,
        style: RopeStyle::RotateHalf,
    };
    let positions = packed_positions(&FUSED_STARTS);
    let (qn, kn) = (
        be.from_host(&i.qn[..hd], 1, hd).unwrap(),
        be.from_host(&i.kn[..hd], 1, hd).unwrap(),
    );
    for with_norm in [true, false] {
        let qkv = be.from_host(&i.qkv[..t * cols], t, cols).unwrap();
        let norm = with_norm.then_some(QkNorm {
            q: &qn,
            k: &kn,
            eps: 1e-6,
        });
        let a = be
            .attention_varlen_qkv(qkv, shape, norm, &positions, &rope, &fused_starts())
            .unwrap();
        out.push(be.to_host(&a).unwrap());
    }
    out
}

/// Fails with how many of the values differ bitwise between `a` and `b` (same lengths).
fn assert_same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let differ = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(differ, 0, "{what}: {differ} of {} values differ", a.len());
}

/// Both whole-row norm kernels (one block per 8 rows below `MANY_ROWS` rows, the weights staged in
/// shared memory and rows walked grid-stride from there) give exactly the grouped kernel's bits,
/// on either side of the switch and for row widths of whole 256-value rounds and of partial last
/// rounds (gpt-oss's 2880: lanes 0–7 hold one chunk more; 8 and 4088: one lane, all but one),
/// in both instances (up to 4096 values, and the wide one: 4104 just past the switch, dense
/// Qwen3-14B and 32B's 5120, 8192).
#[test]
fn cuda_row_norm_kernels_match_the_grouped_kernel_bit_for_bit() {
    use draftlens_engine::backend::cuda::elementwise::MANY_ROWS;
    let Some(gpu) = gpu() else { return };
    for cols in [256, 1024, 4096, 2880, 8, 4088, 4104, 5120, 8192] {
        for rows in [1, 64, MANY_ROWS - 1, MANY_ROWS, 2 * MANY_ROWS + 37] {
            let x = gpu
                .from_host(&bf16_random(rows * cols, 61, 2.0, 0.0), rows, cols)
                .unwrap();
            let w = gpu
                .from_host(&bf16_random(cols, 62, 0.3, 1.0), 1, cols)
                .unwrap();
            let fast = gpu
                .to_host(&gpu.rms_norm_rows(&x, &w, 1e-6).unwrap())
                .unwrap();
            let seam = gpu
                .to_host(&gpu.rms_norm_groups(&x, &w, 1e-6, cols).unwrap())
                .unwrap();
            assert_same_bits(
                &fast,
                &seam,
                &format!("{rows} rows of {cols}, grouped kernel"),
            );
        }
    }
}

/// SwiGLU on a fused gate|up output (`swiglu_packed_rows_bf16`: rows grid-stride, four rows'
/// loads at a time) gives exactly the bits of the seam kernel on separate gate and up tensors, for
/// row counts around the kernel's row steps and widths with and without whole 8-value chunks.
#[test]
fn cuda_swiglu_rows_kernel_matches_the_seam_kernel_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    for inter in [12288, 320, 100] {
        for rows in [1, 7, 1000, 4099] {
            let gu = bf16_random(rows * 2 * inter, 81, 3.0, 0.0);
            let (mut gate, mut up) = (Vec::new(), Vec::new());
            for r in gu.chunks(2 * inter) {
                gate.extend_from_slice(&r[..inter]);
                up.extend_from_slice(&r[inter..]);
            }
            let packed = gpu.from_host(&gu, rows, 2 * inter).unwrap();
            let fast = gpu.to_host(&gpu.swiglu_packed(&packed).unwrap()).unwrap();
            let g = gpu.from_host(&gate, rows, inter).unwrap();
            let u = gpu.from_host(&up, rows, inter).unwrap();
            let seam = gpu.to_host(&gpu.swiglu(&g, &u).unwrap()).unwrap();
            assert_same_bits(
                &fast,
                &seam,
                &format!("{rows} rows of {inter}, seam kernel"),
            );
        }
    }
}

/// flash_attention2 normalising and rotating q itself (after a k-only pass) gives exactly the
/// bits of the separate q/k pass followed by the attention: head dims 64, 128 and 256, 4 and 6
/// query heads per KV head, full and partial rotate-half and interleaved RoPE, packed sequences
/// (one of one token) with positions restarting per sequence, and blocks that span sequences.
/// (The last shape, one query head per KV head, takes the separate pass either way.)
#[test]
fn cuda_q_norm_inside_flash_attention_matches_the_separate_pass_bit_for_bit() {
    use draftlens_engine::backend::{QkNorm, Rope, RopeStyle};
    let Some(gpu) = gpu() else { return };
    let starts = [0usize, 300, 301, 777];
    let t = *starts.last().unwrap();
    let positions = packed_positions(&starts);
    for (heads, kv_heads, hd, rotary_dim, style) in [
        (8, 2, 128, 128, RopeStyle::RotateHalf),
        (8, 2, 128, 64, RopeStyle::RotateHalf),
        (8, 2, 64, 64, RopeStyle::Interleaved),
        (16, 4, 128, 128, RopeStyle::Interleaved),
        (12, 2, 256, 64, RopeStyle::RotateHalf),
        (8, 2, 128, 0, RopeStyle::RotateHalf),
        (4, 4, 128, 128, RopeStyle::RotateHalf),
    ] {
        let shape = AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        };
        let cols = (heads + 2 * kv_heads) * hd;
        let qkv = bf16_random(t * cols, 71, 2.0, 0.0);
        let qn = gpu
            .from_host(&bf16_random(hd, 72, 0.3, 1.0), 1, hd)
            .unwrap();
        let kn = gpu
            .from_host(&bf16_random(hd, 73, 0.3, 1.0), 1, hd)
            .unwrap();
        let rope = Rope {
            theta: 1e6,
            head_dim: hd,
            rotary_dim,
            style,
        };
        let run = |inside: bool| {
            gpu.set_q_norm_in_attention(inside);
            let x = gpu.from_host(&qkv, t, cols).unwrap();
            let norm = QkNorm {
                q: &qn,
                k: &kn,
                eps: 1e-6,
            };
            let o = gpu
                .attention_varlen_qkv(
                    x,
                    shape,
                    Some(norm),
                    &positions,
                    &rope,
                    &SeqStarts::new(starts.to_vec()).unwrap(),
                )
                .unwrap();
            gpu.to_host(&o).unwrap()
        };
        let (inside, separate) = (run(true), run(false));
        gpu.set_q_norm_in_attention(true);
        assert!(separate.iter().all(|v| v.is_finite()));
        assert_same_bits(
            &inside,
            &separate,
            &format!("hd {hd}, {heads}/{kv_heads} heads, rotary {rotary_dim} {style:?}"),
        );
    }
}

#[test]
fn cuda_fused_trait_ops_match_cpu() {
    use draftlens_engine::backend::{attention_varlen_qkv_unfused, QkNorm, Rope, RopeStyle};
    use draftlens_engine::parity::{diff, Check, OpTolerance};
    let Some(gpu) = gpu() else { return };
    let cpu = CpuBackend::new();
    let t = FUSED_T;
    let inputs = FusedInputs {
        x: bf16_random(t * 256, 41, 1.0, 0.0),
        w: bf16_random(96 * 256, 42, 0.1, 0.0),
        acc: bf16_random(t * 96, 43, 1.0, 0.0),
        gu: bf16_random(t * 640, 44, 3.0, 0.0),
        hidden: bf16_random(t * 512, 45, 2.0, 0.0),
        norm_w: bf16_random(512, 46, 0.3, 1.0),
        qkv: bf16_random(t * 8 * 256, 47, 2.0, 0.0),
        qn: bf16_random(256, 48, 0.3, 1.0),
        kn: bf16_random(256, 49, 0.3, 1.0),
    };
    let one_rounding = OpTolerance {
        max_rel_l2: 4e-3,
        min_cosine: 0.99999,
    };
    let attn = OpTolerance {
        max_rel_l2: 1.2e-2,
        min_cosine: 0.9999,
    };
    let names = [
        ("split_cols [0]", OpTolerance::EXACT),
        ("split_cols [1]", OpTolerance::EXACT),
        ("split_cols [2]", OpTolerance::EXACT),
        ("matmul_acc", one_rounding),
        ("swiglu_packed", one_rounding),
        ("rms_norm group = cols (rows kernel)", one_rounding),
        ("attention_varlen_qkv q/k norm", attn),
        ("attention_varlen_qkv no norm", attn),
    ];
    let mut checks = Vec::new();
    // Head dim 128 (Qwen3, GQA 4:1), 64 (GQA 3:1) and 256 (GQA 6:1, flash_attention2_hd256): the
    // fused path with q/k norms, the unfused fallback without.
    for shape in [
        AttnShape {
            heads: 8,
            kv_heads: 2,
            head_dim: 128,
        },
        AttnShape {
            heads: 6,
            kv_heads: 2,
            head_dim: 64,
        },
        AttnShape {
            heads: 6,
            kv_heads: 1,
            head_dim: 256,
        },
    ] {
        let a = fused_trait_ops(&cpu, &inputs, shape);
        let b = fused_trait_ops(&gpu, &inputs, shape);
        assert_eq!(a.len(), names.len());
        for ((name, tol), (ra, rb)) in names.iter().zip(a.iter().zip(&b)) {
            let d = diff(ra, rb);
            checks.push(Check {
                name: format!("{name}, head_dim {}", shape.head_dim),
                diff: d,
                tol: *tol,
                pass: tol.accepts(&d),
            });
        }
        // On the GPU the fused q/k norm + RoPE + packed attention equals the split path bit for
        // bit (same kernels' arithmetic, only the strides differ).
        let hd = shape.head_dim;
        let cols = (shape.heads + 2 * shape.kv_heads) * hd;
        let rope = Rope {
            theta: 1e6,
            head_dim: hd,
            rotary_dim: hd,
            style: RopeStyle::RotateHalf,
        };
        let positions = packed_positions(&FUSED_STARTS);
        let (qn, kn) = (
            gpu.from_host(&inputs.qn[..hd], 1, hd).unwrap(),
            gpu.from_host(&inputs.kn[..hd], 1, hd).unwrap(),
        );
        let qkv = || gpu.from_host(&inputs.qkv[..t * cols], t, cols).unwrap();
        let norm = || {
            Some(QkNorm {
                q: &qn,
                k: &kn,
                eps: 1e-6,
            })
        };
        let unfused = attention_varlen_qkv_unfused(
            &gpu,
            qkv(),
            shape,
            norm(),
            &positions,
            &rope,
            &fused_starts(),
        )
        .unwrap();
        let d = diff(&gpu.to_host(&unfused).unwrap(), &b[names.len() - 2]);
        checks.push(Check {
            name: format!("GPU fused vs split attention_varlen_qkv, head_dim {hd}"),
            diff: d,
            tol: OpTolerance::EXACT,
            pass: OpTolerance::EXACT.accepts(&d),
        });
    }
    println!(
        "{}",
        format_checks(
            "fused trait ops, CUDA vs CPU (and GPU fused vs split)",
            &checks
        )
    );
    let failed: Vec<_> = checks
        .iter()
        .filter(|c| !c.pass)
        .map(|c| c.name.clone())
        .collect();
    assert!(failed.is_empty(), "fused ops outside tolerance: {failed:?}");
}

/// Arbitrary f32 bit patterns (every 5th) among ordinary values, led by the special values a
/// conversion must carry: ±0, ±inf, NaNs with payloads, subnormals, bf16 rounding ties.
fn raw_values(n: usize, seed: u64) -> Vec<f32> {
    let special = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(0x7fc0_0001),
        f32::from_bits(0xff81_2345),
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0x0000_0001),
        6.0e-8,
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        65504.0,
    ];
    let ordinary = host_random(n, seed);
    let mut r = draftlens_engine::util::DetRng::new(seed);
    (0..n)
        .map(|i| {
            let s = r.next_u64();
            if i < special.len() {
                special[i]
            } else if i % 5 == 0 {
                f32::from_bits(s as u32)
            } else {
                ordinary[i] * 3.0
            }
        })
        .collect()
}

/// Stored bytes of `v` in `dtype`, and the f32 values a loader reading them back gets.
fn stored(dtype: draftlens_engine::backend::raw::RawDtype, v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    use draftlens_engine::backend::raw::RawDtype;
    use half::{bf16, f16};
    match dtype {
        RawDtype::F32 => (v.iter().flat_map(|x| x.to_le_bytes()).collect(), v.to_vec()),
        RawDtype::F16 => {
            let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
            (
                h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                h.iter().map(|x| x.to_f32()).collect(),
            )
        }
        RawDtype::BF16 => {
            let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
            (
                h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                h.iter().map(|x| x.to_f32()).collect(),
            )
        }
    }
}

/// Every value of a device matrix, as bf16 bit patterns.
fn matrix_bits(gpu: &CudaBackend, m: &draftlens_engine::backend::cuda::CudaMatrix) -> Vec<u16> {
    let (out, _) = gpu.matrix_dims(m);
    let ids: Vec<u32> = (0..out as u32).collect();
    let t = gpu.embed(m, &ids).unwrap();
    gpu.to_host_bf16(&t)
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// The raw upload (pinned staging, GPU-side f16/f32 → bf16, parts stacked at their row offsets)
/// builds exactly the matrix `Backend::matrix` builds from the same values as f32, bit for bit,
/// NaN payloads included; tensors larger than one staging buffer (32 MiB) cross chunk and
/// staging-slot boundaries.
#[test]
fn cuda_raw_upload_matches_matrix_bit_for_bit() {
    use draftlens_engine::backend::raw::{RawDtype, RawPart};
    let Some(gpu) = gpu() else { return };
    let cols = 4096;
    let mut all = Vec::new();
    for (i, (dtype, rows)) in [
        (RawDtype::BF16, 3),
        (RawDtype::F16, 5),
        (RawDtype::F32, 7),
        (RawDtype::BF16, 4500), // 36 MiB
        (RawDtype::F16, 4200),  // 33.6 MiB
        (RawDtype::F32, 2100),  // 34.4 MiB
    ]
    .into_iter()
    .enumerate()
    {
        let (bytes, values) = stored(dtype, &raw_values(rows * cols, 11 + i as u64));
        let want = gpu.matrix(&values, rows, cols).unwrap();
        let part = RawPart {
            dtype,
            rows,
            cols,
            bytes: &bytes,
            mapped: false,
        };
        let got = gpu.matrix_raw(part).unwrap();
        assert_eq!(
            matrix_bits(&gpu, &got),
            matrix_bits(&gpu, &want),
            "{dtype:?} [{rows}, {cols}]"
        );
        all.push((dtype, rows, bytes, values));
    }
    // Stacked: every part above, mixed dtypes, at its row offset.
    let parts: Vec<RawPart> = all
        .iter()
        .map(|(dtype, rows, bytes, _)| RawPart {
            dtype: *dtype,
            rows: *rows,
            cols,
            bytes,
            mapped: false,
        })
        .collect();
    let values: Vec<f32> = all.iter().flat_map(|a| a.3.iter().copied()).collect();
    let rows: usize = all.iter().map(|a| a.1).sum();
    let want = gpu.matrix(&values, rows, cols).unwrap();
    let got = gpu.matrix_stacked_raw(&parts).unwrap();
    assert_eq!(gpu.matrix_dims(&got), (rows, cols));
    assert_eq!(matrix_bits(&gpu, &got), matrix_bits(&gpu, &want), "stacked");
    // The same parts read from a file mapping: the upload drops each chunk's pages once copied
    // (`release_mapped_pages`), which must not change a bit, and leaves fewer of them resident.
    let mut file = tempfile::tempfile().unwrap();
    for (_, _, bytes, _) in &all {
        std::io::Write::write_all(&mut file, bytes).unwrap();
    }
    // SAFETY: a private temporary file nothing else writes while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let mut at = 0;
    let mapped: Vec<RawPart> = all
        .iter()
        .map(|(dtype, rows, bytes, _)| {
            let part = RawPart {
                dtype: *dtype,
                rows: *rows,
                cols,
                bytes: &map[at..at + bytes.len()],
                mapped: true,
            };
            at += bytes.len();
            part
        })
        .collect();
    let from_map = gpu.matrix_stacked_raw(&mapped).unwrap();
    assert_eq!(
        matrix_bits(&gpu, &from_map),
        matrix_bits(&gpu, &want),
        "stacked, from a file mapping"
    );
    // Free memory is known on CUDA and below the card's size.
    let free = gpu.free_memory().expect("CUDA reports free memory");
    assert!(free > 0 && free <= gpu.info().total_mem_bytes as u64 + (1 << 30));
}

/// A weight stored transposed (`[inp, out]`, gpt-oss's fused expert stacks) uploaded as stored
/// and transposed on the GPU (`Backend::matrix_raw_transposed`, `transpose_bf16_rows`) equals the
/// host transpose (`raw::transposed`) uploaded as rows, bit for bit, with and without gate_up's
/// interleaved rows: at gpt-oss-20b's gate_up (2 880 × 5 760, one staging buffer) and down
/// (2 880 × 2 880), off the 32 × 32 tile (37 × 70), and over several staging buffers
/// (5 000 × 4 096 bf16 = 39 MiB), from host memory and from a file mapping. f32 takes the host
/// path and must agree too.
#[test]
fn cuda_transposed_raw_upload_equals_the_host_transpose() {
    use draftlens_engine::backend::raw::{transposed, RawDtype, RawPart};
    let Some(gpu) = gpu() else { return };
    for (i, (dtype, inp, out)) in [
        (RawDtype::BF16, 37, 70),
        (RawDtype::BF16, 2880, 5760),
        (RawDtype::BF16, 2880, 2880),
        (RawDtype::BF16, 5000, 4096),
        (RawDtype::F32, 37, 70),
    ]
    .into_iter()
    .enumerate()
    {
        let (bytes, _) = stored(dtype, &raw_values(inp * out, 31 + i as u64));
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &bytes).unwrap();
        // SAFETY: a private temporary file nothing else writes while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        for interleaved in [false, true] {
            let part = |bytes, mapped| RawPart {
                dtype,
                rows: inp,
                cols: out,
                bytes,
                mapped,
            };
            let host = transposed(part(&bytes, false), interleaved).unwrap();
            let want = gpu
                .matrix_raw(RawPart {
                    dtype,
                    rows: out,
                    cols: inp,
                    bytes: &host,
                    mapped: false,
                })
                .unwrap();
            let want = matrix_bits(&gpu, &want);
            for (from, mapped) in [("host memory", false), ("a file mapping", true)] {
                let src: &[u8] = if mapped { &map } else { &bytes };
                let got = gpu
                    .matrix_raw_transposed(part(src, mapped), interleaved)
                    .unwrap();
                assert_eq!(gpu.matrix_dims(&got), (out, inp));
                assert!(
                    matrix_bits(&gpu, &got) == want,
                    "{dtype:?} [{inp}, {out}] interleaved {interleaved}, from {from}: the GPU \
                     transpose differs from the host's"
                );
            }
        }
    }
}

/// A hybrid's gated attention on the GPU: `q_proj`'s per-head query and gate rows uploaded as row
/// views of the stored bytes (`load_gated_qkv`) give the same device matrices, bit for bit, as
/// the f32 path that splits them on the host (the committed Qwen3.5 / Qwen3-Next goldens).
#[test]
fn hybrid_gated_attention_loads_raw_as_from_f32_on_the_gpu() {
    use draftlens_engine::model::config::LayerType;
    use draftlens_engine::model::transformer::Attention;
    use draftlens_engine::model::TargetFiles;
    let Some(gpu) = gpu() else { return };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden");
    for name in ["qwen3_5", "qwen3_next"] {
        let files = TargetFiles::open(&root.join(name)).unwrap();
        let spec = &files.spec;
        let layer = spec
            .hybrid
            .as_ref()
            .unwrap()
            .layer_types
            .iter()
            .position(|t| *t == LayerType::FullAttention);
        let prefix = format!(
            "model.layers.{}.self_attn",
            layer.expect("an attention layer")
        );
        let w = files.weights.as_ref();
        assert!(
            w.raw(&format!("{prefix}.q_proj.weight")).unwrap().is_some(),
            "{name}: q_proj has no raw view"
        );
        let raw = Attention::load(&gpu, w, &prefix, spec).unwrap();
        let f32s = Attention::load(&gpu, &F32Only(w), &prefix, spec).unwrap();
        assert_eq!(
            matrix_bits(&gpu, &raw.qkv_proj),
            matrix_bits(&gpu, &f32s.qkv_proj),
            "{name}: q|k|v"
        );
        let (Some(a), Some(b)) = (&raw.gate_proj, &f32s.gate_proj) else {
            panic!("{name}: a gated attention layer without its gate");
        };
        assert_eq!(matrix_bits(&gpu, a), matrix_bits(&gpu, b), "{name}: gate");
    }
}

/// A tuned GEMM's algorithm is remembered for the next process (docs/cuda.md, "GEMM modes and
/// tuning"): with its plans forgotten and the choices file read again (what a new process starts
/// from) the backend runs the shape without timing and gives the same bits; a remembered
/// `cublasGemmEx` choice is taken as such. One backend throughout: a second one in the same
/// process segfaulted at exit on the H200 (session 10), after all tests had passed.
#[test]
fn cuda_tuned_gemm_choice_is_remembered_by_the_next_backend() {
    let Some(be) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = dir
        .path()
        .join(draftlens_engine::backend::cuda::gemm_choices::FILE_NAME);
    // Large enough to be tuned: ≥ 2048 rows and ≥ 1e10 FLOPs.
    let (rows, out, inp) = (2048, 2048, 4096);
    let x = be.random_tensor(rows, inp, 1.0, 0.0, 5).unwrap();
    let w = be.random_matrix(out, inp, 0.02, 6).unwrap();
    let run = || -> Vec<f32> {
        // As a new process: no plans, the choices as the file holds them.
        be.forget_gemm_plans();
        be.set_gemm_choices_file(Some(file.clone()));
        be.to_host(&be.matmul(&x, &w).unwrap()).unwrap()
    };
    let first = run();
    assert_eq!(be.gemm_tune_records().len(), 1, "{}", be.gemm_status());
    assert_eq!(be.gemm_reused_choices(), 0);
    let text = std::fs::read_to_string(&file).unwrap();
    println!("{text}");
    assert!(text.contains(&be.info().name), "{text}");
    let second = run();
    println!("{}", be.gemm_status());
    assert_eq!(be.gemm_tune_records().len(), 1, "timed again");
    assert_eq!(be.gemm_reused_choices(), 1);
    assert!(
        first
            .iter()
            .zip(&second)
            .all(|(p, q)| p.to_bits() == q.to_bits()),
        "the remembered algorithm gave other bits"
    );
    // The choice rewritten to cublasGemmEx: taken without timing, and the result still a GEMM.
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    for entries in json["machines"].as_object_mut().unwrap().values_mut() {
        for v in entries.as_object_mut().unwrap().values_mut() {
            *v = serde_json::Value::String("gemm_ex".into());
        }
    }
    std::fs::write(&file, serde_json::to_string(&json).unwrap()).unwrap();
    let third = run();
    assert_eq!(be.gemm_tune_records().len(), 1);
    assert_eq!(be.gemm_reused_choices(), 2);
    let err = third
        .iter()
        .zip(&first)
        .map(|(p, q)| (p - q).abs() / (q.abs() + 1e-2))
        .fold(0f32, f32::max);
    assert!(err < 2e-2, "cublasGemmEx vs cuBLASLt: {err}");
}

/// Tap downloads cut into sequences (`to_host_rows_split`, staged in page-locked memory above 2 MiB)
/// equal the plain download's rows, bit for bit, for parts of every size including empty ones,
/// through a staging buffer that grows and is reused; bf16 uploads (staged above 1 MiB) round-trip
/// exactly.
#[test]
fn cuda_split_tap_download_equals_the_whole_download() {
    let Some(be) = gpu() else { return };
    for (rows, cols, starts) in [
        (9usize, 64usize, vec![0usize, 4, 4, 9]), // below the staging size
        (3000, 1024, vec![0, 1, 1000, 1000, 2999, 3000]),
        (5000, 1024, vec![0, 5000]),
        (5000, 1024, vec![0, 17, 2500, 5000]), // the buffer reused
        (2000, 4096, vec![0, 1, 2, 1999, 2000]), // grown
    ] {
        // bf16 values uploaded as they are: above 1 MiB through the page-locked staging.
        let values: Vec<half::bf16> = host_random(rows * cols, rows as u64)
            .into_iter()
            .map(half::bf16::from_f32)
            .collect();
        let x = be
            .from_host_rows(HostRowsRef::BF16(&values), rows, cols)
            .unwrap();
        let whole = be.to_host_rows(&x).unwrap();
        assert!(
            whole == HostRows::BF16(values),
            "{rows}x{cols}: upload round trip"
        );
        let parts = be.to_host_rows_split(&x, &starts).unwrap();
        assert_eq!(parts.len(), starts.len() - 1);
        for (p, w) in parts.iter().zip(starts.windows(2)) {
            assert_eq!(
                p.view().to_f32(),
                whole.view().slice(w[0] * cols..w[1] * cols).to_f32(),
                "{rows}x{cols} part {w:?}"
            );
        }
    }
    let x = be.from_host(&host_random(64, 1), 8, 8).unwrap();
    assert!(be.to_host_rows_split(&x, &[0, 9]).is_err());
}
