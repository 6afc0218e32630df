//! Finding plugin files: the plugin folders and name resolution for `--plugin NAME`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Plugin folders: `$DRAFTLENS_PLUGIN_PATH` (':'-separated) when set, else `plugins/dist`
/// (where plugins/build.sh puts the built-in plugins) relative to the current folder.
pub fn default_plugin_dirs() -> Vec<PathBuf> {
    match std::env::var_os("DRAFTLENS_PLUGIN_PATH") {
        Some(p) if !p.is_empty() => std::env::split_paths(&p).collect(),
        _ => vec![PathBuf::from("plugins/dist")],
    }
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

/// Resolve `name_or_path`: an existing file is used as it is; otherwise `NAME.wasm` (also with
/// `-` and `_` swapped) is looked up in `dirs`.
pub fn resolve_plugin(name_or_path: &str, dirs: &[PathBuf]) -> anyhow::Result<PathBuf> {
    let p = Path::new(name_or_path);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    if name_or_path.ends_with(".wasm") || name_or_path.contains('/') {
        bail!("{name_or_path}: no such plugin file");
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
                return Ok(f);
            }
        }
    }
    let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    bail!(
        "plugin {name_or_path} not found: not a file, and no {name_or_path}.wasm in {} (set DRAFTLENS_PLUGIN_PATH or \
         pass a path; build the built-in plugins with plugins/build.sh)",
        if searched.is_empty() { "no plugin folder".to_string() } else { searched.join(", ") }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_resolves() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("accept-length.wasm"), b"x").unwrap();
        std::fs::write(dir.path().join("topk_bound.wasm"), b"x").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        let dirs = vec![dir.path().to_path_buf(), dir.path().join("missing")];
        let files = list_plugin_files(&dirs).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(
            resolve_plugin("accept-length", &dirs).unwrap(),
            dir.path().join("accept-length.wasm")
        );
        assert_eq!(
            resolve_plugin("topk-bound", &dirs).unwrap(),
            dir.path().join("topk_bound.wasm")
        );
        let e = resolve_plugin("nope", &dirs).unwrap_err().to_string();
        assert!(
            e.contains("plugin nope not found") && e.contains(&dir.path().display().to_string()),
            "{e}"
        );
        let e = resolve_plugin("/no/such/file.wasm", &dirs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such plugin file"), "{e}");
    }
}
