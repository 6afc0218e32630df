//! CUDA backend tests: per-op and whole-forward parity with the CPU reference backend, kernel
//! compilation, clean errors. On a machine without CUDA every test that needs the GPU prints
//! "SKIP: CUDA unavailable: <reason>" and returns (CI has no GPU); on the GPU machine they run
//! for real (see docs/cuda.md for the command).
#![cfg(feature = "cuda")]

use draftlens::backend::cpu::CpuBackend;
use draftlens::backend::cuda::bench::{host_random, Decoder, DecoderShape, Drafter, HostWeights};
use draftlens::backend::cuda::{compile_kernels_offline, CudaBackend};
use draftlens::backend::{AttnMask, AttnShape, Backend};
use draftlens::parity::{format_checks, forward_parity, op_parity};

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
                msg.starts_with("CUDA unavailable: "),
                "unexpected error text: {msg}"
            );
            println!("SKIP: {msg}");
        }
    }
    // An ordinal past the last device is an error on every machine.
    let e = CudaBackend::new(1 << 20)
        .err()
        .expect("device 2^20 cannot exist");
    assert!(e.to_string().starts_with("CUDA unavailable: "), "{e}");
}

#[test]
fn cuda_kernels_compile_with_nvrtc() {
    match compile_kernels_offline("compute_90") {
        Ok(mods) => {
            for want in ["elementwise", "attention", "topk", "decode"] {
                assert!(
                    mods.iter().any(|(n, _)| n == want),
                    "module {want} missing from {mods:?}"
                );
            }
            for (name, bytes) in mods {
                assert!(bytes > 1000, "{name}: PTX of {bytes} bytes");
                println!("kernels/{name}.cu: {bytes} bytes of PTX for compute_90");
            }
        }
        Err(e) => {
            assert!(e.to_string().starts_with("CUDA unavailable: "), "{e:#}");
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
    for shape in [
        DecoderShape {
            vocab: 2000,
            hidden: 256,
            inter: 768,
            layers: 4,
            heads: 8,
            kv_heads: 2,
            head_dim: 128,
            eps: 1e-6,
            theta: 1e6,
        },
        DecoderShape {
            vocab: 1500,
            hidden: 192,
            inter: 512,
            layers: 3,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            eps: 1e-5,
            theta: 1e4,
        },
    ] {
        let p = forward_parity(&CpuBackend::new(), &gpu, &shape, 5, &[150, 1, 97, 260])
            .expect("forward parity runs");
        println!(
            "{}",
            format_checks(
                &format!(
                    "CUDA vs CPU forward, {} tokens in 4 packed sequences, {shape:?}",
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
    let shape = DecoderShape {
        vocab: 1200,
        hidden: 256,
        inter: 512,
        layers: 2,
        heads: 8,
        kv_heads: 2,
        head_dim: 128,
        eps: 1e-6,
        theta: 1e6,
    };
    let (block, n_taps, t) = (16usize, 3usize, 180usize);
    let w = HostWeights::random(&shape, 21, 0.05);
    let mut fc: Vec<f32> = host_random(shape.hidden * n_taps * shape.hidden, 22)
        .into_iter()
        .map(|v| v * 0.05)
        .collect();
    draftlens::backend::cuda::bench::round_bf16(&mut fc);
    let hn = vec![1.0f32; shape.hidden];
    let mut taps: Vec<f32> = host_random(t * n_taps * shape.hidden, 23)
        .into_iter()
        .map(|v| v * 2.0)
        .collect();
    draftlens::backend::cuda::bench::round_bf16(&mut taps);
    let anchors: Vec<usize> = vec![1, 17, 60, 100, 150, 179];
    let toks: Vec<u32> = anchors
        .iter()
        .map(|&a| (a * 7 % shape.vocab) as u32)
        .collect();
    let run = |be_cpu: bool| -> draftlens::backend::TopK {
        macro_rules! go {
            ($be:expr) => {{
                let be = $be;
                let d = Drafter::from_host(be, &shape, block, n_taps, &w, &fc, &hn).unwrap();
                let embed = be.matrix(&w.embed, shape.vocab, shape.hidden).unwrap();
                let ctx = d
                    .context(be, &be.from_host(&taps, t, n_taps * shape.hidden).unwrap())
                    .unwrap();
                d.draft(be, &ctx, &embed, &embed, &anchors, &toks, 5, 4)
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
    let d = draftlens::parity::diff(&a.logprobs, &b.logprobs);
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
    // Fused QKV / gate|up GEMMs and epilogue residual adds give the unfused hidden states up to
    // one bf16 rounding of each residual add.
    let shape = DecoderShape {
        vocab: 1000,
        hidden: 256,
        inter: 768,
        layers: 3,
        heads: 8,
        kv_heads: 2,
        head_dim: 128,
        eps: 1e-6,
        theta: 1e6,
    };
    let w = HostWeights::random(&shape, 9, 0.05);
    let m = Decoder::from_host(&gpu, &shape, &w).unwrap();
    let fused = m.fuse(&gpu).unwrap();
    let starts = [0usize, 100, 230];
    let ids: Vec<u32> = (0..230u32).map(|i| (i * 37) % 1000).collect();
    let taps = [1usize, 2, 3];
    let a = m.forward(&gpu, &ids, &starts, &taps).unwrap();
    let b = m.forward_fused(&gpu, &fused, &ids, &starts, &taps).unwrap();
    for (i, (ta, tb)) in a.taps.iter().zip(&b.taps).enumerate() {
        let d = draftlens::parity::diff(&gpu.to_host(ta).unwrap(), &gpu.to_host(tb).unwrap());
        println!("fused vs unfused tap {}: {d:?}", taps[i]);
        assert!(
            d.rel_l2 < 6e-3 && d.non_finite == 0,
            "tap {}: {d:?}",
            taps[i]
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

fn bf16_random(n: usize, seed: u64, scale: f32, offset: f32) -> Vec<f32> {
    let mut v: Vec<f32> = host_random(n, seed)
        .into_iter()
        .map(|x| offset + x * scale)
        .collect();
    draftlens::backend::cuda::bench::round_bf16(&mut v);
    v
}

/// The fused trait methods (`split_cols`, `matmul_acc`, `swiglu_packed`, row `rms_norm`,
/// `attention_varlen_qkv` with and without q/k norms) on one backend, as host vectors.
fn fused_trait_ops<B: Backend>(be: &B, i: &FusedInputs, shape: AttnShape) -> Vec<Vec<f32>> {
    use draftlens::backend::{QkNorm, Rope, RopeStyle};
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
    let positions = draftlens::backend::cuda::bench::positions_for(&FUSED_STARTS);
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
            .attention_varlen_qkv(qkv, shape, norm, &positions, &rope, &FUSED_STARTS)
            .unwrap();
        out.push(be.to_host(&a).unwrap());
    }
    out
}

#[test]
fn cuda_fused_trait_ops_match_cpu() {
    use draftlens::backend::{attention_varlen_qkv_unfused, QkNorm, Rope, RopeStyle};
    use draftlens::parity::{diff, Check, OpTolerance};
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
        qkv: bf16_random(t * 12 * 128, 47, 2.0, 0.0),
        qn: bf16_random(128, 48, 0.3, 1.0),
        kn: bf16_random(128, 49, 0.3, 1.0),
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
    // Head dim 128 (Qwen3, GQA 4:1) and 64 (GQA 3:1): the fused path with q/k norms, the unfused
    // fallback without.
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
        let positions = draftlens::backend::cuda::bench::positions_for(&FUSED_STARTS);
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
            &FUSED_STARTS,
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
