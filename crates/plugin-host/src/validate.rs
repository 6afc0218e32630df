//! The contract's rules on what a plugin returns (metadata and metric values). A plugin that
//! breaks them fails with `bad-output`; nothing it returned is stored.

use std::collections::HashSet;

use crate::runtime::Limits;
use crate::types::{Metadata, MetricResult, SeriesKind, SeriesResult};
use crate::wit;

use crate::text::preview;

/// Bytes of a plugin, metric (family members included) or parameter name.
pub const MAX_NAME: usize = 64;
/// Bytes of a description.
pub const MAX_TEXT: usize = 2000;
/// Largest count a value may have: counts are stored as SQLite integers (i64).
pub const MAX_COUNT: u64 = i64::MAX as u64;

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
            "returned the plugin name \"{}\"; expected [a-z][a-z0-9_-]*, at most {MAX_NAME} bytes",
            preview(&m.name, 64)
        ));
    }
    if m.version.is_empty()
        || m.version.len() > MAX_NAME
        || m.version
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "returned the version \"{}\"; expected a short version string like 0.1.0",
            preview(&m.version, 64)
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
                "declares the metric name \"{}\"; expected [a-z][a-z0-9_]*, at most {MAX_NAME} bytes (or a family \
                 ending in _*)",
                preview(&s.name, 64)
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
                "declares the parameter name \"{}\"; expected [a-z][a-z0-9_]*, at most {MAX_NAME} bytes",
                preview(&p.name, 64)
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
        if let crate::types::ParamValue::Text(t) = &p.default {
            if t.len() > MAX_TEXT {
                return Err(format!(
                    "declares parameter {} with a default of {} bytes (limit {MAX_TEXT})",
                    p.name,
                    t.len()
                ));
            }
        }
    }
    if m.params.len() > 64 {
        return Err(format!("declares {} parameters (limit 64)", m.params.len()));
    }
    Ok(())
}

/// What one plugin may return over one run, over all its groups (see [`Limits`]).
pub(crate) struct OutputBudget<'m> {
    /// The plugin's declaration: each value's row stores its metric's unit and description.
    meta: &'m Metadata,
    max_entries: usize,
    max_bytes: usize,
    entries: usize,
    bytes: usize,
}

/// Bytes a value costs besides its text (value, count, flags), and a series entry.
const VALUE_BYTES: usize = 16;
const ENTRY_BYTES: usize = 16;

impl<'m> OutputBudget<'m> {
    pub(crate) fn new(limits: &Limits, meta: &'m Metadata) -> Self {
        OutputBudget {
            meta,
            max_entries: limits.max_output_entries,
            max_bytes: limits.max_output_bytes,
            entries: 0,
            bytes: 0,
        }
    }

    /// What storing `v` costs: the row keeps its name and its metric's unit and description
    /// (each row carries its own copy, in memory and in the database: a 2000-byte description
    /// on a one-letter name is 2000 bytes per row, not 1), plus [`VALUE_BYTES`], plus
    /// [`ENTRY_BYTES`] per series entry.
    fn cost(&self, v: &MetricResult) -> usize {
        let text = self
            .meta
            .spec_for(&v.name)
            .map_or(0, |s| s.unit.len() + s.description.len());
        let n = v.series.as_ref().map_or(0, |s| s.values.len());
        (v.name.len() + text + VALUE_BYTES).saturating_add(n.saturating_mul(ENTRY_BYTES))
    }

    /// Count `values` against the budget. The message completes "returned ...".
    pub(crate) fn charge(&mut self, values: &[MetricResult]) -> Result<(), String> {
        for v in values {
            let n = v.series.as_ref().map_or(0, |s| s.values.len());
            self.entries = self.entries.saturating_add(1 + n);
            self.bytes = self.bytes.saturating_add(self.cost(v));
        }
        if self.entries > self.max_entries || self.bytes > self.max_bytes {
            return Err(format!(
                "more than its output budget for a run: {} values and series entries ({} bytes as stored, \
                 descriptions and units included) over all its groups, limit {} entries and {} bytes",
                self.entries, self.bytes, self.max_entries, self.max_bytes
            ));
        }
        Ok(())
    }
}

