//! The verdict through the built binary (docs/verdict.md): a DFlash run (the reference drafter)
//! and an EAGLE-3 run (a random-weight SpecForge-layout checkpoint written here) of the default
//! target on the same prompts and CPU backend; `live --baseline --store` times the DFlash run;
//! `runs ls/show` and `compare` (text and `--json`) show each run's family, and the verdict's
//! estimate is the cost model over the stored inputs and the run's replayed τ. Bad `--store`
//! uses are one error each.

mod cli_util;

use cli_util::*;
use draftlens_engine::model::TargetFiles;
use draftlens_engine::util::write_safetensors;
use safetensors::Dtype;
use std::path::Path;

/// xorshift64*: a seeded stream for the random weights (no rand in this crate).
struct Stream(u64);
impl Stream {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        x as f32 / (1u64 << 24) as f32 // [0, 1)
    }
}

fn f32s(name: &str, shape: Vec<usize>, v: Vec<f32>) -> draftlens_engine::util::SafetensorsEntry {
    let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    (name.into(), Dtype::F32, shape, bytes)
}

/// A random EAGLE-3 drafter (SpecForge / vLLM `LlamaForCausalLMEagle3`, own embedding, the
/// engines' default taps, a chain of 3) for a target of hidden `dt` and vocabulary `vocab`, its
/// draft vocabulary the first `draft_vocab` target ids.
fn write_eagle3(dir: &Path, dt: usize, vocab: usize, draft_vocab: usize) {
    let (d, inter) = (32usize, 48usize);
    let mut rng = Stream(0x9e37_79b9_7f4a_7c15);
    let mut mat = |name: &str, out: usize, inp: usize| {
        let b = (3.0 / inp as f32).sqrt();
        let v = (0..out * inp)
            .map(|_| (2.0 * rng.next() - 1.0) * b)
            .collect();
        f32s(name, vec![out, inp], v)
    };
    let mut tensors = vec![
        mat("embed_tokens.weight", vocab, d),
        mat("fc.weight", d, 3 * dt),
        mat("midlayer.self_attn.q_proj.weight", d, 2 * d),
        mat("midlayer.self_attn.k_proj.weight", d / 2, 2 * d),
        mat("midlayer.self_attn.v_proj.weight", d / 2, 2 * d),
        mat("midlayer.self_attn.o_proj.weight", d, d),
        mat("midlayer.mlp.gate_proj.weight", inter, d),
        mat("midlayer.mlp.up_proj.weight", inter, d),
        mat("midlayer.mlp.down_proj.weight", d, inter),
        mat("lm_head.weight", draft_vocab, d),
    ];
    for name in [
        "midlayer.input_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.post_attention_layernorm.weight",
        "norm.weight",
    ] {
        tensors.push(f32s(name, vec![d], vec![1.0; d]));
    }
    // d2t[i] = target id − draft id = 0 for the first draft_vocab ids.
    let d2t: Vec<u8> = (0..draft_vocab).flat_map(|_| 0i64.to_le_bytes()).collect();
    tensors.push(("d2t".into(), Dtype::I64, vec![draft_vocab], d2t));
    let t2d: Vec<u8> = (0..vocab).map(|t| (t < draft_vocab) as u8).collect();
    tensors.push(("t2d".into(), Dtype::BOOL, vec![vocab], t2d));
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": d,
        "intermediate_size": inter,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": d / 2,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "num_speculative_tokens": 3,
        "target_hidden_size": dt,
        "torch_dtype": "float32"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    write_safetensors(&dir.join("model.safetensors"), &tensors).unwrap();
}

const MAX_NEW: &str = "12";

fn run(cache: &Path, db: &Path, prompts: &Path, drafter: &Path) -> i64 {
    let o = dl(
        cache,
        &[
            "--json",
            "run",
            "--backend",
            "cpu",
            "--drafter",
            s(drafter),
            "--prompts",
            s(prompts),
            "--max-new-tokens",
            MAX_NEW,
            "--db",
            s(db),
        ],
    );
    ok(&o, "run");
    *runs(db).iter().map(|r| &r.id).max().unwrap()
}

