//! `draftlens parity --features FILE` through the built binary on the fixture target (SmolLM2-135M)
//! and the reference drafter (taps 1, 8, 15, 22, 27), CPU: `extract --out` read back as features
//! (zero divergence, identical τ), features perturbed by a known amount (the reported relative L2
//! is that amount), features taken one layer too early (the drafter loses τ), and every kind of bad
//! file refused with one error naming the tensor or prompt, before any target pass.

mod cli_util;

use cli_util::*;
use draftlens_engine::util::{write_safetensors, DetRng, SafetensorsEntry};
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The drafter's taps (drafters/smollm2-reference/step-2581/config.json).
const TAPS: [usize; 5] = [1, 8, 15, 22, 27];
/// Tokens of the greedy continuation extracted per prompt.
const MAX_NEW: usize = 32;

/// One extraction shared by every test: the states of the taps and of the layer before each.
struct Fixture {
    set: PathBuf,
    /// The cache `extract` filled (its passes and continuations).
    cache: PathBuf,
    /// `extract --out` as written.
    extracted: PathBuf,
    /// name → (shape, values) of `extracted`.
    states: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// prompt id → (draftlens's sequence, prompt length)
    ids: BTreeMap<String, (Vec<u32>, usize)>,
}

fn fixture() -> &'static Fixture {
    static FX: OnceLock<Fixture> = OnceLock::new();
    FX.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-parity-features");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (set, cache, extracted) = (
            dir.join("p.jsonl"),
            dir.join("cache"),
            dir.join("extract.safetensors"),
        );
        write_two_prompts(&set);
        let layers: Vec<String> = TAPS
            .iter()
            .flat_map(|l| [l - 1, *l])
            .map(|l| l.to_string())
            .collect();
        let max_new = MAX_NEW.to_string();
        let o = dl(
            &cache,
            &[
                "--json",
                "extract",
                "--backend",
                "cpu",
                "--target",
                s(&model()),
                "--prompts",
                s(&set),
                "--layers",
                &layers.join(","),
                "--max-new-tokens",
                &max_new,
                "--out",
                s(&extracted),
            ],
        );
        ok(&o, "extract --out");
        let bytes = std::fs::read(&extracted).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let states = st
            .tensors()
            .into_iter()
            .map(|(name, t)| {
                let v = t
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                (name, (t.shape().to_vec(), v))
            })
            .collect();
        Fixture {
            ids: sequences(&cache, &set),
            set,
            cache,
            extracted,
            states,
        }
    })
}

/// draftlens's sequences (prompt + greedy continuation, from the cache `extract` filled).
fn sequences(cache: &Path, set: &Path) -> BTreeMap<String, (Vec<u32>, usize)> {
    use draftlens_engine::backend::cpu::CpuBackend;
    use draftlens_engine::hidden_cache::HiddenCache;
    use draftlens_engine::prompts::PromptSet;
    use draftlens_engine::session::{Session, SessionOptions};
    let sess = Session::load(
        CpuBackend::new(),
        &model(),
        HiddenCache::open(cache).unwrap(),
        SessionOptions::default(),
    )
    .unwrap();
    let set = PromptSet::load(s(set)).unwrap();
    let done = sess
        .prompts_with_continuations(&set.prompts, MAX_NEW)
        .unwrap();
    set.prompts
        .iter()
        .zip(done)
        .map(|(p, (mut ids, c))| {
            let prompt_len = ids.len();
            ids.extend(&c.ids);
            (p.id.clone(), (ids, prompt_len))
        })
        .collect()
}

fn f32_entry(name: &str, shape: &[usize], v: &[f32]) -> SafetensorsEntry {
    let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    (name.into(), Dtype::F32, shape.to_vec(), bytes)
}

fn ids_entry(name: &str, ids: &[u32]) -> SafetensorsEntry {
    let bytes = ids.iter().flat_map(|&x| (x as i64).to_le_bytes()).collect();
    (name.into(), Dtype::I64, vec![ids.len()], bytes)
}

/// The drafter's taps of both prompts, f32 as extracted, each transformed by `f(name, values)`.
fn taps_with(fx: &Fixture, f: impl Fn(&str, &mut Vec<f32>)) -> Vec<SafetensorsEntry> {
    let mut out = Vec::new();
    for id in fx.ids.keys() {
        for l in TAPS {
            let name = format!("{id}.layer{l}");
            let (shape, v) = &fx.states[&name];
            let mut v = v.clone();
            f(&name, &mut v);
            out.push(f32_entry(&name, shape, &v));
        }
    }
    out
}

