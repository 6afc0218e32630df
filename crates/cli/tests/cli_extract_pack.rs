//! `extract --pack-tokens`: the hidden states and the cache entries do not depend on how the
//! prompts are packed into target forwards, and a budget of 0 is a clean error.

mod cli_util;

use cli_util::*;
use safetensors::SafeTensors;
use std::path::Path;

/// Sorted entry file names under a cache folder (the content-addressed keys).
fn entry_names(cache: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(cache)
        .into_iter()
        // Cache entries only: the identity store (`identity/*.json`, the remembered weight
        // hashes) lives in the same folder but holds no hidden states.
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|p| p.strip_prefix(cache).unwrap().display().to_string())
        .collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn extract_gives_the_same_states_and_entries_whatever_the_pack_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("p.jsonl");
    write_prompts(
        &prompts,
        &[
            ("haiku", None, "Write a haiku about the sea."),
            ("hi", None, "Hi"),
            (
                "primes",
                None,
                "List three prime numbers greater than one hundred.",
            ),
        ],
    );
    let extract = |name: &str, pack: &str| {
        let (cache, out) = (
            tmp.path().join(format!("cache-{name}")),
            tmp.path().join(format!("{name}.safetensors")),
        );
        let o = dl(
            &cache,
            &[
                "--json",
                "extract",
                "--prompts",
                s(&prompts),
                "--max-new-tokens",
                "6",
                "--layers",
                "1,15,29",
                "--pack-tokens",
                pack,
                "--out",
                s(&out),
            ],
        );
        let v = json_out(&o, &format!("extract --pack-tokens {pack}"));
        assert_eq!(v.as_array().unwrap().len(), 3);
        (entry_names(&cache), std::fs::read(&out).unwrap())
    };
    // One token per pack: every prompt runs alone; 100 000: all three in one forward.
    let (alone_entries, alone_states) = extract("alone", "1");
    let (packed_entries, packed_states) = extract("packed", "100000");
    // 3 greedy continuations + 3 target passes, under the same keys.
    assert_eq!(alone_entries.len(), 6, "{alone_entries:?}");
    assert_eq!(alone_entries, packed_entries);
    // Packing is the same arithmetic row for row; only f32 summation order may differ (the
    // build machine gives bit-identical files). Tolerance as in crates/engine/tests/packed_forward.rs.
    let (a, p) = (
        SafeTensors::deserialize(&alone_states).unwrap(),
        SafeTensors::deserialize(&packed_states).unwrap(),
    );
    let mut names: Vec<String> = a.names().into_iter().map(String::from).collect();
    names.sort();
    let mut pnames: Vec<String> = p.names().into_iter().map(String::from).collect();
    pnames.sort();
    assert_eq!(names, pnames);
    assert_eq!(names.len(), 9, "3 prompts × 3 layers: {names:?}");
    for n in &names {
        let (ta, tp) = (a.tensor(n).unwrap(), p.tensor(n).unwrap());
        assert_eq!(ta.shape(), tp.shape(), "{n}");
        let f = |b: &[u8]| -> Vec<f64> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect()
        };
        let (va, vp) = (f(ta.data()), f(tp.data()));
        let num: f64 = va.iter().zip(&vp).map(|(x, y)| (x - y) * (x - y)).sum();
        let den: f64 = va.iter().map(|x| x * x).sum();
        let rel = (num / den).sqrt();
        assert!(rel <= 1e-5, "{n}: packed vs alone rel {rel:.3e}");
    }
}

#[test]
fn pack_tokens_zero_is_a_clean_error() {
    let tmp = tempfile::tempdir().unwrap();
    let o = dl(
        &tmp.path().join("cache"),
        &[
            "extract",
            "--prompts",
            "builtin:humaneval",
            "--pack-tokens",
            "0",
        ],
    );
    clean_error(&o, "extract --pack-tokens 0", &["--pack-tokens"]);
}
