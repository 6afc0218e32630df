//! `live`'s report of divergences from plain greedy decoding: its text, its `--json` rows and
//! its exit status with and without `--strict`.

use super::*;

fn row(id: &str, divergence: Option<LiveDivergence>) -> LiveRow {
    LiveRow {
        id: id.into(),
        tau: 2.0,
        rounds: 4,
        new_tokens: 8,
        lossless: Some(divergence.is_none()),
        text: "out".into(),
        divergence,
        timing: None,
    }
}

fn report(rows: Vec<LiveRow>) -> LiveReport {
    LiveReport {
        rows,
        block_size: 16,
        backend: "cuda",
        dtype: "bf16",
        sampling: None,
        speed: None,
    }
}

fn diverged_at(position: usize) -> LiveDivergence {
    LiveDivergence {
        position,
        live_token: Some(11),
        live_text: Some(" a\n".into()),
        greedy_token: Some(22),
        greedy_text: Some(" b".into()),
        logit_margin: Some(-0.0123),
    }
}

#[test]
fn a_lossless_report_prints_as_before_and_succeeds_even_when_strict() {
    let r = report(vec![row("p1", None), row("p2", None)]);
    assert_eq!(
        r.render(),
        "p1                       τ 2.000  4 rounds  8 tokens  lossless\n\
         p2                       τ 2.000  4 rounds  8 tokens  lossless\n\
         live τ (macro over 2 prompts): 2.000\n"
    );
    assert!(r.divergence_summary().is_none());
    r.verdict(false).unwrap();
    r.verdict(true).unwrap();
    let v = serde_json::to_value(&r.rows).unwrap();
    assert!(v[0]["divergence"].is_null(), "{v}");
    assert_eq!(v[0]["lossless"], true);
}

#[test]
fn a_divergence_is_data_and_fails_the_command_only_when_strict() {
    let r = report(vec![row("p1", None), row("p2", Some(diverged_at(5)))]);
    let text = r.render();
    assert!(
        text.contains(
            "p2                       τ 2.000  4 rounds  8 tokens  diverges from greedy at token 5: \
             live 11 \" a\\n\" vs greedy 22 \" b\", logit margin -0.0123\n"
        ),
        "{text}"
    );
    // τ and the macro line are kept; one summary line says how many and why.
    assert!(
        text.contains("live τ (macro over 2 prompts): 2.000\n"),
        "{text}"
    );
    let summary = r.divergence_summary().unwrap();
    assert!(!summary.contains('\n'));
    assert!(text.ends_with(&format!("{summary}\n")), "{text}");
    for want in [
        "1 of 2 prompts diverged",
        "cuda (bf16)",
        "verify pass over 16 tokens",
        "f32 CPU backend",
    ] {
        assert!(summary.contains(want), "{want}: {summary}");
    }
    r.verdict(false).unwrap();
    let e = r.verdict(true).unwrap_err().to_string();
    assert_eq!(
        e,
        "--strict: 1 of 2 prompts diverged from plain greedy decoding"
    );

    let v = serde_json::to_value(&r.rows).unwrap();
    assert_eq!(v[1]["lossless"], false);
    assert_eq!(v[1]["tau"], 2.0);
    assert_eq!(v[1]["text"], "out");
    let d = &v[1]["divergence"];
    assert_eq!(d["position"], 5);
    assert_eq!(d["live_token"], 11);
    assert_eq!(d["live_text"], " a\n");
    assert_eq!(d["greedy_token"], 22);
    assert_eq!(d["greedy_text"], " b");
    assert!((d["logit_margin"].as_f64().unwrap() + 0.0123).abs() < 1e-6);
}

#[test]
fn an_output_that_ended_first_says_so() {
    let d = LiveDivergence {
        position: 7,
        live_token: Some(3),
        live_text: Some("x".into()),
        greedy_token: None,
        greedy_text: None,
        logit_margin: None,
    };
    assert_eq!(
        render_divergence(&d),
        "diverges from greedy at token 7: live 3 \"x\" vs greedy (output ended)"
    );
}