fn write(path: &Path, entries: &[SafetensorsEntry]) {
    write_safetensors(path, entries).unwrap();
}

/// `parity --features FILE --drafter reference` with `cache`.
fn parity(cache: &Path, features: &Path, json: bool) -> std::process::Output {
    let fx = fixture();
    let target = model();
    let mut args = vec![
        "parity",
        "--features",
        s(features),
        "--backend",
        "cpu",
        "--target",
        s(&target),
        "--prompts",
        s(&fx.set),
    ];
    let drafter = reference_drafter();
    args.extend(["--drafter", s(&drafter)]);
    if json {
        args.insert(0, "--json");
    }
    dl(cache, &args)
}

fn layer(v: &serde_json::Value, id: usize) -> &serde_json::Value {
    v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer_id"] == id)
        .unwrap_or_else(|| panic!("no layer {id} in {}", v["layers"]))
}

fn rel(v: &serde_json::Value, id: usize) -> f64 {
    layer(v, id)["diff"]["rel_l2"].as_f64().unwrap()
}

/// An object's keys, sorted.
fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

fn tau(v: &serde_json::Value) -> (f64, f64) {
    let t = &v["drafter"]["tau"];
    (
        t["draftlens"].as_f64().unwrap(),
        t["features"].as_f64().unwrap(),
    )
}

#[test]
fn extract_out_read_back_is_zero_divergence_and_the_same_tau() {
    let fx = fixture();
    let v = json_out(&parity(&fx.cache, &fx.extracted, true), "parity --features");
    assert_eq!(v["schema_version"], 1);
    // The keys docs/parity-features.md §3 (and docs/json.md §6) lists.
    assert_eq!(
        keys(&v),
        [
            "backend",
            "drafter",
            "features",
            "layers",
            "prompts",
            "schema_version",
            "target",
            "tokens"
        ]
    );
    assert_eq!(
        keys(&v["prompts"][0]),
        [
            "id",
            "prompt_tokens",
            "tau_draftlens",
            "tau_features",
            "token_ids_from",
            "tokens"
        ]
    );
    assert_eq!(
        keys(&v["layers"][0]),
        ["diff", "hidden_state_index", "layer_id", "worst_positions"]
    );
    assert_eq!(
        keys(&v["layers"][0]["diff"]),
        ["cosine", "max_abs", "n", "non_finite", "ref_rms", "rel_l2"]
    );
    assert_eq!(
        keys(&v["drafter"]),
        [
            "drafter",
            "layer_ids",
            "metrics",
            "per_position",
            "tau",
            "verdict"
        ]
    );
    assert_eq!(
        keys(&v["drafter"]["tau"]),
        ["delta", "draftlens", "features"]
    );
    assert_eq!(
        keys(&v["drafter"]["per_position"][0]),
        ["delta", "draftlens", "features", "k"]
    );
    assert_eq!(v["backend"], "cpu");
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 10, "every layer of the file: {}", v["layers"]);
    for l in layers {
        assert_eq!(
            l["hidden_state_index"].as_u64().unwrap(),
            l["layer_id"].as_u64().unwrap() + 1
        );
        assert_eq!(l["diff"]["rel_l2"], 0.0, "{l}");
        assert_eq!(l["diff"]["max_abs"], 0.0, "{l}");
        assert_eq!(
            l["worst_positions"],
            serde_json::json!([]),
            "no row differs"
        );
    }
    for p in v["prompts"].as_array().unwrap() {
        assert_eq!(p["token_ids_from"], "draftlens", "{p}");
        let (ids, prompt_len) = &fx.ids[p["id"].as_str().unwrap()];
        assert_eq!(p["tokens"], ids.len());
        assert_eq!(p["prompt_tokens"], *prompt_len);
        assert_eq!(p["tau_draftlens"], p["tau_features"], "{p}");
    }
    let d = &v["drafter"];
    assert_eq!(d["layer_ids"], serde_json::json!(TAPS));
    let (a, b) = tau(&v);
    assert!(
        a > 1.5,
        "the reference drafter accepts on its own states: τ {a}"
    );
    assert_eq!(a, b);
    for (name, m) in d["metrics"].as_object().unwrap() {
        assert_eq!(m["draftlens"], m["features"], "{name}: {m}");
    }
    let positions = d["per_position"].as_array().unwrap();
    assert_eq!(positions.len(), 15, "block size 16: positions 1..=15");
    assert!(positions.iter().all(|p| p["draftlens"] == p["features"]));
    assert!(
        d["verdict"].as_str().unwrap().contains("same τ"),
        "{}",
        d["verdict"]
    );

    // The text report: the table, the drafter block and the verdict.
    let o = parity(&fx.cache, &fx.extracted, false);
    ok(&o, "parity --features text");
    let t = stdout(&o);
    for needle in [
        "vs draftlens (cpu) on 2 prompts",
        "hidden_states",
        "[28]",
        "tau_replayed_macro",
        "acceptance by position",
        "same τ",
    ] {
        assert!(t.contains(needle), "{needle:?} missing:\n{t}");
    }
}

