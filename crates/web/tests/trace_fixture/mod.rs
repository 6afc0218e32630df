//! A database with a serving engine's trace run diffed against its reference drafter, built
//! without the engine (tests/trace_diff.rs, tests/browser_trace_diff.rs): 24 prompts imported
//! through `trace import`'s own code (the neutral JSONL, with one output cut at its
//! end-of-generation token), a reference drafter's records on the engine's tokens, compared by
//! `trace diff`'s own `diff_prompt` and stored, and a draftlens run of the same drafter weights
//! to compare the trace run with.
//!
//! What the engine and the reference do is chosen so every number has an independent answer:
//! the reference accepts 3 drafts (B = 4) everywhere except at anchor prompt + 4 of every prompt
//! i ≡ 3 (mod 6), where it accepts 1; the engine commits full rounds except round 1 of every
//! even prompt (1 token) and round 3 of every prompt i ≡ 0 (mod 4) (2 tokens). The target's
//! greedy token is the engine's everywhere but at prompt 0's anchor + 2 of its round 1 (998).
#![allow(dead_code)]

use draftlens_records::{RecordBatch, Region};
use draftlens_results::metrics::{summarize, PromptInfo};
use draftlens_results::store::{NewRun, NewTraceDiff, RunPrompt, RunStatus, Store};
use draftlens_results::trace::diff::{diff_prompt, ReplayedPrompt, LISTED};
use draftlens_results::trace::{
    build_trace_run, read_trace, Format, ImportOptions, SetPrompt, TraceTarget,
};
use std::path::Path;

pub const PROMPTS: u32 = 24;
pub const BLOCK: u32 = 4;
pub const PROMPT_LEN: u32 = 3;
pub const EOS: u32 = 2;
/// The prompt whose output runs past its end-of-generation token (`tokens-after-eos`).
pub const CUT: u32 = 23;
pub const DRAFTER_SHA: &str = "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";
pub const TOKENIZER_SHA: &str = "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk";

/// Token id i reads "w{i} ".
pub fn piece(id: u32) -> String {
    format!("w{id} ")
}

/// A tokenizer of 1000 ids: prompt i is [1, 10 + i, 20 + i].
struct FakeTarget;

impl TraceTarget for FakeTarget {
    fn prompt_ids(&self, index: usize) -> anyhow::Result<Vec<u32>> {
        Ok(vec![1, 10 + index as u32, 20 + index as u32])
    }
    fn decode(&self, ids: &[u32]) -> anyhow::Result<String> {
        Ok(ids.iter().map(|&i| piece(i)).collect())
    }
    fn eos_ids(&self) -> Vec<u32> {
        vec![EOS]
    }
}

/// Drafts the reference accepts at anchor `a` of prompt `i`.
pub fn reference_accepts(i: u32, a: u32) -> u32 {
    if i % 6 == 3 && a == PROMPT_LEN + 4 {
        1
    } else {
        BLOCK - 1
    }
}

/// One prompt as stored: prompt + the engine's output (cut at its end), the engine's rounds
/// (normalised by the import) and the target's greedy tokens on those tokens.
#[derive(Clone, Debug)]
pub struct FixturePrompt {
    pub index: u32,
    pub id: String,
    pub ids: Vec<u32>,
    pub rounds: Vec<u32>,
    pub greedy: Vec<u32>,
}

/// A round that differs, worked out from the rules above (not by `diff_prompt`).
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedRound {
    pub round: usize,
    pub anchor: u32,
    pub engine: u32,
    pub reference: u32,
    pub engine_ids: Vec<u32>,
    pub reference_ids: Vec<u32>,
}

