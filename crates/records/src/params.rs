//! Plugin parameters: a name and a value whose case is also the parameter's kind (the WIT
//! `param-value` variant).

use std::fmt;

/// A parameter value (also the parameter's kind). Serialised in kebab-case (`{"int": 3}`).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum ParamValue {
    Int(i64),
    Float(f64),
    Flag(bool),
    Text(String),
}

impl ParamValue {
    /// The kind's name as users see it in messages.
    pub fn kind(&self) -> &'static str {
        match self {
            ParamValue::Int(_) => "int",
            ParamValue::Float(_) => "float",
            ParamValue::Flag(_) => "flag",
            ParamValue::Text(_) => "text",
        }
    }

    /// Parse `text` as a value of the same kind as `self` (for `name=value` on the command line).
    pub fn parse_like(&self, text: &str) -> Result<ParamValue, String> {
        match self {
            ParamValue::Int(_) => text
                .parse()
                .map(ParamValue::Int)
                .map_err(|_| format!("{text:?} is not an int")),
            ParamValue::Float(_) => text
                .parse()
                .map(ParamValue::Float)
                .map_err(|_| format!("{text:?} is not a float")),
            ParamValue::Flag(_) => match text {
                "true" | "1" | "yes" => Ok(ParamValue::Flag(true)),
                "false" | "0" | "no" => Ok(ParamValue::Flag(false)),
                _ => Err(format!("{text:?} is not a flag (true/false)")),
            },
            ParamValue::Text(_) => Ok(ParamValue::Text(text.to_string())),
        }
    }
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Float(v) => write!(f, "{v}"),
            ParamValue::Flag(v) => write!(f, "{v}"),
            ParamValue::Text(v) => write!(f, "{v:?}"),
        }
    }
}

/// A parameter given to a plugin.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Param {
    pub name: String,
    pub value: ParamValue,
}

impl Param {
    pub fn new(name: &str, value: ParamValue) -> Self {
        Param {
            name: name.to_string(),
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_like_keeps_the_kind_and_names_bad_text() {
        assert_eq!(ParamValue::Int(0).parse_like("12"), Ok(ParamValue::Int(12)));
        assert_eq!(
            ParamValue::Float(0.0).parse_like("0.5"),
            Ok(ParamValue::Float(0.5))
        );
        assert_eq!(
            ParamValue::Flag(false).parse_like("yes"),
            Ok(ParamValue::Flag(true))
        );
        assert_eq!(
            ParamValue::Int(0).parse_like("x").unwrap_err(),
            "\"x\" is not an int"
        );
        assert_eq!(ParamValue::Text("a".into()).to_string(), "\"a\"");
    }
}
