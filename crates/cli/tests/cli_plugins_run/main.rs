//! Metric plugins on runs, end to end through the built binary: `run --plugin` and `rescore`.
//!
//! - the built-in accept-length and replayed-tau plugins (plugins/dist) give exactly the native
//!   metrics of the same run, at run, prompt and category scope;
//! - an oracle-drafter run rescored gives τ = B along the replayed chain, and the uniform-anchor τ
//!   its definition implies;
//! - a hostile plugin (endless loop, panic) is recorded as a failure with its class while the
//!   run completes (exit code 0) and the other plugin's metrics are stored;
//! - rescoring replaces a plugin's rows (no duplicates, no stale names), values checked against
//!   an independent computation from the stored records;
//! - bad input (unknown run, run without records, missing database, plugin given twice) is one
//!   clear error that names the run or the plugin.
//!
//! - a plugin looping in `describe` costs `rescore` one time limit (each plugin is loaded once).
//!
//! The built-in plugins come from plugins/dist: without them the tests fail and say to run
//! plugins/build.sh (scripts/test.sh runs it before cargo test). The hostile and describe-loop
//! guests are built here the way crates/plugin-host's tests build them (`fixtures.rs`).

#[path = "../cli_util/mod.rs"]
mod cli_util;
mod fixtures;

use cli_util::*;
use draftlens_records::Region;
use draftlens_results::store::{MetricRow, MetricScope, NewRun, RunStatus, Store};
use fixtures::*;

// ---------------------------------------------------------------------------------------------
// run --plugin: the plugins agree with the native metrics
// ---------------------------------------------------------------------------------------------

