//! The store's unit tests (~950 lines, over the ~800 guideline: one file per concern would split
//! the shared fixtures; the hostile-input tests are in `tests_hostile.rs`).

use super::*;
use draftlens_records::{RecordBatch, Region};
use serde_json::json;

fn new_run(name: &str) -> NewRun {
    NewRun {
        name: name.into(),
        mode: RunMode::Deployment,
        config: json!({"anchors": "all", "max_new_tokens": 64}),
        target_path: "/models/qwen3-0.6b".into(),
        target_sha256: "aa".repeat(32),
        target_arch: "qwen3".into(),
        drafter_path: "/ckpt/step-1000".into(),
        drafter_sha256: "bb".repeat(32),
        drafter_series: "ckpt".into(),
        drafter_step: Some(1000),
        prompt_set_name: "humaneval".into(),
        prompt_set_sha256: "cc".repeat(32),
        backend: "cpu".into(),
        dtype: "f32".into(),
        block_size: 4,
        top_k: 2,
        train_style: None,
        tokenizer_sha256: None,
        drafter_family: String::new(),
    }
}

/// A batch with `n` blocks of prompt `p`, every column holding distinct, checkable values.
fn batch(p: u32, n: usize, with_target_topk: bool) -> RecordBatch {
    let mut b = RecordBatch::new(4, 2);
    for i in 0..n {
        b.prompt_index.push(p);
        b.anchor.push(10 + i as u32);
        b.region.push(if i % 5 == 0 {
            Region::Prompt as u8
        } else {
            Region::Completion as u8
        });
        for k in 0..3 {
            let x = (p * 1000 + i as u32 * 10 + k) as u32;
            b.target.push(x);
            b.valid.push((i + k as usize) as u8 % 2);
            b.loss_mask.push(1);
            b.draft_ids.extend([x, x + 1]);
            b.draft_logprobs.extend([-0.25 * k as f32, -1.5 - i as f32]);
        }
    }
    if with_target_topk {
        b.target_ids = Some(b.draft_ids.iter().map(|x| x + 7).collect());
        b.target_logprobs = Some(b.draft_logprobs.iter().map(|x| x - 0.5).collect());
    }
    b
}

fn tmp() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("runs.sqlite");
    (d, p)
}

#[test]
fn migrates_from_empty_and_sets_pragmas() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    assert_eq!(s.schema_version().unwrap(), schema::latest_version());
    s.read(|c| {
        let fk: i64 = c.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
        let jm: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        let bt: i64 = c.query_row("PRAGMA busy_timeout", [], |r| r.get(0))?;
        assert_eq!((fk, jm.as_str(), bt), (1, "wal", 10_000));
        let tables: String = c.query_row(
            "SELECT group_concat(name, ',') FROM (SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name)",
            [],
            |r| r.get(0),
        )?;
        assert_eq!(
            tables,
            "api_token,baseline,derived,import_log,metric,plugin_failure,plugin_run,record_chunk,run,run_eval,run_prompt,share,sqlite_sequence,trace_diff,trace_diff_prompt,trace_diff_round,vocab,watch_checkpoint"
        );
        Ok(())
    })
    .unwrap();
}

#[test]
fn second_open_keeps_data_and_refuses_newer_schema() {
    let (_d, path) = tmp();
    let id = {
        let s = Store::open(&path).unwrap();
        s.create_run(&new_run("first")).unwrap()
    };
    let s = Store::open(&path).unwrap();
    assert_eq!(s.run(id).unwrap().unwrap().run.name, "first");
    assert_eq!(s.schema_version().unwrap(), schema::latest_version());
    drop(s);
    // A database from a newer draftlens is refused with a clear message, not mangled.
    let c = Connection::open(&path).unwrap();
    c.pragma_update(None, "user_version", 99).unwrap();
    drop(c);
    let err = Store::open(&path).err().unwrap().to_string();
    assert!(err.contains("schema version 99 is newer"), "{err}");
    assert!(err.contains("runs.sqlite"), "{err}");
}

#[test]
fn not_a_database_is_a_clear_error() {
    let (_d, path) = tmp();
    std::fs::write(
        &path,
        b"this is not sqlite, just text that is long enough to have a header",
    )
    .unwrap();
    let err = format!("{:#}", Store::open(&path).err().unwrap());
    assert!(err.contains("runs.sqlite"), "{err}");
}

