//! draftlens' two GDN profiles against goldens made by fla itself (transformers with fla-core
//! 0.6.0's Triton kernels, bf16 model on CUDA): the Engine profile exists to reproduce those
//! numerics (docs/hybrid-models.md, "Two numeric profiles"). Runs on the GPU machine through
//! tools/golden/fla_device.sh, which makes the goldens and points DRAFTLENS_FLA_GOLDENS at them;
//! skips (printing why) when that variable is unset, the folder has no fla golden, or there is no
//! GPU. Models: the committed qwen3_5 / qwen3_next goldens (32-wide attention heads, which the
//! CUDA attention kernels do not take: skipped here; their fla goldens are committed for the
//! record) and qwen3_5_d128 (128-wide GDN heads and 64-wide attention heads, made on the device:
//! the CUDA GDN kernels themselves).
//!
//! Per model, prompt and hidden-state index: ‖ours − fla‖/‖fla‖ for the CPU (f32) in both profiles
//! and CUDA in both profiles, printed as a table; asserted: CUDA engine within twice the bf16
//! layer tolerance of fla at every index (two bf16 implementations, each about one tolerance from
//! the exact values), and CUDA engine's teacher-forced top-1 equal to fla's greedy token at ≥ 90 %
//! of the decisive positions (fla's top-1 leads by > 0.1).
#![cfg(feature = "cuda")]

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::cuda::CudaBackend;
use draftlens_engine::backend::{Backend, GdnProfile};
use draftlens_engine::model::config::LayerType;
use draftlens_engine::model::{Capture, TargetFiles, TargetModel};
use draftlens_engine::parity::{diff, layer_tolerance};
use golden_util::*;
use std::path::PathBuf;

const MODELS: [&str; 3] = ["qwen3_5", "qwen3_next", "qwen3_5_d128"];

fn goldens() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("DRAFTLENS_FLA_GOLDENS").map(PathBuf::from) else {
        println!("SKIP: DRAFTLENS_FLA_GOLDENS is not set (tools/golden/fla_device.sh sets it)");
        return None;
    };
    if !MODELS
        .iter()
        .any(|m| dir.join(m).join("golden-fla.safetensors").exists())
    {
        println!("SKIP: no */golden-fla.safetensors under {}", dir.display());
        return None;
    }
    Some(dir)
}

/// Hidden states (every HF index) and per-position top-1 of `m` over `ids`.
fn run<B: Backend>(be: &B, m: &TargetModel<B>, ids: &[u32]) -> (Vec<Vec<f32>>, Vec<u32>) {
    let l = m.spec.num_layers;
    let cap = Capture::hf_indices((0..=l).collect(), l).unwrap();
    let out = m.forward(be, ids, &mut m.new_cache(), &cap).unwrap();
    let states = (0..=l)
        .map(|i| be.to_host(out.captured.get(i).unwrap()).unwrap())
        .collect();
    let top = m.logits_topk(be, &out.last_hidden, 1).unwrap();
    (states, (0..ids.len()).map(|r| top.row_ids(r)[0]).collect())
}

#[test]
fn cuda_engine_profile_tracks_fla() {
    let Some(root) = goldens() else { return };
    let gpu = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            println!("SKIP: {e}");
            return;
        }
    };
    let cpu = CpuBackend::new();
    let mut checked = 0;
    for name in MODELS {
        let dir = root.join(name);
        if !dir.join("golden-fla.safetensors").exists() {
            println!("{name}: no fla golden, skipped");
            continue;
        }
        let files = TargetFiles::open(&dir).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let spec = &files.spec;
        // The committed models' 32-wide attention heads have no CUDA attention kernel (the GPU
        // refuses them with a clear error); only qwen3_5_d128 runs on the GPU.
        if ![64, 128, 256].contains(&spec.head_dim) {
            println!(
                "{name}: attention heads of {} have no CUDA kernel (64, 128, 256): skipped",
                spec.head_dim
            );
            continue;
        }
        let kinds: Vec<&str> = std::iter::once("embedding")
            .chain(
                spec.hybrid
                    .as_ref()
                    .unwrap()
                    .layer_types
                    .iter()
                    .map(|t| match t {
                        LayerType::LinearAttention => "gdn",
                        LayerType::FullAttention => "attention",
                    }),
            )
            .collect();
        let mut models_cpu = Vec::new();
        let mut models_gpu = Vec::new();
        for p in [GdnProfile::Reference, GdnProfile::Engine] {
            let mut c = TargetModel::load(&cpu, spec, files.weights.as_ref()).unwrap();
            c.set_gdn_profile(p);
            models_cpu.push(c);
            let mut g = TargetModel::load(&gpu, spec, files.weights.as_ref()).unwrap();
            g.set_gdn_profile(p);
            models_gpu.push(g);
        }
        let g = Golden::open(dir.join("golden-fla.safetensors"));
        let manifest = json(&dir.join("manifest-fla.json"));
        println!("{name}: {}", manifest["profile"]);
        for p in 0..manifest["prompts"].as_array().unwrap().len() {
            let prompt = g.ids(&format!("p{p}.input_ids"));
            let greedy = g.ids(&format!("p{p}.greedy_ids"));
            let (_, margin) = g.f32(&format!("p{p}.greedy_margin"));
            let ids: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
            let runs = [
                run(&cpu, &models_cpu[0], &ids),
                run(&cpu, &models_cpu[1], &ids),
                run(&gpu, &models_gpu[0], &ids),
                run(&gpu, &models_gpu[1], &ids),
            ];
            println!(
                "  prompt {p} ({} + {} tokens): rel error against fla per hidden state",
                prompt.len(),
                greedy.len()
            );
            println!(
                "  {:<6} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10}  closer",
                "index", "layer", "cpu/ref", "cpu/eng", "cuda/ref", "cuda/eng", "bound"
            );
            for (i, kind) in kinds.iter().enumerate() {
                let (_, want) = g.f32(&format!("p{p}.hs{i}"));
                let rel: Vec<f64> = runs
                    .iter()
                    .map(|(st, _)| diff(&want, &round_f16(&st[i])).rel_l2)
                    .collect();
                let bound = 2.0 * layer_tolerance(i).max_rel_l2;
                println!(
                    "  {i:<6} {kind:<10} {:>10.3e} {:>10.3e} {:>10.3e} {:>10.3e} {bound:>10.1e}  {}",
                    rel[0],
                    rel[1],
                    rel[2],
                    rel[3],
                    if rel[3] < rel[2] { "engine" } else { "reference" }
                );
                assert!(
                    rel[3] <= bound,
                    "{name} prompt {p} hidden_states[{i}] ({kind}): CUDA engine is {:.3e} from fla, bound {bound:.1e}",
                    rel[3]
                );
            }
            // Teacher-forced next tokens over the continuation against fla's greedy tokens.
            let top = &runs[3].1;
            let (mut agree, mut decisive) = (0, 0);
            for (j, (&want, &m)) in greedy.iter().zip(&margin).enumerate() {
                if m > 0.1 {
                    decisive += 1;
                    agree += (top[prompt.len() - 1 + j] == want) as usize;
                }
            }
            println!("  CUDA engine top-1 = fla greedy at {agree}/{decisive} decisive positions");
            assert!(
                decisive > 0 && agree * 10 >= decisive * 9,
                "{name} prompt {p}: {agree}/{decisive}"
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no fla golden was checked");
}
