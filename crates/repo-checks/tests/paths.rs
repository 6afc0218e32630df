//! Every repository path that docs, scripts and code comments cite (`crates/engine/src/hidden_cache/mod.rs`,
//! `scripts/test.sh`, …) exists, so a move or rename cannot leave a stale pointer behind.
//! Run: `cargo test -p draftlens-repo-checks --test paths`.

use draftlens_repo_checks::{check_paths_tree, repo_paths};
use std::path::Path;

#[test]
fn every_cited_repository_path_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The bench logs record what ran at the time (with the paths of the time); this crate's own
    // tests cite made-up paths on purpose.
    let skip = ["docs/bench-logs/", "crates/repo-checks/"];
    let findings = check_paths_tree(&root, &skip);
    assert!(
        findings.is_empty(),
        "{} stale path(s):\n{}",
        findings.len(),
        findings
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn paths_are_read_as_written_and_templates_are_left_out() {
    let t = "see crates/engine/src/hidden_cache/mod.rs, and `scripts/test.sh`.\n\
             not a path: mycrates/x, plugins/dist/$NAME.wasm plugins/tests-guests/NAME/src\n\
             drafters/x/step-${S}/config.json and tools/a/b.py:12";
    let got: Vec<(usize, String)> = repo_paths(t);
    assert_eq!(
        got,
        [
            (1, "crates/engine/src/hidden_cache/mod.rs".to_string()),
            (1, "scripts/test.sh".to_string()),
            (3, "tools/a/b.py".to_string()),
        ]
    );
}

#[test]
fn a_missing_path_is_reported_with_its_file_and_line() {
    let dir = std::env::temp_dir().join(format!("repo-paths-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::write(dir.join("scripts/real.sh"), "").unwrap();
    std::fs::write(
        dir.join("README.md"),
        "run scripts/real.sh\nthen scripts/gone.sh\n",
    )
    .unwrap();
    let f = check_paths_tree(&dir, &[]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].file.as_str(), f[0].line), ("README.md", 2));
    assert!(f[0].problem.contains("scripts/gone.sh"));
}
