//! The `--json` shape of a run's metrics (docs/json.md), through the built binary on the
//! default target (CPU): `run --json` and `runs show --json` of the same run give the same
//! `metrics` object, keyed source → metric name (the native metrics and a plugin's), next to
//! the same `schema_version`; `runs show` adds the per-prompt and per-category metrics in the
//! same shape; `merge --json` gives a merged run's metrics in that shape too.

mod cli_util;

use cli_util::*;
use draftlens_results::store::MetricScope;
use std::path::Path;

/// `draftlens --json run` of the oracle drafter with one plugin over `prompts` into `db`.
fn run_json(cache: &Path, prompts: &Path, db: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "--json",
        "run",
        "--backend",
        "cpu",
        "--drafter",
        "builtin:oracle",
        "--prompts",
        s(prompts),
        "--max-new-tokens",
        "12",
        "--plugin",
        "accept-length",
        "--db",
        s(db),
    ];
    args.extend(extra);
    json_out(&dl(cache, &args), &format!("run --json {extra:?}"))
}

fn runs_show_json(cache: &Path, db: &Path, id: i64) -> serde_json::Value {
    json_out(
        &dl(
            cache,
            &["--json", "runs", "show", &id.to_string(), "--db", s(db)],
        ),
        "runs show --json",
    )
}

#[test]
fn run_json_and_runs_show_json_give_one_metrics_object() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        tmp.path().join("two.jsonl"),
    );
    write_two_prompts(&prompts);
    let run = run_json(&cache, &prompts, &db, &[]);
    let run = &run.as_array().expect("run --json is a list of runs")[0];
    let id = run["run_id"].as_i64().unwrap();
    let show = runs_show_json(&cache, &db, id);

    assert_eq!(run["schema_version"], 1);
    assert_eq!(show["schema_version"], run["schema_version"]);
    assert_eq!(show["metrics"], run["metrics"]);

    // Keyed source → name → {value, unit, description, count, higher_is_better, series}.
    let native = run["metrics"]["native"]
        .as_object()
        .expect("native metrics");
    let tau = &native["tau_replayed_macro"];
    for key in [
        "value",
        "unit",
        "description",
        "count",
        "higher_is_better",
        "series",
    ] {
        assert!(
            tau.get(key).is_some(),
            "tau_replayed_macro lacks {key}: {tau}"
        );
    }
    assert!(
        run["metrics"]["accept-length"]
            .as_object()
            .is_some_and(|m| !m.is_empty()),
        "the plugin's run-level metrics are in `metrics` too: {}",
        run["metrics"]
    );
    // Exactly the stored run-level rows, value for value.
    let stored = metric_map(&db, id);
    let run_rows: Vec<_> = stored
        .iter()
        .filter(|(_, m)| m.scope == MetricScope::Run)
        .collect();
    let keyed: usize = run["metrics"]
        .as_object()
        .unwrap()
        .values()
        .map(|by_name| by_name.as_object().unwrap().len())
        .sum();
    assert_eq!(keyed, run_rows.len());
    for (_, m) in &run_rows {
        let j = &run["metrics"][&m.source][&m.name];
        match j["value"].as_f64() {
            Some(v) => assert_eq!(v.to_bits(), m.value.to_bits(), "{}/{}", m.source, m.name),
            None => assert!(m.value.is_nan(), "{}/{}: {j}", m.source, m.name),
        }
        assert_eq!(j["count"], m.count);
    }

    // The other scopes, in the same shape: prompt index and category name, then source → name.
    assert!(
        show["prompt_metrics"]["0"]["native"]["tau_replayed"]["value"].is_f64(),
        "{}",
        show["prompt_metrics"]
    );
    assert!(
        show["category_metrics"]["code"]["native"]["tau_replayed_macro"]["value"].is_f64(),
        "{}",
        show["category_metrics"]
    );
    let scoped = stored
        .iter()
        .filter(|(_, m)| m.scope != MetricScope::Run)
        .count();
    let in_show: usize = ["prompt_metrics", "category_metrics"]
        .iter()
        .flat_map(|k| show[k].as_object().unwrap().values())
        .flat_map(|by_source| by_source.as_object().unwrap().values())
        .map(|by_name| by_name.as_object().unwrap().len())
        .sum();
    assert_eq!(in_show, scoped, "every stored row appears once");
}

#[test]
fn merge_json_gives_the_merged_runs_metrics_in_the_same_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, prompts, merged) = (
        tmp.path().join("cache"),
        tmp.path().join("two.jsonl"),
        tmp.path().join("merged.sqlite"),
    );
    write_two_prompts(&prompts);
    let shards: Vec<_> = (0..2)
        .map(|i| {
            let db = tmp.path().join(format!("shard{i}.sqlite"));
            run_json(&cache, &prompts, &db, &["--shard", &format!("{i}/2")]);
            db
        })
        .collect();
    let mut args = vec!["--json", "merge", "--db", s(&merged)];
    args.extend(shards.iter().map(|p| s(p)));
    let out = json_out(&dl(&cache, &args), "merge --json");
    let show = runs_show_json(&cache, &merged, out["run_id"].as_i64().unwrap());
    assert_eq!(out["schema_version"], 1);
    assert_eq!(out["metrics"], show["metrics"]);
    assert!(
        out["metrics"]["native"]["tau_replayed_macro"]["value"].is_f64(),
        "{}",
        out["metrics"]
    );
    assert!(
        out["metrics"]["accept-length"].is_object(),
        "{}",
        out["metrics"]
    );
}
