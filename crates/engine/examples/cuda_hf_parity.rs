//! Parity with Hugging Face transformers, Rust half (docs/cuda.md): writes a random Qwen3 checkpoint
//! (HF names, bf16 safetensors + config.json) to DIR, loads it through draftlens' own loader and
//! target model on the CPU and CUDA backends, prints the CPU-vs-CUDA parity report and saves every
//! hidden state of both backends (and the input ids and greedy tokens) to
//! DIR/draftlens_hidden.safetensors. `tools/bench/hf_parity.py DIR` then runs transformers (bf16
//! sdpa, and an fp32 eager "gold" run) on the same checkpoint and inputs and compares.
//!
//! cuda_hf_parity DIR [--cpu-check]   (--cpu-check: without a GPU, run the CPU twice to check the
//! checkpoint writing and loading path)

use anyhow::{Context, Result};
use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::cuda::CudaBackend;
use draftlens_engine::backend::Backend;
use draftlens_engine::formats::WeightSource;
use draftlens_engine::model::capture::Capture;
use draftlens_engine::model::load::TargetFiles;
use draftlens_engine::model::random::{qwen3_8b_spec, RandomWeights};
use draftlens_engine::model::transformer::TargetModel;
use draftlens_engine::model::ModelSpec;
use draftlens_engine::parity::{format_checks, target_parity};
use draftlens_engine::util::host_random;
use safetensors::{Dtype, View};
use std::borrow::Cow;
use std::path::Path;

struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn bf16_raw(v: &[f32], shape: Vec<usize>) -> Raw {
    Raw {
        dtype: Dtype::BF16,
        shape,
        data: v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
    }
}
fn f32_raw(v: &[f32], shape: Vec<usize>) -> Raw {
    Raw {
        dtype: Dtype::F32,
        shape,
        data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}
fn i32_raw(v: &[u32], shape: Vec<usize>) -> Raw {
    Raw {
        dtype: Dtype::I32,
        shape,
        data: v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
    }
}

fn write(path: &Path, tensors: Vec<(String, Raw)>) -> Result<()> {
    let refs: Vec<(String, &Raw)> = tensors.iter().map(|(n, r)| (n.clone(), r)).collect();
    safetensors::serialize_to_file(refs, None, path)
        .with_context(|| format!("{}: cannot write", path.display()))
}

fn main() -> Result<()> {
    let dir = std::env::args()
        .nth(1)
        .context("usage: cuda_hf_parity DIR")?;
    let dir = Path::new(&dir);
    std::fs::create_dir_all(dir)?;
    let cpu_check = std::env::args().any(|a| a == "--cpu-check");
    let gpu = match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) if cpu_check => {
            println!("{e}; checking the checkpoint path on the CPU only");
            None
        }
        Err(e) => {
            println!("SKIP: {e}");
            return Ok(());
        }
    };
    // Qwen3-0.6B widths (head_dim 128, GQA 2:1) with 6 layers, a small vocabulary and tied
    // embeddings; weights of std 0.05 and norms in 1 ± 0.3, bf16-exact (the checkpoint is bf16).
    let spec = ModelSpec {
        vocab_size: 8192,
        hidden_size: 1024,
        intermediate_size: 3072,
        num_layers: 6,
        num_heads: 16,
        num_kv_heads: 8,
        head_dim: 128,
        tie_word_embeddings: true,
        max_position_embeddings: 4096,
        ..qwen3_8b_spec()
    };
    let w = RandomWeights::new(&spec, 2024)
        .with_init(0.05, 0.3)
        .bf16_exact();
    let mut tensors = Vec::new();
    for info in w.tensors() {
        let t = w.tensor(&info.name)?;
        tensors.push((info.name, bf16_raw(&t.data, t.shape)));
    }
    write(&dir.join("model.safetensors"), tensors)?;
    let config = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps, "rope_theta": spec.rope_theta, "max_position_embeddings": 4096, "tie_word_embeddings": true, "attention_bias": false,
        "use_sliding_window": false, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;

    let prompts: Vec<Vec<u32>> = [(300usize, 1u64), (45, 2), (1000, 3)]
        .iter()
        .map(|&(n, seed)| {
            host_random(n, seed + 500)
                .into_iter()
                .map(|x| (((x + 1.0) * 0.5) * (spec.vocab_size - 1) as f32) as u32)
                .collect()
        })
        .collect();
    let files = TargetFiles::open(dir)?;
    let cpu = CpuBackend::new();
    let rep = match &gpu {
        Some(gpu) => target_parity(&cpu, gpu, &files.spec, files.weights.as_ref(), &prompts)?,
        None => target_parity(&cpu, &cpu, &files.spec, files.weights.as_ref(), &prompts)?,
    };
    println!(
        "{}",
        format_checks(
            &format!(
                "draftlens TargetModel, CPU (reference) vs CUDA, {} prompts / {} tokens",
                rep.prompts, rep.tokens
            ),
            &rep.layers
        )
    );
    println!(
        "greedy agreement: {}/{} all positions, {}/{} decisive (margin > 0.1 nats)",
        rep.greedy_agree, rep.greedy_total, rep.greedy_agree_decisive, rep.greedy_decisive
    );

    // Hidden states of both backends for the Python comparison.
    let capture = Capture::hf_indices((0..=spec.num_layers).collect(), spec.num_layers)?;
    let mut out = Vec::new();
    fn dump<B: Backend>(
        be: &B,
        files: &TargetFiles,
        prompts: &[Vec<u32>],
        capture: &Capture,
        out: &mut Vec<(String, Raw)>,
    ) -> Result<()> {
        let m = TargetModel::load(be, &files.spec, files.weights.as_ref())?;
        for (j, ids) in prompts.iter().enumerate() {
            let o = m.forward(be, ids, &mut m.new_cache(), capture)?;
            for (i, t) in &o.captured.states {
                let (r, c) = be.dims(t);
                out.push((
                    format!("{}.hs.{i}.p{j}", be.name()),
                    f32_raw(&be.to_host(t)?, vec![r, c]),
                ));
            }
            let top = m.logits_topk(be, &o.last_hidden, 1)?;
            out.push((
                format!("{}.greedy.p{j}", be.name()),
                i32_raw(&top.ids, vec![ids.len()]),
            ));
        }
        Ok(())
    }
    if let Some(gpu) = &gpu {
        dump(gpu, &files, &prompts, &capture, &mut out)?;
    }
    dump(&cpu, &files, &prompts, &capture, &mut out)?;
    for (j, ids) in prompts.iter().enumerate() {
        out.push((format!("ids.p{j}"), i32_raw(ids, vec![ids.len()])));
    }
    write(&dir.join("draftlens_hidden.safetensors"), out)?;
    println!("wrote {}", dir.display());
    Ok(())
}
