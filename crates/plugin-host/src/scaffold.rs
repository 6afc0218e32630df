//! `draftlens plugins new NAME`: a plugin crate from the template in plugins/template/.
//!
//! The SDK comes with the crate: by default its sources (and those of the record contract and
//! the WIT it builds on, all embedded in this binary) are written to `NAME/vendor/`, and the
//! crate depends on them by the relative path `vendor/draftlens-plugin-sdk`; so a plugin
//! scaffolded by an installed draftlens builds anywhere, against exactly the contract that
//! draftlens implements. `--sdk PATH` uses an SDK checkout of the user's choosing instead.
//! A `Cargo.lock` is written (`cargo generate-lockfile`, offline first) so that builds are
//! reproducible.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// The vendored SDK: (path under `vendor/`, contents). Cargo manifests are written for the
/// vendored layout (the repository's use workspace inheritance).
const VENDORED: &[(&str, &str)] = &[
    (
        "wit/metric.wit",
        include_str!("../../../plugins/wit/metric.wit"),
    ),
    (
        "draftlens-plugin-sdk/src/lib.rs",
        include_str!("../../../plugins/sdk/src/lib.rs"),
    ),
    (
        "draftlens-plugin-sdk/src/guest.rs",
        include_str!("../../../plugins/sdk/src/guest.rs"),
    ),
    (
        "draftlens-plugin-sdk/src/params.rs",
        include_str!("../../../plugins/sdk/src/params.rs"),
    ),
    (
        "draftlens-plugin-sdk/src/testdata.rs",
        include_str!("../../../plugins/sdk/src/testdata.rs"),
    ),
    (
        "draftlens-plugin-sdk/src/types.rs",
        include_str!("../../../plugins/sdk/src/types.rs"),
    ),
    (
        "draftlens-records/src/lib.rs",
        include_str!("../../records/src/lib.rs"),
    ),
    (
        "draftlens-records/src/batch.rs",
        include_str!("../../records/src/batch.rs"),
    ),
    (
        "draftlens-records/src/columns.rs",
        include_str!("../../records/src/columns.rs"),
    ),
    (
        "draftlens-records/src/params.rs",
        include_str!("../../records/src/params.rs"),
    ),
    (
        "draftlens-records/src/replay.rs",
        include_str!("../../records/src/replay.rs"),
    ),
    (
        "draftlens-records/src/sampling.rs",
        include_str!("../../records/src/sampling.rs"),
    ),
];

const SDK_MANIFEST: &str = r#"[package]
name = "draftlens-plugin-sdk"
description = "guest SDK for draftlens metric plugins (vendored by `draftlens plugins new`)"
version = "VERSION"
edition = "2021"
license = "Apache-2.0"
publish = false

[dependencies]
draftlens-records = { path = "../draftlens-records" }
wit-bindgen = { version = "0.61", default-features = false, features = ["macros", "realloc", "std"] }
"#;

const RECORDS_MANIFEST: &str = r#"[package]
name = "draftlens-records"
description = "the draftlens record contract (vendored by `draftlens plugins new`)"
version = "VERSION"
edition = "2021"
license = "Apache-2.0"
publish = false

[features]
serde = ["dep:serde"]

[dependencies]
serde = { version = "1", features = ["derive"], optional = true }
"#;

/// The Python template and SDK (plugins/python/).
const PY_APP: &str = include_str!("../../../plugins/python/template/app.py.tmpl");
const PY_BUILD_SH: &str = include_str!("../../../plugins/python/template/build.sh.tmpl");
const PY_README: &str = include_str!("../../../plugins/python/template/README.md.tmpl");
const PY_SDK: &str = include_str!("../../../plugins/python/sdk/draftlens_metric.py");
const WIT: &str = include_str!("../../../plugins/wit/metric.wit");

