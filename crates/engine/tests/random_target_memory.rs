//! A `random:DIR` target's generator holds one tensor at a time in host memory: the bf16 bytes
//! `WeightSource::raw` hands the loader leave the process at `release` (as a file's pages do,
//! tests/host_memory.rs), and gpt-oss's MXFP4 experts are generated one expert at a time. Measured
//! on this process's resident anonymous memory (`RssAnon` in /proc/self/status; Linux only, skips
//! elsewhere), in a test binary of its own so that no other test allocates meanwhile. Also prints
//! the generation rate on this machine (docs/loading.md §7 quotes it).

use draftlens_engine::formats::WeightSource;
use draftlens_engine::model::random_target::RandomTarget;
use draftlens_engine::model::ModelSpec;
use std::path::Path;
use std::time::Instant;

/// This process's resident anonymous memory in bytes, `None` without /proc/self/status.
fn rss_anon() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

const MIB: u64 = 1 << 20;

#[test]
fn generating_a_model_holds_one_tensor_at_a_time() {
    if rss_anon().is_none() {
        eprintln!("no /proc/self/status: skipped");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A dense model of 0.55 B parameters (1.1 GB of bf16), the largest tensor 128 MiB, and a
    // gpt-oss-shaped MXFP4 layer pair: 64 experts of 2880 (0.77 GB of packed bytes).
    let dense = serde_json::json!({
        "model_type": "qwen3", "vocab_size": 65536, "hidden_size": 1024,
        "intermediate_size": 4096, "num_hidden_layers": 16, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 128
    });
    let oss = serde_json::json!({
        "model_type": "gpt_oss", "vocab_size": 4096, "hidden_size": 2880,
        "intermediate_size": 2880, "num_hidden_layers": 2, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 64,
        "num_experts_per_tok": 4, "sliding_window": 128,
        "quantization_config": {"quant_method": "mxfp4"}
    });
    let mut rates = Vec::new();
    for (name, config) in [("dense", dense), ("oss", oss)] {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let spec = ModelSpec::from_hf_config(&dir.join("config.json")).unwrap();
        let w = RandomTarget::open(&dir)
            .unwrap()
            .weights(&spec, Path::new("random:memory"));
        // `held`: the most bytes one request hands out (a 2-D tensor, or one expert's blocks).
        let (mut total, mut held, mut peak) = (0u64, 0u64, 0u64);
        let before = rss_anon().unwrap();
        let t0 = Instant::now();
        for t in w.tensors() {
            total += t.bytes;
            if t.dtype == "U8" {
                // The loader asks for one expert at a time (formats::mxfp4::Mxfp4Tensor).
                for e in 0..t.shape[0] {
                    let bytes = w.generated_u8_slice(&t.name, e).unwrap();
                    held = held.max(bytes.len() as u64);
                    peak = peak.max(rss_anon().unwrap());
                    drop(bytes);
                }
                continue;
            }
            match w.raw(&t.name).unwrap() {
                Some(r) => {
                    assert_eq!(r.bytes.len() as u64, t.bytes);
                    held = held.max(t.bytes);
                    peak = peak.max(rss_anon().unwrap());
                    w.release(&t.name);
                }
                None => drop(w.tensor(&t.name).unwrap()),
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        let after = rss_anon().unwrap();
        eprintln!(
            "{name}: {:.0} MiB generated in {seconds:.2} s ({:.0} MiB/s on {} threads); resident anon memory {:.0} MiB before, peak {:.0} MiB, {:.0} MiB after; at most {:.0} MiB handed out at once",
            total as f64 / MIB as f64,
            total as f64 / MIB as f64 / seconds,
            rayon::current_num_threads(),
            before as f64 / MIB as f64,
            peak as f64 / MIB as f64,
            after as f64 / MIB as f64,
            held as f64 / MIB as f64,
        );
        rates.push(total as f64 / seconds);
        assert!(
            total > 700 * MIB,
            "{name}: a model much larger than the allowance below"
        );
        // At most one request's bytes (plus the allocator's and rayon's slack) are resident at
        // any time, and nothing stays: for gpt-oss one expert's blocks (8 MiB), not the layer's
        // 0.5 GiB tensor.
        let slack = 48 * MIB;
        assert!(
            peak <= before + held + slack,
            "{name}: peak {peak} with {before} before, {held} handed out at once"
        );
        assert!(
            after <= before + slack,
            "{name}: {after} after, {before} before"
        );
    }
    eprintln!(
        "generation rate: {:.0} MiB/s (dense bf16), {:.0} MiB/s (MXFP4 model)",
        rates[0] / MIB as f64,
        rates[1] / MIB as f64
    );
}
