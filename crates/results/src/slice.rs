//! Workload slices (docs/slices.md): which part of a prompt set a run evaluates and how its prompts
//! are presented to the target: chat template or raw text, the template's thinking switch, one
//! category, one language. The same drafter's τ swings 2–3× between slices, so a slice is a run
//! option: it is stored in the run's settings (`config_json["slice"]`), it is part of the run's
//! evaluation identity, and `compare` and the web UI group and filter runs by it.
//!
//! A run with no slice option stores nothing (no `"slice"` key, no identity field), so every run
//! stored before slices existed, and every run made with the default options, keeps its settings
//! text and its identity byte for byte. This module is the one place that reads a slice back.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How prompts reach the target (`--prompt-format`). Without the option each prompt is used as
/// its set gives it (a `messages` prompt through the chat template, a `prompt` as raw text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptFormat {
    /// Every prompt through the target's chat template (a raw prompt becomes one user message).
    Chat,
    /// Every prompt as plain text, no template (a chat prompt's message contents, joined by a
    /// blank line).
    Raw,
}

impl PromptFormat {
    pub const ALL: [PromptFormat; 2] = [PromptFormat::Chat, PromptFormat::Raw];

    pub fn as_str(self) -> &'static str {
        match self {
            PromptFormat::Chat => "chat",
            PromptFormat::Raw => "raw",
        }
    }
}

impl std::str::FromStr for PromptFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| format!("unknown prompt format {s:?} (expected chat or raw)"))
    }
}

/// A run's slice. Every field `None` is the default: the whole set, as the set gives it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_format: Option<PromptFormat>,
    /// The chat template's thinking switch (`enable_thinking`); `None` is the template's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<bool>,
    /// Only prompts whose `category` is this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Only prompts whose `language` is this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// The facets a run is grouped and filtered by, in display order (`compare --group-by`, the
/// UI's facet bar, `?format=` ... in its URLs).
pub const FACETS: [&str; 4] = ["format", "thinking", "category", "language"];

/// What a facet shows for a run that did not set it.
pub const FACET_FORMAT_DEFAULT: &str = "as set";
pub const FACET_THINKING_DEFAULT: &str = "template default";
pub const FACET_ALL: &str = "all";

impl Slice {
    /// True when no slice option is set (nothing is stored).
    pub fn is_default(&self) -> bool {
        *self == Slice::default()
    }

    /// The slice as stored in a run's settings and identity: `None` for the default slice.
    pub fn to_stored(&self) -> Option<serde_json::Value> {
        (!self.is_default())
            .then(|| serde_json::to_value(self).expect("a slice serialises to JSON"))
    }

    /// The slice of a run from its settings (`config_json`): the default when the run stored
    /// none (runs made before slices, runs with default options, imports that carry none) or
    /// when what it stored is not a slice this version reads.
    pub fn of_config(config: &serde_json::Value) -> Slice {
        config
            .get("slice")
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }

    /// The value this slice shows for `facet` (one of [`FACETS`]); defaults read as
    /// [`FACET_FORMAT_DEFAULT`], [`FACET_THINKING_DEFAULT`] and [`FACET_ALL`].
    pub fn facet(&self, facet: &str) -> String {
        match facet {
            "format" => self
                .prompt_format
                .map_or(FACET_FORMAT_DEFAULT, PromptFormat::as_str)
                .to_string(),
            "thinking" => match self.thinking {
                None => FACET_THINKING_DEFAULT.into(),
                Some(true) => "on".into(),
                Some(false) => "off".into(),
            },
            "category" => self.category.clone().unwrap_or_else(|| FACET_ALL.into()),
            "language" => self.language.clone().unwrap_or_else(|| FACET_ALL.into()),
            _ => String::new(),
        }
    }

    /// `(facet, value)` for every facet, in [`FACETS`] order.
    pub fn facets(&self) -> Vec<(&'static str, String)> {
        FACETS.iter().map(|f| (*f, self.facet(f))).collect()
    }
}

