//! The config diff of a comparison: identity fields and the flattened run config, one row per
//! key, rows that differ between runs first.

use super::ConfigRow;
use draftlens_results::store::RunInfo;
use std::collections::BTreeMap;

/// Identity fields and the flattened config, per run; rows that differ first.
pub fn config_diff(runs: &[RunInfo]) -> Vec<ConfigRow> {
    let mut keys: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        let mut flat: Vec<(String, String)> = vec![
            ("mode".into(), r.mode.to_string()),
            ("target.arch".into(), r.target_arch.clone()),
            ("target.path".into(), r.target_path.clone()),
            ("target.sha256".into(), short(&r.target_sha256)),
            ("drafter.family".into(), r.drafter_family.clone()),
            ("drafter.series".into(), r.drafter_series.clone()),
            (
                "drafter.step".into(),
                r.drafter_step.map(|s| s.to_string()).unwrap_or_default(),
            ),
            ("drafter.path".into(), r.drafter_path.clone()),
            ("drafter.sha256".into(), short(&r.drafter_sha256)),
            ("prompt_set.name".into(), r.prompt_set_name.clone()),
            ("prompt_set.sha256".into(), short(&r.prompt_set_sha256)),
            ("backend".into(), r.backend.clone()),
            ("dtype".into(), r.dtype.clone()),
            ("block_size".into(), r.block_size.to_string()),
            ("top_k".into(), r.top_k.to_string()),
        ];
        if let Some(t) = &r.train_style {
            flat.push(("train_style.labels".into(), t.labels.clone()));
            flat.push(("train_style.mask_rule".into(), t.mask_rule.clone()));
        }
        flatten_json("config", &r.config, &mut flat);
        for (k, v) in flat {
            keys.entry(k).or_insert_with(|| vec![None; runs.len()])[i] = Some(v);
        }
    }
    let mut rows: Vec<ConfigRow> = keys
        .into_iter()
        .map(|(key, values)| {
            let differs = values.iter().any(|v| v != &values[0]);
            ConfigRow {
                key,
                values,
                differs,
            }
        })
        .collect();
    rows.sort_by_key(|r| !r.differs);
    rows
}

fn short(s: &str) -> String {
    s.chars().take(12).collect()
}

fn flatten_json(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                flatten_json(&format!("{prefix}.{k}"), x, out);
            }
        }
        serde_json::Value::String(s) => out.push((prefix.into(), s.clone())),
        other => out.push((prefix.into(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_results::store::RunMode;

    #[test]
    fn config_diff_puts_differences_first() {
        let mut a = RunInfo {
            id: 1,
            uid: "u1".into(),
            name: "a".into(),
            mode: RunMode::Deployment,
            status: draftlens_results::store::RunStatus::Complete,
            error: None,
            created_at: String::new(),
            finished_at: None,
            timings: serde_json::json!({}),
            config: serde_json::json!({"drafter": {"layers": 5, "k": [1, 2]}, "seed": 1}),
            target_path: "t".into(),
            target_sha256: String::new(),
            target_arch: "qwen3".into(),
            drafter_path: String::new(),
            drafter_sha256: String::new(),
            drafter_series: String::new(),
            drafter_step: Some(1),
            prompt_set_name: String::new(),
            prompt_set_sha256: String::new(),
            backend: "cpu".into(),
            dtype: "f32".into(),
            block_size: 16,
            top_k: 8,
            train_style: None,
            tokenizer_sha256: None,
            origin: "local".into(),
            num_prompts: 0,
            num_blocks: 0,
            drafter_family: "dflash".into(),
        };
        let mut b = a.clone();
        b.config =
            serde_json::json!({"drafter": {"layers": 3, "k": [1, 2]}, "seed": 1, "extra": "x"});
        b.drafter_step = Some(2);
        a.id = 1;
        let rows = config_diff(&[a, b]);
        let differing: Vec<&str> = rows
            .iter()
            .filter(|r| r.differs)
            .map(|r| r.key.as_str())
            .collect();
        assert_eq!(
            differing,
            ["config.drafter.layers", "config.extra", "drafter.step"]
        );
        assert!(rows.iter().take(3).all(|r| r.differs));
        let k = rows.iter().find(|r| r.key == "config.drafter.k").unwrap();
        assert_eq!(k.values[0].as_deref(), Some("[1,2]"));
    }
}
