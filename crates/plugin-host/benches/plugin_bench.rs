//! Plugin benchmark: blocks/s through the sandbox boundary for the accepted-length plugin vs the
//! same code native, with and without the wall-clock limit (and with fuel), plus plugin load time
//! cold (Cranelift) and from the precompiled cache. Not a test: run it in release mode.
//!
//!     plugins/build.sh
//!     cargo bench -p draftlens-plugin-host --bench plugin_bench -- [--blocks 1000000] [--reps 5] [--wasm PATH]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use draftlens_plugin_host::sdk::{self, Batch};
use draftlens_plugin_host::{Grouping, Inputs, Limits, Runtime, RuntimeConfig, CHUNK_CANDIDATES};
use draftlens_records::RecordBatch;
use metric_accept_length::AcceptLength;

/// B = 16, K = 8; 1000 anchors per prompt; draft top-1 = target with probability 0.8.
fn synthetic(blocks: usize) -> RecordBatch {
    let (b, k) = (16u32, 8u32);
    let p = (b - 1) as usize;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut r = RecordBatch::new(b, k);
    r.prompt_index = (0..blocks).map(|i| (i / 1000) as u32).collect();
    r.anchor = (0..blocks).map(|i| 20 + (i % 1000) as u32).collect();
    r.region = vec![0; blocks];
    r.valid = vec![1; blocks * p];
    r.loss_mask = vec![1; blocks * p];
    r.target = Vec::with_capacity(blocks * p);
    r.draft_ids = Vec::with_capacity(blocks * p * k as usize);
    r.draft_logprobs = Vec::with_capacity(blocks * p * k as usize);
    let lps: Vec<f32> = (0..k).map(|i| -0.2 - i as f32).collect();
    for _ in 0..blocks * p {
        let v = next();
        let t = (v % 50_000) as u32;
        r.target.push(t);
        let top1 = if (v >> 32) % 10 < 8 { t } else { t + 1 };
        r.draft_ids.push(top1);
        for j in 1..k {
            r.draft_ids.push(t + 1 + j);
        }
        r.draft_logprobs.extend_from_slice(&lps);
    }
    r
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut blocks = 1_000_000usize;
    let mut reps = 5usize;
    let mut wasm =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plugins/dist/accept-length.wasm");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--blocks" => {
                blocks = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--blocks N")
            }
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--wasm" => wasm = PathBuf::from(args.next().expect("--wasm PATH")),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    if !wasm.is_file() {
        eprintln!(
            "error: {}: missing; build the plugins with plugins/build.sh first",
            wasm.display()
        );
        std::process::exit(1);
    }
    let t = Instant::now();
    let batch = synthetic(blocks);
    batch.check().unwrap();
    eprintln!(
        "generated {blocks} blocks (B=16, K=8) in {:.1?}",
        t.elapsed()
    );
    let chunk = (CHUNK_CANDIDATES / (15 * 8)).max(1);

    // Native: the same plugin code on borrowed chunks of the same size (no copies at all).
    let view = batch.view();
    let native_run = || {
        let chunks = (0..blocks.div_ceil(chunk)).map(|i| {
            let (s, e) = (i * chunk, ((i + 1) * chunk).min(blocks));
            let (ps, pe) = (s * 15, e * 15);
            Batch {
                prompt_index: &view.prompt_index[s..e],
                anchor: &view.anchor[s..e],
                region: &view.region[s..e],
                target: &view.target[ps..pe],
                valid: &view.valid[ps..pe],
                loss_mask: &view.loss_mask[ps..pe],
                draft_ids: &view.draft_ids[ps * 8..pe * 8],
                draft_logprobs: &view.draft_logprobs[ps * 8..pe * 8],
                ..view
            }
        });
        sdk::evaluate_chunks::<AcceptLength>(&[], chunks).unwrap()
    };
    let reference = native_run();

    let cfg = |time_limit: Option<Duration>, fuel: Option<u64>| RuntimeConfig {
        limits: Limits {
            time_limit,
            fuel,
            ..Limits::default()
        },
        cache_dir: None,
        cache_key_file: None,
    };
    let mut variants: Vec<(&str, Runtime, Grouping)> = vec![
        (
            "wasm, no time limit",
            Runtime::new(cfg(None, None)).unwrap(),
            Grouping::default(),
        ),
        (
            "wasm + epoch time limit",
            Runtime::new(cfg(Some(Duration::from_secs(600)), None)).unwrap(),
            Grouping::default(),
        ),
        (
            "wasm + fuel",
            Runtime::new(cfg(None, Some(u64::MAX / 2))).unwrap(),
            Grouping::default(),
        ),
        (
            "wasm + epoch, per-prompt groups (1000 prompts)",
            Runtime::new(cfg(Some(Duration::from_secs(600)), None)).unwrap(),
            Grouping {
                per_prompt: true,
                ..Default::default()
            },
        ),
    ];
    let mut loaded: Vec<_> = variants
        .iter()
        .map(|(_, rt, _)| rt.load(&wasm).unwrap())
        .collect();
    // The same plugin as if it had declared `Inputs::ALL`: all K ids and log-probs cross the
    // boundary (what the declared top-1 projection saves).
    variants.push((
        "wasm + epoch, no projection (all 8 ids + log-probs sent)",
        Runtime::new(cfg(Some(Duration::from_secs(600)), None)).unwrap(),
        Grouping::default(),
    ));
    let mut unprojected = variants.last().unwrap().1.load(&wasm).unwrap();
    unprojected.metadata.inputs = Inputs::default();
    loaded.push(unprojected);

    // Interleaved repetitions: machine noise hits every variant alike.
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len() + 1];
    for _ in 0..reps {
        let t = Instant::now();
        std::hint::black_box(native_run());
        times[0].push(t.elapsed());
        for (i, ((_, rt, groups), plugin)) in variants.iter().zip(&loaded).enumerate() {
            let t = Instant::now();
            let o = rt.score(plugin, &[], &batch, groups);
            times[i + 1].push(t.elapsed());
            let scores = o.scores.unwrap_or_else(|| panic!("{:?}", o.failure));
            // Same values as native (same code, same order).
            for (w, n) in scores.overall.iter().zip(&reference) {
                assert_eq!(
                    w.value.map(f64::to_bits),
                    Some(n.value.to_bits()),
                    "{}",
                    w.name
                );
            }
        }
    }
    let native = median(times[0].clone());
    println!("blocks: {blocks} (B = 16, K = 8, {chunk} blocks per call), {reps} interleaved reps, medians");
    println!();
    println!("| path | time | M blocks/s | vs native |");
    println!("|---|---|---|---|");
    let row = |name: &str, d: Duration| {
        println!(
            "| {name} | {:.1} ms | {:.2} | {:.2}× |",
            d.as_secs_f64() * 1e3,
            blocks as f64 / d.as_secs_f64() / 1e6,
            d.as_secs_f64() / native.as_secs_f64()
        );
    };
    row("native (same plugin code)", native);
    for (i, (name, _, _)) in variants.iter().enumerate() {
        row(name, median(times[i + 1].clone()));
    }

    // Load time: cold compile vs precompiled cache.
    let cache = std::env::temp_dir().join(format!("draftlens-plugin-bench-{}", std::process::id()));
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut nocache = Vec::new();
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&cache);
        let rt = Runtime::new(RuntimeConfig {
            cache_dir: Some(cache.clone()),
            cache_key_file: None,
            ..cfg(Some(Duration::from_secs(60)), None)
        })
        .unwrap();
        let p = rt.load(&wasm).unwrap();
        assert!(!p.from_cache);
        cold.push(p.load_time);
        let rt = Runtime::new(RuntimeConfig {
            cache_dir: Some(cache.clone()),
            cache_key_file: None,
            ..cfg(Some(Duration::from_secs(60)), None)
        })
        .unwrap();
        let p = rt.load(&wasm).unwrap();
        assert!(p.from_cache);
        warm.push(p.load_time);
        let rt = Runtime::new(cfg(Some(Duration::from_secs(60)), None)).unwrap();
        nocache.push(rt.load(&wasm).unwrap().load_time);
    }
    let _ = std::fs::remove_dir_all(&cache);
    let size = std::fs::metadata(&wasm).unwrap().len();
    println!();
    println!(
        "plugin load ({}, {size} bytes), including describe():",
        wasm.file_name().unwrap().to_string_lossy()
    );
    println!();
    println!("| load | median |");
    println!("|---|---|");
    println!(
        "| cold: compile (Cranelift) + write .cwasm | {:.1} ms |",
        median(cold).as_secs_f64() * 1e3
    );
    println!(
        "| cold: compile, no cache | {:.1} ms |",
        median(nocache).as_secs_f64() * 1e3
    );
    println!(
        "| precompiled cache (.cwasm read + deserialize) | {:.2} ms |",
        median(warm).as_secs_f64() * 1e3
    );
}