impl FixturePrompt {
    fn end(&self) -> u32 {
        self.ids.len() as u32 - 1
    }
    /// What the reference commits at anchor `a`: min(A + 1, end − a).
    pub fn reference_at(&self, a: u32) -> u32 {
        (reference_accepts(self.index, a) + 1).min(self.end() - a)
    }
    /// The first [`LISTED`] rounds where the engine and the reference differ.
    pub fn expected_rounds(&self) -> Vec<ExpectedRound> {
        let mut out = Vec::new();
        let mut a = PROMPT_LEN;
        for (round, &c) in self.rounds.iter().enumerate() {
            let r = self.reference_at(a);
            if r != c && out.len() < LISTED {
                let from = a as usize + 1;
                out.push(ExpectedRound {
                    round,
                    anchor: a,
                    engine: c,
                    reference: r,
                    engine_ids: self.ids[from..from + c as usize].to_vec(),
                    reference_ids: self.greedy[from..from + r as usize].to_vec(),
                });
            }
            a += c;
        }
        out
    }
    /// The reference's own replayed chain: (tokens, rounds).
    pub fn reference_chain(&self) -> (u64, u64) {
        let (mut a, mut tokens, mut rounds) = (PROMPT_LEN, 0u64, 0u64);
        while a < self.end() {
            let c = self.reference_at(a);
            tokens += c as u64;
            rounds += 1;
            a += c;
        }
        (tokens, rounds)
    }
    /// Σ (reference − engine tokens) over the engine's anchors.
    pub fn tokens_lost(&self) -> i64 {
        let mut a = PROMPT_LEN;
        let mut lost = 0i64;
        for &c in &self.rounds {
            lost += self.reference_at(a) as i64 - c as i64;
            a += c;
        }
        lost
    }
}

pub struct Fixture {
    pub trace_run: i64,
    pub trace_uid: String,
    pub reference_run: i64,
    pub diff: i64,
    pub prompts: Vec<FixturePrompt>,
}

/// The engine's output of prompt i (the prefill token first) and its rounds, before the import.
fn engine_output(i: u32) -> (Vec<u32>, Vec<u32>) {
    let len = 13 + i % 5;
    let mut out: Vec<u32> = (0..len).map(|t| 100 + (i * 13 + t * 7) % 800).collect();
    if i == CUT {
        out.extend([EOS, 55]);
    }
    let mut remaining = out.len() as u32 - 1;
    let mut rounds = Vec::new();
    while remaining > 0 {
        let r = rounds.len();
        let c = if r == 1 && i % 2 == 0 {
            1
        } else if r == 3 && i % 4 == 0 {
            2
        } else {
            BLOCK.min(remaining)
        };
        rounds.push(c);
        remaining -= c;
    }
    (out, rounds)
}

/// The reference drafter's records at every completion anchor of `p` (B = 4, K = 1).
fn reference_records(p: &FixturePrompt, into: &mut RecordBatch) {
    let n = p.ids.len() as u32;
    for a in PROMPT_LEN..n - 1 {
        into.prompt_index.push(p.index);
        into.anchor.push(a);
        into.region.push(Region::Completion as u8);
        let accepts = reference_accepts(p.index, a);
        for k in 1..BLOCK {
            let valid = a + k < n;
            let label = if valid { p.greedy[(a + k) as usize] } else { 0 };
            into.target.push(label);
            into.valid.push(valid as u8);
            into.loss_mask.push(valid as u8);
            into.draft_ids.push(if k <= accepts { label } else { 7 });
            into.draft_logprobs.push(-0.1);
        }
    }
}

