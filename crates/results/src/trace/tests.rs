//! Trace import: each format from the fixture files (crates/results/tests/fixtures/traces/,
//! shaped as the engines write them), each correction, each bad input, and the stored run read
//! back. Every τ below is computed by hand in the comment next to it.

use super::normalise::{Correction, Effect};
use super::*;
use crate::metrics::{RunStats, SOURCE, STATS_KIND};
use crate::store::{MetricScope, NewRun, Store};
use std::path::PathBuf;

/// The tests' prompt set: p0, p1 (code), p2 (chat).
fn set() -> Vec<SetPrompt> {
    [("p0", "code"), ("p1", "code"), ("p2", "chat")]
        .iter()
        .map(|(id, c)| SetPrompt {
            id: id.to_string(),
            sha256: format!("sha-{id}"),
            category: Some(c.to_string()),
        })
        .collect()
}

/// A tokenizer of 1000 ids whose end-of-generation id is 2; prompt i is [1, 10 + i, 20 + i].
struct FakeTarget;

impl TraceTarget for FakeTarget {
    fn prompt_ids(&self, index: usize) -> Result<Vec<u32>> {
        Ok(vec![1, 10 + index as u32, 20 + index as u32])
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        match ids.iter().find(|&&i| i >= 1000) {
            Some(bad) => bail!("cannot decode token id {bad}: the tokenizer has 1000 ids"),
            None => Ok(ids.iter().map(|i| format!("t{i} ")).collect()),
        }
    }
    fn eos_ids(&self) -> Vec<u32> {
        vec![2]
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/traces")
        .join(name)
}

fn options(format: Format) -> ImportOptions {
    ImportOptions {
        format,
        file_name: "trace.jsonl".into(),
        file_sha256: "f".repeat(64),
        block_size: None,
        cut_at_eos: true,
        drafts_overcounted: false,
        run: NewRun {
            target_sha256: "t".repeat(64),
            prompt_set_name: "tiny".into(),
            prompt_set_sha256: "p".repeat(64),
            tokenizer_sha256: Some("k".repeat(64)),
            ..Default::default()
        },
    }
}

fn import_file(name: &str, format: Format) -> TraceRun {
    let records = read_trace(&fixture(name), format).unwrap();
    build_trace_run(&records, &set(), &FakeTarget, &options(format)).unwrap()
}

/// The error of importing `lines` written to a file called `bad.jsonl`.
fn import_error(lines: &[&str], format: Format, opts: impl FnOnce(&mut ImportOptions)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let mut o = options(format);
    opts(&mut o);
    let result =
        read_trace(&path, format).and_then(|r| build_trace_run(&r, &set(), &FakeTarget, &o));
    format!("{:#}", result.expect_err("the import must fail"))
}

fn rounds(run: &TraceRun) -> Vec<(String, Vec<u32>)> {
    run.requests
        .iter()
        .map(|r| (r.prompt_id.clone(), r.rounds.clone()))
        .collect()
}

fn effect(run: &TraceRun, c: Correction) -> Option<Effect> {
    run.report
        .corrections
        .iter()
        .find(|a| a.name == c.name())
        .map(|a| a.effect)
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-12)
}

#[test]
fn vllm_detailed_metrics_normalised() {
    let run = import_file("vllm.jsonl", Format::Vllm);
    // p0: accepted [3,0,2,1] + bonus = [4,1,3,2], 10 tokens after the prefill one: τ 2.5.
    // p1: accepted [3,3] → [4,4] = 8, but the output holds 6 after the prefill token (its EOS is
    //     the 2nd draft of step 2): the last round is trimmed to 2: [4,2], τ 3.
    // p2: accepted [1] → [2]; 4 tokens after the prefill one: 2 undrafted steps of 1: [2,1,1], τ 4/3.
    assert_eq!(
        rounds(&run),
        [
            ("p0".into(), vec![4, 1, 3, 2]),
            ("p1".into(), vec![4, 2]),
            ("p2".into(), vec![2, 1, 1])
        ]
    );
    let r = &run.report;
    assert_eq!(
        (r.block_size, r.requests, r.rounds, r.tokens),
        (4, 3, 9, 20)
    );
    assert!(close(r.tau_macro, (2.5 + 3.0 + 4.0 / 3.0) / 3.0));
    assert!(close(r.tau_pooled, 20.0 / 9.0));
    // vLLM's own: 1 + accepted / steps = 2.5, 4, 2.
    assert!(close(r.engine_tau_macro, (2.5 + 4.0 + 2.0) / 3.0));
    let e = |requests, rounds, tokens| {
        Some(Effect {
            requests,
            rounds,
            tokens,
        })
    };
    assert_eq!(effect(&run, Correction::BonusToken), e(3, 7, 7));
    assert_eq!(effect(&run, Correction::EosInAcceptedBlock), e(1, 1, 2));
    assert_eq!(effect(&run, Correction::UndraftedSteps), e(1, 2, 2));
    assert_eq!(effect(&run, Correction::PrefillToken), None);
    // p1's prompt came with a double BOS.
    assert_eq!(r.prompt_mismatches, 1);
    assert_eq!(
        r.prompt_mismatch_examples,
        ["vllm.jsonl:2: the engine's prompt ids differ from draftlens's (4 tokens against 3)"]
    );
    assert_eq!(r.round_order, RoundOrder::Decode);
    assert_eq!(
        run.origin,
        "trace:vllm:trace.jsonl (bonus-token, eos-in-accepted-block, undrafted-steps)"
    );
}

