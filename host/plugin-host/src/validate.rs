//! The contract's rules on what a plugin returns (metadata and metric values). A plugin that
//! breaks them fails with `bad-output`; nothing it returned is stored.

use std::collections::HashSet;

use crate::runtime::Limits;
use crate::types::{Metadata, MetricResult, SeriesKind, SeriesResult};
use crate::wit;

const MAX_NAME: usize = 64;
const MAX_TEXT: usize = 2000;

fn identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
}

fn plugin_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
}

/// Check `describe()`'s answer. The message completes "describe() ...".
pub(crate) fn metadata(m: &Metadata) -> Result<(), String> {
    if !plugin_name(&m.name) {
        return Err(format!(
            "returned the plugin name {:?}; expected [a-z][a-z0-9_-]*, at most {MAX_NAME} bytes",
            m.name
        ));
    }
    if m.version.is_empty()
        || m.version.len() > MAX_NAME
        || m.version
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "returned the version {:?}; expected a short version string like 0.1.0",
            m.version
        ));
    }
    if m.description.len() > MAX_TEXT {
        return Err(format!(
            "returned a description of {} bytes (limit {MAX_TEXT})",
            m.description.len()
        ));
    }
    if m.metrics.is_empty() || m.metrics.len() > 256 {
        return Err(format!(
            "declares {} metrics; expected 1 to 256",
            m.metrics.len()
        ));
    }
    let mut seen = HashSet::new();
    for s in &m.metrics {
        let base = s.name.strip_suffix("_*").unwrap_or(&s.name);
        if !identifier(base) {
            return Err(format!(
                "declares the metric name {:?}; expected [a-z][a-z0-9_]* (or a family ending in _*)",
                s.name
            ));
        }
        if !seen.insert(s.name.as_str()) {
            return Err(format!("declares the metric {} twice", s.name));
        }
        if s.unit.len() > MAX_NAME || s.description.len() > MAX_TEXT {
            return Err(format!(
                "declares metric {} with an over-long unit or description",
                s.name
            ));
        }
    }
    let mut seen = HashSet::new();
    for p in &m.params {
        if !identifier(&p.name) {
            return Err(format!(
                "declares the parameter name {:?}; expected [a-z][a-z0-9_]*",
                p.name
            ));
        }
        if !seen.insert(p.name.as_str()) {
            return Err(format!("declares the parameter {} twice", p.name));
        }
        if p.description.len() > MAX_TEXT {
            return Err(format!(
                "declares parameter {} with an over-long description",
                p.name
            ));
        }
    }
    if m.params.len() > 64 {
        return Err(format!("declares {} parameters (limit 64)", m.params.len()));
    }
    Ok(())
}

