//! Finding plugins: the built-ins embedded in the binary ([`crate::builtins`]), the plugin
//! folders, and name resolution for `--plugin NAME`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::score::PluginRequest;

/// Plugin folders: `$DRAFTLENS_PLUGIN_PATH` (':'-separated) when set, else the user's plugin
/// folder `$XDG_DATA_HOME/draftlens/plugins` (`~/.local/share/draftlens/plugins`). The
/// built-in plugins need no folder: they are embedded in the binary.
pub fn default_plugin_dirs() -> Vec<PathBuf> {
    match std::env::var_os("DRAFTLENS_PLUGIN_PATH") {
        Some(p) if !p.is_empty() => std::env::split_paths(&p).collect(),
        _ => user_plugin_dir().into_iter().collect(),
    }
}

/// `$XDG_DATA_HOME/draftlens/plugins`, else `~/.local/share/draftlens/plugins`.
pub fn user_plugin_dir() -> Option<PathBuf> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(data.join("draftlens").join("plugins"))
}

/// The `.wasm` files directly inside `dirs`, sorted by path. Missing folders are skipped.
pub fn list_plugin_files(dirs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for dir in dirs {
        if !dir.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(dir)
            .with_context(|| format!("{}: cannot list the folder", dir.display()))?
        {
            let path = entry
                .with_context(|| format!("{}: cannot list the folder", dir.display()))?
                .path();
            if path.extension().is_some_and(|e| e == "wasm") && path.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Every plugin available without a path: the built-ins, then the files in `dirs`.
pub fn list_plugins(dirs: &[PathBuf]) -> anyhow::Result<Vec<PluginRequest>> {
    let mut out: Vec<PluginRequest> = crate::builtins::builtins()
        .iter()
        .map(PluginRequest::builtin)
        .collect();
    out.extend(list_plugin_files(dirs)?.into_iter().map(PluginRequest::new));
    Ok(out)
}

/// Resolve `name_or_path`: an existing file is used as it is; otherwise a built-in plugin of
/// that name; otherwise `NAME.wasm` (also with `-` and `_` swapped) in `dirs`.
pub fn resolve(name_or_path: &str, dirs: &[PathBuf]) -> anyhow::Result<PluginRequest> {
    let p = Path::new(name_or_path);
    if p.is_file() {
        return Ok(PluginRequest::new(p));
    }
    if name_or_path.ends_with(".wasm") || name_or_path.contains('/') {
        bail!("{name_or_path}: no such plugin file");
    }
    if let Some(b) = crate::builtins::find(name_or_path) {
        return Ok(PluginRequest::builtin(b));
    }
    let candidates = [
        name_or_path.to_string(),
        name_or_path.replace('-', "_"),
        name_or_path.replace('_', "-"),
    ];
    for dir in dirs {
        for c in &candidates {
            let f = dir.join(format!("{c}.wasm"));
            if f.is_file() {
                return Ok(PluginRequest::new(f));
            }
        }
    }
    let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let builtin: Vec<&str> = crate::builtins::builtins().iter().map(|b| b.name).collect();
    bail!(
        "plugin {name_or_path} not found: not a file, not a built-in plugin ({}), and no {name_or_path}.wasm in {} \
         (set DRAFTLENS_PLUGIN_PATH, pass --plugin-dir, or pass a path)",
        builtin.join(", "),
        if searched.is_empty() { "no plugin folder".to_string() } else { searched.join(", ") }
    )
}

/// [`resolve`] for callers that need a file: the path of a file plugin (a built-in has none).
pub fn resolve_plugin(name_or_path: &str, dirs: &[PathBuf]) -> anyhow::Result<PathBuf> {
    Ok(resolve(name_or_path, dirs)?.path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_resolves() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("my-metric.wasm"), b"x").unwrap();
        std::fs::write(dir.path().join("topk_bound.wasm"), b"x").unwrap();
        std::fs::write(dir.path().join("accept-length.wasm"), b"x").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        let dirs = vec![dir.path().to_path_buf(), dir.path().join("missing")];
        let files = list_plugin_files(&dirs).unwrap();
        assert_eq!(files.len(), 3);
        let all = list_plugins(&dirs).unwrap();
        assert_eq!(all.len(), crate::builtins::builtins().len() + 3);
        assert_eq!(
            resolve("my-metric", &dirs).unwrap().path,
            dir.path().join("my-metric.wasm")
        );
        assert_eq!(
            resolve("topk-bound", &dirs).unwrap().path,
            dir.path().join("topk_bound.wasm")
        );
        // A built-in's name finds the embedded built-in, whatever the folders hold.
        let r = resolve("accept-length", &dirs).unwrap();
        assert_eq!(
            (r.builtin.as_deref(), r.path),
            (
                Some("accept-length"),
                PathBuf::from("builtin:accept-length")
            )
        );
        assert_eq!(
            resolve("ddtree", &[]).unwrap().builtin.as_deref(),
            Some("ddtree")
        );
        let e = resolve("nope", &dirs).unwrap_err().to_string();
        assert!(
            e.contains("plugin nope not found") && e.contains(&dir.path().display().to_string()),
            "{e}"
        );
        let e = resolve("/no/such/file.wasm", &dirs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such plugin file"), "{e}");
    }
}