#[test]
fn sglang_histogram_normalised() {
    let run = import_file("sglang.jsonl", Format::Sglang);
    // p0: histogram [1,1,0,2] → rounds 1,2,4,4 = 11 tokens after the prefill one: τ 11/4.
    // p1: output [200,201,202,EOS,203..206]: cut after the EOS, 3 tokens after the prefill one;
    //     histogram [0,2,1] → 2,2,3: fitted 2,1 (the 3 dropped): τ 1.5.
    assert_eq!(
        rounds(&run),
        [("p0".into(), vec![1, 2, 4, 4]), ("p1".into(), vec![2, 1])]
    );
    assert_eq!(run.requests[1].token_ids, [200, 201, 202, 2]);
    let r = &run.report;
    assert_eq!(
        r.block_size_from,
        "the trace (spec_num_proposed_drafts / spec_verify_ct + 1)"
    );
    assert!(close(r.tau_macro, (2.75 + 1.5) / 2.0));
    assert!(close(r.tau_pooled, 14.0 / 6.0));
    // SGLang's own: completion_tokens / verify steps = 12/4 and 8/3.
    assert!(close(r.engine_tau_macro, (3.0 + 8.0 / 3.0) / 2.0));
    let e = |requests, rounds, tokens| {
        Some(Effect {
            requests,
            rounds,
            tokens,
        })
    };
    assert_eq!(effect(&run, Correction::PrefillToken), e(2, 0, 2));
    // 4 output tokens cut; one round trimmed and one dropped.
    assert_eq!(effect(&run, Correction::TokensAfterEos), e(1, 2, 4));
    assert_eq!(effect(&run, Correction::EosInAcceptedBlock), None);
    assert_eq!(r.round_order, RoundOrder::Histogram);
    assert_eq!(r.prompt_mismatches, 0);
}

#[test]
fn llamacpp_totals_normalised() {
    let run = import_file("llamacpp.jsonl", Format::Llamacpp);
    // p0: 12 tokens after the prefill one, 8 accepted drafts: 4 rounds, τ 3.
    // p2: nothing drafted (no draft fields): 5 rounds of one token, τ 1.
    assert_eq!(
        rounds(&run),
        [("p0".into(), vec![3, 3, 3, 3]), ("p2".into(), vec![1; 5])]
    );
    let r = &run.report;
    assert_eq!(r.block_size_from, "the trace (speculative.n_max + 1)");
    assert!(close(r.tau_macro, 2.0));
    assert!(close(r.tau_pooled, 17.0 / 9.0));
    assert_eq!(r.engine_tau_macro, None);
    assert_eq!(r.round_order, RoundOrder::Totals);
}

#[test]
fn neutral_jsonl_is_taken_as_given() {
    let run = import_file("neutral.jsonl", Format::Jsonl);
    // p0: [3,1,2] over 6 tokens: τ 2; p1: [4] over 4: τ 4.
    assert_eq!(
        rounds(&run),
        [("p0".into(), vec![3, 1, 2]), ("p1".into(), vec![4])]
    );
    assert!(close(run.report.tau_macro, 3.0));
    assert!(close(run.report.tau_pooled, 10.0 / 4.0));
    assert!(run.report.corrections.is_empty());
    assert_eq!(run.origin, "trace:jsonl:trace.jsonl");
}