/// Create the folder `parent/name` for a new plugin in plain Python: `app.py` (an example
/// metric), the Python SDK `draftlens_metric.py`, the contract `wit/metric.wit` and `build.sh`
/// (componentize-py --stub-wasi; without it the component imports WASI, served deny-all by the
/// host). Returns the folder.
pub fn new_python_plugin(name: &str, parent: &Path) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    let dir = parent.join(name);
    if dir.exists() {
        bail!(
            "{}: already exists; choose another name or folder",
            dir.display()
        );
    }
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{contract}}", &crate::ContractVersion::HOST.to_string())
    };
    std::fs::create_dir_all(dir.join("wit"))
        .with_context(|| format!("{}: cannot create the folder", dir.display()))?;
    for (rel, text) in [
        ("app.py", fill(PY_APP)),
        ("draftlens_metric.py", PY_SDK.to_string()),
        ("wit/metric.wit", WIT.to_string()),
        ("build.sh", fill(PY_BUILD_SH)),
        ("README.md", fill(PY_README)),
        (".gitignore", "*.wasm\n__pycache__/\n".to_string()),
    ] {
        let path = dir.join(rel);
        std::fs::write(&path, text).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    make_executable(&dir.join("build.sh"))?;
    Ok(dir)
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !valid {
        bail!("{name}: a plugin name is lower-case letters, digits and '-', starting with a letter (e.g. my-metric)");
    }
    Ok(())
}

fn make_executable(p: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("{}: cannot make it executable", p.display()))?;
    }
    let _ = p;
    Ok(())
}

/// Write the SDK, the record contract and the WIT into `dir` (`dir/draftlens-plugin-sdk`, ...).
pub fn vendor_sdk(dir: &Path) -> anyhow::Result<PathBuf> {
    let version = env!("CARGO_PKG_VERSION");
    let mut files: Vec<(String, String)> = VENDORED
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect();
    files.push((
        "draftlens-plugin-sdk/Cargo.toml".into(),
        SDK_MANIFEST.replace("VERSION", version),
    ));
    files.push((
        "draftlens-records/Cargo.toml".into(),
        RECORDS_MANIFEST.replace("VERSION", version),
    ));
    for (rel, text) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("{}: cannot create the folder", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    Ok(dir.join("draftlens-plugin-sdk"))
}

/// Write `Cargo.lock` for the crate at `dir` with cargo (offline first: the dependencies are
/// usually cached already). Err says why when cargo could not.
pub fn write_lock_file(dir: &Path) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut last = String::new();
    for offline in [true, false] {
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(dir).arg("generate-lockfile");
        if offline {
            cmd.arg("--offline");
        }
        match cmd.output() {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => last = String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => last = format!("cannot run {cargo}: {e}"),
        }
    }
    bail!("{}: cargo generate-lockfile failed: {last}", dir.display())
}

const CARGO_TOML: &str = include_str!("../../../plugins/template/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("../../../plugins/template/lib.rs.tmpl");
const BUILD_SH: &str = include_str!("../../../plugins/template/build.sh.tmpl");
const README: &str = include_str!("../../../plugins/template/README.md.tmpl");
const GITIGNORE: &str = include_str!("../../../plugins/template/gitignore.tmpl");

/// The SDK of the source tree this binary was built from (for tests in this repository).
pub fn default_sdk_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins/sdk")
}