impl fmt::Display for Slice {
    /// `format=chat thinking=off category=math500 language=en`, only the options set; `default`
    /// when none is.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_default() {
            return f.write_str("default");
        }
        let set: Vec<String> = FACETS
            .iter()
            .zip([
                self.prompt_format.is_some(),
                self.thinking.is_some(),
                self.category.is_some(),
                self.language.is_some(),
            ])
            .filter(|(_, is_set)| *is_set)
            .map(|(name, _)| format!("{name}={}", self.facet(name)))
            .collect();
        f.write_str(&set.join(" "))
    }
}

/// A facet filter (`compare --where format=chat`, the UI's `?format=chat`): `FACET=VALUE`, where
/// VALUE is what [`Slice::facet`] shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FacetFilter {
    pub facet: &'static str,
    pub value: String,
}

impl FacetFilter {
    /// Parses `FACET=VALUE`; an unknown facet or a missing `=` is one error naming the input.
    pub fn parse(s: &str) -> Result<FacetFilter, String> {
        let (name, value) = s.split_once('=').ok_or_else(|| {
            format!(
                "{s:?}: expected FACET=VALUE, FACET one of {}",
                FACETS.join(", ")
            )
        })?;
        let facet = FACETS.iter().find(|f| **f == name.trim()).ok_or_else(|| {
            format!(
                "{s:?}: unknown facet {name:?} (facets: {})",
                FACETS.join(", ")
            )
        })?;
        Ok(FacetFilter {
            facet,
            value: value.trim().to_string(),
        })
    }

    pub fn matches(&self, slice: &Slice) -> bool {
        slice.facet(self.facet) == self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_slice_stores_nothing_and_reads_back_from_any_config() {
        assert!(Slice::default().is_default());
        assert_eq!(Slice::default().to_stored(), None);
        assert_eq!(
            Slice::of_config(&json!({"mode": "deployment"})),
            Slice::default()
        );
        // A stored value this version cannot read is the default, not an error: old and foreign
        // settings must still list.
        assert_eq!(Slice::of_config(&json!({"slice": 3})), Slice::default());
        assert_eq!(Slice::default().to_string(), "default");
    }

    #[test]
    fn stored_form_is_only_the_options_set() {
        let s = Slice {
            prompt_format: Some(PromptFormat::Chat),
            thinking: Some(false),
            category: None,
            language: Some("zh".into()),
        };
        let stored = s.to_stored().unwrap();
        assert_eq!(
            serde_json::to_string(&stored).unwrap(),
            r#"{"language":"zh","prompt_format":"chat","thinking":false}"#
        );
        assert_eq!(Slice::of_config(&json!({ "slice": stored })), s);
        assert_eq!(s.to_string(), "format=chat thinking=off language=zh");
        assert_eq!(
            s.facets(),
            vec![
                ("format", "chat".to_string()),
                ("thinking", "off".to_string()),
                ("category", "all".to_string()),
                ("language", "zh".to_string())
            ]
        );
    }

    #[test]
    fn prompt_format_parses_and_refuses() {
        assert_eq!("chat".parse::<PromptFormat>(), Ok(PromptFormat::Chat));
        assert_eq!("raw".parse::<PromptFormat>(), Ok(PromptFormat::Raw));
        let e = "jinja".parse::<PromptFormat>().unwrap_err();
        assert!(e.contains("\"jinja\"") && e.contains("chat or raw"), "{e}");
    }

    #[test]
    fn facet_filters_parse_match_and_refuse() {
        let f = FacetFilter::parse("thinking=off").unwrap();
        assert!(f.matches(&Slice {
            thinking: Some(false),
            ..Default::default()
        }));
        assert!(!f.matches(&Slice::default()));
        let all = FacetFilter::parse("category=all").unwrap();
        assert!(all.matches(&Slice::default()));
        let e = FacetFilter::parse("colour=red").unwrap_err();
        assert!(e.contains("unknown facet \"colour\""), "{e}");
        let e = FacetFilter::parse("format").unwrap_err();
        assert!(e.contains("FACET=VALUE"), "{e}");
    }
}
