//! Synthetic runs with realistic shapes, for development, tests, screenshots and the benchmark.
//!
//! The shapes follow what real drafters show: acceptance decays with the drafted position,
//! errors cluster (after a miss the next positions are harder), easy tokens (keywords,
//! punctuation, whitespace) are drafted better than identifiers and numbers, code is easier than
//! math which is easier than chat, later checkpoints are better, and train-style evaluation is
//! inflated by mechanism (shared forward, inclusive mask leak) or deflated (data labels).
//! Everything is seeded: the same spec gives the same database.
//!
//! This module turns the synthetic prompts into runs, records and metrics; `language.rs` makes
//! the prompts (a small vocabulary of easy, common and hard tokens).

mod language;

use language::{gen_prompt_set, Class, Vocab};

use crate::analysis::compute_stats;
use crate::stats::Rng;
use anyhow::Result;
use draftlens_records::{RecordBatch, Region};
use draftlens_results::store::{
    MetricRow, MetricScope, NewRun, PromptMeta, RunMode, RunPrompt, RunStatus, Store, TrainStyle,
};
use serde_json::json;
use sha2::{Digest, Sha256};

/// What to generate.
#[derive(Clone, Debug)]
pub struct DemoSpec {
    pub seed: u64,
    /// Prompts in the prompt set (every run with records uses the same set).
    pub prompts: usize,
    /// Continuation length range (tokens).
    pub min_new_tokens: usize,
    pub max_new_tokens: usize,
    pub block_size: u32,
    pub top_k: u32,
    /// Deployment runs of one drafter series, one per checkpoint step, with records.
    pub checkpoints: Vec<i64>,
    /// Add train-style runs at the last checkpoint (strict/target, inclusive/target, inclusive/data).
    pub train_style: bool,
    /// Add a second drafter at the last step (a different architecture choice), with records.
    pub alternative: bool,
    /// Metric-only runs (no records) to fill the run list.
    pub extra_runs: usize,
    /// Add one failed and one still-running run.
    pub failed_and_running: bool,
}

impl DemoSpec {
    /// Small and fast: for unit and browser tests.
    pub fn small() -> Self {
        DemoSpec {
            seed: 7,
            prompts: 12,
            min_new_tokens: 40,
            max_new_tokens: 80,
            block_size: 8,
            top_k: 4,
            checkpoints: vec![4000, 8000, 12000],
            train_style: true,
            alternative: true,
            extra_runs: 6,
            failed_and_running: true,
        }
    }
    /// Looks good in screenshots.
    pub fn showcase() -> Self {
        DemoSpec {
            seed: 11,
            prompts: 48,
            min_new_tokens: 90,
            max_new_tokens: 180,
            block_size: 16,
            top_k: 8,
            checkpoints: vec![2000, 4000, 8000, 12000, 16000, 20000, 24000],
            train_style: true,
            alternative: true,
            extra_runs: 40,
            failed_and_running: true,
        }
    }
    /// The benchmark database: 1,000 list runs and two 1,000-prompt runs with records.
    pub fn bench() -> Self {
        DemoSpec {
            seed: 5,
            prompts: 1000,
            min_new_tokens: 80,
            max_new_tokens: 160,
            block_size: 16,
            top_k: 4,
            checkpoints: vec![20000, 40000],
            train_style: false,
            alternative: false,
            extra_runs: 1000,
            failed_and_running: false,
        }
    }
}

/// Ids of what was created.
#[derive(Clone, Debug, Default)]
pub struct DemoRuns {
    pub checkpoints: Vec<i64>,
    pub train_style: Vec<i64>,
    pub alternative: Option<i64>,
    pub extra: Vec<i64>,
    pub failed: Option<i64>,
    pub running: Option<i64>,
    pub tokenizer_sha256: String,
}