#[test]
fn run_plugins_equal_the_native_metrics_of_the_same_run() {
    dist("accept-length");
    let replay = dist("replayed-tau");
    let tmp = tempfile::tempdir().unwrap();
    let (db, prompts) = (
        tmp.path().join("runs.sqlite"),
        tmp.path().join("three.jsonl"),
    );
    write_prompts(
        &prompts,
        &[
            (
                "rev",
                Some("code"),
                "Write a Python function that reverses a string.",
            ),
            (
                "sum",
                Some("math"),
                "What is the sum of the first ten positive integers? Show the steps.",
            ),
            (
                "fib",
                Some("code"),
                "Write a Python function that returns the n-th Fibonacci number.",
            ),
        ],
    );
    let d = reference_drafter();
    assert!(
        d.join("config.json").is_file(),
        "{} is missing: the reference drafter is a tracked fixture (drafters/ in git)",
        d.display()
    );
    // One plugin by name (found in plugins/dist from the repository root), one by path.
    let out = json_out(
        &dl_plugins(
            tmp.path(),
            &[
                "--json",
                "run",
                "--drafter",
                s(&d),
                "--prompts",
                s(&prompts),
                "--max-new-tokens",
                "24",
                "--db",
                s(&db),
                "--plugin",
                "accept-length",
                "--plugin",
                s(&replay),
            ],
        ),
        "run --plugin accept-length --plugin replayed-tau.wasm",
    );
    let o = &out.as_array().unwrap()[0];
    let plugins = o["plugins"]["plugins"].as_array().unwrap();
    let names: Vec<&str> = plugins
        .iter()
        .map(|p| p["plugin"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["accept-length", "replayed-tau"]);
    assert!(plugins.iter().all(|p| p["failure"].is_null()), "{o}");
    assert_eq!(o["plugins"]["prompts"], 3);
    assert_eq!(
        o["plugins"]["categories"],
        serde_json::json!(["code", "math"])
    );

    let run = o["run_id"].as_i64().unwrap();
    let rows = rows_of(&db, run);
    let b = runs(&db)[0].block_size as f64;
    // The drafter is neither perfect nor useless, so equality says something.
    let tau = same(
        &rows,
        ("replayed-tau", "replayed_tau_pooled"),
        "tau_replayed_pooled",
        &MetricScope::Run,
    );
    assert!(tau > 1.0 && tau < b, "replayed τ {tau} (B = {b})");
    same(
        &rows,
        ("replayed-tau", "replayed_tau_macro"),
        "tau_replayed_macro",
        &MetricScope::Run,
    );
    same(
        &rows,
        ("accept-length", "tau_pooled"),
        "tau_uniform",
        &MetricScope::Run,
    );
    same(
        &rows,
        ("accept-length", "accept_len_pooled"),
        "mean_streak",
        &MetricScope::Run,
    );
    for p in 0..3 {
        let scope = MetricScope::Prompt(p);
        same(
            &rows,
            ("replayed-tau", "replayed_tau_pooled"),
            "tau_replayed",
            &scope,
        );
        same(
            &rows,
            ("accept-length", "tau_pooled"),
            "tau_uniform",
            &scope,
        );
    }
    for c in ["code", "math"] {
        let scope = MetricScope::Category(c.into());
        same(
            &rows,
            ("replayed-tau", "replayed_tau_macro"),
            "tau_replayed_macro",
            &scope,
        );
        same(
            &rows,
            ("replayed-tau", "replayed_tau_pooled"),
            "tau_replayed_pooled",
            &scope,
        );
    }
    // Plugin rows carry the plugin's declared unit and description.
    let m = metric(&rows, "accept-length", "tau_pooled", &MetricScope::Run);
    assert_eq!(m.unit, "tokens");
    assert!(m.description.contains("bonus"), "{}", m.description);
    let store = Store::open(&db).unwrap();
    assert!(store.plugin_failures(run).unwrap().is_empty());
    assert_eq!(
        store.run(run).unwrap().unwrap().run.status,
        RunStatus::Complete
    );
    drop(store);

    // `runs show` lists the plugins' run-level metrics next to the native ones.
    let o = dl_plugins(
        tmp.path(),
        &["runs", "show", &run.to_string(), "--db", s(&db)],
    );
    ok(&o, "runs show");
    let text = stdout(&o);
    for want in [
        "accept-length",
        "tau_pooled",
        "replayed-tau",
        "replayed_tau_pooled",
        "native",
    ] {
        assert!(text.contains(want), "runs show lacks {want}:\n{text}");
    }
    // ... and finds the run by a uid prefix as well as by id; an unknown run is one clean error.
    let uid = Store::open(&db).unwrap().run(run).unwrap().unwrap().run.uid;
    let o = dl_plugins(
        tmp.path(),
        &["--json", "runs", "show", &uid[..10], "--db", s(&db)],
    );
    ok(&o, "runs show UID-PREFIX");
    assert_eq!(
        json_out(&o, "runs show UID-PREFIX")["run"]["run"]["id"],
        run
    );
    let o = dl_plugins(tmp.path(), &["runs", "show", "999", "--db", s(&db)]);
    clean_error(&o, "runs show 999", &["no run \"999\"", s(&db)]);
}

// ---------------------------------------------------------------------------------------------
// rescore: the oracle drafter
// ---------------------------------------------------------------------------------------------

#[test]
fn oracle_run_rescored_gives_tau_equal_to_block_size() {
    dist("accept-length");
    dist("replayed-tau");
    let tmp = tempfile::tempdir().unwrap();
    let (db, prompts) = (tmp.path().join("runs.sqlite"), tmp.path().join("two.jsonl"));
    write_two_prompts(&prompts);
    // B = 4 and 17 new tokens: the 16 after the first come in 4 full verify rounds.
    let (b, n) = (4u64, 17u64);
    let out = json_out(
        &dl_plugins(
            tmp.path(),
            &[
                "--json",
                "run",
                "--drafter",
                "builtin:oracle",
                "--block-size",
                "4",
                "--prompts",
                s(&prompts),
                "--max-new-tokens",
                "17",
                "--db",
                s(&db),
            ],
        ),
        "run builtin:oracle",
    );
    let o = &out.as_array().unwrap()[0];
    assert!(
        o.get("plugins").is_none(),
        "no --plugin, no plugins field: {o}"
    );
    let run = runs(&db)[0].clone();
    let store = Store::open(&db).unwrap();
    for p in store.prompts(run.id).unwrap() {
        assert_eq!(
            p.token_ids.len() as u64 - p.prompt_len as u64,
            n,
            "prompt {} stopped before {n} tokens: the known answer needs full continuations",
            p.id
        );
    }
    drop(store);
    // No model is loaded: rescore by uid (as `compare` accepts), plugins by name.
    let v = json_out(
        &dl_plugins(
            tmp.path(),
            &[
                "--json",
                "rescore",
                &run.uid,
                "--db",
                s(&db),
                "--plugin",
                "replayed-tau",
                "--plugin",
                "accept-length",
            ],
        ),
        "rescore the oracle run",
    );
    assert_eq!(
        (v["run"].as_i64(), v["uid"].as_str()),
        (Some(run.id), Some(run.uid.as_str()))
    );
    let rows = rows_of(&db, run.id);
    let rounds = (n - 1) / b;
    for scope in [
        MetricScope::Run,
        MetricScope::Prompt(0),
        MetricScope::Prompt(1),
        MetricScope::Category("code".into()),
    ] {
        let m = metric(&rows, "replayed-tau", "replayed_tau_pooled", &scope);
        assert_eq!(m.value, b as f64, "replayed τ {scope}");
        let want_rounds = if scope == MetricScope::Run {
            2 * rounds
        } else {
            rounds
        };
        assert_eq!(m.count, want_rounds, "rounds {scope}");
    }
    assert_eq!(
        metric(
            &rows,
            "replayed-tau",
            "replayed_tau_macro",
            &MetricScope::Run
        )
        .value,
        b as f64
    );
    // Every completion anchor a, with d = n - 1 - (a - prompt_len) tokens after it (d = 1..16):
    // A + 1 = min(B, d + 1), so uniform τ = (2 + 3 + 4 × 14) / 16.
    let uniform = metric(&rows, "accept-length", "tau_pooled", &MetricScope::Run);
    assert_eq!((uniform.value, uniform.count), (61.0 / 16.0, 2 * (n - 1)));
    same(
        &rows,
        ("replayed-tau", "replayed_tau_pooled"),
        "tau_replayed_pooled",
        &MetricScope::Run,
    );

    // 16 new tokens: 15 after the first, so the last of 4 rounds has 3 tokens and no bonus past
    // the end of the continuation; the plugin's replay ends it exactly as the native one does.
    let out = json_out(
        &dl_plugins(
            tmp.path(),
            &[
                "--json",
                "run",
                "--drafter",
                "builtin:oracle",
                "--block-size",
                "4",
                "--prompts",
                s(&prompts),
                "--max-new-tokens",
                "16",
                "--db",
                s(&db),
                "--plugin",
                "replayed-tau",
            ],
        ),
        "run builtin:oracle with 16 new tokens",
    );
    let id = out[0]["run_id"].as_i64().unwrap();
    let rows = rows_of(&db, id);
    for scope in [
        MetricScope::Run,
        MetricScope::Prompt(0),
        MetricScope::Prompt(1),
    ] {
        let v = same(
            &rows,
            ("replayed-tau", "replayed_tau_pooled"),
            if scope == MetricScope::Run {
                "tau_replayed_pooled"
            } else {
                "tau_replayed"
            },
            &scope,
        );
        assert_eq!(v, 15.0 / 4.0, "{scope}");
    }
}

// ---------------------------------------------------------------------------------------------
// Failing plugins
// ---------------------------------------------------------------------------------------------

#[test]
fn a_failing_plugin_is_recorded_while_the_run_completes_and_the_others_are_stored() {
    dist("accept-length");
    let hostile = hostile();
    let tmp = tempfile::tempdir().unwrap();
    let (db, prompts) = (tmp.path().join("runs.sqlite"), tmp.path().join("one.jsonl"));
    write_prompts(
        &prompts,
        &[("q", Some("chat"), "Give three tips for brewing good tea.")],
    );
    let o = dl_plugins(
        tmp.path(),
        &[
            "--json",
            "run",
            "--drafter",
            "builtin:oracle",
            "--prompts",
            s(&prompts),
            "--max-new-tokens",
            "12",
            "--db",
            s(&db),
            "--plugin",
            s(hostile),
            "--param",
            "hostile:mode=loop",
            "--plugin",
            "accept-length",
            "--plugin-time-limit",
            "1",
        ],
    );
    let v = json_out(&o, "run with a plugin that never returns");
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.starts_with("warning: plugin hostile failed [timeout]")),
        "no warning naming the plugin and its failure:\n{err}"
    );
    assert!(!err.contains("error:"), "{err}");
    let p = &v[0]["plugins"]["plugins"];
    assert_eq!(p[0]["failure"]["kind"], "timeout", "{p}");
    assert!(p[1]["failure"].is_null(), "{p}");

    let run = runs(&db)[0].clone();
    assert_eq!(run.status, RunStatus::Complete);
    let store = Store::open(&db).unwrap();
    let f = store.plugin_failures(run.id).unwrap();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].plugin.as_str(), f[0].kind.as_str()),
        ("hostile", "timeout")
    );
    assert!(
        f[0].message.contains("time limit of 1s"),
        "{}",
        f[0].message
    );
    assert!(
        f[0].message.contains("guest_hostile.wasm"),
        "{}",
        f[0].message
    );
    let rows = store.metrics(run.id).unwrap();
    assert!(
        rows.iter().all(|m| m.source != "hostile"),
        "a failed plugin left rows"
    );
    same(
        &rows,
        ("accept-length", "tau_pooled"),
        "tau_uniform",
        &MetricScope::Run,
    );
    same(
        &rows,
        ("accept-length", "tau_pooled"),
        "tau_uniform",
        &MetricScope::Prompt(0),
    );
    drop(store);

    // Rescoring with a panicking plugin: stored too; rescore says it failed (exit code 1).
    let o = dl_plugins(
        tmp.path(),
        &[
            "rescore",
            &run.id.to_string(),
            "--db",
            s(&db),
            "--plugin",
            s(hostile),
            "--param",
            "mode=panic",
        ],
    );
    // Not `clean_error`: the plugin's own panic message is part of the output here.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(!err.contains("internal error"), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("1 of 1 plugins failed") && errors[0].contains("hostile [panic]"),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("warning: plugin hostile failed [panic]")),
        "{err}"
    );
    let f = Store::open(&db).unwrap().plugin_failures(run.id).unwrap();
    let kinds: Vec<&str> = f.iter().map(|x| x.kind.as_str()).collect();
    assert_eq!(kinds, ["timeout", "panic"]);
    assert!(
        f[1].message.contains("index out of bounds"),
        "{}",
        f[1].message
    );

    // Once the plugin works, its rows are stored and its earlier failures are cleared.
    let v = json_out(
        &dl_plugins(
            tmp.path(),
            &[
                "--json",
                "rescore",
                &run.id.to_string(),
                "--db",
                s(&db),
                "--plugin",
                s(hostile),
                "--param",
                "mode=ok",
            ],
        ),
        "rescore with a working plugin",
    );
    assert!(v["plugins"][0]["failure"].is_null(), "{v}");
    let store = Store::open(&db).unwrap();
    assert!(store.plugin_failures(run.id).unwrap().is_empty());
    let rows = store.metrics(run.id).unwrap();
    let blocks = metric(&rows, "hostile", "blocks", &MetricScope::Run);
    assert_eq!(blocks.count, run.num_blocks);
    assert!(
        rows.iter().any(|m| m.source == "accept-length"),
        "other plugins' rows stay"
    );
}

