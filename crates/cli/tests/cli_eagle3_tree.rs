//! `run --eagle3-tree TOPK,TOTAL` through the built binary (docs/eagle3.md §3.1): a malformed or
//! out-of-range shape is one error naming the flag before any model loads, and a drafter that
//! drafts no EAGLE-3 tree is refused before a run is stored. The tree itself, its golden and its
//! metrics through `run` are tested in the engine (crates/engine/tests/eagle3/tree.rs).

mod cli_util;

use cli_util::*;

#[test]
fn bad_tree_shapes_are_one_error_before_any_model_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let drafter = reference_drafter();
    for (shape, needles) in [
        ("0,8", &["--eagle3-tree", "TOPK 0"][..]),
        ("4", &["--eagle3-tree", "expected TOPK,TOTAL"]),
        ("4,eight", &["--eagle3-tree", "TOTAL \"eight\""]),
        (
            "40,64",
            &["--eagle3-tree", "TOPK 40 is above the cap of 32"],
        ),
        (
            "4,600",
            &["--eagle3-tree", "TOTAL 600 is above the cap of 512"],
        ),
    ] {
        let args = [
            "run",
            "--drafter",
            s(&drafter),
            "--eagle3-tree",
            shape,
            "--target",
            "/nonexistent/model.gguf",
            "--backend",
            "cpu",
            "--db",
            "/nonexistent/runs.sqlite",
        ];
        let line = clean_error(&dl(&cache, &args), shape, needles);
        assert!(!line.contains("nonexistent"), "{line}");
    }
}

#[test]
fn a_dflash_drafter_has_no_eagle3_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        tmp.path().join("p.jsonl"),
    );
    write_two_prompts(&prompts);
    let o = dl(
        &cache,
        &[
            "run",
            "--backend",
            "cpu",
            "--target",
            s(&model()),
            "--drafter",
            s(&reference_drafter()),
            "--eagle3-tree",
            "4,8",
            "--prompts",
            s(&prompts),
            "--max-new-tokens",
            "4",
            "--db",
            s(&db),
        ],
    );
    clean_error(
        &o,
        "run --eagle3-tree with a DFlash drafter",
        &["--eagle3-tree needs an EAGLE-3 checkpoint"],
    );
    assert!(!db.exists() || runs(&db).is_empty(), "a run was stored");
}