#[test]
fn record_batch_round_trip_across_chunks_and_prompts() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let id = s.create_run(&new_run("rt")).unwrap();
    let mut all = batch(0, 3, true);
    all.extend(&batch(1, CHUNK_BLOCKS + 7, true)); // spans two chunks
    all.extend(&batch(0, 2, true)); // prompt 0 again later
    s.add_records(id, &all).unwrap();
    let back = s.records(id).unwrap();
    assert_eq!(back, all);
    // Per-prompt read returns exactly that prompt's blocks, in order.
    let p0 = s.prompt_records(id, 0).unwrap();
    assert_eq!(p0.num_blocks(), 5);
    assert_eq!(p0.anchor, vec![10, 11, 12, 10, 11]);
    assert_eq!(p0.target_ids.as_ref().unwrap().len(), 5 * 3 * 2);
    assert_eq!(
        s.run(id).unwrap().unwrap().run.num_blocks,
        (CHUNK_BLOCKS + 12) as u64
    );
    assert_eq!(s.record_prompts(id).unwrap(), vec![0, 1]);
    let chunks: i64 = s
        .read(|c| {
            Ok(c.query_row(
                "SELECT count(*) FROM record_chunk WHERE run_id = ?1",
                [id],
                |r| r.get(0),
            )?)
        })
        .unwrap();
    assert_eq!(chunks, 4);
}

#[test]
fn optional_target_topk_is_none_when_any_chunk_lacks_it() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let id = s.create_run(&new_run("opt")).unwrap();
    s.add_records(id, &batch(0, 2, true)).unwrap();
    s.add_records(id, &batch(1, 2, false)).unwrap();
    let back = s.records(id).unwrap();
    assert_eq!(back.target_ids, None);
    assert_eq!(back.num_blocks(), 4);
    assert_eq!(
        s.records(s.create_run(&new_run("empty")).unwrap())
            .unwrap()
            .num_blocks(),
        0
    );
}

#[test]
fn bad_batches_are_refused_whole() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let id = s.create_run(&new_run("bad")).unwrap();
    let mut b = batch(0, 3, false);
    b.draft_ids.pop();
    let err = s.add_records(id, &b).unwrap_err().to_string();
    assert!(err.contains("draft_ids"), "{err}");
    let mut wrong = batch(0, 1, false);
    wrong.block_size = 8;
    wrong.target = vec![0; 7];
    wrong.valid = vec![0; 7];
    wrong.loss_mask = vec![0; 7];
    wrong.draft_ids = vec![0; 14];
    wrong.draft_logprobs = vec![0.0; 14];
    let err = s.add_records(id, &wrong).unwrap_err().to_string();
    assert!(err.contains("block size 4"), "{err}");
    assert_eq!(s.records(id).unwrap().num_blocks(), 0);
    assert!(s
        .add_records(9999, &batch(0, 1, false))
        .unwrap_err()
        .to_string()
        .contains("run 9999 does not exist"));
}