pub fn build(store: &Store, dir: &Path) -> Fixture {
    store
        .put_vocab(
            TOKENIZER_SHA,
            "fake",
            &(0..1000).map(piece).collect::<Vec<_>>(),
        )
        .unwrap();
    let set: Vec<SetPrompt> = (0..PROMPTS)
        .map(|i| SetPrompt {
            id: format!("q{i}"),
            sha256: format!("{i:064x}"),
            category: None,
        })
        .collect();
    let lines: Vec<String> = (0..PROMPTS)
        .map(|i| {
            let (out, rounds) = engine_output(i);
            serde_json::json!({"prompt_id": format!("q{i}"), "token_ids": out, "rounds": rounds, "block_size": BLOCK})
                .to_string()
        })
        .collect();
    let file = dir.join("engine.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let records = read_trace(&file, Format::Jsonl).unwrap();
    let built = build_trace_run(
        &records,
        &set,
        &FakeTarget,
        &ImportOptions {
            format: Format::Jsonl,
            file_name: "engine.jsonl".into(),
            file_sha256: "f".repeat(64),
            block_size: None,
            cut_at_eos: true,
            drafts_overcounted: false,
            run: NewRun {
                name: "engine trace".into(),
                target_path: "models/fake".into(),
                target_sha256: "t".repeat(64),
                drafter_path: "engine's dflash".into(),
                prompt_set_name: "tiny".into(),
                prompt_set_sha256: "s".repeat(64),
                tokenizer_sha256: Some(TOKENIZER_SHA.into()),
                ..Default::default()
            },
        },
    )
    .unwrap();
    let (trace_run, _) = built.store(store).unwrap();

    // The stored prompts with the import's (normalised) rounds.
    let prompts: Vec<FixturePrompt> = store
        .prompts(trace_run)
        .unwrap()
        .into_iter()
        .map(|p| {
            let request = built.requests.iter().find(|r| r.prompt_id == p.id).unwrap();
            let mut greedy = p.token_ids.clone();
            if p.index == 0 {
                // Round 0 commits 4 tokens: round 1 is at the prompt length + 4.
                greedy[(PROMPT_LEN + 4 + 2) as usize] = 998;
            }
            FixturePrompt {
                index: p.index,
                id: p.id,
                ids: p.token_ids,
                rounds: request.rounds.clone(),
                greedy,
            }
        })
        .collect();
    let mut batch = RecordBatch::new(BLOCK, 1);
    for p in &prompts {
        reference_records(p, &mut batch);
    }
    batch.check().unwrap();
    let diffs: Vec<_> = prompts
        .iter()
        .map(|p| {
            diff_prompt(&ReplayedPrompt {
                index: p.index,
                id: &p.id,
                prompt_len: PROMPT_LEN as usize,
                ids: &p.ids,
                engine_rounds: &p.rounds,
                records: &batch,
                target_greedy: &p.greedy,
            })
            .unwrap()
        })
        .collect();
    let diff = store
        .put_trace_diff(
            trace_run,
            &NewTraceDiff {
                drafter_path: "ckpts/reference/step-9",
                drafter_sha256: DRAFTER_SHA,
                target_path: "models/fake",
                backend: "cpu",
                prompts: &diffs,
            },
        )
        .unwrap();

    // draftlens's own run of the same drafter weights on the same prompts.
    let reference_run = store
        .create_run(&NewRun {
            name: "reference drafter".into(),
            target_sha256: "t".repeat(64),
            drafter_path: "ckpts/reference/step-9".into(),
            drafter_sha256: DRAFTER_SHA.into(),
            prompt_set_name: "tiny".into(),
            prompt_set_sha256: "s".repeat(64),
            tokenizer_sha256: Some(TOKENIZER_SHA.into()),
            backend: "cpu".into(),
            dtype: "f32".into(),
            block_size: BLOCK,
            top_k: 1,
            ..Default::default()
        })
        .unwrap();
    let rows: Vec<RunPrompt> = prompts
        .iter()
        .map(|p| RunPrompt {
            index: p.index,
            id: p.id.clone(),
            sha256: format!("{:064x}", p.index),
            category: None,
            prompt_len: PROMPT_LEN,
            token_ids: p.ids.clone(),
            text: FakeTarget.decode(&p.ids).unwrap(),
        })
        .collect();
    store.add_prompts(reference_run, &rows).unwrap();
    store.add_records(reference_run, &batch).unwrap();
    let infos: Vec<PromptInfo> = prompts
        .iter()
        .map(|p| PromptInfo {
            index: p.index,
            prompt_len: PROMPT_LEN as usize,
            seq_len: p.ids.len(),
            category: None,
        })
        .collect();
    store
        .add_metrics(reference_run, &summarize(&batch, &infos))
        .unwrap();
    store
        .finish_run(
            reference_run,
            RunStatus::Complete,
            None,
            &serde_json::json!({}),
        )
        .unwrap();
    Fixture {
        trace_run,
        trace_uid: built.uid.clone(),
        reference_run,
        diff,
        prompts,
    }
}
