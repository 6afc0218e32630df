//! `draftlens plugins new NAME`: a plugin crate from the template in plugins/template/.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

const CARGO_TOML: &str = include_str!("../../../plugins/template/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("../../../plugins/template/lib.rs.tmpl");
const BUILD_SH: &str = include_str!("../../../plugins/template/build.sh.tmpl");
const README: &str = include_str!("../../../plugins/template/README.md.tmpl");
const GITIGNORE: &str = include_str!("../../../plugins/template/gitignore.tmpl");

/// The SDK of the source tree this binary was built from (used when `--sdk` is not given).
pub fn default_sdk_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins/sdk")
}

/// Create the crate `parent/name` for a new plugin named `name` ([a-z][a-z0-9-]*), depending on
/// the SDK at `sdk`. Returns the crate folder. Refuses to overwrite an existing folder.
pub fn new_plugin(name: &str, parent: &Path, sdk: &Path) -> anyhow::Result<PathBuf> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !valid {
        bail!("{name}: a plugin name is lower-case letters, digits and '-', starting with a letter (e.g. my-metric)");
    }
    let sdk = sdk.canonicalize().with_context(|| {
        format!(
            "{}: the plugin SDK folder is missing (pass --sdk PATH)",
            sdk.display()
        )
    })?;
    if !sdk.join("Cargo.toml").is_file() {
        bail!("{}: not the plugin SDK (no Cargo.toml)", sdk.display());
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
            .replace("{{sdk_path}}", &sdk.display().to_string())
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
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("build.sh");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("{}: cannot make it executable", p.display()))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_placeholders_filled() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "My", "9x", "a_b", "a-", "a b"] {
            assert!(
                new_plugin(bad, dir.path(), &default_sdk_path()).is_err(),
                "{bad:?}"
            );
        }
        let d = new_plugin("my-metric", dir.path(), &default_sdk_path()).unwrap();
        let lib = std::fs::read_to_string(d.join("src/lib.rs")).unwrap();
        assert!(lib.contains("pub struct MyMetric;") && lib.contains("name: \"my-metric\""));
        assert!(
            !lib.contains("{{")
                && !std::fs::read_to_string(d.join("Cargo.toml"))
                    .unwrap()
                    .contains("{{")
        );
        let e = new_plugin("my-metric", dir.path(), &default_sdk_path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists"), "{e}");
        let e = new_plugin("other", dir.path(), Path::new("/no/sdk"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/no/sdk: the plugin SDK folder is missing"),
            "{e}"
        );
    }
}