#[test]
fn failed_run_stays_failed_and_interrupted_run_is_marked_at_the_next_open() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let a = s.create_run(&new_run("interrupted")).unwrap();
    s.add_records(a, &batch(0, 2, false)).unwrap();
    // The process "dies" here: nothing finishes the run. A fresh open must not see it complete;
    // no process has the database open any more, so it is marked interrupted (liveness.rs).
    drop(s);
    let s = Store::open(&path).unwrap();
    let r = s.run(a).unwrap().unwrap().run;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(
        r.error.as_deref().unwrap().starts_with("interrupted"),
        "{:?}",
        r.error
    );
    assert!(r.finished_at.is_some());

    let b = s.create_run(&new_run("fails")).unwrap();
    s.add_plugin_failure(b, "tau", "trap", "wasm trap: unreachable")
        .unwrap();
    s.finish_run(
        b,
        RunStatus::Failed,
        Some("target OOM at prompt 3"),
        &json!({"total_s": 1.5}),
    )
    .unwrap();
    let d = s.run(b).unwrap().unwrap();
    assert_eq!(d.run.status, RunStatus::Failed);
    assert_eq!(d.run.error.as_deref(), Some("target OOM at prompt 3"));
    assert_eq!(d.run.timings, json!({"total_s": 1.5}));
    assert!(d.run.finished_at.is_some());
    assert_eq!(d.failures.len(), 1);
    assert_eq!(d.failures[0].message, "wasm trap: unreachable");
    // Its outcome is final: it can't be completed later or get more records.
    let err = s
        .finish_run(b, RunStatus::Complete, None, &json!({}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is failed"), "{err}");
    assert!(s.add_records(b, &batch(0, 1, false)).is_err());
    assert!(s
        .finish_run(a, RunStatus::Complete, Some("x"), &json!({}))
        .is_err());
    // Metrics can still be re-scored on finished runs.
    s.add_metrics(
        b,
        &[MetricRow::scalar(
            "native",
            "tau",
            MetricScope::Run,
            2.0,
            10,
            true,
        )],
    )
    .unwrap();
}

#[test]
fn prompts_and_metrics_round_trip() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let id = s.create_run(&new_run("m")).unwrap();
    let p = RunPrompt {
        index: 0,
        id: "HumanEval/0".into(),
        sha256: "dd".repeat(32),
        category: Some("code".into()),
        prompt_len: 3,
        token_ids: vec![1, 2, 3, 4, 70000],
        text: "def f(): <script>alert(1)</script>".into(),
    };
    s.add_prompt(id, &p).unwrap();
    assert!(
        s.add_prompt(id, &p).is_err(),
        "duplicate index must be refused"
    );
    assert_eq!(s.prompts(id).unwrap(), vec![p.clone()]);
    assert_eq!(s.prompt(id, 0).unwrap(), Some(p.clone()));
    assert_eq!(s.prompt_metas(id).unwrap()[0].num_tokens, 5);
    assert_eq!(s.run(id).unwrap().unwrap().run.num_prompts, 1);
    let mut series = MetricRow::scalar("native", "acc_by_pos", MetricScope::Run, 0.5, 30, true);
    series.series = Some(json!([0.9, 0.5, 0.1]));
    series.unit = "fraction".into();
    let rows = vec![
        MetricRow::scalar("native", "tau", MetricScope::Run, 2.5, 12, true),
        MetricRow::scalar("native", "tau", MetricScope::Prompt(0), 2.25, 4, true),
        MetricRow::scalar(
            "native",
            "tau",
            MetricScope::Category("code".into()),
            f64::NAN,
            0,
            true,
        ),
        series.clone(),
    ];
    s.add_metrics(id, &rows).unwrap();
    let back = s.metrics(id).unwrap();
    assert_eq!(back.len(), 4);
    let nan = back
        .iter()
        .find(|m| m.scope == MetricScope::Category("code".into()))
        .unwrap();
    assert!(nan.value.is_nan());
    assert!(back.contains(&series));
    // Replacing a metric keeps one row.
    s.add_metrics(
        id,
        &[MetricRow::scalar(
            "native",
            "tau",
            MetricScope::Run,
            2.75,
            12,
            true,
        )],
    )
    .unwrap();
    let run_scope = s.metrics_in_scope(id, &MetricScope::Run).unwrap();
    assert_eq!(run_scope.iter().filter(|m| m.name == "tau").count(), 1);
    assert_eq!(
        run_scope.iter().find(|m| m.name == "tau").unwrap().value,
        2.75
    );
    assert!(s
        .add_metrics(
            id,
            &[MetricRow::scalar(
                "a/b",
                "x",
                MetricScope::Run,
                1.0,
                1,
                true
            )]
        )
        .is_err());
}