// ---------------------------------------------------------------------------------------------
// rescore over a synthetic stored run (no model needed)
// ---------------------------------------------------------------------------------------------

#[test]
fn rescore_twice_replaces_the_rows_of_the_plugin() {
    dist("accept-length");
    dist("ddtree");
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.sqlite");
    let (id, recs) = synthetic_run(&db);
    let rescore = |extra: &[&str]| {
        let mut a = vec!["--json", "rescore", "1", "--db", s(&db)];
        a.extend_from_slice(extra);
        json_out(&dl_plugins(tmp.path(), &a), &format!("rescore {extra:?}"))
    };
    let first = rescore(&["--plugin", "accept-length"]);
    let n = count_rows(&db, id, "accept-length");
    // 5 metrics × (run + 3 prompts + 2 categories).
    assert_eq!(n, 5 * 6);
    assert_eq!(first["plugins"][0]["rows"], 30);
    assert_eq!(first["plugins"][0]["replaced"], 0);

    // Independent reference: τ = 1 + mean accepted length over the completion blocks.
    let (mut sum, mut blocks) = (0usize, 0usize);
    for blk in 0..recs.num_blocks() {
        if recs.region[blk] == Region::Completion as u8 {
            sum += recs.accepted_len(blk);
            blocks += 1;
        }
    }
    let want = 1.0 + sum as f64 / blocks as f64;
    let rows = rows_of(&db, id);
    let tau = metric(&rows, "accept-length", "tau_pooled", &MetricScope::Run);
    assert!((tau.value - want).abs() < 1e-12, "{} vs {want}", tau.value);
    assert_eq!(tau.count, blocks as u64);
    assert!(tau.value > 1.5 && tau.value < 8.0, "{}", tau.value);
    metric(
        &rows,
        "accept-length",
        "tau_macro",
        &MetricScope::Category("a".into()),
    );
    metric(&rows, "accept-length", "tau_macro", &MetricScope::Prompt(2));

    // Again: same rows, same values, nothing duplicated.
    let second = rescore(&["--plugin", "accept-length"]);
    assert_eq!(count_rows(&db, id, "accept-length"), n);
    assert_eq!(second["plugins"][0]["replaced"], 30);
    assert_eq!(rows_of(&db, id), rows);

    // A parameter that changes which metrics a plugin produces: the old names go.
    rescore(&["--plugin", "ddtree", "--param", "budgets=4,8"]);
    let names = |rows: &[MetricRow]| -> Vec<String> {
        let mut v: Vec<String> = rows
            .iter()
            .filter(|m| m.source == "ddtree" && m.scope == MetricScope::Run)
            .map(|m| m.name.clone())
            .collect();
        v.sort();
        v
    };
    let before = names(&rows_of(&db, id));
    assert!(before.contains(&"ddtree_tau_4".to_string()), "{before:?}");
    rescore(&["--plugin", "ddtree", "--param", "ddtree:budgets=16"]);
    let after = names(&rows_of(&db, id));
    assert!(
        after.iter().all(|n| n.ends_with("_16")),
        "stale ddtree rows: {after:?}"
    );
    assert!(!after.is_empty());
    // The other plugin's rows are untouched.
    assert_eq!(count_rows(&db, id, "accept-length"), n);

    // The text table shows the new values.
    let o = dl_plugins(
        tmp.path(),
        &["rescore", "1", "--db", s(&db), "--plugin", "accept-length"],
    );
    ok(&o, "rescore (text)");
    let text = stdout(&o);
    assert!(
        text.contains("tau_pooled")
            && text.contains(&format!("{want:.6}"))
            && text.contains("replacing 30 earlier rows"),
        "{text}"
    );
}

