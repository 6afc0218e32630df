//! `bench`: CPU prefill throughput of the target next to this machine's own f32 GEMM rate,
//! measured in the same run (a ratio against the physical floor, not an absolute number).

use crate::common::Global;
use anyhow::Result;
use clap::Args;
use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::Backend;
use draftlens_engine::model::{Capture, TargetFiles, TargetModel};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    /// Target model
    /// [default: the model `draftlens setup` installs in the data folder]
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Prompt lengths to prefill.
    #[arg(long, value_delimiter = ',', default_value = "128,512,2048")]
    pub lengths: Vec<usize>,
    /// Timed repetitions per length (the best is reported, after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Also measure drafter scoring: anchors/s with random-weight drafters of these depths (B=16, top-8).
    #[arg(long, value_delimiter = ',')]
    pub drafter_layers: Vec<usize>,
    /// Prompts (HumanEval) for the drafter measurement.
    #[arg(long, default_value_t = 4)]
    pub drafter_prompts: usize,
}

impl BenchArgs {
    /// The target, resolved by [`run`] (`--target` or the installed default).
    fn target(&self) -> &std::path::Path {
        self.target
            .as_deref()
            .expect("resolved at the start of `run`")
    }
}

#[derive(Serialize)]
struct DrafterRow {
    layers: usize,
    anchors: usize,
    anchors_per_s: f64,
    target_s: f64,
    draft_s: f64,
    metrics_s: f64,
}

#[derive(Serialize)]
struct GemmRate {
    shape: String,
    gflops: f64,
}

#[derive(Serialize)]
struct PrefillRow {
    tokens: usize,
    seconds: f64,
    tokens_per_s: f64,
    gflop_per_token: f64,
    gflops: f64,
    share_of_gemm_peak: f64,
}

#[derive(Serialize)]
struct BenchOut {
    threads: usize,
    gemm: Vec<GemmRate>,
    gemm_peak_gflops: f64,
    prefill: Vec<PrefillRow>,
    drafters: Vec<DrafterRow>,
}

fn best_of<F: FnMut() -> Result<()>>(reps: usize, mut f: F) -> Result<f64> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

pub fn run(g: &Global, a: BenchArgs) -> Result<()> {
    let a = BenchArgs {
        target: Some(g.target(&a.target)?),
        ..a
    };
    let be = CpuBackend::new();
    // The machine's own GEMM rate, on the shapes the model runs and on a large square one.
    let mut gemm = Vec::new();
    for (m, n, k) in [
        (2048usize, 1536usize, 576usize),
        (2048, 576, 1536),
        (1024, 1024, 1024),
    ] {
        let x = be.from_host(&vec![0.5f32; m * k], m, k)?;
        let w = be.matrix(&vec![0.25f32; n * k], n, k)?;
        let s = best_of(a.reps, || be.matmul(&x, &w).map(|_| ()))?;
        gemm.push(GemmRate {
            shape: format!("{m}x{k} · ({n}x{k})ᵀ"),
            gflops: 2.0 * (m * n * k) as f64 / s / 1e9,
        });
    }
    let peak = gemm.iter().map(|r| r.gflops).fold(0.0, f64::max);

    let files = TargetFiles::open(a.target())?;
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref())?;
    let spec = &files.spec;
    // FLOPs per token (docs/models.md §6.1): 2·N_lin + attention 4·H·hd·(S+1)/2 per layer; no LM head.
    let n_lin = spec.num_layers
        * (spec.hidden_size * spec.num_heads * spec.head_dim * 2
            + spec.hidden_size * spec.num_kv_heads * spec.head_dim * 2
            + 3 * spec.hidden_size * spec.intermediate_size);
    let mut prefill = Vec::new();
    for &t in &a.lengths {
        let ids: Vec<u32> = (0..t)
            .map(|i| ((i * 7919 + 13) % spec.vocab_size) as u32)
            .collect();
        let s = best_of(a.reps, || {
            let mut cache = model.new_cache();
            model
                .forward(&be, &ids, &mut cache, &Capture::none())
                .map(|_| ())
        })?;
        let gf_tok = (2.0 * n_lin as f64
            + (spec.num_layers * 2 * spec.num_heads * spec.head_dim * (t + 1)) as f64)
            / 1e9;
        let gflops = gf_tok * t as f64 / s;
        prefill.push(PrefillRow {
            tokens: t,
            seconds: s,
            tokens_per_s: t as f64 / s,
            gflop_per_token: gf_tok,
            gflops,
            share_of_gemm_peak: gflops / peak,
        });
    }
    let drafters = bench_drafters(&a)?;
    let out = BenchOut {
        threads: rayon::current_num_threads(),
        gemm,
        gemm_peak_gflops: peak,
        prefill,
        drafters,
    };
    g.emit(&out, || {
        let mut o = format!("CPU, {} threads\n", out.threads);
        for r in &out.gemm {
            o += &format!("  f32 GEMM {:<26} {:>7.1} GFLOP/s\n", r.shape, r.gflops);
        }
        o += &format!("  prefill of {} ({}):\n", a.target().display(), spec.arch.as_str());
        for r in &out.prefill {
            o += &format!(
                "  {:>5} tokens  {:>8.3} s  {:>8.0} tok/s  {:>7.1} GFLOP/s  = {:>5.1}% of the GEMM peak\n",
                r.tokens,
                r.seconds,
                r.tokens_per_s,
                r.gflops,
                100.0 * r.share_of_gemm_peak
            );
        }
        for r in &out.drafters {
            let tot = r.target_s + r.draft_s + r.metrics_s;
            o += &format!(
                "  drafter {} layer(s), B=16: {} anchors, {:.1} anchors/s drafting; time shares: target {:.0}% (cached after the first run), drafting {:.0}%, metrics {:.1}%\n",
                r.layers, r.anchors, r.anchors_per_s, 100.0 * r.target_s / tot, 100.0 * r.draft_s / tot, 100.0 * r.metrics_s / tot
            );
        }
        o
    })
}

