//! The native metric rows `draftlens run` stores, pinned: `summarize` on synthetic batches must give
//! exactly the rows in `summarize_pinned.txt` (same order, names, scopes, units, descriptions,
//! directions, counts, series, and every value to the last bit: the file holds each value's bits).
//! The batches cover several prompts and categories, prompt-region anchors, sequences ending in
//! the middle of a block, a prompt with no records, a prompt whose continuation is one token, a
//! chain that lands on an anchor that was not evaluated, records of a prompt the prompt list
//! lacks, prompts listed out of index order and non-round log-probabilities.
//!
//! The file was written by the `summarize` of before the metrics became folds of per-prompt
//! statistics; a change to a stored metric has to change it on purpose. To rewrite it after such
//! a change: `DRAFTLENS_BLESS=1 cargo test -p draftlens-results --test summarize_pinned`.

use draftlens_records::{RecordBatch, Region};
use draftlens_results::metrics::{summarize, PromptInfo};
use draftlens_results::store::MetricRow;
use std::fmt::Write;

/// A small deterministic generator (64-bit LCG, high bits).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    /// True with probability `pct` / 100.
    fn chance(&mut self, pct: u32) -> bool {
        self.next() % 100 < pct
    }
}

/// One prompt of a synthetic run.
struct Spec {
    index: u32,
    prompt_len: u32,
    /// Tokens of prompt + continuation (T).
    len: u32,
    category: Option<&'static str>,
    /// Also store prompt-region anchors from prompt_len / 2 on.
    prompt_anchors: bool,
    /// Anchors not evaluated (a chain landing on one cannot be replayed).
    skipped: std::ops::Range<u32>,
    /// Store the anchor T−1 too (no valid position), as the demo generator does.
    last_anchor: bool,
    /// Percent chance that the drafter's top-1 is right at a position.
    skill: u32,
    /// Listed in the prompt list given to `summarize` (false: records without a prompt row).
    listed: bool,
}

fn spec(index: u32, prompt_len: u32, len: u32, category: Option<&'static str>, skill: u32) -> Spec {
    Spec {
        index,
        prompt_len,
        len,
        category,
        prompt_anchors: false,
        skipped: 0..0,
        last_anchor: false,
        skill,
        listed: true,
    }
}

fn tok(p: u32, pos: u32) -> u32 {
    1000 * (p + 1) + pos
}

/// Records as the drafter evaluation stores them (region and loss mask by the prompt length),
/// with a drafter that is right at each position with the prompt's skill, and the prompt list
/// in the order of `specs`.
fn build(b: u32, k: u32, specs: &[Spec], seed: u64) -> (RecordBatch, Vec<PromptInfo>) {
    let mut rng = Lcg(seed);
    let mut r = RecordBatch::new(b, k);
    for s in specs {
        let first = if s.prompt_anchors {
            s.prompt_len / 2
        } else {
            s.prompt_len
        };
        let last = if s.last_anchor {
            s.len
        } else {
            s.len.saturating_sub(1)
        };
        for a in first..last {
            if s.skipped.contains(&a) {
                continue;
            }
            r.prompt_index.push(s.index);
            r.anchor.push(a);
            r.region.push(if a >= s.prompt_len {
                Region::Completion as u8
            } else {
                Region::Prompt as u8
            });
            for kk in 1..b {
                let pos = a + kk;
                let valid = pos < s.len;
                let target = if valid { tok(s.index, pos) } else { 0 };
                r.target.push(target);
                r.valid.push(valid as u8);
                r.loss_mask.push((valid && pos >= s.prompt_len) as u8);
                let right = rng.chance(s.skill);
                for c in 0..k {
                    let id = match (c, right) {
                        (0, true) => target,
                        // The target often among the other candidates (top-K accuracy).
                        (1, false) if rng.chance(50) => target,
                        _ => 7 + c + 10 * (rng.next() % 5),
                    };
                    r.draft_ids.push(id);
                    // Non-round log-probabilities, best first, so the NLL's summation order shows.
                    let lp = -((rng.next() % 10_007) as f32) / 1_237.0 - 0.013 - c as f32;
                    r.draft_logprobs.push(lp);
                }
            }
        }
    }
    r.check().expect("synthetic records are well-formed");
    let infos = specs
        .iter()
        .filter(|s| s.listed)
        .map(|s| PromptInfo {
            index: s.index,
            prompt_len: s.prompt_len as usize,
            seq_len: s.len as usize,
            category: s.category.map(String::from),
        })
        .collect();
    (r, infos)
}