/// Check and convert the values of one `finish`/`evaluate`. The message completes
/// "returned ...".
pub(crate) fn results(
    meta: &Metadata,
    values: Vec<wit::MetricValue>,
    limits: &Limits,
) -> Result<Vec<MetricResult>, String> {
    if values.len() > limits.max_values {
        return Err(format!(
            "{} metric values (limit {})",
            values.len(),
            limits.max_values
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(values.len());
    for v in values {
        if meta.spec_for(&v.name).is_none() {
            let short: String = v.name.chars().take(80).collect();
            return Err(format!(
                "the metric {short:?}, which describe() does not declare"
            ));
        }
        if !seen.insert(v.name.clone()) {
            return Err(format!("the metric {} twice", v.name));
        }
        if v.value.is_infinite() {
            return Err(format!(
                "an infinite value for {} (NaN means undefined; infinities are not allowed)",
                v.name
            ));
        }
        let series = match v.series {
            None => None,
            Some(s) => {
                if s.values.len() > limits.max_series_len {
                    return Err(format!(
                        "a series of {} entries for {} (limit {})",
                        s.values.len(),
                        v.name,
                        limits.max_series_len
                    ));
                }
                if s.values.len() != s.counts.len() {
                    return Err(format!(
                        "a series for {} with {} values but {} counts (must be equal)",
                        v.name,
                        s.values.len(),
                        s.counts.len()
                    ));
                }
                if let Some(i) = s.values.iter().position(|x| x.is_infinite()) {
                    return Err(format!(
                        "an infinite series value for {} at index {i}",
                        v.name
                    ));
                }
                Some(SeriesResult {
                    kind: match s.kind {
                        wit::SeriesKind::PerPosition => SeriesKind::PerPosition,
                        wit::SeriesKind::Histogram => SeriesKind::Histogram,
                    },
                    values: s
                        .values
                        .into_iter()
                        .map(|x| (!x.is_nan()).then_some(x))
                        .collect(),
                    counts: s.counts,
                })
            }
        };
        out.push(MetricResult {
            name: v.name,
            value: (!v.value.is_nan()).then_some(v.value),
            count: v.count,
            series,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::MetricSpec;

    fn meta() -> Metadata {
        Metadata {
            name: "m".into(),
            version: "1.0.0".into(),
            description: String::new(),
            metrics: vec![
                MetricSpec {
                    name: "tau".into(),
                    unit: "tokens".into(),
                    description: String::new(),
                    higher_is_better: true,
                },
                MetricSpec {
                    name: "acc_*".into(),
                    unit: "fraction".into(),
                    description: String::new(),
                    higher_is_better: true,
                },
            ],
            params: vec![],
            inputs: Default::default(),
        }
    }

    fn value(name: &str, v: f64) -> wit::MetricValue {
        wit::MetricValue {
            name: name.into(),
            value: v,
            count: 1,
            series: None,
        }
    }

    #[test]
    fn names_must_be_declared_or_in_a_family() {
        let l = Limits::default();
        let ok = results(
            &meta(),
            vec![
                value("tau", 2.0),
                value("acc_8", 0.5),
                value("acc_top_2", f64::NAN),
            ],
            &l,
        )
        .unwrap();
        assert_eq!(ok[2].value, None, "NaN becomes undefined");
        let e = results(&meta(), vec![value("acc_", 0.5)], &l).unwrap_err();
        assert!(e.contains("does not declare"), "{e}");
        let e = results(&meta(), vec![value("surprise", 0.5)], &l).unwrap_err();
        assert!(
            e.contains("\"surprise\", which describe() does not declare"),
            "{e}"
        );
        let e = results(&meta(), vec![value("tau", 1.0), value("tau", 2.0)], &l).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = results(&meta(), vec![value("tau", f64::INFINITY)], &l).unwrap_err();
        assert!(e.contains("infinite"), "{e}");
    }

    #[test]
    fn series_are_bounded_and_consistent() {
        let l = Limits {
            max_series_len: 4,
            ..Limits::default()
        };
        let mut v = value("tau", 1.0);
        v.series = Some(wit::draftlens::metric::types::Series {
            kind: wit::SeriesKind::Histogram,
            values: vec![0.0; 5],
            counts: vec![0; 5],
        });
        assert!(results(&meta(), vec![v.clone()], &l)
            .unwrap_err()
            .contains("series of 5 entries"));
        v.series = Some(wit::draftlens::metric::types::Series {
            kind: wit::SeriesKind::Histogram,
            values: vec![0.0; 2],
            counts: vec![0; 3],
        });
        assert!(results(&meta(), vec![v], &l)
            .unwrap_err()
            .contains("2 values but 3 counts"));
    }

    #[test]
    fn metadata_rules() {
        assert!(metadata(&meta()).is_ok());
        let mut m = meta();
        m.name = "Bad Name".into();
        assert!(metadata(&m).unwrap_err().contains("plugin name"));
        let mut m = meta();
        m.metrics[1].name = "tau".into();
        assert!(metadata(&m).unwrap_err().contains("twice"));
        let mut m = meta();
        m.metrics.clear();
        assert!(metadata(&m).unwrap_err().contains("declares 0 metrics"));
    }
}
