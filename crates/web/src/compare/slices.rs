//! Workload slices in a comparison (docs/slices.md): `compare --where FACET=VALUE` keeps the runs
//! whose slice shows that value, `--group-by FACET` lists the runs under each value of a facet
//! with the group's mean τ. A run's slice is read from its stored settings by
//! `draftlens_results::slice::Slice::of_config`, the one rule; runs stored before slices read as
//! the default slice (format "as set", thinking "template default", category and language "all").

use super::Comparison;
use anyhow::{bail, Context, Result};
use draftlens_results::slice::{FacetFilter, Slice, FACETS};
use draftlens_results::store::Store;
use serde::Serialize;
use std::collections::BTreeMap;

/// The metric a slice group's τ is read from (replayed τ, pooled over the run's prompts).
pub const SLICE_TAU_METRIC: &str = "tau_replayed_pooled";

/// One run's line in the slices section.
#[derive(Clone, Debug, Serialize)]
pub struct SliceRun {
    pub run: i64,
    pub name: String,
    /// facet -> value, for every facet.
    pub facets: BTreeMap<&'static str, String>,
    pub tau: Option<f64>,
}

/// The runs that show one value of the grouping facet.
#[derive(Clone, Debug, Serialize)]
pub struct SliceGroup {
    pub value: String,
    pub runs: Vec<SliceRun>,
    /// Mean of the runs' τ (runs without one left out).
    pub tau_mean: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SliceSection {
    /// The facet the groups are of; `None`: one group holding every run.
    pub group_by: Option<&'static str>,
    pub groups: Vec<SliceGroup>,
}

/// The facet called `name` (one of [`FACETS`]), for `--group-by`.
pub fn parse_facet(name: &str) -> std::result::Result<&'static str, String> {
    FACETS
        .iter()
        .find(|f| **f == name)
        .copied()
        .ok_or_else(|| format!("unknown facet {name:?} (facets: {})", FACETS.join(", ")))
}

/// The runs of `ids` (in order) whose slice matches every filter. One error when none does,
/// listing the values the runs have for each filtered facet.
pub fn filter_runs(store: &Store, ids: &[i64], filters: &[FacetFilter]) -> Result<Vec<i64>> {
    if filters.is_empty() {
        return Ok(ids.to_vec());
    }
    let mut kept = Vec::new();
    let mut slices = Vec::new();
    for &id in ids {
        let run = store
            .run(id)?
            .with_context(|| format!("{}: no run {id}", store.path().display()))?;
        let slice = Slice::of_config(&run.run.config);
        if filters.iter().all(|f| f.matches(&slice)) {
            kept.push(id);
        }
        slices.push(slice);
    }
    if kept.is_empty() {
        let seen: Vec<String> = filters
            .iter()
            .map(|f| {
                let mut values: Vec<String> = slices.iter().map(|s| s.facet(f.facet)).collect();
                values.sort();
                values.dedup();
                format!("{}: {}", f.facet, values.join(", "))
            })
            .collect();
        bail!(
            "--where {} matches none of the {} runs (their values: {})",
            filters
                .iter()
                .map(|f| format!("{}={}", f.facet, f.value))
                .collect::<Vec<_>>()
                .join(" --where "),
            ids.len(),
            seen.join("; ")
        );
    }
    Ok(kept)
}

/// True when any run of `c` has a slice: only then does a comparison show the slices section
/// unasked (a comparison of unsliced runs prints what it always printed).
pub fn any_sliced(c: &Comparison) -> bool {
    c.runs
        .iter()
        .any(|r| !Slice::of_config(&r.config).is_default())
}

/// The slices section of `c`, grouped by `group_by` (groups in order of the value's first run).
pub fn slice_section(c: &Comparison, group_by: Option<&'static str>) -> SliceSection {
    let tau = c
        .metrics
        .iter()
        .find(|m| m.key.name == SLICE_TAU_METRIC)
        .map(|m| m.values.clone())
        .unwrap_or_else(|| vec![None; c.runs.len()]);
    let mut groups: Vec<SliceGroup> = Vec::new();
    for (i, r) in c.runs.iter().enumerate() {
        let slice = Slice::of_config(&r.config);
        let value = group_by.map(|f| slice.facet(f)).unwrap_or_default();
        let line = SliceRun {
            run: r.id,
            name: r.name.clone(),
            facets: slice.facets().into_iter().collect(),
            tau: tau.get(i).copied().flatten(),
        };
        match groups.iter_mut().find(|g| g.value == value) {
            Some(g) => g.runs.push(line),
            None => groups.push(SliceGroup {
                value,
                runs: vec![line],
                tau_mean: None,
            }),
        }
    }
    for g in &mut groups {
        let taus: Vec<f64> = g.runs.iter().filter_map(|r| r.tau).collect();
        g.tau_mean = (!taus.is_empty()).then(|| taus.iter().sum::<f64>() / taus.len() as f64);
    }
    SliceSection { group_by, groups }
}

/// The section as terminal text.
pub fn slice_text(s: &SliceSection) -> String {
    use std::fmt::Write;
    let mut out = String::from("\nworkload slices (docs/slices.md)\n");
    for g in &s.groups {
        if let Some(f) = s.group_by {
            let _ = writeln!(
                out,
                "  {f} = {}: {} run{}, mean τ {}",
                g.value,
                g.runs.len(),
                if g.runs.len() == 1 { "" } else { "s" },
                super::fmt_value(g.tau_mean)
            );
        }
        for r in &g.runs {
            let facets: Vec<String> = FACETS
                .iter()
                .map(|f| format!("{f}={}", r.facets[f]))
                .collect();
            let _ = writeln!(
                out,
                "    run {:<4} τ {:<7} {}  {}",
                r.run,
                super::fmt_value(r.tau),
                facets.join(" "),
                r.name
            );
        }
    }
    out
}