#[test]
fn replace_metrics_swaps_one_source_atomically() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let id = s.create_run(&new_run("rescored")).unwrap();
    let other = s.create_run(&new_run("other")).unwrap();
    let row = |src: &str, name: &str, scope: MetricScope, v: f64| {
        MetricRow::scalar(src, name, scope, v, 3, true)
    };
    s.add_metrics(id, &[row("native", "tau", MetricScope::Run, 2.0)])
        .unwrap();
    s.add_metrics(other, &[row("plug", "old", MetricScope::Run, 9.0)])
        .unwrap();
    // First scoring: nothing to replace.
    let first = [
        row("plug", "old", MetricScope::Run, 1.0),
        row("plug", "old", MetricScope::Prompt(0), 1.5),
    ];
    assert_eq!(s.replace_metrics(id, "plug", &first).unwrap(), 0);
    s.add_plugin_failure(id, "plug", "timeout", "slow").unwrap();
    s.add_plugin_failure(id, "else", "panic", "boom").unwrap();
    // Second scoring produces another metric name: the old rows and the plugin's failure go,
    // other sources, other plugins' failures and other runs stay.
    let second = [row("plug", "new", MetricScope::Run, 4.0)];
    assert_eq!(s.replace_metrics(id, "plug", &second).unwrap(), 2);
    let names: Vec<(String, String)> = s
        .metrics(id)
        .unwrap()
        .into_iter()
        .map(|m| (m.source, m.name))
        .collect();
    assert_eq!(
        names,
        vec![
            ("native".into(), "tau".into()),
            ("plug".into(), "new".into())
        ]
    );
    let failures = s.plugin_failures(id).unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].plugin, "else");
    assert_eq!(s.metrics(other).unwrap()[0].value, 9.0);
    // Same rows again: same count, no duplicates.
    assert_eq!(s.replace_metrics(id, "plug", &second).unwrap(), 1);
    assert_eq!(s.metrics(id).unwrap().len(), 2);
    // A row of another source, or a bad row, changes nothing (one transaction).
    let e = s
        .replace_metrics(id, "plug", &[row("native", "x", MetricScope::Run, 0.0)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("row of source \"native\""), "{e}");
    let bad = [
        row("plug", "fine", MetricScope::Run, 1.0),
        row("plug", "", MetricScope::Run, 1.0),
    ];
    assert!(s.replace_metrics(id, "plug", &bad).is_err());
    assert_eq!(s.metrics(id).unwrap().len(), 2);
    assert_eq!(s.metrics(id).unwrap()[1].name, "new");
    assert!(s
        .replace_metrics(999, "plug", &second)
        .unwrap_err()
        .to_string()
        .contains("run 999 does not exist"));
}

#[test]
fn metric_scope_parses_and_rejects() {
    assert_eq!(
        "prompt:12".parse::<MetricScope>().unwrap(),
        MetricScope::Prompt(12)
    );
    assert_eq!(
        "category:math/algebra".parse::<MetricScope>().unwrap(),
        MetricScope::Category("math/algebra".into())
    );
    assert!("prompt:x".parse::<MetricScope>().is_err());
    assert!("global".parse::<MetricScope>().is_err());
}

