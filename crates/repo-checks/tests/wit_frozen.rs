//! The plugin contract's released versions are frozen: `plugins/wit-frozen/<version>/metric.wit`
//! declares `<version>`, and when `plugins/wit/metric.wit` has that version the two say the same
//! thing: identical once comments are set aside (documentation may be improved; declarations
//! may not change). The current version must have a frozen copy.

use std::path::Path;

/// The declarations of a WIT file: comments removed, lines trimmed, blank lines dropped.
fn meaning(wit: &str) -> Vec<&str> {
    wit.lines()
        .map(|l| l.split("//").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The `X.Y.Z` of the `package draftlens:metric@X.Y.Z;` line.
fn package_version(wit: &str) -> Option<&str> {
    wit.lines()
        .find_map(|l| l.trim().strip_prefix("package draftlens:metric@"))
        .and_then(|v| v.strip_suffix(';'))
}

#[test]
fn released_contracts_are_frozen_and_the_current_one_is_released() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let current = std::fs::read_to_string(root.join("plugins/wit/metric.wit")).unwrap();
    let cur_version = package_version(&current).expect("plugins/wit/metric.wit: no package line");
    let mut found_current = false;
    let dir = root.join("plugins/wit-frozen");
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if !e.file_type().unwrap().is_dir() {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let frozen = std::fs::read_to_string(e.path().join("metric.wit"))
            .unwrap_or_else(|err| panic!("plugins/wit-frozen/{name}/metric.wit: {err}"));
        assert_eq!(
            package_version(&frozen),
            Some(name.as_str()),
            "plugins/wit-frozen/{name}/metric.wit declares another version"
        );
        if name == cur_version {
            found_current = true;
            assert!(
                meaning(&frozen) == meaning(&current),
                "plugins/wit/metric.wit still says {cur_version} but declares something else than the \
                 frozen copy: bump its version (and freeze the new one) instead of editing a released contract"
            );
        }
    }
    assert!(
        found_current,
        "contract {cur_version} has no frozen copy in plugins/wit-frozen/{cur_version}/"
    );
}

#[test]
fn comments_do_not_change_the_meaning() {
    assert_eq!(
        meaning("/// doc\nrecord a { x: u32, } // why\n\n"),
        meaning("record a { x: u32, }\n// other words\n")
    );
    assert_ne!(
        meaning("record a { x: u32, }"),
        meaning("record a { x: u64, }")
    );
}

#[test]
fn package_line_is_parsed() {
    assert_eq!(
        package_version("// x\npackage draftlens:metric@0.2.1;\n"),
        Some("0.2.1")
    );
    assert_eq!(package_version("package other:thing@1.0.0;"), None);
}
