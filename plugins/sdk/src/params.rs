//! Parameters: checked against the plugin's declared `ParamSpec`s, defaults filled in.

use crate::{Param, ParamSpec, ParamValue, PluginError, Region};

/// Resolved parameters: every declared parameter has a value of its declared kind.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    values: Vec<(String, ParamValue)>,
}

impl Params {
    /// Resolve `given` against `specs`: unknown names, duplicates and wrong kinds are
    /// `InvalidParams`; an int is accepted where a float is declared.
    pub fn resolve(specs: &[ParamSpec], given: &[Param]) -> Result<Params, PluginError> {
        let mut values: Vec<(String, ParamValue)> = specs
            .iter()
            .map(|s| (s.name.clone(), s.default.clone()))
            .collect();
        let mut seen: Vec<&str> = Vec::new();
        for p in given {
            if seen.contains(&p.name.as_str()) {
                return Err(PluginError::InvalidParams(format!(
                    "parameter {} given twice",
                    p.name
                )));
            }
            seen.push(&p.name);
            let Some(slot) = values.iter_mut().find(|(n, _)| *n == p.name) else {
                let known: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                return Err(PluginError::InvalidParams(format!(
                    "unknown parameter {} (known: {})",
                    p.name,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            };
            slot.1 = match (&slot.1, &p.value) {
                (ParamValue::Float(_), ParamValue::Int(v)) => ParamValue::Float(*v as f64),
                (d, v) if d.kind() == v.kind() => v.clone(),
                (d, v) => {
                    return Err(PluginError::InvalidParams(format!(
                        "parameter {} must be {}, got {} {}",
                        p.name,
                        d.kind(),
                        v.kind(),
                        v
                    )))
                }
            };
        }
        Ok(Params { values })
    }

    fn get(&self, name: &str) -> Result<&ParamValue, PluginError> {
        self.values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .ok_or_else(|| {
                PluginError::Internal(format!("plugin reads undeclared parameter {name}"))
            })
    }

    pub fn int(&self, name: &str) -> Result<i64, PluginError> {
        match self.get(name)? {
            ParamValue::Int(v) => Ok(*v),
            v => Err(PluginError::Internal(format!(
                "parameter {name} is {}, not int",
                v.kind()
            ))),
        }
    }

    pub fn float(&self, name: &str) -> Result<f64, PluginError> {
        match self.get(name)? {
            ParamValue::Float(v) => Ok(*v),
            v => Err(PluginError::Internal(format!(
                "parameter {name} is {}, not float",
                v.kind()
            ))),
        }
    }

    pub fn flag(&self, name: &str) -> Result<bool, PluginError> {
        match self.get(name)? {
            ParamValue::Flag(v) => Ok(*v),
            v => Err(PluginError::Internal(format!(
                "parameter {name} is {}, not flag",
                v.kind()
            ))),
        }
    }

    pub fn text(&self, name: &str) -> Result<&str, PluginError> {
        match self.get(name)? {
            ParamValue::Text(v) => Ok(v),
            v => Err(PluginError::Internal(format!(
                "parameter {name} is {}, not text",
                v.kind()
            ))),
        }
    }

    /// A text parameter holding a comma-separated list of positive integers ("4,8,16"), sorted
    /// and deduplicated.
    pub fn positive_int_list(&self, name: &str) -> Result<Vec<usize>, PluginError> {
        let text = self.text(name)?;
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match part.parse::<usize>() {
                Ok(v) if v > 0 => out.push(v),
                _ => {
                    return Err(PluginError::InvalidParams(format!(
                        "parameter {name}: {part:?} is not a positive integer (expected a list like \"4,8,16\")"
                    )))
                }
            }
        }
        if out.is_empty() {
            return Err(PluginError::InvalidParams(format!(
                "parameter {name} is empty"
            )));
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The common `region` parameter: which anchors a metric counts.
    pub fn region_filter(&self, name: &str) -> Result<RegionFilter, PluginError> {
        match self.text(name)? {
            "completion" => Ok(RegionFilter::Completion),
            "prompt" => Ok(RegionFilter::Prompt),
            "all" => Ok(RegionFilter::All),
            other => Err(PluginError::InvalidParams(format!(
                "parameter {name} is {other:?}; expected \"completion\", \"prompt\" or \"all\""
            ))),
        }
    }
}

/// Which anchors a metric counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionFilter {
    /// Anchors inside the target's continuation: what deployment sees (the default).
    Completion,
    /// Prompt anchors only.
    Prompt,
    /// Every stored anchor.
    All,
}

impl RegionFilter {
    pub fn accepts(self, region: Region) -> bool {
        match self {
            RegionFilter::All => true,
            RegionFilter::Completion => region == Region::Completion,
            RegionFilter::Prompt => region == Region::Prompt,
        }
    }
}

/// The `region` parameter spec shared by the built-in metrics.
pub fn region_param(default: &str) -> ParamSpec {
    ParamSpec::new(
        "region",
        "which anchors count: \"completion\" (deployment), \"prompt\" or \"all\"",
        ParamValue::Text(default.into()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<ParamSpec> {
        vec![
            ParamSpec::new("budgets", "", ParamValue::Text("4,8".into())),
            ParamSpec::new("scale", "", ParamValue::Float(1.5)),
            ParamSpec::new("strict", "", ParamValue::Flag(false)),
        ]
    }

    #[test]
    fn defaults_and_overrides() {
        let p = Params::resolve(&specs(), &[Param::new("scale", ParamValue::Int(2))]).unwrap();
        assert_eq!(p.float("scale").unwrap(), 2.0);
        assert!(!p.flag("strict").unwrap());
        assert_eq!(p.positive_int_list("budgets").unwrap(), vec![4, 8]);
    }

    #[test]
    fn bad_params_are_named() {
        let e = Params::resolve(&specs(), &[Param::new("nope", ParamValue::Int(1))]).unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown parameter nope (known: budgets, scale, strict)"),
            "{e}"
        );
        let e = Params::resolve(&specs(), &[Param::new("strict", ParamValue::Int(1))]).unwrap_err();
        assert!(
            e.to_string().contains("strict must be flag, got int 1"),
            "{e}"
        );
        let p = Params::resolve(
            &specs(),
            &[Param::new("budgets", ParamValue::Text("4,x".into()))],
        )
        .unwrap();
        let e = p.positive_int_list("budgets").unwrap_err();
        assert!(
            e.to_string().contains("\"x\" is not a positive integer"),
            "{e}"
        );
        let e = Params::resolve(
            &specs(),
            &[
                Param::new("scale", ParamValue::Int(1)),
                Param::new("scale", ParamValue::Int(2)),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }

    #[test]
    fn int_lists_are_sorted_and_deduplicated() {
        let p = Params::resolve(
            &specs(),
            &[Param::new(
                "budgets",
                ParamValue::Text(" 16, 4 ,4,8,".into()),
            )],
        )
        .unwrap();
        assert_eq!(p.positive_int_list("budgets").unwrap(), vec![4, 8, 16]);
    }
}