/// After [`metadata`] accepted it: strip control characters and bidi controls from the free
/// text (version, descriptions, units, text defaults), which terminals, the database and pages
/// show. Names are identifiers already.
pub(crate) fn clean_metadata(m: &mut Metadata) {
    use crate::text::clean;
    // The version may hold anything but whitespace and control characters: bidi controls
    // (U+202E, U+2066) would reorder what `plugins info`, `runs show` and pages show.
    m.version = clean(&m.version, MAX_NAME);
    m.description = clean(&m.description, MAX_TEXT);
    for s in &mut m.metrics {
        s.unit = clean(&s.unit, MAX_NAME);
        s.description = clean(&s.description, MAX_TEXT);
    }
    for p in &mut m.params {
        p.description = clean(&p.description, MAX_TEXT);
        if let crate::types::ParamValue::Text(t) = &mut p.default {
            *t = clean(t, MAX_TEXT);
        }
    }
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
            return Err(format!(
                "the metric \"{}\", which describe() does not declare",
                preview(&v.name, 64)
            ));
        }
        // A family member (`prefix_*` → `prefix_8`) is a metric name like any other.
        if !identifier(&v.name) {
            return Err(format!(
                "the metric name \"{}\"; expected [a-z][a-z0-9_]*, at most {MAX_NAME} bytes",
                preview(&v.name, 64)
            ));
        }
        if v.count > MAX_COUNT {
            return Err(format!(
                "a count of {} for {} (counts are at most {MAX_COUNT})",
                v.count, v.name
            ));
        }
        if !v.value.is_nan() && v.count == 0 {
            return Err(format!(
                "the value {} for {} with a count of 0: a value is computed over count items (its \
                 denominator), and over none it is undefined, which is NaN",
                v.value, v.name
            ));
        }
        if v.value.is_nan() && v.count != 0 {
            return Err(format!(
                "an undefined (NaN) value for {} with a count of {}: NaN means undefined, whose count is 0",
                v.name, v.count
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
                if let Some(i) = s.counts.iter().position(|&n| n > MAX_COUNT) {
                    return Err(format!(
                        "a series count of {} for {} at index {i} (counts are at most {MAX_COUNT})",
                        s.counts[i], v.name
                    ));
                }
                if let Some(i) =
                    (0..s.values.len()).find(|&i| s.values[i].is_nan() && s.counts[i] != 0)
                {
                    return Err(format!(
                        "an undefined (NaN) series value for {} at index {i} with a count of {}: NaN means \
                         undefined, whose count is 0",
                        v.name, s.counts[i]
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
        let mut undefined = value("acc_top_2", f64::NAN);
        undefined.count = 0;
        let ok = results(
            &meta(),
            vec![value("tau", 2.0), value("acc_8", 0.5), undefined],
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
    fn the_output_budget_is_shared_by_every_call() {
        let l = Limits {
            max_output_entries: 10,
            max_output_bytes: 1000,
            ..Limits::default()
        };
        let m = meta();
        let mut b = OutputBudget::new(&l, &m);
        let mut v = value("tau", 1.0);
        v.series = Some(wit::draftlens::metric::types::Series {
            kind: wit::SeriesKind::PerPosition,
            values: vec![0.5; 4],
            counts: vec![1; 4],
        });
        let v = results(&meta(), vec![v], &l).unwrap();
        // 5 entries per call: the second call fits, the third does not.
        assert!(b.charge(&v).is_ok());
        assert!(b.charge(&v).is_ok());
        let e = b.charge(&v).unwrap_err();
        assert!(e.contains("15 values and series entries"), "{e}");
        // Bytes: a long name costs its length.
        let mut b = OutputBudget::new(&l, &m);
        let e = b
            .charge(&[MetricResult::scalar(&"x".repeat(2000), Some(1.0), 1)])
            .unwrap_err();
        assert!(e.contains("2016 bytes"), "{e}");
    }

    #[test]
    fn the_output_budget_counts_the_unit_and_description_every_row_stores() {
        // Issue 39: the maximum descriptions on one-letter names fitted the budget (17 bytes a
        // value) while every stored row carried 2000 bytes: gigabytes of rows and memory.
        let mut m = meta();
        m.metrics[0].description = "d".repeat(MAX_TEXT);
        m.metrics[0].unit = "u".repeat(MAX_NAME);
        let l = Limits {
            max_output_bytes: 100 * (3 + MAX_TEXT + MAX_NAME + 16),
            ..Limits::default()
        };
        let mut b = OutputBudget::new(&l, &m);
        let group = vec![MetricResult::scalar("tau", Some(1.0), 1)];
        for _ in 0..100 {
            b.charge(&group).unwrap();
        }
        let e = b.charge(&group).unwrap_err();
        assert!(
            e.contains(&format!(
                "({} bytes as stored",
                101 * (3 + MAX_TEXT + MAX_NAME + 16)
            )),
            "{e}"
        );
        // A family member pays its family's description.
        let mut m = meta();
        m.metrics[1].description = "d".repeat(1000);
        let mut b = OutputBudget::new(&l, &m);
        b.charge(&[MetricResult::scalar("acc_8", Some(1.0), 1)])
            .unwrap();
        assert_eq!(b.bytes, 5 + "fraction".len() + 1000 + 16);
    }

    #[test]
    fn member_names_counts_and_nan_follow_the_rules() {
        let l = Limits::default();
        // A family member with a huge name: refused, and the message quotes only its start.
        let long = format!("acc_{}", "x".repeat(1 << 20));
        let e = results(&meta(), vec![value(&long, 0.5)], &l).unwrap_err();
        assert!(
            e.contains("at most 64 bytes") && e.len() < 400,
            "{}",
            &e[..200]
        );
        let e = results(&meta(), vec![value("acc_\u{1b}[2J", 0.5)], &l).unwrap_err();
        assert!(!e.contains('\u{1b}'), "{e}");
        // NaN is undefined: its count must be 0.
        let mut v = value("tau", f64::NAN);
        v.count = 3;
        let e = results(&meta(), vec![v.clone()], &l).unwrap_err();
        assert!(
            e.contains("undefined (NaN) value for tau with a count of 3"),
            "{e}"
        );
        v.count = 0;
        assert!(results(&meta(), vec![v], &l).is_ok());
        // Counts are stored as i64: u64::MAX must not become -1.
        let mut v = value("tau", 1.0);
        v.count = u64::MAX;
        let e = results(&meta(), vec![v], &l).unwrap_err();
        assert!(e.contains("a count of 18446744073709551615"), "{e}");
        let mut v = value("tau", 1.0);
        v.series = Some(wit::draftlens::metric::types::Series {
            kind: wit::SeriesKind::PerPosition,
            values: vec![0.5, f64::NAN],
            counts: vec![2, 1],
        });
        let e = results(&meta(), vec![v], &l).unwrap_err();
        assert!(e.contains("NaN) series value for tau at index 1"), "{e}");
    }

    #[test]
    fn a_defined_value_needs_a_count() {
        // Issue 39: a value over no items was accepted; undefined is NaN with count 0.
        let l = Limits::default();
        let mut v = value("tau", 0.0);
        v.count = 0;
        let e = results(&meta(), vec![v], &l).unwrap_err();
        assert!(e.contains("the value 0 for tau with a count of 0"), "{e}");
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

    #[test]
    fn the_version_reaches_nobody_with_bidi_controls() {
        // Issue 39: U+202E and U+2066 in a version passed into `plugins info`, `runs show`,
        // `plugins list` and the database.
        let mut m = meta();
        m.version = "1.0.0\u{202e}\u{2066}".into();
        assert!(metadata(&m).is_ok());
        clean_metadata(&mut m);
        assert_eq!(m.version, "1.0.0\u{fffd}\u{fffd}");
    }
}