#[test]
fn rescore_errors_name_the_run_or_the_plugin() {
    dist("accept-length");
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.sqlite");
    synthetic_run(&db);
    let store = Store::open(&db).unwrap();
    let empty = store
        .create_run(&NewRun {
            name: "no-records".into(),
            block_size: 8,
            top_k: 4,
            ..NewRun::default()
        })
        .unwrap();
    store
        .finish_run(empty, RunStatus::Complete, None, &serde_json::json!({}))
        .unwrap();
    let running = store
        .create_run(&NewRun {
            name: "unfinished".into(),
            block_size: 8,
            top_k: 4,
            ..NewRun::default()
        })
        .unwrap();
    // This process keeps the database open, as the process of a run still running does: the
    // `running` run is alive (a run whose process is gone is marked interrupted at the next open,
    // crates/results/src/store/liveness.rs), so rescore must refuse it as unfinished.
    let _running_process = store;
    let rescore = |run: &str, extra: &[&str]| {
        let mut a = vec!["rescore", run, "--db", s(&db)];
        a.extend_from_slice(extra);
        dl_plugins(tmp.path(), &a)
    };
    let plugin = ["--plugin", "accept-length"];
    clean_error(
        &rescore("42", &plugin),
        "unknown run id",
        &["no run \"42\"", s(&db)],
    );
    clean_error(
        &rescore("feedbeefcafe", &plugin),
        "unknown uid",
        &["no run \"feedbeefcafe\""],
    );
    clean_error(
        &rescore(&empty.to_string(), &plugin),
        "run without records",
        &[&format!("run {empty}"), "no-records", "no stored records"],
    );
    clean_error(
        &rescore(&running.to_string(), &plugin),
        "unfinished run",
        &[&format!("run {running}"), "has not finished"],
    );
    clean_error(&rescore("1", &[]), "no plugin", &["at least one --plugin"]);
    clean_error(
        &rescore("1", &["--plugin", "no-such-metric"]),
        "unknown plugin",
        &["plugin no-such-metric not found"],
    );
    clean_error(
        &rescore("1", &["--plugin", "accept-length", "--param", "nope=1"]),
        "unknown parameter",
        &["plugin accept-length has no parameter nope", "region"],
    );
    clean_error(
        &rescore(
            "1",
            &[
                "--plugin",
                "accept-length",
                "--plugin",
                s(&dist("accept-length")),
            ],
        ),
        "the same plugin twice",
        &["both the plugin accept-length"],
    );
    // A missing database is an error, not a new empty file.
    let missing = tmp.path().join("missing.sqlite");
    let o = dl_plugins(
        tmp.path(),
        &[
            "rescore",
            "1",
            "--db",
            s(&missing),
            "--plugin",
            "accept-length",
        ],
    );
    clean_error(
        &o,
        "missing database",
        &[s(&missing), "no such run database"],
    );
    assert!(!missing.exists());
    // Nothing was stored by any of these.
    assert!(rows_of(&db, 1).is_empty());
    assert!(Store::open(&db)
        .unwrap()
        .plugin_failures(1)
        .unwrap()
        .is_empty());
}

