//! Known answers for every drafter family through the `draftlens` binary on the CPU backend, on
//! the fixtures of tools/golden/make_successor_fixtures.py (written by `python3`, standard
//! library only, into a temporary folder): a "successor" target whose greedy next token after
//! word t is word t + 1 (mod 62), and per family (DFlash, DFlash2, EAGLE-3, the target's MTP head)
//!
//! - an exact drafter that proposes the target's continuation: every draft is accepted, so with
//!   41 new tokens (40 counted) every round commits B tokens and τ = B exactly (10 rounds at
//!   B = 4, 8 at B = 5): `run`'s replayed τ, `live`'s τ and rounds at T = 0, at T = 1 and at
//!   T = 0.7 / top-k 8 / top-p 0.9 (p and q are one-hot up to e^-30, so the sampled drafts and
//!   tokens are the greedy ones), and `run --temperature 1`'s expected acceptance;
//! - a defect drafter, wrong exactly after the tokens of a known set, whose rounds commit every
//!   length from 1 (every draft rejected) to B: its rounds per prompt and τ are the generator's
//!   (manifest.json), the same in every one of those commands;
//!
//! and in every `live` the output is the successor words (= plain greedy decoding: `lossless` at
//! T = 0). tools/bench/families_known_answer_device.sh runs the same cases on CUDA
//! (docs/live.md §4).

mod cli_util;

use cli_util::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Words on the target's successor cycle (w0 → w1 → … → w61 → w0).
const CYCLE: u64 = 62;
const MAX_NEW_TOKENS: usize = 41;

/// The generator's fixtures in `dir`, and its manifest.
fn fixtures(dir: &Path) -> Value {
    let script = root().join("tools/golden/make_successor_fixtures.py");
    let o = std::process::Command::new("python3")
        .arg(&script)
        .arg("--out")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "python3 {}: {e} (the fixtures' generator needs python3 on PATH)",
                script.display()
            )
        });
    assert!(
        o.status.success(),
        "{}: exit {:?}\n{}",
        script.display(),
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

/// The target's greedy continuation of a prompt, worked out here from its last word: the next
/// `MAX_NEW_TOKENS` words of the cycle.
fn successor_words(prompt: &str) -> String {
    let last: u64 = prompt.rsplit(' ').next().unwrap()[1..].parse().unwrap();
    (1..=MAX_NEW_TOKENS as u64)
        .map(|i| format!("w{}", (last + i) % CYCLE))
        .collect::<Vec<_>>()
        .join(" ")
}

struct Case {
    name: String,
    target: PathBuf,
    drafter: String,
    block: usize,
    /// Rounds per prompt id, and the macro τ over the prompts.
    rounds: Vec<(String, usize)>,
    tau_macro: f64,
}

fn case(dir: &Path, manifest: &Value, name: &str) -> Case {
    let c = manifest["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case"] == name)
        .unwrap_or_else(|| panic!("no case {name} in the manifest"));
    let drafter = c["drafter"].as_str().unwrap();
    let drafter = if drafter.starts_with("target:") {
        drafter.to_string()
    } else {
        s(&dir.join(drafter)).to_string()
    };
    let rounds = c["prompts"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(id, p)| (id.clone(), p["rounds"].as_u64().unwrap() as usize))
        .collect();
    Case {
        name: name.into(),
        target: dir.join(c["target"].as_str().unwrap()),
        drafter,
        block: c["block"].as_u64().unwrap() as usize,
        rounds,
        tau_macro: c["tau_macro"].as_f64().unwrap(),
    }
}

/// `draftlens --json <cmd> --backend cpu --target … --drafter … --prompts … --max-new-tokens 41
/// <extra…>`.
fn dl_json(cache: &Path, dir: &Path, c: &Case, cmd: &str, extra: &[&str]) -> Value {
    let prompts = dir.join("prompts.jsonl");
    let n = MAX_NEW_TOKENS.to_string();
    let mut args = vec!["--json", cmd, "--backend", "cpu", "--target", s(&c.target)];
    args.extend(["--drafter", &c.drafter, "--prompts", s(&prompts)]);
    args.extend(["--max-new-tokens", &n]);
    args.extend(extra);
    json_out(&dl(cache, &args), &format!("{} {cmd} {extra:?}", c.name))
}

