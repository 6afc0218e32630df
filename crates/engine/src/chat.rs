//! Chat templates: render a Hugging Face (Jinja2) chat template the way
//! `transformers.PreTrainedTokenizerBase.apply_chat_template` does, with minijinja.
//!
//! What "the way transformers does" means here (transformers `utils/chat_template_utils.py`):
//! - the environment uses `trim_blocks=True, lstrip_blocks=True` and drops one trailing newline
//!   of the template source (Jinja2's default), with `break`/`continue` enabled;
//! - variables: `messages` (list of `{role, content}`), `add_generation_prompt`, `bos_token`,
//!   `eos_token`, `tools = None`, `documents = None`, plus any extra variables the caller passes
//!   (e.g. Qwen3's `enable_thinking`);
//! - functions: `raise_exception(msg)`; the filter `tojson` is Python's
//!   `json.dumps(x, ensure_ascii=False)` (separators `", "`/`": "`), not Jinja2's HTML-safe one;
//! - Python string/dict methods (`.strip()`, `.startswith()`, `.split()`, `.items()` …) come from
//!   `minijinja-contrib`'s pycompat layer;
//! - no auto-escaping.
//!
//! - `strftime_now(fmt)` formats a **pinned** date, [`PINNED_DATE`] (26 July 2024, midnight), not
//!   the clock: transformers uses the current time, which would make the prompt — and so every
//!   cached hidden state — depend on the day the evaluation runs. 26 Jul 2024 is also the date
//!   Llama 3.x templates fall back to when `strftime_now` is missing;
//! - the `{% generation %}…{% endgeneration %}` block of transformers' `AssistantTracker`
//!   extension (assistant-token masks) renders its body unchanged, as in transformers when no
//!   mask is asked for;
//! - the `iterable` test follows Python: `none is iterable` is false (minijinja says true), which
//!   templates rely on in `tools is iterable and tools | length > 0`.
//!
//! Known remaining difference: iterating over `none` (`{% for t in tools %}` with no tools) renders
//! nothing here but raises `TypeError` in Jinja2; only tool-use-only templates do that.

use anyhow::{anyhow, Result};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// One chat turn. `role` is "system", "user" or "assistant" (templates decide what else they accept).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

/// A chat template together with where it came from, so that every error names its source
/// (e.g. `models/x.gguf: tokenizer.chat_template` or `ckpt/tokenizer_config.json: chat_template`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTemplate {
    source: String,
    text: String,
}

impl ChatTemplate {
    /// Parses the template once so that syntax errors surface at load time, not at the first prompt.
    pub fn new(source: impl Into<String>, text: impl Into<String>) -> Result<ChatTemplate> {
        let t = ChatTemplate {
            source: source.into(),
            text: text.into(),
        };
        let env = environment();
        env.template_from_named_str(&t.source, &rewrite_generation_tags(&t.text))
            .map_err(|e| template_error(&t.source, e))?;
        Ok(t)
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// Renders `messages` with HF's standard variables.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String> {
        self.render_with(
            messages,
            add_generation_prompt,
            bos,
            eos,
            &serde_json::Map::new(),
        )
    }

    /// Like [`render`](Self::render), plus extra template variables (HF's `**kwargs` to
    /// `apply_chat_template`, e.g. `{"enable_thinking": false}` for Qwen3). Extra variables
    /// cannot replace the standard ones.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let env = environment();
        let text = rewrite_generation_tags(&self.text);
        let tmpl = env
            .template_from_named_str(&self.source, &text)
            .map_err(|e| template_error(&self.source, e))?;

        // Messages as maps in insertion order (role, content) — what `tojson` of a message shows.
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let mut ctx: Vec<(String, Value)> = extra
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(minijinja::value::Serde(v))))
            .collect();
        ctx.extend([
            ("messages".to_string(), Value::from(msgs)),
            (
                "add_generation_prompt".to_string(),
                Value::from(add_generation_prompt),
            ),
            ("bos_token".to_string(), Value::from(bos)),
            ("eos_token".to_string(), Value::from(eos)),
            ("tools".to_string(), Value::from(())),
            ("documents".to_string(), Value::from(())),
        ]);
        tmpl.render(Value::from_pairs(ctx))
            .map_err(|e| template_error(&self.source, e))
    }
}

