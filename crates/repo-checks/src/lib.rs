//! Checks over the repository's own text, run as ordinary cargo tests (`tests/citations.rs`).
//!
//! Code, scripts and docs cite definitions as `docs/<file>.md §<section>` (e.g. `docs/metrics.md §3`,
//! `docs/models.md §3.2–§3.6`, `docs/dflash.md §1.1, §2`). [`check_tree`] walks the source tree and
//! reports every citation whose file is missing or whose section has no heading in that file (a
//! heading `## 3. Title` or `### 3.2 Title` defines `§3` / `§3.2`), and every mention of the
//! private design notes the project was started from, which users never see: a bare `dflash.md`,
//! `models.md`, `ui.md`, `product.md`, `fixtures.md`, `wasm-plugins.md` not under `docs/`, or the
//! folder they live in. No dependencies: plain byte scanning, so the check builds in seconds.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Names of the private notes. Built at run time so that this file does not cite them itself.
pub fn private_names() -> Vec<String> {
    [
        "dflash",
        "models",
        "ui",
        "product",
        "fixtures",
        "wasm-plugins",
        "slurm-ci",
    ]
    .iter()
    .map(|n| format!("{n}.md"))
    .collect()
}

/// The folder that holds the private notes (never part of the repository).
pub fn private_folder() -> String {
    ["shared", "specs"].join("/")
}

/// Directories never scanned: build output, git, installed fixtures, screenshots.
const SKIP_DIRS: &[&str] = &[
    "target",
    ".git",
    "models",
    "data",
    "screenshots",
    "node_modules",
];
/// Files scanned, by extension; extension-less files are scanned when under `.ci/` or `scripts/`.
const EXTS: &[&str] = &[
    "rs", "md", "sh", "py", "cu", "cuh", "toml", "wit", "js", "css", "yml", "yaml", "txt",
];

/// One problem found, with the file (relative to the root) and 1-based line.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    pub file: String,
    pub line: usize,
    pub problem: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.problem)
    }
}

/// Section numbers defined by the headings of a markdown text: `## 2. Title` → "2",
/// `### 1.1 Title` → "1.1".
pub fn sections(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        let t = line.trim_start();
        if !t.starts_with('#') {
            continue;
        }
        let rest = t.trim_start_matches('#').trim_start();
        let num: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let num = num.trim_end_matches('.');
        if !num.is_empty() && num.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            out.insert(num.to_string());
        }
    }
    out
}

/// A citation found in a text: the docs file (e.g. `docs/metrics.md`) and the sections cited
/// right after it (`§2`, `§2, §3`, `§3.2–§3.6`, `§1 and §2`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Citation {
    pub line: usize,
    pub file: String,
    pub sections: Vec<String>,
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'/'
}

/// Every `docs/<name>.md` citation of a text with the sections that follow it.
pub fn citations(text: &str) -> Vec<Citation> {
    let mut out = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let b = line.as_bytes();
        let mut from = 0;
        while let Some(off) = line[from..].find("docs/") {
            let start = from + off;
            from = start + 5;
            // `ggml/docs/x.md` or `my-docs/` are other repositories' paths.
            if start > 0 && (is_name_char(b[start - 1]) || b[start - 1] == b'.') {
                continue;
            }
            let mut end = start + 5;
            while end < b.len() && (is_name_char(b[end]) || b[end] == b'.') {
                end += 1;
            }
            let path = line[start..end].trim_end_matches('.');
            if !path.ends_with(".md") || path.contains('*') {
                continue;
            }
            out.push(Citation {
                line: ln + 1,
                file: path.to_string(),
                sections: section_refs(&line[start + path.len()..]),
            });
        }
    }
    out
}

/// The section numbers at the start of `rest`: ` §2`, then any of `, §3`, `–§4`, ` and §5`.
fn section_refs(rest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Some(mut s) = rest.strip_prefix(" §") else {
        return out;
    };
    loop {
        let len = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        // A sentence may end right after the number: `§3.5.`
        let num = s[..len].trim_end_matches('.');
        if num.is_empty() {
            return out;
        }
        out.push(num.to_string());
        s = &s[len..];
        match [", §", "–§", " and §"]
            .iter()
            .find(|sep| s.starts_with(**sep))
        {
            Some(sep) => s = &s[sep.len()..],
            None => return out,
        }
    }
}

/// Findings of one text (`rel` names it in the messages).
pub fn check_text(root: &Path, rel: &str, text: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    let names = private_names();
    let folder = private_folder();
    for (ln, line) in text.lines().enumerate() {
        for name in &names {
            let mut from = 0;
            while let Some(off) = line[from..].find(name.as_str()) {
                let at = from + off;
                from = at + name.len();
                let before = &line[..at];
                let b = before.as_bytes();
                // Part of a longer name (`my-models.md`) or a path other than docs/ (`x/ui.md`
                // is checked as a path only when it is docs/).
                if b.last()
                    .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
                {
                    continue;
                }
                if before.ends_with("docs/") {
                    continue;
                }
                out.push(Finding {
                    file: rel.into(),
                    line: ln + 1,
                    problem: format!(
                        "cites `{name}`, a design note outside the repository: cite `docs/…` instead"
                    ),
                });
            }
        }
        if line.contains(&folder) {
            out.push(Finding {
                file: rel.into(),
                line: ln + 1,
                problem: format!("cites `{folder}`, which is not part of the repository"),
            });
        }
    }
    for c in citations(text) {
        let path = root.join(&c.file);
        let Ok(md) = fs::read_to_string(&path) else {
            out.push(Finding {
                file: rel.into(),
                line: c.line,
                problem: format!("cites `{}`, which does not exist", c.file),
            });
            continue;
        };
        let have = sections(&md);
        for s in &c.sections {
            if !have.contains(s) {
                out.push(Finding {
                    file: rel.into(),
                    line: c.line,
                    problem: format!(
                        "cites `{} §{s}`, but that file has no heading numbered {s}",
                        c.file
                    ),
                });
            }
        }
    }
    out
}