/// Create the crate `parent/name` for a new plugin named `name` ([a-z][a-z0-9-]*), depending on
/// the SDK at `sdk` (as given), or on a vendored copy under `name/vendor/` when `sdk` is None.
/// Returns the crate folder. Refuses to overwrite an existing folder. The lock file is written
/// by [`write_lock_file`] (separately: it needs cargo).
pub fn new_plugin(name: &str, parent: &Path, sdk: Option<&Path>) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    if let Some(sdk) = sdk {
        if !sdk.join("Cargo.toml").is_file() {
            bail!(
                "{}: not the plugin SDK (no Cargo.toml there; leave --sdk out to get a vendored copy)",
                sdk.display()
            );
        }
    }
    let dir = parent.join(name);
    if dir.exists() {
        bail!(
            "{}: already exists; choose another name or folder",
            dir.display()
        );
    }
    let crate_name = name.replace('-', "_");
    let struct_name: String = name
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{crate_name}}", &crate_name)
            .replace("{{struct_name}}", &struct_name)
            .replace(
                "{{sdk_path}}",
                &sdk.map_or("vendor/draftlens-plugin-sdk".into(), |p| {
                    p.display().to_string()
                }),
            )
            .replace("{{contract}}", &crate::ContractVersion::HOST.to_string())
    };
    std::fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("{}: cannot create the folder", dir.display()))?;
    let files = [
        ("Cargo.toml", fill(CARGO_TOML)),
        ("src/lib.rs", fill(LIB_RS)),
        ("build.sh", fill(BUILD_SH)),
        ("README.md", fill(README)),
        (".gitignore", fill(GITIGNORE)),
    ];
    for (rel, text) in files {
        let path = dir.join(rel);
        std::fs::write(&path, text).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    if sdk.is_none() {
        vendor_sdk(&dir.join("vendor"))?;
    }
    make_executable(&dir.join("build.sh"))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_placeholders_filled() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "My", "9x", "a_b", "a-", "a b"] {
            assert!(new_plugin(bad, dir.path(), None).is_err(), "{bad:?}");
        }
        let d = new_plugin("my-metric", dir.path(), None).unwrap();
        // The vendored SDK, by a relative path: the crate can move, and needs no source tree.
        let toml = std::fs::read_to_string(d.join("Cargo.toml")).unwrap();
        assert!(
            toml.contains(r#"draftlens-plugin-sdk = { path = "vendor/draftlens-plugin-sdk" }"#),
            "{toml}"
        );
        for f in [
            "vendor/wit/metric.wit",
            "vendor/draftlens-plugin-sdk/Cargo.toml",
            "vendor/draftlens-plugin-sdk/src/guest.rs",
            "vendor/draftlens-records/src/batch.rs",
        ] {
            assert!(d.join(f).is_file(), "{f}");
        }
        // Every source file of the records crate is vendored (a new module file must be added to
        // the list above, or the scaffolded plugin does not build).
        let records = Path::new(env!("CARGO_MANIFEST_DIR")).join("../records/src");
        for e in std::fs::read_dir(&records).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let vendored = d.join("vendor/draftlens-records/src").join(&name);
            assert!(
                vendored.is_file(),
                "crates/records/src/{name} is not vendored by the scaffold"
            );
        }
        let readme = std::fs::read_to_string(d.join("README.md")).unwrap();
        assert!(
            readme.contains("rescore RUN --db runs.sqlite --plugin"),
            "{readme}"
        );
        let lib = std::fs::read_to_string(d.join("src/lib.rs")).unwrap();
        assert!(lib.contains("pub struct MyMetric;") && lib.contains("name: \"my-metric\""));
        assert!(
            !lib.contains("{{")
                && !std::fs::read_to_string(d.join("Cargo.toml"))
                    .unwrap()
                    .contains("{{")
        );
        let e = new_plugin("my-metric", dir.path(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists"), "{e}");
        let e = new_plugin("other", dir.path(), Some(Path::new("/no/sdk")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/no/sdk: not the plugin SDK"), "{e}");
        // A user-chosen SDK path is written as given.
        let d = new_plugin("mine", dir.path(), Some(&default_sdk_path())).unwrap();
        let toml = std::fs::read_to_string(d.join("Cargo.toml")).unwrap();
        assert!(toml.contains(&default_sdk_path().display().to_string()));
        assert!(!d.join("vendor").exists());
        // Python: app, SDK, contract and build script.
        let d = new_python_plugin("py-metric", dir.path()).unwrap();
        for f in [
            "app.py",
            "draftlens_metric.py",
            "wit/metric.wit",
            "build.sh",
            "README.md",
        ] {
            assert!(d.join(f).is_file(), "{f}");
        }
        let app = std::fs::read_to_string(d.join("app.py")).unwrap();
        assert!(app.contains("name=\"py-metric\"") && !app.contains("{{"));
        assert!(new_python_plugin("Bad", dir.path()).is_err());
    }
}