/// Renders `template` (a Hugging Face chat template) for `messages`. Errors name the template as
/// "chat template"; use [`ChatTemplate`] to have them name the file it came from.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos: &str,
    eos: &str,
) -> Result<String> {
    ChatTemplate::new("chat template", template)?.render(messages, add_generation_prompt, bos, eos)
}

/// The environment transformers compiles chat templates in (see the module docs).
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .expect("the default delimiters are a valid syntax config");
    env.set_syntax(syntax);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_test("iterable", is_iterable);
    env
}

/// `(year, month, day)` that `strftime_now` reports (see the module docs). A Friday, day 208.
pub const PINNED_DATE: (u32, u32, u32) = (2024, 7, 26);

/// Python's `datetime.strftime` for [`PINNED_DATE`] at 00:00:00 (the directives chat templates
/// use; any other is an error rather than a silently wrong prompt).
fn strftime_now(format: &str) -> Result<String, Error> {
    let (year, month, day) = PINNED_DATE;
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month_name = MONTHS[month as usize - 1];
    let (weekday, day_of_year) = ("Friday", 208);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's "%-d" (no padding) is accepted by Python on Linux.
        let mut d = chars.next();
        let unpadded = d == Some('-');
        if unpadded {
            d = chars.next();
        }
        let num = |v: u32, width: usize| {
            if unpadded {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        match d {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year % 100, 2)),
            Some('m') => out.push_str(&num(month, 2)),
            Some('d') => out.push_str(&num(day, 2)),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('j') => out.push_str(&num(day_of_year, 3)),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') | Some('M') | Some('S') => out.push_str(&num(0, 2)),
            Some('I') => out.push_str(&num(12, 2)),
            Some('p') => out.push_str("AM"),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.map(String::from).unwrap_or_default()
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// Python's notion of iterable: strings, lists, dicts and (Jinja2's) undefined, not none/numbers.
fn is_iterable(v: &Value) -> bool {
    match v.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
        ValueKind::Undefined | ValueKind::String | ValueKind::Bytes => true,
        _ => v.try_iter().is_ok(),
    }
}

/// Rewrites `{% generation %}` / `{% endgeneration %}` (transformers' AssistantTracker tags) into
/// `{% if true %}` / `{% endif %}`, keeping whitespace-control markers and line numbers.
fn rewrite_generation_tags(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("generation") {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..end];
        let body = inner
            .trim_start_matches(['-', '+'])
            .trim_end_matches(['-', '+']);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{}%}}", inner.replacen(body.trim(), r, 1))),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out.into()
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {msg}"),
    ))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?; // always False in transformers
    kwargs.assert_all_used()?;
    // Python's defaults: (", ", ": ") without indent, (",", ": ") with it.
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    let style = PyJson {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    style.write(&value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct PyJson {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl PyJson {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    }

    /// Walks the minijinja value itself (not a `serde_json::Value`) so that maps keep their
    /// insertion order, as Python dicts do.
    fn write(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Seq | ValueKind::Iterable if v.len() != Some(0) => {
                out.push('[');
                for (i, item) in v.try_iter()?.enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.write(&item, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push(']');
            }
            ValueKind::Map if v.len() != Some(0) => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    // JSON keys are strings; Python converts ints/bools/None the same way.
                    let key = match k.as_str() {
                        Some(s) => s.to_string(),
                        None => k.to_string(),
                    };
                    out.push_str(&serde_json::Value::from(key).to_string());
                    out.push_str(&self.key_sep);
                    self.write(&v.get_item(k)?, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => out.push_str("[]"),
            ValueKind::Map => out.push_str("{}"),
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            // Scalars print the same in Python and serde_json (both escape only '"', '\\' and
            // control characters when ensure_ascii=False).
            _ => {
                let s = serde_json::to_string(v).map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: cannot serialise {v:?}: {e}"),
                    )
                })?;
                out.push_str(&s);
            }
        }
        Ok(())
    }
}