/// Standard normal values (Box–Muller on the crate's deterministic generator).
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut r = DetRng::new(seed);
    (0..n)
        .map(|_| {
            let u1 = (r.unit() as f64).max(1e-12);
            let u2 = r.unit() as f64;
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        })
        .collect()
}

#[test]
fn perturbed_features_report_the_divergence_they_were_given() {
    let fx = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("perturbed.safetensors");
    // Layer 8: Gaussian noise of relative size 1e-2 (σ = 1e-2 · the tensor's RMS, so
    // E‖noise‖² = 1e-4 ‖x‖²); layer 15 scaled by 1.05 (relative L2 exactly 0.05, cosine 1); layer
    // 1 stored as BF16 (rounding only); layers 22 and 27 as extracted. Prompt "add" carries its
    // token ids, "sky" does not.
    let mut entries = taps_with(fx, |name, v| {
        if name.ends_with(".layer8") {
            let rms = (v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
            let seed = name.bytes().map(u64::from).sum();
            let noise = gaussian(v.len(), seed);
            for (x, g) in v.iter_mut().zip(noise) {
                *x += (1e-2 * rms) as f32 * g;
            }
        } else if name.ends_with(".layer15") {
            v.iter_mut().for_each(|x| *x *= 1.05);
        }
    });
    for e in entries.iter_mut().filter(|e| e.0.ends_with(".layer1")) {
        e.1 = Dtype::BF16;
        e.3 =
            e.3.chunks_exact(4)
                .flat_map(|c| {
                    half::bf16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_le_bytes()
                })
                .collect();
    }
    entries.push(ids_entry("add.input_ids", &fx.ids["add"].0));
    write(&file, &entries);

    let v = json_out(&parity(&fx.cache, &file, true), "perturbed features");
    let noise = rel(&v, 8);
    assert!(
        (noise / 1e-2 - 1.0).abs() < 0.03,
        "layer 8 was given relative noise 1e-2, reported {noise}"
    );
    assert!((rel(&v, 15) - 0.05).abs() < 1e-6, "{}", layer(&v, 15));
    assert!(
        (layer(&v, 15)["diff"]["cosine"].as_f64().unwrap() - 1.0).abs() < 1e-6,
        "scaling keeps the direction: {}",
        layer(&v, 15)
    );
    let worst = layer(&v, 15)["worst_positions"].as_array().unwrap();
    assert_eq!(worst.len(), 5, "--worst defaults to 5");
    assert_eq!(
        keys(&worst[0]),
        [
            "cosine",
            "in_prompt",
            "position",
            "prompt_id",
            "rel_l2",
            "token_id"
        ]
    );
    for w in worst {
        assert!(
            (w["rel_l2"].as_f64().unwrap() - 0.05).abs() < 1e-5,
            "every row is scaled: {w}"
        );
    }
    let bf16 = rel(&v, 1);
    assert!(
        bf16 > 1e-4 && bf16 < 4e-3,
        "bf16 rounding of layer 1: {bf16}"
    );
    assert_eq!((rel(&v, 22), rel(&v, 27)), (0.0, 0.0));
    let from: Vec<(&str, &str)> = v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap(),
                p["token_ids_from"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(from, [("add", "file"), ("sky", "draftlens")]);
    let (a, b) = tau(&v);
    assert!(a.is_finite() && b.is_finite(), "{}", v["drafter"]);
}

#[test]
fn features_one_layer_early_lose_tau() {
    // The classic off-by-one: a pipeline that stores hidden_states[L] (the input of layer L)
    // under layer id L instead of hidden_states[L+1].
    let fx = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("shifted.safetensors");
    let mut entries = Vec::new();
    for id in fx.ids.keys() {
        for l in TAPS {
            let (shape, v) = &fx.states[&format!("{id}.layer{}", l - 1)];
            entries.push(f32_entry(&format!("{id}.layer{l}"), shape, v));
        }
    }
    write(&file, &entries);
    let v = json_out(&parity(&fx.cache, &file, true), "shifted features");
    // Adjacent layers of the residual stream are close (the massive activations dominate the
    // norm): the divergence is visible but small, the τ loss is not.
    for l in TAPS {
        assert!(rel(&v, l) > 1e-3, "layer {l}: {}", layer(&v, l));
    }
    let (a, b) = tau(&v);
    assert!(
        b < a - 0.1,
        "features one layer early: τ {b} should be well below draftlens's {a}"
    );
    let verdict = v["drafter"]["verdict"].as_str().unwrap();
    assert!(
        verdict.contains(&format!("lose {:.3} τ", a - b)),
        "{verdict}"
    );
}

/// `parity --features` on a bad file: one clean error with every needle, and no target pass or
/// continuation computed (the fresh cache stays without entries).
fn refused(entries: &[SafetensorsEntry], what: &str, needles: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let (file, cache) = (tmp.path().join("bad.safetensors"), tmp.path().join("cache"));
    write(&file, entries);
    let o = parity(&cache, &file, true);
    clean_error(&o, what, needles);
    assert!(stdout(&o).trim().is_empty(), "{what}: printed a report");
    assert_eq!(
        cache_verifies(&cache),
        0,
        "{what}: computed before refusing"
    );
}

#[test]
fn token_ids_unlike_the_prompts_tokenisation_are_refused() {
    let fx = fixture();
    let mut ids = fx.ids["add"].0.clone();
    ids[3] += 1;
    let mut entries = taps_with(fx, |_, _| {});
    entries.push(ids_entry("add.input_ids", &ids));
    refused(
        &entries,
        "token ids",
        &[
            "add.input_ids",
            "differs from the prompt's tokenisation at position 3",
        ],
    );
    // Shorter than the prompt: rows and ids agree, but the prompt is not covered.
    let p = fx.ids["sky"].1;
    let mut entries: Vec<SafetensorsEntry> = taps_with(fx, |_, _| {})
        .into_iter()
        .filter(|e| !e.0.starts_with("sky."))
        .collect();
    for l in TAPS {
        let name = format!("sky.layer{l}");
        let (shape, v) = &fx.states[&name];
        entries.push(f32_entry(
            &name,
            &[p - 2, shape[1]],
            &v[..(p - 2) * shape[1]],
        ));
    }
    entries.push(ids_entry("sky.input_ids", &fx.ids["sky"].0[..p - 2]));
    refused(
        &entries,
        "ids shorter than the prompt",
        &["sky.input_ids", "fewer than the prompt's"],
    );
}

#[test]
fn a_layer_the_drafter_reads_missing_is_refused() {
    let fx = fixture();
    let entries: Vec<SafetensorsEntry> = taps_with(fx, |_, _| {})
        .into_iter()
        .filter(|e| e.0 != "sky.layer22")
        .collect();
    refused(
        &entries,
        "missing layer",
        &[
            "prompt \"sky\" has no tensor sky.layer22",
            "the drafter reads layers [1, 8, 15, 22, 27]",
        ],
    );
}

#[test]
fn shapes_unlike_the_target_or_the_tokens_are_refused() {
    let fx = fixture();
    // Hidden size: one column short.
    let entries: Vec<SafetensorsEntry> = taps_with(fx, |_, _| {})
        .into_iter()
        .map(|e| {
            if e.0 != "add.layer8" {
                return e;
            }
            let (t, h) = (e.2[0], e.2[1]);
            let v: Vec<f32> = fx.states["add.layer8"]
                .1
                .chunks_exact(h)
                .flat_map(|r| r[..h - 1].to_vec())
                .collect();
            f32_entry(&e.0, &[t, h - 1], &v)
        })
        .collect();
    refused(
        &entries,
        "hidden size",
        &[
            "add.layer8",
            "hidden size 575",
            "the target's hidden size is 576",
        ],
    );
    // Rows ≠ tokens: every layer of "add" one row short of its input_ids.
    let (ids, _) = &fx.ids["add"];
    let mut entries: Vec<SafetensorsEntry> = taps_with(fx, |_, _| {})
        .into_iter()
        .map(|e| {
            if !e.0.starts_with("add.") {
                return e;
            }
            let (t, h) = (e.2[0], e.2[1]);
            (e.0, e.1, vec![t - 1, h], e.3[..(t - 1) * h * 4].to_vec())
        })
        .collect();
    entries.push(ids_entry("add.input_ids", ids));
    refused(
        &entries,
        "rows vs tokens",
        &[
            "add.input_ids holds",
            &format!(
                "{} token ids but add.layer1 has {} rows",
                ids.len(),
                ids.len() - 1
            ),
        ],
    );
    // Without input_ids: fewer rows than the prompt has tokens.
    let p = fx.ids["sky"].1;
    let entries: Vec<SafetensorsEntry> = taps_with(fx, |_, _| {})
        .into_iter()
        .map(|e| {
            if !e.0.starts_with("sky.") {
                return e;
            }
            let h = e.2[1];
            (e.0, e.1, vec![p - 1, h], e.3[..(p - 1) * h * 4].to_vec())
        })
        .collect();
    refused(
        &entries,
        "rows short of the prompt",
        &[
            "prompt \"sky\"",
            &format!("{} rows, fewer than the prompt's {p} tokens", p - 1),
        ],
    );
    // Layers of one prompt over different token counts.
    let entries: Vec<SafetensorsEntry> = taps_with(fx, |_, _| {})
        .into_iter()
        .map(|e| {
            if e.0 != "sky.layer27" {
                return e;
            }
            let (t, h) = (e.2[0], e.2[1]);
            (e.0, e.1, vec![t - 1, h], e.3[..(t - 1) * h * 4].to_vec())
        })
        .collect();
    refused(
        &entries,
        "ragged layers",
        &["sky.layer27 has", "sky.layer1 has"],
    );
}

#[test]
fn non_float_states_and_non_integer_ids_are_refused() {
    let fx = fixture();
    let entries: Vec<SafetensorsEntry> = taps_with(fx, |_, _| {})
        .into_iter()
        .map(|e| {
            if e.0 != "add.layer15" {
                return e;
            }
            let bytes =
                e.3.chunks_exact(4)
                    .flat_map(|c| (f32::from_le_bytes(c.try_into().unwrap()) as i32).to_le_bytes())
                    .collect();
            (e.0, Dtype::I32, e.2, bytes)
        })
        .collect();
    refused(
        &entries,
        "integer hidden states",
        &["add.layer15 has dtype I32", "must be floating point"],
    );
    let mut entries = taps_with(fx, |_, _| {});
    let ids: Vec<f32> = fx.ids["add"].0.iter().map(|&x| x as f32).collect();
    entries.push(f32_entry("add.input_ids", &[ids.len()], &ids));
    refused(
        &entries,
        "float token ids",
        &["add.input_ids has dtype F32", "I64 or I32"],
    );
}

#[test]
fn prompt_ids_outside_the_set_and_unknown_names_are_refused() {
    let fx = fixture();
    let mut entries = taps_with(fx, |_, _| {});
    let (shape, v) = &fx.states["add.layer1"];
    entries.push(f32_entry("nope.layer1", shape, v));
    refused(
        &entries,
        "unknown prompt id",
        &[
            "tensor nope.layer1",
            "prompt id \"nope\" is not in the prompt set",
        ],
    );
    let mut entries = taps_with(fx, |_, _| {});
    entries.push(f32_entry("add.hidden_states8", shape, v));
    refused(
        &entries,
        "unknown name",
        &["tensor add.hidden_states8", "PROMPT.layerL"],
    );
    let mut entries = taps_with(fx, |_, _| {});
    entries.push(f32_entry("add.layer30", shape, v));
    refused(
        &entries,
        "layer out of range",
        &["add.layer30", "layer id 30 is out of range"],
    );
    // The GDN/backend options belong to the other mode.
    let cache = tempfile::tempdir().unwrap();
    clean_error(
        &dl(
            cache.path(),
            &[
                "parity",
                "--features",
                s(&fx.extracted),
                "--backends",
                "cpu,cpu",
            ],
        ),
        "--features with --backends",
        &["--features", "--backends"],
    );
}
