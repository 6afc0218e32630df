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
            assert_eq!(mods.len(), 3);
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