/// "<source>: chat template syntax error: ... (line N)" — minijinja's message already carries the
/// template name and line, but the leading "<source>: " follows the crate's error convention.
fn template_error(source: &str, e: Error) -> anyhow::Error {
    let what = match e.kind() {
        ErrorKind::SyntaxError => "chat template syntax error",
        ErrorKind::InvalidOperation
            if e.detail()
                .is_some_and(|d| d.starts_with("raise_exception: ")) =>
        {
            "chat template raised an exception"
        }
        _ => "chat template render error",
    };
    let line = e.line().map(|l| format!(" (line {l})")).unwrap_or_default();
    let detail = e
        .detail()
        .map(|d| d.trim_start_matches("raise_exception: ").to_string())
        .unwrap_or_else(|| e.kind().to_string());
    anyhow!("{source}: {what}: {detail}{line}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_like_transformers() {
        let out = render_chat(
            CHATML,
            &[ChatMessage::user("Hi"), ChatMessage::assistant("Hello!")],
            true,
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_are_on() {
        // With Jinja2's defaults this would keep the newline after `%}` and the indentation.
        let t = "{% for m in messages %}\n    {{ m.content }}\n{% endfor %}";
        let out = render_chat(
            t,
            &[ChatMessage::user("a"), ChatMessage::user("b")],
            false,
            "",
            "",
        )
        .unwrap();
        assert_eq!(out, "    a\n    b\n");
    }

    #[test]
    fn python_methods_and_raise_exception() {
        let t = "{% if messages[0].role != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith(' x') }}";
        let out = render_chat(t, &[ChatMessage::system(" xy ")], false, "", "").unwrap();
        // Jinja2 prints Python booleans: "True".
        assert_eq!(out, "XY|True");
        let err = render_chat(t, &[ChatMessage::user("u")], false, "", "")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "chat template: chat template raised an exception: first message must be system"
            ),
            "{err}"
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = "{{ messages[0] | tojson }}|{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2) }}|{{ 'é\"' | tojson }}";
        let out = render_chat(t, &[ChatMessage::user("q")], false, "", "").unwrap();
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"q\"}|{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ]\n}|\"é\\\"\""
        );
    }

    #[test]
    fn syntax_error_names_source_and_line() {
        let err = ChatTemplate::new(
            "ckpt/tokenizer_config.json: chat_template",
            "ok\n{% for m in messages %}",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(
                "ckpt/tokenizer_config.json: chat_template: chat template syntax error:"
            ),
            "{err}"
        );
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn strftime_now_formats_the_pinned_date() {
        let t = "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%B %-d, %Y (%a)') }}";
        assert_eq!(
            render_chat(t, &[], false, "", "").unwrap(),
            "26 Jul 2024|2024-07-26|July 26, 2024 (Fri)"
        );
        let err = render_chat("{{ strftime_now('%Z') }}", &[], false, "", "").unwrap_err();
        assert!(
            err.to_string().contains("unsupported directive %Z"),
            "{err}"
        );
    }

    #[test]
    fn generation_tags_render_their_body() {
        let t = "{% for m in messages %}{%- generation -%}\n[{{ m.content }}]\n{%- endgeneration -%}{% endfor %}";
        let out = render_chat(
            t,
            &[ChatMessage::user("a"), ChatMessage::user("b")],
            false,
            "",
            "",
        )
        .unwrap();
        assert_eq!(out, "[a][b]");
        assert_eq!(
            rewrite_generation_tags("{%+ generation%}x{% endgeneration +%}"),
            "{%+ if true%}x{% endif +%}"
        );
        // Not a generation tag: untouched.
        assert_eq!(
            rewrite_generation_tags("{% set generation = 1 %}"),
            "{% set generation = 1 %}"
        );
    }

    #[test]
    fn none_is_not_iterable_like_python() {
        let t = "{{ tools is iterable }}|{{ messages is iterable }}|{{ 'ab' is iterable }}|{{ nothing is iterable }}|{{ 3 is iterable }}";
        assert_eq!(
            render_chat(t, &[], false, "", "").unwrap(),
            "False|True|True|True|False"
        );
    }

    #[test]
    fn extra_variables_reach_the_template() {
        let t = "{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}";
        let tpl = ChatTemplate::new("t", t).unwrap();
        assert_eq!(tpl.render(&[], false, "", "").unwrap(), "on");
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), serde_json::Value::Bool(false));
        assert_eq!(tpl.render_with(&[], false, "", "", &extra).unwrap(), "off");
    }
}