#[test]
fn run_list_filters_sorts_pages() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let mut ids = Vec::new();
    for i in 0..30 {
        let mut r = new_run(&format!("run-{i:02}"));
        r.drafter_step = Some(i * 100);
        r.backend = if i % 3 == 0 {
            "cuda".into()
        } else {
            "cpu".into()
        };
        if i % 10 == 9 {
            r.mode = RunMode::TrainStyle;
            r.train_style = Some(TrainStyle {
                labels: "data".into(),
                mask_rule: "inclusive".into(),
            });
        }
        let id = s.create_run(&r).unwrap();
        if i % 2 == 0 {
            s.add_metrics(
                id,
                &[MetricRow::scalar(
                    "native",
                    "tau",
                    MetricScope::Run,
                    1.0 + (i as f64 * 7.0) % 11.0,
                    1,
                    true,
                )],
            )
            .unwrap();
        }
        ids.push(id);
    }
    let key = MetricKey::new("native", "tau");
    let f = RunFilter {
        limit: 5,
        offset: 5,
        metric_columns: vec![key.clone()],
        ..Default::default()
    };
    let (page, total) = s.runs(&f).unwrap();
    assert_eq!(total, 30);
    assert_eq!(
        page.iter().map(|r| r.run.name.as_str()).collect::<Vec<_>>(),
        ["run-05", "run-06", "run-07", "run-08", "run-09"]
    );
    assert_eq!(page[0].metrics, vec![None]);
    assert_eq!(page[1].metrics, vec![Some(1.0 + 42.0 % 11.0)]);

    let (cuda, total) = s
        .runs(&RunFilter {
            backend: Some("cuda".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((cuda.len(), total), (10, 10));
    let (ts, _) = s
        .runs(&RunFilter {
            mode: Some(RunMode::TrainStyle),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        ts.iter().map(|r| r.run.name.clone()).collect::<Vec<_>>(),
        ["run-09", "run-19", "run-29"]
    );
    assert_eq!(
        ts[0].run.train_style.as_ref().unwrap().mask_rule,
        "inclusive"
    );

    // Sort by metric, descending, runs without the metric last.
    let (sorted, _) = s
        .runs(&RunFilter {
            sort: RunSort::Metric(0),
            descending: true,
            metric_columns: vec![key],
            ..Default::default()
        })
        .unwrap();
    let vals: Vec<Option<f64>> = sorted.iter().map(|r| r.metrics[0]).collect();
    let some: Vec<f64> = vals.iter().flatten().copied().collect();
    assert_eq!(some.len(), 15);
    assert!(some.windows(2).all(|w| w[0] >= w[1]), "{some:?}");
    assert!(vals[15..].iter().all(|v| v.is_none()));

    // Text filter treats LIKE wildcards literally.
    let (hits, n) = s
        .runs(&RunFilter {
            text: Some("run-1".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((hits.len(), n), (10, 10));
    let (none, n) = s
        .runs(&RunFilter {
            text: Some("run_%".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((none.len(), n), (0, 0));
    let (stepped, _) = s
        .runs(&RunFilter {
            step: Some(700),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(stepped[0].run.name, "run-07");
    let facets = s.facets().unwrap();
    assert_eq!(facets.backends, ["cpu", "cuda"]);
    assert_eq!(facets.steps.len(), 30);
    assert_eq!(s.metric_keys().unwrap()[0].1, 15);
    assert!(s
        .runs(&RunFilter {
            sort: RunSort::Metric(3),
            ..Default::default()
        })
        .is_err());
}

#[test]
fn delete_cascades() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let id = s.create_run(&new_run("del")).unwrap();
    s.add_records(id, &batch(0, 3, false)).unwrap();
    s.add_metrics(
        id,
        &[MetricRow::scalar(
            "native",
            "tau",
            MetricScope::Run,
            2.0,
            1,
            true,
        )],
    )
    .unwrap();
    s.finish_run(id, RunStatus::Complete, None, &json!({}))
        .unwrap();
    s.pin_baseline("*", id).unwrap();
    s.delete_run(id).unwrap();
    assert!(s.run(id).unwrap().is_none());
    let left: i64 = s
        .read(|c| {
            Ok(c.query_row(
                "SELECT (SELECT count(*) FROM record_chunk) + (SELECT count(*) FROM metric) + (SELECT count(*) FROM baseline)",
                [],
                |r| r.get(0),
            )?)
        })
        .unwrap();
    assert_eq!(left, 0);
    assert!(s
        .delete_run(id)
        .unwrap_err()
        .to_string()
        .contains("does not exist"));
}

#[test]
fn reader_never_sees_half_a_batch_while_writer_writes() {
    let (_d, path) = tmp();
    let s = std::sync::Arc::new(Store::open(&path).unwrap());
    let id = s.create_run(&new_run("conc")).unwrap();
    const BATCH: usize = 300; // blocks per add_records call
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            // A second Store on the same file: another process's view.
            let other = Store::open(s.path()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                for st in [&*s, &other] {
                    let n = st.records(id).unwrap().num_blocks();
                    assert_eq!(n % BATCH, 0, "reader saw a partial batch of {n} blocks");
                    let (list, _) = st.runs(&RunFilter::default()).unwrap();
                    assert_eq!(list[0].run.num_blocks as usize % BATCH, 0);
                    seen.push(n);
                }
            }
            seen
        })
    };
    for i in 0..20u32 {
        // Each batch has three prompts, so it is written as several chunk rows.
        let mut b = batch(i, 100, false);
        b.extend(&batch(i + 100, 100, false));
        b.extend(&batch(i + 200, 100, false));
        s.add_records(id, &b).unwrap();
    }
    s.finish_run(id, RunStatus::Complete, None, &json!({}))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let seen = reader.join().unwrap();
    assert!(!seen.is_empty());
    assert_eq!(s.records(id).unwrap().num_blocks(), 20 * BATCH);
}

#[test]
fn tokens_shares_baselines_vocab_derived() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let w = s.create_token("ci", TokenScope::Write).unwrap();
    let r = s.create_token("viewer", TokenScope::Read).unwrap();
    assert_ne!(w, r);
    assert_eq!(s.check_token(&w).unwrap(), Some(TokenScope::Write));
    assert_eq!(s.check_token(&r).unwrap(), Some(TokenScope::Read));
    assert_eq!(s.check_token("dl_guess").unwrap(), None);
    // Only hashes are stored.
    let stored: String = s
        .read(|c| {
            Ok(c.query_row(
                "SELECT group_concat(token_sha256) FROM api_token",
                [],
                |x| x.get(0),
            )?)
        })
        .unwrap();
    assert!(!stored.contains(&w[3..]));
    assert_eq!(s.revoke_token("viewer").unwrap(), 1);
    assert_eq!(s.check_token(&r).unwrap(), None);
    assert_eq!(s.tokens().unwrap().len(), 2);

    let a = s.create_share("/compare?runs=1,2").unwrap();
    assert_eq!(a.len(), 10);
    assert_eq!(s.create_share("/compare?runs=1,2").unwrap(), a);
    assert_eq!(s.share(&a).unwrap().as_deref(), Some("/compare?runs=1,2"));
    assert_eq!(s.share("nope").unwrap(), None);

    let id = s.create_run(&new_run("b")).unwrap();
    s.finish_run(id, RunStatus::Complete, None, &json!({}))
        .unwrap();
    s.pin_baseline("*", id).unwrap();
    assert_eq!(s.baselines().unwrap(), vec![("*".to_string(), id)]);
    assert!(s.pin_baseline("*", 999).is_err());

    s.put_vocab("t1", "tok", &["a".into(), "<b>".into()])
        .unwrap();
    assert_eq!(
        s.vocab("t1").unwrap().unwrap().1,
        vec!["a".to_string(), "<b>".to_string()]
    );
    s.put_derived(
        id,
        &Derived {
            kind: "stats".into(),
            version: 3,
            data: vec![1, 2, 3],
        },
    )
    .unwrap();
    assert_eq!(s.derived(id, "stats").unwrap().unwrap().data, vec![1, 2, 3]);
}

#[test]
fn export_import_is_idempotent_and_atomic() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let id = s.create_run(&new_run("exp")).unwrap();
    s.add_prompt(
        id,
        &RunPrompt {
            index: 0,
            id: "p".into(),
            sha256: "ee".repeat(32),
            prompt_len: 1,
            token_ids: vec![5, 6],
            ..Default::default()
        },
    )
    .unwrap();
    s.add_records(id, &batch(0, 3, false)).unwrap();
    s.add_metrics(
        id,
        &[MetricRow::scalar(
            "native",
            "tau",
            MetricScope::Run,
            2.0,
            3,
            true,
        )],
    )
    .unwrap();
    s.finish_run(id, RunStatus::Complete, None, &json!({"s": 1}))
        .unwrap();
    let ex = s.export_run(id, true).unwrap().unwrap();

    let (_d2, path2) = tmp();
    let t = Store::open(&path2).unwrap();
    let o = t.import_runs("team.html", "ff", &[ex.clone()]).unwrap();
    assert_eq!((o.imported.len(), o.skipped.len()), (1, 0));
    let o = t.import_runs("team.html", "ff", &[ex.clone()]).unwrap();
    assert_eq!((o.imported.len(), o.skipped.len()), (0, 1));
    let (list, n) = t.runs(&RunFilter::default()).unwrap();
    assert_eq!(n, 1);
    let got = &list[0].run;
    assert_eq!(
        (got.uid.as_str(), got.status, got.origin.as_str()),
        (ex.run.uid.as_str(), RunStatus::Complete, "import:team.html")
    );
    assert_eq!(got.created_at, ex.run.created_at);
    assert_eq!(t.records(got.id).unwrap(), ex.records.clone().unwrap());

    // A bundle whose second run is broken imports nothing.
    let mut good = ex.clone();
    good.run.uid = "good-uid".into();
    let mut bad = ex.clone();
    bad.run.uid = "bad-uid".into();
    bad.records.as_mut().unwrap().target.pop();
    let err = t.import_runs("x.json", "00", &[good, bad]).unwrap_err();
    assert!(format!("{err:#}").contains("bad-uid"), "{err:#}");
    assert_eq!(t.runs(&RunFilter::default()).unwrap().1, 1);
    assert_eq!(t.run_id_by_uid("good-uid").unwrap(), None);
}

#[test]
fn time_format_known_answers() {
    assert_eq!(rfc3339_from_unix(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339_from_unix(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339_from_unix(1_798_761_599), "2026-12-31T23:59:59Z");
    let (a, b) = (random_hex(16), random_hex(16));
    assert!(a.len() == 32 && a != b);
    let f = fallback_random_hex(20);
    assert!(
        f.len() == 40 && f.chars().all(|c| c.is_ascii_hexdigit()) && f != fallback_random_hex(20)
    );
    let u = new_uid();
    assert_eq!(u.len(), 32);
    assert!(u.chars().all(|c| c.is_ascii_hexdigit()));
}

#[test]
fn plugin_rows_record_their_file_and_go_stale_when_a_rescore_fails() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let id = s.create_run(&new_run("p")).unwrap();
    let row = MetricRow::scalar("tau", "tau_pooled", MetricScope::Run, 2.5, 10, true);
    let prov = PluginProvenance {
        source: "tau".into(),
        sha256: "ab".repeat(32),
        version: "0.1.0".into(),
        file: "builtin:tau".into(),
        builtin: true,
        params_json: "[]".into(),
        scored_at: String::new(),
        stale_since: None,
    };
    s.replace_plugin_metrics(id, &prov, std::slice::from_ref(&row))
        .unwrap();
    let p = s.plugin_runs(id).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(
        (
            p[0].sha256.as_str(),
            p[0].builtin,
            p[0].stale_since.as_deref()
        ),
        (prov.sha256.as_str(), true, None)
    );
    // A later failure keeps the rows and marks them stale; another plugin's failure does not.
    assert_eq!(
        s.record_plugin_failure(id, "tau", "timeout", "slow")
            .unwrap(),
        1
    );
    assert_eq!(
        s.record_plugin_failure(id, "other", "panic", "boom")
            .unwrap(),
        0
    );
    assert_eq!(s.metrics(id).unwrap().len(), 1);
    let p = s.plugin_runs(id).unwrap();
    assert_eq!(p.len(), 1, "no provenance for a source without rows");
    assert!(p[0].stale_since.is_some());
    // Scoring again clears the mark and the failure.
    s.replace_plugin_metrics(id, &prov, std::slice::from_ref(&row))
        .unwrap();
    assert_eq!(s.plugin_runs(id).unwrap()[0].stale_since, None);
    assert_eq!(
        s.plugin_failures(id).unwrap().len(),
        1,
        "only the other plugin's failure is left"
    );
}

/// `run_eval` (schema v3): stored with the run, read back, listed when sharded, refused when the
/// shard is impossible, deleted with its run.
#[test]
fn run_eval_round_trip() {
    use crate::shard::Shard;
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("e.sqlite")).unwrap();
    let new = NewRun {
        name: "r".into(),
        block_size: 4,
        top_k: 2,
        ..Default::default()
    };
    let eval = RunEval {
        identity: "abc".into(),
        identity_json: serde_json::json!({"k": 1}),
        shard: Some(Shard::new(1, 3).unwrap()),
        set_prompts: 9,
        run_prompts: 3,
        merged_from: None,
    };
    let id = s.create_eval_run(&new, &eval).unwrap();
    assert_eq!(s.run_eval(id).unwrap().as_ref(), Some(&eval));
    let plain = s
        .create_eval_run(
            &new,
            &RunEval {
                shard: None,
                ..eval.clone()
            },
        )
        .unwrap();
    let listed: Vec<i64> = s.shard_runs().unwrap().iter().map(|r| r.0.id).collect();
    assert_eq!(listed, [id], "only sharded runs are listed");
    // The CHECK constraints refuse an impossible shard written around `Shard::new`.
    let third = s.create_run(&new).unwrap();
    let bad = s.write(|c| {
        Ok(c.execute(
            "INSERT INTO run_eval (run_id, identity, identity_json, shard_index, shard_count, set_prompts, run_prompts) \
             VALUES (?1, 'x', '{}', 3, 3, 1, 1)",
            [third],
        ))
    });
    assert!(bad.unwrap().is_err());
    s.delete_run(id).unwrap();
    assert_eq!(s.run_eval(id).unwrap(), None);
    assert!(s.run_eval(plain).unwrap().is_some());
}

/// Export carries `run_eval` and the plugin provenance; import stores them (so an imported
/// shard run is a shard to `merge`), and an export without them (an older bundle) still
/// imports, with none.
#[test]
fn export_and_import_carry_the_evaluation_and_plugin_provenance() {
    use crate::shard::Shard;
    let dir = tempfile::tempdir().unwrap();
    let a = Store::open(&dir.path().join("a.sqlite")).unwrap();
    let eval = RunEval {
        identity: "ab".repeat(32),
        identity_json: serde_json::json!({"k": 1}),
        shard: Some(Shard::new(0, 2).unwrap()),
        set_prompts: 4,
        run_prompts: 0,
        merged_from: None,
    };
    let id = a.create_eval_run(&new_run("s"), &eval).unwrap();
    let prov = PluginProvenance {
        source: "accept-length".into(),
        sha256: "cd".repeat(32),
        version: "1".into(),
        file: "builtin:accept-length".into(),
        builtin: true,
        params_json: "[]".into(),
        scored_at: String::new(),
        stale_since: None,
    };
    a.replace_plugin_metrics(id, &prov, &[]).unwrap();
    a.finish_run(id, RunStatus::Complete, None, &json!({}))
        .unwrap();
    let ex = a.export_run(id, true).unwrap().unwrap();
    assert_eq!(ex.eval.as_ref(), Some(&eval));
    assert_eq!(ex.plugins.len(), 1);

    let b = Store::open(&dir.path().join("b.sqlite")).unwrap();
    b.import_runs("x.json", "00", std::slice::from_ref(&ex))
        .unwrap();
    let bid = b.run_id_by_uid(&ex.run.uid).unwrap().unwrap();
    assert_eq!(b.run_eval(bid).unwrap(), Some(eval));
    assert_eq!(b.plugin_runs(bid).unwrap(), ex.plugins);
    assert_eq!(b.shard_runs().unwrap().len(), 1);

    let old = RunExport {
        eval: None,
        plugins: Vec::new(),
        ..ex.clone()
    };
    let mut old = old;
    old.run.uid = "older-bundle".into();
    let c = Store::open(&dir.path().join("c.sqlite")).unwrap();
    c.import_runs("old.json", "01", &[old]).unwrap();
    let cid = c.run_id_by_uid("older-bundle").unwrap().unwrap();
    assert_eq!(c.run_eval(cid).unwrap(), None);
    assert!(c.plugin_runs(cid).unwrap().is_empty());
}

/// Schema v5 rebuilds `watch_checkpoint` (status `submitted`, `slurm_job`) keeping its rows.
#[test]
fn v5_keeps_the_watch_records_of_a_v4_database() {
    let (_d, path) = tmp();
    {
        let mut c = Connection::open(&path).unwrap();
        let tx = c.transaction().unwrap();
        for sql in &schema::MIGRATIONS[..4] {
            tx.execute_batch(sql).unwrap();
        }
        tx.pragma_update(None, "user_version", 4).unwrap();
        tx.execute(
            "INSERT INTO watch_checkpoint (job, path, sha256, step, status, run_uid, pushed, message, at) \
             VALUES ('j', '/ck/step-1', 'ab', 1, 'evaluated', 'u1', 1, NULL, 't')",
            [],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    let s = Store::open(&path).unwrap();
    assert_eq!(s.schema_version().unwrap(), schema::latest_version());
    let r = s.watch_record("j", "/ck/step-1", "ab").unwrap().unwrap();
    assert_eq!(
        (
            r.status,
            r.run_uid.as_deref(),
            r.pushed,
            r.slurm_job.clone()
        ),
        (WatchStatus::Evaluated, Some("u1"), true, None)
    );
    let sub = WatchRecord {
        path: "/ck/step-2".into(),
        step: Some(2),
        status: WatchStatus::Submitted,
        run_uid: None,
        pushed: false,
        slurm_job: Some("42".into()),
        ..r
    };
    s.put_watch_record(&sub).unwrap();
    assert_eq!(s.watch_record("j", "/ck/step-2", "ab").unwrap(), Some(sub));
}
