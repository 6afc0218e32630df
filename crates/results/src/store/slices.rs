//! The workload slice of every run (docs/slices.md), read from the settings each run stored
//! (`config_json["slice"]`, absent for the default slice) by `crate::slice::Slice::of_config`,
//! the one rule: the UI's facet bar lists their values and filters the run list by them.

use super::Store;
use crate::slice::Slice;
use anyhow::Result;

impl Store {
    /// `(run id, slice)` of every run, by id.
    pub fn run_slices(&self) -> Result<Vec<(i64, Slice)>> {
        self.read(|c| {
            let mut st = c.prepare("SELECT id, config_json FROM run ORDER BY id")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (id, config) = row?;
                let config = serde_json::from_str(&config).unwrap_or(serde_json::Value::Null);
                out.push((id, Slice::of_config(&config)));
            }
            Ok(out)
        })
    }
}