#[test]
fn one_draft_too_many_is_corrected_only_when_asked() {
    // A fork that counts one draft token too many per step: rounds [4,2,3] for 6 tokens.
    let line = r#"{"prompt_id":"p0","token_ids":[100,101,102,103,104,105,106],"rounds":[4,2,3],"block_size":4}"#;
    let err = import_error(&[line], Format::Jsonl, |_| {});
    assert!(
        err.contains("bad.jsonl:1: the rounds commit 9 tokens but the output has 6"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    std::fs::write(&path, line).unwrap();
    let mut o = options(Format::Jsonl);
    o.drafts_overcounted = true;
    let run = build_trace_run(
        &read_trace(&path, Format::Jsonl).unwrap(),
        &set(),
        &FakeTarget,
        &o,
    )
    .unwrap();
    assert_eq!(run.requests[0].rounds, [3, 1, 2]);
    assert_eq!(
        effect(&run, Correction::OneDraftTooMany),
        Some(Effect {
            requests: 1,
            rounds: 3,
            tokens: 3
        })
    );
    // A round one over the block says so.
    let over =
        r#"{"prompt_id":"p0","token_ids":[100,101,102,103,104,105],"rounds":[5],"block_size":4}"#;
    let err = import_error(&[over], Format::Jsonl, |_| {});
    assert!(
        err.contains(
            "bad.jsonl:1: round 1 commits 5 tokens, more than a round of block size 4 can"
        ),
        "{err}"
    );
    assert!(err.contains("--drafts-overcounted"), "{err}");
}

#[test]
fn ignore_eos_keeps_the_tokens_after_one() {
    let records = read_trace(&fixture("sglang.jsonl"), Format::Sglang).unwrap();
    let mut o = options(Format::Sglang);
    o.cut_at_eos = false;
    let run = build_trace_run(&records, &set(), &FakeTarget, &o).unwrap();
    // p1 whole: 7 tokens after the prefill one in rounds 2,2,3.
    assert_eq!(run.requests[1].rounds, [2, 2, 3]);
    assert_eq!(effect(&run, Correction::TokensAfterEos), None);
}

#[test]
fn bad_inputs_are_one_error_naming_the_record() {
    let ok = r#"{"prompt_id":"p0","token_ids":[100,101,102],"rounds":[2],"block_size":4}"#;
    let cases: Vec<(Vec<&str>, Format, &str)> = vec![
        (
            vec![ok, r#"{"prompt_id":"nope","token_ids":[1,2],"rounds":[1]}"#],
            Format::Jsonl,
            "bad.jsonl:2: prompt \"nope\" is not in the prompt set \"tiny\" (3 prompts)",
        ),
        (
            vec![ok, r#"{"prompt_id":"p1","token_ids":[100,5000,7],"rounds":[2]}"#],
            Format::Jsonl,
            "bad.jsonl:2: the generated token ids do not decode with the target's tokenizer: cannot decode token id 5000",
        ),
        (vec![ok, ok], Format::Jsonl, "bad.jsonl:2: a second record for prompt \"p0\" (the first is bad.jsonl:1)"),
        (
            vec![ok, r#"{"prompt_id":"p1","token_ids":[100,101,102],"rounds":[2],"block_size":8}"#],
            Format::Jsonl,
            "bad.jsonl:2: block size 8 (γ = 7), but bad.jsonl:1 says 4",
        ),
        (
            vec![r#"{"prompt_id":"p0","token_ids":[100,101,102],"rounds":[1]}"#],
            Format::Jsonl,
            "does not say how many tokens a round drafts (block_size); pass --block-size",
        ),
        (
            vec![r#"{"prompt_id":"p0","token_ids":[100,101,102],"rounds":[1,0,1],"block_size":4}"#],
            Format::Jsonl,
            "bad.jsonl:1: round 2 commits no token",
        ),
        (vec!["{not json"], Format::Jsonl, "bad.jsonl:1: not JSON"),
        (vec![r#"{"token_ids":[1],"rounds":[]}"#], Format::Jsonl, "bad.jsonl:1: no prompt_id"),
        (
            vec![r#"{"prompt_id":"p0","choices":[{"index":0,"text":"x"}],"metrics":null}"#],
            Format::Vllm,
            "bad.jsonl:1: no choices[0].token_ids: send the request with \"return_token_ids\": true",
        ),
        (
            vec![r#"{"prompt_id":"p0","choices":[{"token_ids":[5,6]}],"metrics":{"speculative_decoding":{"num_spec_tokens":3}}}"#],
            Format::Vllm,
            "--per-request-spec-decode-metrics detailed",
        ),
        (
            // 4 steps accepted 3 of 3 drafts: 16 tokens claimed for 5 generated.
            vec![r#"{"prompt_id":"p0","choices":[{"token_ids":[5,6,7,8,9]}],"metrics":{"speculative_decoding":{"num_spec_tokens":2,"per_step_accepted":[3]}}}"#],
            Format::Vllm,
            "bad.jsonl:1: round 1 commits 4 tokens, more than a round of block size 3 can (2 drafts and the bonus token)",
        ),
        (
            vec![r#"{"prompt_id":"p0","output_ids":[5,6,7],"meta_info":{"completion_tokens":3,"spec_verify_ct":2}}"#],
            Format::Sglang,
            "bad.jsonl:1: no meta_info.spec_correct_drafts_histogram: send the request with \"return_spec_tokens_details\": true",
        ),
        (
            vec![r#"{"prompt_id":"p0","output_ids":[5,6,7],"meta_info":{"completion_tokens":3,"spec_verify_ct":3,"spec_correct_drafts_histogram":[2]}}"#],
            Format::Sglang,
            "bad.jsonl:1: the histogram counts 2 steps but meta_info.spec_verify_ct is 3",
        ),
        (
            vec![r#"{"prompt_id":"p0","tokens":[5,6,7],"tokens_predicted":3,"timings":{"draft_n":4,"draft_n_accepted":2},"generation_settings":{"speculative.n_max":3}}"#],
            Format::Llamacpp,
            "bad.jsonl:1: 2 accepted drafts but 2 tokens after the prefill token",
        ),
        (
            vec![r#"{"prompt_id":"p0","tokens":[],"tokens_predicted":3,"timings":{}}"#],
            Format::Llamacpp,
            "bad.jsonl:1: tokens is empty but 3 tokens were predicted",
        ),
    ];
    for (lines, format, want) in cases {
        let err = import_error(&lines, format, |_| {});
        assert!(
            err.contains(want),
            "{format} {lines:?}:\n  got  {err}\n  want {want}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    let err = import_error(&[ok], Format::Jsonl, |o| o.block_size = Some(8));
    assert!(
        err.contains("bad.jsonl:1: the record says block size 4 (γ = 3) but --block-size is 8"),
        "{err}"
    );
}

#[test]
fn stored_run_reads_back_with_the_hand_computed_tau() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("runs.sqlite")).unwrap();
    let run = import_file("vllm.jsonl", Format::Vllm);
    let (id, new) = run.store(&store).unwrap();
    assert!(new);
    let info = store.run(id).unwrap().unwrap().run;
    assert_eq!(info.status, crate::store::RunStatus::Complete);
    assert_eq!(info.origin, run.origin);
    assert_eq!(
        (info.block_size, info.num_prompts, info.num_blocks),
        (4, 3, 0)
    );
    assert_eq!(info.backend, "vllm");
    assert_eq!(
        info.config["trace"]["corrections"][1]["name"],
        "eos-in-accepted-block"
    );
    let metric = |name: &str, scope: MetricScope| {
        store
            .metrics(id)
            .unwrap()
            .into_iter()
            .find(|m| m.source == SOURCE && m.name == name && m.scope == scope)
            .map(|m| (m.value, m.count))
    };
    // Hand-computed in `vllm_detailed_metrics_normalised`.
    let (macro_tau, n) = metric("tau_replayed_macro", MetricScope::Run).unwrap();
    assert!((macro_tau - (2.5 + 3.0 + 4.0 / 3.0) / 3.0).abs() < 1e-12);
    assert_eq!(n, 3);
    assert_eq!(
        metric("tau_replayed_pooled", MetricScope::Run),
        Some((20.0 / 9.0, 9))
    );
    assert_eq!(
        metric("tau_replayed", MetricScope::Prompt(1)),
        Some((3.0, 2))
    );
    // Numbers a trace does not have are not stored.
    assert_eq!(metric("tau_uniform", MetricScope::Run), None);
    // The prompts: draftlens's prompt tokens, then the engine's continuation (p1's cut at nothing).
    let prompts = store.prompts(id).unwrap();
    assert_eq!(
        prompts[1].token_ids,
        [1, 11, 21, 200, 201, 202, 203, 204, 205, 2]
    );
    assert_eq!(
        (prompts[1].prompt_len, prompts[1].sha256.as_str()),
        (3, "sha-p1")
    );
    // The statistics the web folds: the same τ through the shared definitions.
    let d = store.derived(id, STATS_KIND).unwrap().unwrap();
    let stats: RunStats = serde_json::from_slice(&d.data).unwrap();
    let all: Vec<_> = stats.evaluated().collect();
    assert_eq!(all.len(), 3);
    let agg = |name| crate::metrics::aggregate(crate::metrics::derived(name), &all);
    assert_eq!(agg("tau_replayed_macro"), Some(macro_tau));
    assert_eq!(agg("tau_replayed_pooled"), Some(20.0 / 9.0));
    assert_eq!(agg("tau_uniform"), None);
    assert_eq!(stats.prompts[1].rounds, [3, 1]);
    // Importing the same trace again changes nothing.
    assert_eq!(run.store(&store).unwrap(), (id, false));
    assert_eq!(store.run_eval(id).unwrap().unwrap().identity[..32], run.uid);
}

#[test]
fn a_failed_write_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("runs.sqlite")).unwrap();
    let mut run = import_file("neutral.jsonl", Format::Jsonl);
    // The second derived row of the same kind fails the insert after the run, its prompts and
    // metrics were written in the transaction.
    run.derived.push(run.derived[0].clone());
    assert!(run.store(&store).is_err());
    let (runs, total) = store.runs(&Default::default()).unwrap();
    assert_eq!((runs.len(), total), (0, 0));
}
