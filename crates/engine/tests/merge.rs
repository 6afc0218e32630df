//! `draftlens_results::merge` on synthetic shard runs written straight into stores (no model):
//!
//! - merging shards gives the records, prompts and native metrics of the unsharded run of the
//!   same records (several blocks per prompt, categories, target top-K, a shard with no prompt);
//! - `merge_received` (a team server's merge of pushed shards) waits, merges, finds its run
//!   again and refuses as documented;
//! - `merge_bench_100_shards` (ignored; run by hand, docs/scale-out.md §6) times the merge of 100
//!   shards of 1,000 prompts each:
//!   `CARGO_INCREMENTAL=0 cargo test --workspace --test merge -- --ignored --nocapture merge_bench`.

use draftlens_engine::prompts::Prompt;
use draftlens_records::{PositionSpec, RecordBatch, Region};
use draftlens_results::merge::{self, Source};
use draftlens_results::metrics::{summarize, PromptInfo};
use draftlens_results::shard::Shard;
use draftlens_results::store::{FinishedRun, NewRun, RunEval, RunPrompt, Store};
use std::path::Path;
use std::time::Instant;

/// Synthetic evaluation: `n` prompts of `blocks` blocks each, block size `b`, top-K `k`.
struct Synth {
    prompts: Vec<RunPrompt>,
    records: RecordBatch,
}

fn synth(n: u32, blocks: u32, b: u32, k: u32) -> Synth {
    let mut rng = draftlens_engine::util::DetRng::new(0x5eed);
    let mut prompts = Vec::new();
    let mut records = RecordBatch::new(b, k);
    records.target_ids = Some(Vec::new());
    records.target_logprobs = Some(Vec::new());
    for i in 0..n {
        let p = Prompt {
            id: format!("p{i}"),
            text: Some(format!("synthetic prompt number {i}")),
            messages: None,
            category: (i % 3 != 2).then(|| ["code", "math"][(i % 3) as usize].to_string()),
            language: None,
            completion: None,
            enable_thinking: None,
        };
        let prompt_len = 4;
        let seq_len = prompt_len + blocks + b;
        prompts.push(RunPrompt {
            index: i,
            id: p.id.clone(),
            sha256: p.hash(),
            category: p.category.clone(),
            prompt_len,
            token_ids: (0..seq_len).map(|t| t % 50).collect(),
            text: String::new(),
        });
        for a in 0..blocks {
            let pos: Vec<PositionSpec> = (0..b - 1)
                .map(|_| {
                    let t = rng.below(4) as u32;
                    let mut draft: Vec<(u32, f32)> = (0..k)
                        .map(|c| ((rng.below(4) as u32 + c) % 8, -(rng.unit() * 3.0)))
                        .collect();
                    draft.sort_by(|x, y| y.1.total_cmp(&x.1));
                    PositionSpec {
                        target: Some(t),
                        loss_mask: true,
                        draft: draft.clone(),
                        target_top: Some(draft),
                    }
                })
                .collect();
            records.push_block(i, prompt_len + a, Region::Completion, &pos);
        }
    }
    Synth { prompts, records }
}

fn infos(prompts: &[RunPrompt]) -> Vec<PromptInfo> {
    prompts
        .iter()
        .map(|p| PromptInfo {
            index: p.index,
            prompt_len: p.prompt_len as usize,
            seq_len: p.token_ids.len(),
            category: p.category.clone(),
        })
        .collect()
}

fn new_run(b: u32, k: u32) -> NewRun {
    NewRun {
        name: "synthetic".into(),
        block_size: b,
        top_k: k,
        ..Default::default()
    }
}

/// Writes the part of `s` that `shard` owns (everything when None) as one finished run, as
/// `draftlens run` would store it: records in prompt order, metrics from `summarize`.
fn write_run(store: &Store, s: &Synth, shard: Option<Shard>, uid: &str) -> i64 {
    let mine: Vec<&RunPrompt> = s
        .prompts
        .iter()
        .filter(|p| shard.is_none_or(|sh| sh.owns_hash(&p.sha256)))
        .collect();
    let keep: std::collections::BTreeSet<u32> = mine.iter().map(|p| p.index).collect();
    let order: Vec<usize> = (0..s.records.num_blocks())
        .filter(|&i| keep.contains(&s.records.prompt_index[i]))
        .collect();
    let records = s.records.select(&order);
    let prompts: Vec<RunPrompt> = mine.into_iter().cloned().collect();
    let metrics = summarize(&records, &infos(&prompts));
    let eval = RunEval {
        identity: "synthetic-identity".into(),
        identity_json: serde_json::json!({ "synthetic": true }),
        shard,
        set_prompts: s.prompts.len() as u32,
        run_prompts: prompts.len() as u32,
        merged_from: None,
    };
    let name = match shard {
        Some(sh) => format!("synthetic · shard {sh}"),
        None => "synthetic".into(),
    };
    let mut run = new_run(s.records.block_size, s.records.top_k);
    run.name = name;
    store
        .insert_finished_run(&FinishedRun {
            run: &run,
            uid,
            origin: "local",
            eval: &eval,
            prompts: &prompts,
            records: &records,
            metrics: &metrics,
            timings: &serde_json::json!({ "total_s": 1.0 }),
        })
        .unwrap()
        .0
}