/// The synthetic runs: (label, records, prompt list).
fn cases() -> Vec<(String, RecordBatch, Vec<PromptInfo>)> {
    let mut out = Vec::new();
    for (b, k) in [(2u32, 1u32), (4, 3), (5, 2), (8, 4)] {
        let mut specs = vec![
            Spec {
                prompt_anchors: true,
                ..spec(0, 6, 31, Some("code"), 80)
            },
            spec(1, 4, 23, Some("chat"), 55),
            // Continuation of one token: only the anchor T−1 (no valid position), no round.
            Spec {
                last_anchor: true,
                ..spec(2, 9, 10, Some("chat"), 70)
            },
            spec(3, 5, 5, Some("code"), 60), // no records at all
            // More skipped anchors in a row than a round can step over: the chain lands on one.
            Spec {
                skipped: 12..21,
                ..spec(4, 7, 40, None, 65)
            },
            Spec {
                last_anchor: true,
                prompt_anchors: true,
                ..spec(5, 3, 19, Some("math"), 95)
            },
            spec(6, 8, 8 + 3 * b + 1, Some("math"), 100), // accepts everything: last rounds cut
            spec(7, 2, 17, None, 0),
            Spec {
                listed: false,
                ..spec(9, 4, 21, Some("code"), 50)
            },
        ];
        for s in specs
            .iter_mut()
            .filter(|s| [0, 1, 4, 5, 7, 9].contains(&s.index))
        {
            // Sequences end at every offset inside a block across prompts.
            s.len += (s.index * 7 + b) % b;
        }
        let (batch, infos) = build(b, k, &specs, 17 + b as u64);
        out.push((format!("B={b} K={k}"), batch, infos));
    }
    // Prompt list out of index order (rows and sums follow the list's order).
    let specs = [
        spec(2, 5, 29, Some("b"), 60),
        spec(0, 3, 26, Some("a"), 75),
        spec(1, 4, 33, Some("b"), 45),
    ];
    let (batch, infos) = build(4, 2, &specs, 5);
    out.push(("prompt list out of order".into(), batch, infos));
    // Only prompt-region anchors: no completion statistic, only the loss-mask accuracy.
    let specs = [Spec {
        prompt_anchors: true,
        ..spec(0, 6, 11, Some("a"), 50)
    }];
    let (batch, infos) = build(3, 2, &specs, 9);
    let prompt_region: Vec<usize> = (0..batch.num_blocks())
        .filter(|&i| batch.region[i] == Region::Prompt as u8)
        .collect();
    out.push((
        "prompt anchors only".into(),
        batch.select(&prompt_region),
        infos,
    ));
    // A run with prompts and no records: no rows.
    let (_, infos) = build(4, 2, &[spec(0, 3, 12, None, 50)], 1);
    out.push(("no records".into(), RecordBatch::new(4, 2), infos));
    out
}

/// One line per row: every field, the value as its bits and (for reading) its decimal form.
fn render(rows: &[MetricRow]) -> String {
    let mut s = String::new();
    for r in rows {
        writeln!(
            s,
            "{} {} {} {:016x} {} count={} hib={} unit={:?} desc={:?} series={}",
            r.source,
            r.name,
            r.scope,
            r.value.to_bits(),
            r.value,
            r.count,
            r.higher_is_better,
            r.unit,
            r.description,
            serde_json::to_string(&r.series).unwrap(),
        )
        .unwrap();
    }
    s
}

fn rendered_cases() -> String {
    let mut s = String::new();
    for (label, batch, infos) in cases() {
        writeln!(s, "## {label}").unwrap();
        s.push_str(&render(&summarize(&batch, &infos)));
    }
    s
}

#[test]
fn summarize_gives_the_pinned_rows() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/summarize_pinned.txt");
    let got = rendered_cases();
    if std::env::var_os("DRAFTLENS_BLESS").is_some() {
        std::fs::write(path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "line {} of {path}", i + 1);
    }
    assert_eq!(got.lines().count(), want.lines().count(), "rows in {path}");
}

/// The cases exercise what they claim to (so the pinned file cannot silently lose coverage).
#[test]
fn the_cases_cover_what_the_pinned_file_claims() {
    let all = rendered_cases();
    for needle in [
        "tau_replayed prompt:",
        "tau_replayed_macro category:",
        "tau_replayed_pooled run ",
        "acc_flat_masked",
        "draft_nll",
        "survival",
        "cond_accept",
        "accept_hist",
        "acc_top1",
        "tau_uniform prompt:9 ",
    ] {
        assert!(all.contains(needle), "no row matches {needle}");
    }
    // In the four runs of nine prompts, prompt 4's chain lands on a skipped anchor, prompt 2
    // has no round, prompt 3 no records, prompt 9 no prompt row: none has a replayed τ.
    let nine = all.split("## prompt list out of order").next().unwrap();
    for p in [2, 3, 4, 9] {
        assert!(
            !nine.contains(&format!("tau_replayed prompt:{p} ")),
            "prompt {p}"
        );
    }
    let (_, batch, _) = &cases()[1];
    assert!(batch.region.contains(&(Region::Prompt as u8)));
    // Per-prompt rows follow the prompt list (2, 0, 1), not the prompt index.
    let unordered = all.split("## prompt list out of order").nth(1).unwrap();
    let at = |p: u32| {
        unordered
            .find(&format!("tau_replayed prompt:{p} "))
            .unwrap()
    };
    assert!(at(2) < at(0) && at(0) < at(1));
}