/// Anchors/s of the exact per-anchor evaluation with random drafters of several depths.
fn bench_drafters(a: &BenchArgs) -> Result<Vec<DrafterRow>> {
    use draftlens_engine::drafter::random::{write_random_checkpoint, RandomDrafter};
    use draftlens_engine::drafter::run::{run_eval, DrafterSpec, RunOptions};
    if a.drafter_layers.is_empty() {
        return Ok(vec![]);
    }
    let tmp = std::env::temp_dir().join(format!("draftlens-bench-{}", std::process::id()));
    let cache = draftlens_engine::hidden_cache::HiddenCache::open(&tmp.join("cache"))?;
    let s = draftlens_engine::session::Session::load(
        CpuBackend::new(),
        a.target(),
        cache,
        Default::default(),
    )?;
    let mut set = draftlens_engine::prompts::PromptSet::load("builtin:humaneval")?;
    set.truncate(a.drafter_prompts);
    let store = draftlens_results::store::Store::open(&tmp.join("bench.sqlite"))?;
    let l = s.files.spec.num_layers;
    let mut rows = Vec::new();
    for &layers in &a.drafter_layers {
        let dir = tmp.join(format!("drafter-{layers}"));
        let ids: Vec<usize> = (0..5).map(|i| 1 + i * (l - 4) / 4).collect();
        write_random_checkpoint(
            &dir,
            &s.files.spec,
            &RandomDrafter {
                layers,
                block_size: 16,
                target_layer_ids: ids,
                intermediate_size: s.files.spec.intermediate_size,
                mask_token_id: 16,
                sliding_layers: 0,
                sliding_window: 0,
                seed: 1,
            },
        )?;
        let opts = RunOptions {
            name: None,
            mode: draftlens_results::store::RunMode::Deployment,
            eval: Default::default(),
            max_new_tokens: 128,
            fail_after: None,
        };
        let spec = DrafterSpec::Checkpoint {
            dir,
            step: None,
            series: "bench".into(),
        };
        let r = run_eval(&s, &spec, &set, &opts, &store)?;
        let t = |k: &str| r.timings.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        rows.push(DrafterRow {
            layers,
            anchors: r.blocks,
            anchors_per_s: r.blocks as f64 / t("draft_s"),
            target_s: t("target_s"),
            draft_s: t("draft_s"),
            metrics_s: t("metrics_s"),
        });
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(rows)
}
