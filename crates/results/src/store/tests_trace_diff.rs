//! Stored trace diffs (schema v7): written and read back unchanged, replaced per drafter,
//! deleted with their run, every bad diff refused with nothing written, and a v6 database
//! migrated.

use super::*;
use crate::trace::diff::{Departure, PromptDiff, RoundDiff};

fn tmp() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("runs.sqlite");
    (d, p)
}

/// A finished run with prompts p0, p1, p2 (indexes 0..3) and the given origin.
fn finished_run(s: &Store, uid: &str, origin: &str) -> i64 {
    let prompts: Vec<RunPrompt> = (0..3u32)
        .map(|i| RunPrompt {
            index: i,
            id: format!("p{i}"),
            sha256: format!("{uid}{i}"),
            category: None,
            prompt_len: 2,
            token_ids: (0..12).map(|t| 100 + t).collect(),
            text: format!("prompt {i}"),
        })
        .collect();
    let run = NewRun {
        name: uid.into(),
        block_size: 4,
        top_k: 1,
        ..NewRun::default()
    };
    s.insert_finished_run(&FinishedRun {
        run: &run,
        uid,
        origin,
        eval: &RunEval {
            identity: "i".repeat(64),
            identity_json: serde_json::json!({}),
            shard: None,
            set_prompts: 3,
            run_prompts: 3,
            merged_from: None,
        },
        prompts: &prompts,
        records: &RecordBatch::new(4, 1),
        metrics: &[],
        timings: &serde_json::json!({}),
    })
    .unwrap()
    .0
}

fn prompt(index: u32, fewer_at: &[usize]) -> PromptDiff {
    PromptDiff {
        index,
        id: format!("p{index}"),
        rounds: 5,
        engine_tokens: 9,
        reference_tokens: 9 + 2 * fewer_at.len() as u64,
        rounds_fewer: fewer_at.len() as u64,
        rounds_more: 0,
        first_rounds: fewer_at
            .iter()
            .map(|&round| RoundDiff {
                round,
                anchor: 2 + round as u32,
                engine: 1,
                reference: 3,
                reference_ids: vec![7, 8, 9 + round as u32],
            })
            .collect(),
        reference_chain: (9, 3),
        departures: 3,
        first_departures: vec![Departure {
            position: 4,
            engine_token: 104,
            target_token: 55,
        }],
    }
}

fn new_diff<'a>(sha: &'a str, prompts: &'a [PromptDiff]) -> NewTraceDiff<'a> {
    NewTraceDiff {
        drafter_path: "ckpts/ref/step-9",
        drafter_sha256: sha,
        target_path: "models/t",
        backend: "cpu",
        prompts,
    }
}

#[test]
fn a_diff_reads_back_as_written_and_a_second_diff_against_the_same_drafter_replaces_it() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let run = finished_run(&s, "r1", "trace:jsonl:t.jsonl");
    // Written out of prompt order: read back in prompt order, rounds in decode order.
    let prompts = vec![prompt(2, &[0, 3]), prompt(0, &[1]), prompt(1, &[])];
    let id = s.put_trace_diff(run, &new_diff("a", &prompts)).unwrap();
    let (info, back) = s.trace_diff(id).unwrap().unwrap();
    assert_eq!(
        (
            info.run_id,
            info.drafter_path.as_str(),
            info.drafter_sha256.as_str()
        ),
        (run, "ckpts/ref/step-9", "a")
    );
    let mut sorted = prompts.clone();
    sorted.sort_by_key(|p| p.index);
    assert_eq!(back, sorted);

    let other = s
        .put_trace_diff(run, &new_diff("b", &prompts[..1]))
        .unwrap();
    let again = s
        .put_trace_diff(run, &new_diff("a", &prompts[1..]))
        .unwrap();
    assert!(s.trace_diff(id).unwrap().is_none(), "replaced");
    let listed: Vec<i64> = s.trace_diffs(run).unwrap().iter().map(|d| d.id).collect();
    assert_eq!(listed, [again, other], "newest first, one per drafter");
    assert_eq!(s.trace_diff(again).unwrap().unwrap().1.len(), 2);
    // The newest row replaced: its id is not reused (a link or a cache keyed by it would
    // otherwise name the new diff).
    let third = s
        .put_trace_diff(run, &new_diff("a", &prompts[1..]))
        .unwrap();
    assert_ne!(third, again);

    // Deleting the run deletes its diffs, their prompts and rounds.
    s.delete_run(run).unwrap();
    assert!(s.trace_diffs(run).unwrap().is_empty());
    let left: i64 = s
        .read(|c| {
            Ok(c.query_row(
                "SELECT (SELECT count(*) FROM trace_diff_prompt) + (SELECT count(*) FROM trace_diff_round)",
                [],
                |r| r.get(0),
            )?)
        })
        .unwrap();
    assert_eq!(left, 0);
}