fn merge_all(dbs: &[&Path], dest: &Store) -> merge::MergeOutcome {
    let stores: Vec<Store> = dbs.iter().map(|p| Store::open(p).unwrap()).collect();
    let sources: Vec<Source> = stores
        .iter()
        .zip(dbs)
        .map(|(store, p)| Source {
            name: p.display().to_string(),
            store,
        })
        .collect();
    let plan = merge::plan(&sources, None).unwrap();
    merge::execute(&sources, &plan, dest).unwrap()
}

#[test]
fn merged_synthetic_shards_equal_the_unsharded_run() {
    let tmp = tempfile::tempdir().unwrap();
    let s = synth(7, 5, 5, 3);
    let full_store = Store::open(&tmp.path().join("full.sqlite")).unwrap();
    let full = write_run(&full_store, &s, None, "full");
    // 9 shards of 7 prompts: at least two are empty.
    for n in [1u32, 2, 3, 9] {
        let db = tmp.path().join(format!("shards-{n}.sqlite"));
        let store = Store::open(&db).unwrap();
        let empty = (0..n)
            .filter(|&i| {
                let sh = Shard::new(i, n).unwrap();
                write_run(&store, &s, Some(sh), &format!("s{n}-{i}"));
                !s.prompts.iter().any(|p| sh.owns_hash(&p.sha256))
            })
            .count();
        assert!(n != 9 || empty >= 2, "{empty} empty shards of 9");
        let dest = Store::open(&tmp.path().join(format!("merged-{n}.sqlite"))).unwrap();
        let out = merge_all(&[&db], &dest);
        assert!(out.created);
        assert_eq!(
            dest.prompts(out.run_id).unwrap(),
            full_store.prompts(full).unwrap()
        );
        assert!(dest.records(out.run_id).unwrap() == full_store.records(full).unwrap());
        let (a, b) = (
            dest.metrics(out.run_id).unwrap(),
            full_store.metrics(full).unwrap(),
        );
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (&x.source, &x.name, &x.scope),
                (&y.source, &y.name, &y.scope)
            );
            assert_eq!(
                x.value.to_bits(),
                y.value.to_bits(),
                "{} {}",
                x.name,
                x.scope
            );
            assert_eq!(
                (x.count, &x.series),
                (y.count, &y.series),
                "{} {}",
                x.name,
                x.scope
            );
        }
        assert_eq!(dest.run(out.run_id).unwrap().unwrap().run.name, "synthetic");
        // Again: the same run, nothing written.
        let again = merge_all(&[&db], &dest);
        assert_eq!(
            (again.created, again.run_id, again.uid),
            (false, out.run_id, out.uid)
        );
    }
}