/// How good a drafter is, and how a train-style evaluation distorts it.
#[derive(Clone, Copy)]
struct Skill {
    /// Overall quality in (0, 1].
    base: f64,
    /// Position-1 accuracy forced up (the inclusive-mask leak nearly reveals x_{a+1}).
    leak_first: Option<f64>,
    /// Fraction of labels that disagree with the target (data labels).
    label_noise: f64,
}

fn ease(c: Class) -> f64 {
    match c {
        Class::Easy => 0.985,
        Class::Word => 0.88,
        Class::Hard => 0.5,
    }
}

fn category_factor(cat: &str) -> f64 {
    match cat {
        "code" => 1.0,
        "math" => 0.93,
        _ => 0.82,
    }
}

/// Records of one prompt for one drafter.
fn gen_records(
    rp: &RunPrompt,
    classes: &[Class],
    skill: Skill,
    spec: &DemoSpec,
    vocab_len: u32,
    rng: &mut Rng,
    prompt_anchors: bool,
) -> RecordBatch {
    let g = spec.block_size as usize - 1;
    let kk = spec.top_k as usize;
    let len = rp.token_ids.len() as u32;
    let p = rp.prompt_len;
    let cat = category_factor(rp.category.as_deref().unwrap_or(""));
    // Per-prompt difficulty: some prompts are much harder than others.
    let prompt_factor = (0.85 + 0.3 * rng.f64()).min(1.1);
    let mut b = RecordBatch::new(spec.block_size, spec.top_k);
    let first = if prompt_anchors { p / 2 } else { p };
    for a in first..len {
        b.prompt_index.push(rp.index);
        b.anchor.push(a);
        b.region.push(if a < p {
            Region::Prompt as u8
        } else {
            Region::Completion as u8
        });
        let mut prev_ok = true;
        for k in 1..=g {
            let pos = a + k as u32;
            let valid = pos < len;
            let t = if valid { rp.token_ids[pos as usize] } else { 0 };
            // Data labels: some "targets" are the data's tokens, not the target's greedy ones.
            let label = if valid && rng.f64() < skill.label_noise {
                3 + rng.below(vocab_len as usize - 3) as u32
            } else {
                t
            };
            b.target.push(if valid { label } else { 0 });
            b.valid.push(valid as u8);
            b.loss_mask.push((pos >= p) as u8);
            let class = if valid {
                classes[pos as usize]
            } else {
                Class::Hard
            };
            let mut pc =
                skill.base * ease(class) * cat * prompt_factor * 0.97f64.powi(k as i32 - 1);
            if !prev_ok {
                pc *= 0.8; // errors cluster: after a miss the next position is harder
            }
            if k == 1 {
                if let Some(l) = skill.leak_first {
                    pc = pc.max(l);
                }
            }
            let ok = valid && rng.f64() < pc.min(0.995);
            prev_ok = ok;
            let wrong = |rng: &mut Rng| loop {
                let x = 3 + rng.below(vocab_len as usize - 3) as u32;
                if x != t {
                    break x;
                }
            };
            let top1 = if ok { t } else { wrong(rng) };
            let mut cands = vec![top1];
            // When wrong, the target is often still in the top-K (tree drafting potential).
            let tslot = if !ok && valid && kk > 1 && rng.f64() < 0.55 {
                Some(1 + rng.below(kk - 1))
            } else {
                None
            };
            for j in 1..kk {
                cands.push(if Some(j) == tslot { t } else { wrong(rng) });
            }
            // Probabilities, best first: the top-1 is the most likely candidate.
            let conf = if ok {
                0.55 + 0.44 * rng.f64()
            } else {
                0.2 + 0.45 * rng.f64()
            };
            let mut rest = 1.0 - conf;
            let mut prev = conf;
            b.draft_ids.extend(&cands);
            b.draft_logprobs.push(conf.ln() as f32);
            for _ in 1..kk {
                let p = (rest * (0.3 + 0.4 * rng.f64())).min(prev);
                rest -= p;
                prev = p;
                b.draft_logprobs.push(p.max(1e-9).ln() as f32);
            }
        }
    }
    b
}