/// Every command of one case: `run` (greedy, and at T = 1 where the family has it), then
/// `live` greedy and sampled.
fn check(cache: &Path, dir: &Path, manifest: &Value, c: &Case, sampled_run: bool) {
    let db = dir.join(format!("{}.sqlite", c.name));
    let db_arg = ["--db", s(&db)];
    let metric = |v: &Value, name: &str| v[0]["metrics"]["native"][name]["value"].as_f64().unwrap();
    let tol = 1e-9;

    let run = dl_json(cache, dir, c, "run", &db_arg);
    let tau = metric(&run, "tau_replayed_macro");
    assert!(
        (tau - c.tau_macro).abs() < tol,
        "{}: run replayed τ {tau}, expected {}",
        c.name,
        c.tau_macro
    );
    if sampled_run {
        // The expected acceptance of speculative sampling from the stored p and q: each α is 1
        // or 0 up to e^-30, so the replayed expectation is the greedy τ.
        let mut extra = db_arg.to_vec();
        extra.extend(["--temperature", "1", "--sampling-top-k", "8"]);
        let run = dl_json(cache, dir, c, "run", &extra);
        let tau = metric(&run, "tau_sampled_replayed_macro");
        assert!(
            (tau - c.tau_macro).abs() < 1e-6,
            "{}: run --temperature 1: expected τ {tau}, want {}",
            c.name,
            c.tau_macro
        );
    }

    let texts: Vec<(String, String)> = manifest["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let (id, words) = (
                p["id"].as_str().unwrap(),
                p["continuation"].as_str().unwrap(),
            );
            assert_eq!(
                words,
                successor_words(p["prompt"].as_str().unwrap()),
                "manifest continuation of {id}"
            );
            (id.to_string(), words.to_string())
        })
        .collect();
    let settings: [&[&str]; 3] = [
        &["--temperature", "0"],
        &["--temperature", "1"],
        &["--temperature", "0.7", "--top-k", "8", "--top-p", "0.9"],
    ];
    for setting in settings {
        let greedy = setting[1] == "0";
        let rows = dl_json(cache, dir, c, "live", setting);
        let rows = rows.as_array().unwrap();
        assert_eq!(rows.len(), texts.len());
        for (r, (id, words)) in rows.iter().zip(&texts) {
            let what = format!("{} live {setting:?} {id}", c.name);
            assert_eq!(r["id"], id.as_str(), "{what}");
            assert_eq!(
                r["text"],
                words.as_str(),
                "{what}: the output is the target's greedy continuation"
            );
            assert_eq!(r["new_tokens"], MAX_NEW_TOKENS, "{what}");
            let rounds = c.rounds.iter().find(|(p, _)| p == id).unwrap().1;
            assert_eq!(r["rounds"], rounds, "{what}: rounds");
            let tau = r["tau"].as_f64().unwrap();
            let want = (MAX_NEW_TOKENS - 1) as f64 / rounds as f64;
            assert!((tau - want).abs() < tol, "{what}: τ {tau}, expected {want}");
            if greedy {
                assert_eq!(r["lossless"], true, "{what}");
            } else {
                assert!(
                    r["lossless"].is_null(),
                    "{what}: a sample is compared with nothing"
                );
            }
        }
    }
}

/// EAGLE-3's dynamic tree (`run --eagle3-tree`): TOPK 1 is the chain, so its τ is the chain's
/// exactly; a TOPK 4 tree holds the chain as its first path, so its τ lies between the chain's
/// and B (the exact drafter: B).
fn check_trees(cache: &Path, dir: &Path, c: &Case) {
    let db = dir.join(format!("{}.sqlite", c.name));
    let metric = |v: &Value, name: &str| v[0]["metrics"]["native"][name]["value"].as_f64().unwrap();
    let b = c.block as f64;
    for shape in [format!("1,{}", c.block), format!("4,{}", 3 * c.block)] {
        let run = dl_json(
            cache,
            dir,
            c,
            "run",
            &["--db", s(&db), "--eagle3-tree", &shape],
        );
        let (tree, chain) = (
            metric(&run, "eagle3_tree_tau_replayed_macro"),
            metric(&run, "tau_replayed_macro"),
        );
        let what = format!("{} --eagle3-tree {shape}", c.name);
        assert!(
            (chain - c.tau_macro).abs() < 1e-9,
            "{what}: chain τ {chain}"
        );
        if shape.starts_with("1,") || c.tau_macro == b {
            assert!(
                (tree - c.tau_macro).abs() < 1e-9,
                "{what}: tree τ {tree}, expected {}",
                c.tau_macro
            );
        } else {
            assert!(
                c.tau_macro - 1e-9 <= tree && tree <= b + 1e-9,
                "{what}: tree τ {tree} outside [{}, {b}]",
                c.tau_macro
            );
        }
    }
}

/// The exact drafter of `family` (τ = `block` in every round, checked here without the
/// manifest) and its defect drafter (the manifest's rounds, some of every length 1..=B); with
/// `trees`, EAGLE-3's trees of both ([`check_trees`]).
fn family(family: &str, block: usize, sampled_run: bool, trees: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, dir) = (tmp.path().join("cache"), tmp.path().join("fixtures"));
    let manifest = fixtures(&dir);

    let exact = case(&dir, &manifest, family);
    assert_eq!(exact.block, block);
    let all = (MAX_NEW_TOKENS - 1) / block;
    assert!(
        exact.rounds.iter().all(|(_, r)| *r == all),
        "{:?}",
        exact.rounds
    );
    assert_eq!(exact.tau_macro, block as f64);
    check(&cache, &dir, &manifest, &exact, sampled_run);
    if trees {
        check_trees(&cache, &dir, &exact);
    }

    let defect = case(&dir, &manifest, &format!("{family}-defect"));
    let lengths: std::collections::BTreeSet<u64> = manifest["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case"] == defect.name.as_str())
        .unwrap()["prompts"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|p| {
            p["round_tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        lengths,
        (1..=block as u64).collect(),
        "the defect drafter's rounds commit every length from 1 to B"
    );
    check(&cache, &dir, &manifest, &defect, sampled_run);
    if trees {
        check_trees(&cache, &dir, &defect);
    }
}

#[test]
fn dflash_accepts_what_it_should() {
    family("dflash", 4, true, false);
}

#[test]
fn dflash2_accepts_what_it_should() {
    // `run --temperature` is refused for DFlash2 (docs/dflash2.md §4).
    family("dflash2", 5, false, false);
}

#[test]
fn eagle3_accepts_what_it_should() {
    family("eagle3", 5, true, true);
}

#[test]
fn mtp_head_accepts_what_it_should() {
    family("mtp", 4, true, false);
}