/// `merge_received`, a team server's merge of pushed shards (docs/scale-out.md §9): a set
/// waits while a shard is missing, merges once complete into the run `merge` makes of the same
/// shards (same uid, records, metrics), finds that run again, refuses a complete set `plan`
/// refuses (two complete runs of one shard), and refuses shards scored with plugins when no
/// plugin host can re-score them.
#[test]
fn received_shards_merge_once_their_set_is_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let s = synth(7, 5, 5, 3);
    let sh = |i| Shard::new(i, 2).unwrap();
    let team = tmp.path().join("team.sqlite");
    let store = Store::open(&team).unwrap();
    let count = |st: &Store| st.runs(&Default::default()).unwrap().1;
    let got = |uid: &str| merge::merge_received(&store, "team", &[uid.to_string()], None).unwrap();

    write_run(&store, &s, Some(sh(0)), "a0");
    let w = got("a0");
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].state, "waiting", "{w:?}");
    assert!(
        w[0].message
            .contains("1 of 2 shards complete here; waiting for 1/2"),
        "{w:?}"
    );
    assert_eq!(count(&store), 1);

    write_run(&store, &s, Some(sh(1)), "a1");
    let m = got("a1");
    assert_eq!((m[0].state, m[0].shards), ("merged", 2), "{m:?}");
    let uid = m[0].run_uid.clone().unwrap();
    assert_eq!(count(&store), 3);
    // What `draftlens merge` makes of the same shards, in another database.
    let dest = Store::open(&tmp.path().join("merged.sqlite")).unwrap();
    let by_merge = merge_all(&[&team], &dest);
    assert_eq!(by_merge.uid, uid);
    let here = store.run_id_by_uid(&uid).unwrap().unwrap();
    assert!(store.records(here).unwrap() == dest.records(by_merge.run_id).unwrap());
    let bits = |st: &Store, id| {
        st.metrics(id)
            .unwrap()
            .into_iter()
            .map(|m| (m.source, m.name, m.scope, m.value.to_bits(), m.count))
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&store, here), bits(&dest, by_merge.run_id));

    // Received again (either shard): the same run, nothing written.
    for u in ["a0", "a1"] {
        let again = got(u);
        assert_eq!(
            (again[0].state, again[0].run_uid.as_deref()),
            ("already-merged", Some(uid.as_str()))
        );
    }
    assert_eq!(count(&store), 3);

    // A second complete run of shard 1 (a rerun pushed later): refused with merge's message.
    write_run(&store, &s, Some(sh(1)), "a1-rerun");
    let r = got("a1-rerun");
    assert_eq!(r[0].state, "refused", "{r:?}");
    assert!(
        r[0].message
            .contains("overlapping shards: shard 1/2 has 2 complete runs"),
        "{r:?}"
    );
    assert_eq!(count(&store), 4);

    // Shards scored with a plugin, and no plugin host: refused, nothing merged.
    let p = Store::open(&tmp.path().join("plugins.sqlite")).unwrap();
    let prov = draftlens_results::store::PluginProvenance {
        source: "accept-length".into(),
        sha256: "ab".repeat(32),
        version: "1".into(),
        file: "builtin:accept-length".into(),
        builtin: true,
        params_json: "[]".into(),
        scored_at: String::new(),
        stale_since: None,
    };
    for i in 0..2 {
        let id = write_run(&p, &s, Some(sh(i)), &format!("p{i}"));
        p.replace_plugin_metrics(id, &prov, &[]).unwrap();
    }
    let r = merge::merge_received(&p, "team", &["p1".to_string()], None).unwrap();
    assert_eq!(r[0].state, "refused", "{r:?}");
    assert!(
        r[0].message.contains("this server cannot run plugins"),
        "{r:?}"
    );
    assert_eq!(count(&p), 2);
}

/// 100 shards of 1,000 prompts (override with DRAFTLENS_BENCH_SHARDS, _PROMPTS, _BLOCKS): every
/// shard in its own database, as the Slurm array writes them.
#[test]
#[ignore = "benchmark: run by hand (docs/scale-out.md §6)"]
fn merge_bench_100_shards() {
    let env = |k: &str, d: u32| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (shards, per_shard, blocks) = (
        env("DRAFTLENS_BENCH_SHARDS", 100),
        env("DRAFTLENS_BENCH_PROMPTS", 1000),
        env("DRAFTLENS_BENCH_BLOCKS", 8),
    );
    let (b, k) = (16, 8);
    let tmp = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let s = synth(shards * per_shard, blocks, b, k);
    let dbs: Vec<std::path::PathBuf> = (0..shards)
        .map(|i| tmp.path().join(format!("shard-{i}.sqlite")))
        .collect();
    {
        use rayon::prelude::*;
        dbs.par_iter().enumerate().for_each(|(i, db)| {
            let store = Store::open(db).unwrap();
            write_run(
                &store,
                &s,
                Some(Shard::new(i as u32, shards).unwrap()),
                &format!("s{i}"),
            );
        });
    }
    let bytes: u64 = dbs
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    eprintln!(
        "built {shards} shard databases: {} prompts, {} blocks (B {b}, K {k}), {:.0} MiB, in {:.1}s",
        s.prompts.len(),
        s.records.num_blocks(),
        bytes as f64 / 1048576.0,
        t.elapsed().as_secs_f64()
    );
    drop(s);
    let dest = Store::open(&tmp.path().join("merged.sqlite")).unwrap();
    let paths: Vec<&Path> = dbs.iter().map(|p| p.as_path()).collect();
    let t = Instant::now();
    let out = merge_all(&paths, &dest);
    let total = t.elapsed().as_secs_f64();
    assert_eq!(out.prompts, (shards * per_shard) as u64);
    eprintln!(
        "merged {} shards: {} prompts, {} blocks in {total:.2}s (checks {:.2}s, read + metrics + write {:.2}s)",
        out.shards,
        out.prompts,
        out.blocks,
        total - out.seconds,
        out.seconds
    );
}