/// Text files of the tree under `root` that the check reads, relative to `root`, sorted.
pub fn source_files(root: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if !SKIP_DIRS.contains(&name.as_str()) && !name.starts_with("target") {
                    walk(root, &p, out);
                }
            } else if ft.is_file() {
                let rel = p.strip_prefix(root).unwrap_or(&p).to_path_buf();
                let ext = p.extension().map(|e| e.to_string_lossy().into_owned());
                let in_script_dir = rel
                    .components()
                    .next()
                    .is_some_and(|c| c.as_os_str() == ".ci" || c.as_os_str() == "scripts");
                let wanted = match ext {
                    Some(e) => EXTS.contains(&e.as_str()),
                    None => in_script_dir,
                };
                if wanted {
                    out.push(rel);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// Findings of every scanned file under `root`, except the files in `skip` (relative paths; an
/// entry ending in `/` skips a folder).
pub fn check_tree(root: &Path, skip: &[&str]) -> Vec<Finding> {
    let mut out = Vec::new();
    for rel in source_files(root) {
        let rel_s = rel.to_string_lossy().replace('\\', "/");
        if skip
            .iter()
            .any(|s| *s == rel_s || (s.ends_with('/') && rel_s.starts_with(s)))
        {
            continue;
        }
        // Binary or non-UTF-8 files carry no citations.
        let Ok(text) = fs::read_to_string(root.join(&rel)) else {
            continue;
        };
        out.extend(check_text(root, &rel_s, &text));
    }
    out
}

/// Top-level folders whose paths, when cited in text (`crates/engine/src/hidden_cache/mod.rs`), must exist.
/// `docs/` is checked with its sections by [`check_text`].
const PATH_ROOTS: &[&str] = &[
    "crates/",
    "plugins/",
    "scripts/",
    "tools/",
    "kernels/",
    "python/",
    "drafters/",
];

/// Cited paths that are build outputs, not sources: they exist only after a build.
const BUILD_OUTPUTS: &[&str] = &["plugins/dist"];

/// Repository paths cited in `text` (1-based line, path), as written: a path starts at a word
/// boundary with one of [`PATH_ROOTS`] and runs over `[A-Za-z0-9_./-]`. Templates are left out: a
/// path followed by `$`, `{`, `<`, `*` or `[`, or with an upper-case placeholder component (`NAME`).
pub fn repo_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let b = line.as_bytes();
        let mut at = 0;
        while at < b.len() {
            let starts = PATH_ROOTS.iter().find(|r| line[at..].starts_with(*r));
            let boundary =
                at == 0 || !(is_name_char(b[at - 1]) || b[at - 1] == b'/' || b[at - 1] == b'.');
            let (Some(_), true) = (starts, boundary) else {
                at += line[at..].chars().next().map_or(1, char::len_utf8);
                continue;
            };
            let mut end = at;
            while end < b.len() && (is_name_char(b[end]) || b[end] == b'/' || b[end] == b'.') {
                end += 1;
            }
            let templated = b.get(end).is_some_and(|c| b"${<*[".contains(c));
            let path = line[at..end].trim_end_matches(['.', '-', '/']);
            let placeholder = path
                .split('/')
                .any(|c| c.len() > 1 && c.bytes().all(|x| x.is_ascii_uppercase() || x == b'_'));
            if !templated && !placeholder && path.contains('/') && !path.ends_with('/') {
                out.push((i + 1, path.to_string()));
            }
            at = end.max(at + 1);
        }
    }
    out
}

/// Every cited repository path of every scanned file under `root` that does not exist (files in
/// `skip` as for [`check_tree`]).
pub fn check_paths_tree(root: &Path, skip: &[&str]) -> Vec<Finding> {
    let mut out = Vec::new();
    for rel in source_files(root) {
        let rel_s = rel.to_string_lossy().replace('\\', "/");
        if skip
            .iter()
            .any(|s| *s == rel_s || (s.ends_with('/') && rel_s.starts_with(s)))
        {
            continue;
        }
        let Ok(text) = fs::read_to_string(root.join(&rel)) else {
            continue;
        };
        for (line, path) in repo_paths(&text) {
            if BUILD_OUTPUTS
                .iter()
                .any(|o| path == *o || path.starts_with(&format!("{o}/")))
            {
                continue;
            }
            if !root.join(&path).exists() {
                out.push(Finding {
                    file: rel_s.clone(),
                    line,
                    problem: format!("{path}: no such file or folder in the repository"),
                });
            }
        }
    }
    out
}