/// Each bad diff is one error naming the prompt, and nothing of it is stored.
#[test]
fn a_bad_diff_stores_nothing() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let run = finished_run(&s, "r1", "trace:vllm:t.jsonl (bonus-token)");
    let local = finished_run(&s, "r2", "local");
    let good = prompt(0, &[1]);
    let with = |f: &dyn Fn(&mut PromptDiff)| {
        let mut p = prompt(1, &[0, 2]);
        f(&mut p);
        vec![good.clone(), p]
    };
    let cases: Vec<(Vec<PromptDiff>, &str)> = vec![
        (
            with(&|p| p.index = 7),
            "prompt 7 (p1): the run has no prompt 7",
        ),
        (
            with(&|p| p.id = "other".into()),
            "prompt 1 (other): the run's prompt 1 is \"p1\"",
        ),
        (
            vec![good.clone(), good.clone()],
            "prompt 0 (p0): compared twice",
        ),
        (
            with(&|p| p.rounds_fewer = 9),
            "9 where the reference commits more",
        ),
        (
            with(&|p| p.rounds_fewer = 1),
            "1 where the reference commits more, 0 fewer and 2 listed",
        ),
        (
            with(&|p| p.first_rounds.swap(0, 1)),
            "listed round 0 is not in decode order",
        ),
        (
            with(&|p| p.first_rounds[1].round = 5),
            "listed round 5 is not in decode order within its 5 rounds",
        ),
        (
            with(&|p| p.first_rounds[0].engine = 3),
            "round 0: engine 3 and reference 3 tokens",
        ),
        (
            with(&|p| {
                p.first_rounds[0].reference_ids.pop();
            }),
            "with 2 reference token ids",
        ),
        (with(&|p| p.departures = 0), "1 departures listed of 0"),
    ];
    for (prompts, expected) in cases {
        let err = format!(
            "{:#}",
            s.put_trace_diff(run, &new_diff("a", &prompts)).unwrap_err()
        );
        assert!(err.contains(expected), "{err}\nexpected: {expected}");
        assert!(err.contains(&format!("trace diff of run {run}")), "{err}");
        assert!(
            s.trace_diffs(run).unwrap().is_empty(),
            "{expected}: something was stored"
        );
    }
    let err = s
        .put_trace_diff(local, &new_diff("a", &[good.clone()]))
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("is not a trace import"),
        "{err:#}"
    );
    let err = s
        .put_trace_diff(99, &new_diff("a", &[prompt(0, &[1])]))
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("run 99 does not exist"),
        "{err:#}"
    );
    // A bad diff leaves an earlier good one as it was.
    let id = s
        .put_trace_diff(run, &new_diff("a", &[prompt(0, &[1])]))
        .unwrap();
    assert!(s
        .put_trace_diff(run, &new_diff("a", &with(&|p| p.index = 7)))
        .is_err());
    assert_eq!(s.trace_diffs(run).unwrap()[0].id, id);
    assert_eq!(s.trace_diff(id).unwrap().unwrap().1, [prompt(0, &[1])]);
}

#[test]
fn a_v6_database_gains_the_trace_diff_tables() {
    let (_d, path) = tmp();
    {
        let mut c = Connection::open(&path).unwrap();
        let tx = c.transaction().unwrap();
        for sql in &schema::MIGRATIONS[..6] {
            tx.execute_batch(sql).unwrap();
        }
        tx.pragma_update(None, "user_version", 6).unwrap();
        tx.commit().unwrap();
    }
    let s = Store::open(&path).unwrap();
    assert_eq!(s.schema_version().unwrap(), 7);
    let run = finished_run(&s, "r1", "trace:jsonl:t.jsonl");
    let id = s
        .put_trace_diff(run, &new_diff("a", &[prompt(0, &[2])]))
        .unwrap();
    assert_eq!(s.trace_diff(id).unwrap().unwrap().1, [prompt(0, &[2])]);
}
