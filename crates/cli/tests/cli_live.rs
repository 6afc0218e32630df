//! `draftlens live` through the built binary on the default target and the reference drafter
//! (CPU, f32): a lossless run prints and exits as before, with `divergence: null` in `--json`,
//! and `--strict` changes nothing when no prompt diverges. How a divergence is reported (data,
//! one summary line, exit status 0 unless `--strict`) is tested on the report itself
//! (src/cmd_eval_tests.rs) and where it is found on a backend whose verify pass rounds near-ties
//! the other way on purpose (crates/engine/src/drafter/live_tests.rs): the f32 CPU backend
//! cannot diverge.

mod cli_util;

use cli_util::*;

fn live(
    cache: &std::path::Path,
    prompts: &std::path::Path,
    extra: &[&str],
) -> std::process::Output {
    let drafter = reference_drafter();
    let mut args = vec![
        "live",
        "--backend",
        "cpu",
        "--drafter",
        s(&drafter),
        "--prompts",
        s(prompts),
        "--max-new-tokens",
        "16",
    ];
    args.extend(extra);
    dl(cache, &args)
}

#[test]
fn a_lossless_live_run_is_unchanged_and_strict_accepts_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, prompts) = (tmp.path().join("cache"), tmp.path().join("two.jsonl"));
    write_two_prompts(&prompts);

    let o = live(&cache, &prompts, &[]);
    ok(&o, "live");
    let text = stdout(&o);
    // (After the line saying which backend runs, which every model command prints.)
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("backend "))
        .collect();
    assert_eq!(
        lines.len(),
        3,
        "two prompts and the macro τ, nothing else:\n{text}"
    );
    for (line, id) in lines.iter().zip(["add", "sky"]) {
        assert!(
            line.starts_with(id) && line.ends_with("  lossless"),
            "{line}"
        );
    }
    assert!(
        lines[2].starts_with("live τ (macro over 2 prompts): "),
        "{text}"
    );
    assert!(!stderr(&o).contains("diverged"), "{}", stderr(&o));

    let o = live(&cache, &prompts, &["--strict"]);
    ok(&o, "live --strict");
    assert_eq!(
        stdout(&o),
        text,
        "--strict changes nothing on a lossless run"
    );

    let mut args = vec!["--json"];
    args.extend(["live", "--backend", "cpu"]);
    let drafter = reference_drafter();
    args.extend(["--drafter", s(&drafter), "--prompts", s(&prompts)]);
    args.extend(["--max-new-tokens", "16", "--strict"]);
    let v = json_out(&dl(&cache, &args), "live --json --strict");
    let rows = v.as_array().expect("a list of prompts");
    assert_eq!(rows.len(), 2);
    for r in rows {
        for key in ["id", "tau", "rounds", "new_tokens", "text"] {
            assert!(r.get(key).is_some(), "{key} missing: {r}");
        }
        assert_eq!(r["lossless"], true, "{r}");
        assert!(r["divergence"].is_null(), "{r}");
        assert!(r["tau"].as_f64().unwrap() >= 1.0, "{r}");
    }
}