fn sha_of(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Fills `store` with synthetic runs.
pub fn fill_demo_db(store: &Store, spec: &DemoSpec) -> Result<DemoRuns> {
    let mut vocab = Vocab::new();
    let set = gen_prompt_set(&mut vocab, spec);
    let tok_sha = sha_of(&format!("demo-tokenizer:{}", vocab.pieces.join("\u{1}")));
    store.put_vocab(&tok_sha, "demo-bpe", &vocab.pieces)?;
    let mut out = DemoRuns {
        tokenizer_sha256: tok_sha.clone(),
        ..Default::default()
    };
    let vlen = vocab.pieces.len() as u32;
    let series = "dflash-qwen3-1.7b-b16";
    let prompt_set = "humaneval+gsm8k+mtbench (synthetic)";

    let base_run = |name: String, step: i64, drafter_series: &str| NewRun {
        name,
        mode: RunMode::Deployment,
        config: json!({
            "anchors": {"policy": "all"},
            "generation": {"max_new_tokens": spec.max_new_tokens, "temperature": 0.0},
            "drafter": {"block_size": spec.block_size, "target_layer_ids": [1, 9, 17, 25], "layers": 5},
            "top_k": spec.top_k,
        }),
        target_path: "/models/Qwen3-1.7B".into(),
        target_sha256: sha_of("qwen3-1.7b"),
        target_arch: "qwen3".into(),
        drafter_path: format!("/ckpts/{drafter_series}/step-{step}"),
        drafter_sha256: sha_of(&format!("{drafter_series}@{step}")),
        drafter_series: drafter_series.into(),
        drafter_step: Some(step),
        prompt_set_name: prompt_set.into(),
        prompt_set_sha256: set.sha256.clone(),
        backend: "cpu".into(),
        dtype: "bf16".into(),
        block_size: spec.block_size,
        top_k: spec.top_k,
        train_style: None,
        tokenizer_sha256: Some(tok_sha.clone()),
        drafter_family: "dflash".into(),
    };

    let record_run = |new: &NewRun, skill: Skill, seed: u64, prompt_anchors: bool| -> Result<i64> {
        let id = store.create_run(new)?;
        let prompts: Vec<RunPrompt> = set.prompts.iter().map(|(p, _)| p.clone()).collect();
        store.add_prompts(id, &prompts)?;
        let mut rng = Rng::new(seed);
        let mut all = RecordBatch::new(spec.block_size, spec.top_k);
        for (p, classes) in &set.prompts {
            let b = gen_records(p, classes, skill, spec, vlen, &mut rng, prompt_anchors);
            all.extend(&b);
            if all.num_blocks() > 20_000 {
                store.add_records(id, &all)?;
                all = RecordBatch::new(spec.block_size, spec.top_k);
            }
        }
        store.add_records(id, &all)?;
        let metas: Vec<PromptMeta> = store.prompt_metas(id)?;
        let records = store.records(id)?;
        let stats = compute_stats(&records, &metas);
        // The engine's own metric code, as `draftlens run` stores it.
        let infos: Vec<draftlens_results::metrics::PromptInfo> = metas
            .iter()
            .map(|m| draftlens_results::metrics::PromptInfo {
                index: m.index,
                prompt_len: m.prompt_len as usize,
                seq_len: m.num_tokens as usize,
                category: m.category.clone(),
            })
            .collect();
        store.add_metrics(id, &draftlens_results::metrics::summarize(&records, &infos))?;
        let blocks = stats.total_blocks() as f64;
        store.finish_run(
            id,
            RunStatus::Complete,
            None,
            &json!({"target_extract_s": (4.0 * blocks).round() / 1e3, "drafting_s": (2.1 * blocks).round() / 1e3, "metrics_s": (0.2 * blocks).round() / 1e3}),
        )?;
        Ok(id)
    };

    let n = spec.checkpoints.len().max(1) as f64;
    let skill_at = |i: usize| 0.74 + 0.2 * (1.0 - (-(i as f64 + 1.0) * 2.2 / n).exp());
    for (i, &step) in spec.checkpoints.iter().enumerate() {
        let new = base_run(format!("{series} @ step {step}"), step, series);
        let skill = Skill {
            base: skill_at(i),
            leak_first: None,
            label_noise: 0.0,
        };
        out.checkpoints
            .push(record_run(&new, skill, spec.seed * 1000 + i as u64, false)?);
    }
    let last_i = spec.checkpoints.len().saturating_sub(1);
    let last_step = spec.checkpoints.last().copied().unwrap_or(0);
    let last_skill = skill_at(last_i);
    if spec.train_style {
        let variants = [
            (
                "strict",
                "target",
                Skill {
                    base: (last_skill * 1.1).min(0.99),
                    leak_first: None,
                    label_noise: 0.0,
                },
            ),
            (
                "inclusive",
                "target",
                Skill {
                    base: (last_skill * 1.16).min(0.99),
                    leak_first: Some(0.97),
                    label_noise: 0.0,
                },
            ),
            (
                "inclusive",
                "data",
                Skill {
                    base: (last_skill * 1.16).min(0.99),
                    leak_first: Some(0.97),
                    label_noise: 0.09,
                },
            ),
        ];
        for (j, (mask, labels, skill)) in variants.into_iter().enumerate() {
            let mut new = base_run(
                format!("{series} @ step {last_step} · train-style {mask}/{labels}"),
                last_step,
                series,
            );
            new.mode = RunMode::TrainStyle;
            new.train_style = Some(TrainStyle {
                labels: labels.into(),
                mask_rule: mask.into(),
            });
            new.config["train_style"] =
                json!({"mask_rule": mask, "labels": labels, "shared_forward": true});
            out.train_style
                .push(record_run(&new, skill, spec.seed * 2000 + j as u64, true)?);
        }
    }
    if spec.alternative {
        let alt_series = "dflash-qwen3-1.7b-b16-3layer";
        let mut new = base_run(
            format!("{alt_series} @ step {last_step}"),
            last_step,
            alt_series,
        );
        new.config["drafter"]["layers"] = json!(3);
        new.config["drafter"]["target_layer_ids"] = json!([2, 14, 26]);
        let skill = Skill {
            base: last_skill * 0.95,
            leak_first: None,
            label_noise: 0.0,
        };
        out.alternative = Some(record_run(&new, skill, spec.seed * 3000, false)?);
    }

    // Metric-only runs: other targets, backends, prompt sets, steps.
    let mut rng = Rng::new(spec.seed ^ 0xface);
    let targets = [
        ("qwen3", "/models/Qwen3-4B"),
        ("qwen3", "/models/Qwen3-8B"),
        ("llama", "/models/Llama-3.1-8B"),
        ("qwen2", "/models/Qwen2.5-7B"),
    ];
    let sets = ["gsm8k", "humaneval", "mt-bench", "math500", "alpaca"];
    for i in 0..spec.extra_runs {
        let (arch, tpath) = targets[i % targets.len()];
        let set_name = sets[(i / 4) % sets.len()];
        let step = 1000 * (1 + (i as i64 * 7) % 40);
        let drafter = format!(
            "dflash-{}-b16",
            tpath.rsplit('/').next().unwrap_or("t").to_lowercase()
        );
        let mut new = base_run(
            format!("{drafter} @ step {step} · {set_name}"),
            step,
            &drafter,
        );
        new.target_arch = arch.into();
        new.target_path = tpath.into();
        new.target_sha256 = sha_of(tpath);
        new.prompt_set_name = set_name.into();
        new.prompt_set_sha256 = sha_of(set_name);
        new.backend = if i % 3 == 0 {
            "cuda".into()
        } else {
            "cpu".into()
        };
        new.tokenizer_sha256 = None;
        if i % 11 == 5 {
            new.mode = RunMode::TrainStyle;
            new.train_style = Some(TrainStyle {
                labels: "target".into(),
                mask_rule: "strict".into(),
            });
        }
        let id = store.create_run(&new)?;
        let q = 0.55 + 0.4 * (step as f64 / 40_000.0) + 0.05 * rng.normal();
        let tau = 1.0 + q * 4.2;
        let rows = vec![
            MetricRow::scalar(
                crate::analysis::SOURCE,
                "tau_replayed_macro",
                MetricScope::Run,
                tau,
                100,
                true,
            ),
            MetricRow::scalar(
                crate::analysis::SOURCE,
                "tau_uniform",
                MetricScope::Run,
                tau * 1.08,
                100,
                true,
            ),
            MetricRow::scalar(
                crate::analysis::SOURCE,
                "flat_accuracy",
                MetricScope::Run,
                (0.35 + 0.45 * q).min(1.0),
                100,
                true,
            ),
            MetricRow::scalar(
                crate::analysis::SOURCE,
                "draft_nll",
                MetricScope::Run,
                2.2 - 1.2 * q,
                100,
                false,
            ),
        ];
        store.add_metrics(id, &rows)?;
        store.finish_run(
            id,
            RunStatus::Complete,
            None,
            &json!({"total_s": 60.0 + 5.0 * i as f64}),
        )?;
        out.extra.push(id);
    }

    if spec.failed_and_running {
        let mut new = base_run(
            format!("{series} @ step {last_step} · cuda"),
            last_step,
            series,
        );
        new.backend = "cuda".into();
        let id = store.create_run(&new)?;
        store.add_plugin_failure(
            id,
            "ddtree-bound",
            "trap",
            "wasm trap: out of fuel after 10000000 instructions",
        )?;
        store.finish_run(
            id,
            RunStatus::Failed,
            Some("CUDA_ERROR_OUT_OF_MEMORY while extracting taps for prompt 17"),
            &json!({}),
        )?;
        out.failed = Some(id);
        let new = base_run(
            format!("{series} @ step {} (in progress)", last_step + 4000),
            last_step + 4000,
            series,
        );
        out.running = Some(store.create_run(&new)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{load_stats, SOURCE};
    use draftlens_results::store::RunFilter;

    #[test]
    fn demo_shapes_are_realistic() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(&d.path().join("demo.sqlite")).unwrap();
        let runs = fill_demo_db(&store, &DemoSpec::small()).unwrap();
        assert_eq!(runs.checkpoints.len(), 3);
        let (_, total) = store.runs(&RunFilter::default()).unwrap();
        assert_eq!(total, 3 + 3 + 1 + 6 + 2);
        let tau = |id: i64| {
            store
                .metrics(id)
                .unwrap()
                .iter()
                .find(|m| {
                    m.source == SOURCE
                        && m.name == "tau_replayed_macro"
                        && m.scope == MetricScope::Run
                })
                .unwrap()
                .value
        };
        // Later checkpoints are better; τ is in a realistic range for B = 8.
        let t: Vec<f64> = runs.checkpoints.iter().map(|&i| tau(i)).collect();
        assert!(t[0] < t[2], "{t:?}");
        assert!(t.iter().all(|&x| (1.5..7.0).contains(&x)), "{t:?}");
        // Train-style with the inclusive leak looks better than deployment (the inflation).
        let flat = |id: i64| {
            store
                .metrics(id)
                .unwrap()
                .iter()
                .find(|m| m.name == "flat_accuracy" && m.scope == MetricScope::Run)
                .unwrap()
                .value
        };
        assert!(flat(runs.train_style[1]) > flat(*runs.checkpoints.last().unwrap()) + 0.05);
        // Acceptance decays along positions.
        let run = store.run(runs.checkpoints[2]).unwrap().unwrap().run;
        let st = load_stats(&store, &run).unwrap().unwrap();
        let c = crate::analysis::position_curve(&st, false, 0, "");
        assert!(c.value[0].unwrap() > c.value[6].unwrap());
        // Stats are cached after the first computation.
        assert!(store
            .derived(run.id, crate::analysis::STATS_KIND)
            .unwrap()
            .is_some());
    }
}