fn live_args<'a>(drafter: &'a Path, prompts: &'a Path, db: &'a Path) -> Vec<&'a str> {
    vec![
        "live",
        "--backend",
        "cpu",
        "--drafter",
        s(drafter),
        "--prompts",
        s(prompts),
        "--max-new-tokens",
        MAX_NEW,
        "--db",
        s(db),
    ]
}

#[test]
fn compare_puts_a_dflash_and_an_eagle3_run_side_by_side_with_the_speed_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        tmp.path().join("p.jsonl"),
    );
    write_prompts(
        &prompts,
        &[
            (
                "add",
                Some("code"),
                "Write a Python function add(a, b) that returns the sum of a and b.",
            ),
            (
                "sky",
                Some("science"),
                "Why is the sky blue? Explain it to a child.",
            ),
            ("list", Some("code"), "Reverse a list in Python."),
            ("tea", None, "How do I make green tea?"),
        ],
    );
    let spec = TargetFiles::open(&model()).unwrap().spec;
    let eagle3 = tmp.path().join("eagle3").join("step-1");
    write_eagle3(&eagle3, spec.hidden_size, spec.vocab_size, 4096);
    let dflash = reference_drafter();
    let a = run(&cache, &db, &prompts, &dflash);
    let b = run(&cache, &db, &prompts, &eagle3);

    // Every run has its family: stored, in runs ls and runs show (text and JSON).
    let families: Vec<(i64, String)> = runs(&db)
        .into_iter()
        .map(|r| (r.id, r.drafter_family))
        .collect();
    assert_eq!(
        families,
        [(a, "dflash".to_string()), (b, "eagle3".to_string())]
    );
    let ls = dl(&cache, &["runs", "ls", "--db", s(&db)]);
    ok(&ls, "runs ls");
    assert!(
        stdout(&ls).lines().any(|l| l.contains(" eagle3 ")),
        "{}",
        stdout(&ls)
    );
    let show = dl(&cache, &["runs", "show", &b.to_string(), "--db", s(&db)]);
    assert!(
        stdout(&show).contains("  drafter family eagle3\n"),
        "{}",
        stdout(&show)
    );
    let show = json_out(
        &dl(
            &cache,
            &["--json", "runs", "show", &a.to_string(), "--db", s(&db)],
        ),
        "runs show",
    );
    assert_eq!(show["run"]["run"]["drafter_family"], "dflash");

    // Bad --store uses: each one error, nothing stored.
    let mut args = live_args(&dflash, &prompts, &db);
    args.extend(["--store", "99"]);
    clean_error(&dl(&cache, &args), "live --store 99", &["no run \"99\""]);
    let b_str = b.to_string();
    let mut args = live_args(&dflash, &prompts, &db);
    args.extend(["--store", &b_str]);
    clean_error(
        &dl(&cache, &args),
        "live --store of another drafter's run",
        &["another drafter"],
    );
    let mut args = live_args(&dflash, &prompts, &db);
    args.extend(["--baseline", "--temperature", "1"]);
    clean_error(
        &dl(&cache, &args),
        "live --baseline at T > 0",
        &["--temperature 0 only"],
    );
    let a_str = a.to_string();
    let mut args = live_args(&dflash, &prompts, &db);
    args[8] = "8"; // --max-new-tokens 8: not the run's budget
    args.extend(["--store", &a_str]);
    clean_error(
        &dl(&cache, &args),
        "live --store with another budget",
        &["--max-new-tokens 8"],
    );
    assert!(metric_map(&db, a).iter().all(|(_, m)| m.source != "speed"));

    // Timed and stored with the DFlash run.
    let mut args = vec!["--json"];
    args.extend(live_args(&dflash, &prompts, &db));
    args.extend(["--store", &a_str]);
    let live = json_out(&dl(&cache, &args), "live --store");
    assert_eq!(live["stored_with_run"], a);
    assert_eq!(live["rows"].as_array().unwrap().len(), 4);
    assert!(live["rows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["lossless"] == true && r["timing"]["greedy_s"].as_f64().unwrap() > 0.0));
    let measured_live = live["speed"]["speedup_measured"].as_f64().unwrap();
    let stored = metric_map(&db, a);
    let run_value = |name: &str| {
        stored
            .iter()
            .find(|(k, _)| k == &format!("speed/{name}/run"))
            .map(|(_, m)| m.value)
            .unwrap_or_else(|| panic!("no speed/{name} row"))
    };
    let (t_decode, t_draft, t_verify) = (
        run_value("t_decode_ms"),
        run_value("t_draft_round_ms"),
        run_value("t_verify_ms"),
    );
    assert!(t_decode > 0.0 && t_draft > 0.0 && t_verify > 0.0);
    assert_eq!(run_value("speedup_measured"), measured_live);
    assert_eq!(
        stored
            .iter()
            .filter(|(k, _)| k.starts_with("speed/live_decode_s/prompt:"))
            .count(),
        4
    );
    let tau_pooled = stored
        .iter()
        .find(|(k, _)| k == "native/tau_replayed_pooled/run")
        .unwrap()
        .1
        .value;
    // Lossless on the f32 CPU: live τ is the replayed τ.
    assert!((run_value("tau_live") - tau_pooled).abs() < 1e-9);

    // compare --json: the verdict against what is stored.
    let c = json_out(
        &dl(
            &cache,
            &["--json", "compare", &a_str, &b_str, "--db", s(&db)],
        ),
        "compare",
    );
    let runs_json = c["runs"].as_array().unwrap();
    assert_eq!(runs_json[0]["drafter_family"], "dflash");
    assert_eq!(runs_json[1]["drafter_family"], "eagle3");
    let v = &c["verdict"];
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(
        (rows[0]["family"].as_str(), rows[1]["family"].as_str()),
        (Some("dflash"), Some("eagle3"))
    );
    let r0 = &rows[0];
    let tau = r0["tau"].as_f64().unwrap();
    assert!((tau - tau_pooled).abs() < 1e-9, "{tau} vs {tau_pooled}");
    let want = tau * t_decode / (t_draft + t_verify);
    let est = r0["estimated"].as_f64().unwrap();
    assert!((est - want).abs() < 1e-9 * want, "{est} vs {want}");
    let measured = r0["measured"].as_f64().unwrap();
    assert!((measured - measured_live).abs() < 1e-9 * measured);
    let err = r0["estimate_error_pct"].as_f64().unwrap();
    assert!((err - 100.0 * (est / measured - 1.0)).abs() < 1e-9);
    assert_eq!(r0["timed_prompts"], 4);
    assert!(r0["tau_ci"].is_array() && r0["measured_ci"].is_array());
    // The EAGLE-3 run has τ but no timings: its estimate is missing and says why.
    let r1 = &rows[1];
    assert!(r1["tau"].as_f64().unwrap() > 0.0);
    assert!(r1["estimated"].is_null() && r1["measured"].is_null());
    assert!(r1["missing"]
        .as_str()
        .unwrap()
        .contains(&format!("--store {b}")));
    let d = &r1["delta_tau"];
    assert_eq!(d["n"], 4);
    assert_eq!(d["method"], "paired_t");
    let (lo, hi) = (d["ci"][0].as_f64().unwrap(), d["ci"][1].as_f64().unwrap());
    let delta = d["delta"].as_f64().unwrap();
    assert!(lo <= delta && delta <= hi);
    assert!((delta - (r1["tau"].as_f64().unwrap() - tau)).abs() < 1e-9);
    // Same runs, same intervals.
    let again = json_out(
        &dl(
            &cache,
            &["--json", "compare", &a_str, &b_str, "--db", s(&db)],
        ),
        "compare",
    );
    assert_eq!(again["verdict"], c["verdict"]);

    // compare (text): families on the run lines and the verdict tables.
    let t = dl(&cache, &["compare", &a_str, &b_str, "--db", s(&db)]);
    ok(&t, "compare");
    let text = stdout(&t);
    assert!(
        text.lines().next().unwrap().ends_with(" · dflash"),
        "{text}"
    );
    assert!(text.contains(" · eagle3 · 4/4 prompts shared"), "{text}");
    assert!(text.contains("verdict (drafter families"), "{text}");
    assert!(text.contains("cost model inputs"), "{text}");
    assert!(text.contains(&format!("{est:.3}×")), "{text}");
    assert!(text.contains(&format!("{measured:.3}×")), "{text}");
}