#[test]
fn run_checks_its_plugins_before_loading_any_model() {
    dist("accept-length");
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.sqlite");
    let base = [
        "run",
        "--drafter",
        "builtin:oracle",
        "--prompts",
        "builtin:humaneval",
        "--limit",
        "1",
        "--db",
        s(&db),
    ];
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        dl_plugins(tmp.path(), &a)
    };
    clean_error(
        &with(&["--plugin", "no-such-metric"]),
        "unknown plugin",
        &["plugin no-such-metric not found", "DRAFTLENS_PLUGIN_PATH"],
    );
    clean_error(
        &with(&["--param", "region=all"]),
        "parameter without plugin",
        &["no --plugin is given"],
    );
    clean_error(
        &with(&["--plugin", "accept-length", "--param", "budgets=4"]),
        "parameter the plugin lacks",
        &[
            "--param budgets=4",
            "plugin accept-length has no parameter budgets",
        ],
    );
    clean_error(
        &with(&[
            "--plugin",
            "accept-length",
            "--plugin",
            s(&dist("accept-length")),
        ]),
        "the same plugin twice",
        &["both the plugin accept-length"],
    );
    assert!(
        !db.exists(),
        "a run was started although its plugins were wrong"
    );
}

/// Each plugin is loaded (and described) once per command: a plugin whose `describe` never
/// returns costs `rescore` one time limit, not one per place that needs its metadata
/// (resolving names, checking parameters, scoring). It is recorded as a timeout and the other
/// plugin's rows are stored.
#[test]
fn a_plugin_looping_in_describe_costs_one_time_limit() {
    dist("accept-length");
    let looping = guest("describe-loop");
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.sqlite");
    let (id, _) = synthetic_run(&db);
    let limit = 3.0;
    let t = std::time::Instant::now();
    let o = dl_plugins(
        tmp.path(),
        &[
            "--json",
            "rescore",
            "1",
            "--db",
            s(&db),
            "--plugin",
            s(&looping),
            "--plugin",
            "accept-length",
            "--plugin-time-limit",
            "3",
        ],
    );
    let took = t.elapsed().as_secs_f64();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.starts_with("warning: plugin ") && l.contains("failed [timeout]")),
        "{err}"
    );
    // One limit, plus start-up, compiling two small plugins and scoring 3 prompts; a second
    // `describe` would add another 3 s.
    assert!(
        took >= limit && took < 2.0 * limit - 0.5,
        "rescore took {took:.2} s with a {limit} s limit and a plugin looping in describe"
    );
    assert_eq!(count_rows(&db, id, "accept-length"), 5 * 6);
}
