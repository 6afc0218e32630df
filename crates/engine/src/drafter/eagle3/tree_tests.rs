//! The tree's rules by hand: the shape's checks, growth and selection, the accepted length, the
//! metric rows. The drafter's trees are checked against SGLang's in float64 PyTorch in
//! `crates/engine/tests/eagle3/tree.rs`.

use super::*;

fn err(r: Result<impl std::fmt::Debug>) -> String {
    format!("{:#}", r.unwrap_err())
}

#[test]
fn parse_takes_topk_and_total() {
    let s = TreeShape::parse("4,8").unwrap();
    assert_eq!((s.topk, s.total_tokens), (4, 8));
    assert_eq!(TreeShape::parse(" 10 , 61 ").unwrap().total_tokens, 61);
    for (bad, says) in [
        ("4", "expected TOPK,TOTAL"),
        ("4,8,2", "expected TOPK,TOTAL"),
        ("x,8", "TOPK \"x\" is not a whole number"),
        ("4,-8", "TOTAL \"-8\" is not a whole number"),
        (
            "0,8",
            "TOPK 0: every expanded node needs at least one child",
        ),
        ("33,64", "TOPK 33 is above the cap of 32"),
        ("4,513", "TOTAL 513 is above the cap of 512"),
    ] {
        let e = err(TreeShape::parse(bad));
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn check_bounds_total_by_the_depth_and_the_candidates() {
    let shape = |topk, total_tokens| TreeShape { topk, total_tokens };
    // Depth 5: TOPK 1 scores 5 candidates, so TOTAL is exactly K + 1 (SGLang's rule).
    shape(1, 6).check(5, 160).unwrap();
    assert!(err(shape(1, 5).check(5, 160)).contains("TOTAL 5 is less than the depth K + 1 = 6"));
    assert!(err(shape(1, 7).check(5, 160))
        .contains("TOTAL 7 is more than the root and the 5 candidates"));
    // TOPK 4: 4 + 4·16 = 68 candidates.
    assert_eq!(shape(4, 8).candidates(5), 68);
    shape(4, 69).check(5, 160).unwrap();
    assert!(err(shape(4, 70).check(5, 160)).contains("the 68 candidates"));
    assert!(err(shape(4, 8).check(5, 3)).contains("TOPK 4 is more than the drafter's 3 draft ids"));
    assert!(err(shape(0, 8).check(5, 160)).contains("TOPK 0"));
    // A depth-1 "tree" is step 1's top-k.
    shape(3, 4).check(1, 160).unwrap();
}

/// k = 2, depth 2: step 1 proposes 10 (−0.1) and 11 (−1.0); 10's children are 20 (−0.2) and
/// 21 (−3.0), 11's are 22 (−0.05) and 23 (−0.5).
fn small_tree() -> (DraftTree, Vec<(usize, u32)>) {
    let mut t = DraftTree::new(&[10, 11], &[-0.1, -1.0]);
    let children: [(&[u32], &[f32]); 2] = [(&[20, 21], &[-0.2, -3.0]), (&[22, 23], &[-0.05, -0.5])];
    let kept = t.grow(&[0, 1], |j| children[j]);
    (t, kept)
}

#[test]
fn children_are_scored_by_their_path_and_the_best_k_kept() {
    let (t, kept) = small_tree();
    // Candidates 2..5 are slot 0's then slot 1's children, SGLang's score_list order.
    assert_eq!(t.tokens, [10, 11, 20, 21, 22, 23]);
    assert_eq!(t.parents, [None, None, Some(0), Some(0), Some(1), Some(1)]);
    let want = [-0.1, -1.0, -0.3, -3.1, -1.05, -1.5];
    for (got, want) in t.scores.iter().zip(want) {
        assert!((got - want).abs() < 1e-6, "{:?}", t.scores);
    }
    // The best two of the four children, best first, with their parents' slots: 20 (−0.3)
    // under slot 0, then 22 (−1.05) under slot 1.
    assert_eq!(kept, [(0, 2), (1, 4)]);
    // The three best of all six: 10, 20, 11 (22 at −1.05 just misses).
    assert_eq!(t.best(0..6, 3), [0, 2, 1]);
}

#[test]
fn ties_go_to_the_earlier_candidate_so_a_parent_precedes_its_child() {
    // A child whose log-probability is 0 ties with its parent: the parent, the earlier
    // candidate, comes first, and the tree never holds a node without its parent.
    let mut t = DraftTree::new(&[5, 6], &[-1.0, -1.0]);
    t.grow(&[0, 1], |_| (&[7, 8][..], &[0.0, -2.0][..]));
    assert_eq!(t.best(0..t.tokens.len(), 3), [0, 1, 2]);
}

#[test]
fn the_accepted_length_follows_the_targets_tokens_through_the_tree() {
    let (mut t, _) = small_tree();
    t.selected = vec![0, 1, 2];
    let labels = |seq: &'static [u32]| move |m: usize| seq.get(m - 1).copied();
    assert_eq!(t.accepted_len(labels(&[10, 20, 99])), 2);
    // 22 is a candidate but not in the tree.
    assert_eq!(t.accepted_len(labels(&[11, 22])), 1);
    // 20 is 10's child, not 11's.
    assert_eq!(t.accepted_len(labels(&[11, 20])), 1);
    assert_eq!(t.accepted_len(labels(&[12, 20])), 0);
    // The end of the sequence stops the path.
    assert_eq!(t.accepted_len(labels(&[10])), 1);
    assert_eq!(t.accepted_len(labels(&[])), 0);
}

fn info(index: u32, prompt_len: usize, seq_len: usize, category: &str) -> PromptInfo {
    PromptInfo {
        index,
        prompt_len,
        seq_len,
        category: Some(category.into()),
    }
}

fn value(rows: &[MetricRow], name: &str, scope: MetricScope) -> (f64, u64) {
    let r = rows
        .iter()
        .find(|r| r.name == name && r.scope == scope)
        .unwrap_or_else(|| panic!("no {name} at {scope:?}"));
    (r.value, r.count)
}

#[test]
fn rows_replay_the_trees_chain_under_the_one_tau() {
    // Prompt 0: positions 0..=9 (end 9), prompt 2. A: 2 → 3 (4 tokens), 6 → 1 (2 tokens),
    // 8 → 0 (1 token, the last position): 7 tokens in 3 rounds. Prompt 1: positions 0..=5
    // (end 5), prompt 3: 3 → 2 accepts every remaining position, 2 tokens and no bonus past
    // the end. Anchors off the chain count in the uniform τ only.
    let trees = [
        PromptTree {
            index: 0,
            accepted: [(2, 3), (3, 0), (6, 1), (8, 0)].into_iter().collect(),
        },
        PromptTree {
            index: 1,
            accepted: [(3, 2), (4, 1)].into_iter().collect(),
        },
    ];
    let prompts = [info(0, 2, 10, "code"), info(1, 3, 6, "math")];
    let shape = TreeShape {
        topk: 2,
        total_tokens: 6,
    };
    let rows = tree_rows(&shape, 4, &prompts, &trees);
    assert_eq!(
        value(&rows, "eagle3_tree_tau_replayed", MetricScope::Prompt(0)),
        (7.0 / 3.0, 3)
    );
    assert_eq!(
        value(&rows, "eagle3_tree_tau_replayed", MetricScope::Prompt(1)),
        (2.0, 1)
    );
    assert_eq!(
        value(&rows, "eagle3_tree_tau_replayed_macro", MetricScope::Run),
        ((7.0 / 3.0 + 2.0) / 2.0, 2)
    );
    assert_eq!(
        value(&rows, "eagle3_tree_tau_replayed_pooled", MetricScope::Run),
        (9.0 / 4.0, 4)
    );
    assert_eq!(
        value(
            &rows,
            "eagle3_tree_tau_replayed_pooled",
            MetricScope::Category("math".into())
        ),
        (2.0, 1)
    );
    // Σ(A + 1) = (4 + 1 + 2 + 1) + (3 + 2) over 6 anchors.
    assert_eq!(
        value(&rows, "eagle3_tree_tau_uniform", MetricScope::Run),
        (13.0 / 6.0, 6)
    );
    let r = rows
        .iter()
        .find(|r| r.name == "eagle3_tree_tau_replayed_macro")
        .unwrap();
    assert!(r
        .description
        .contains("top-2 per depth, 6 tokens with the root, depth 4"));
    assert_eq!(r.unit, "tokens/round");
}

#[test]
fn a_run_without_a_tree_stores_its_options_as_before() {
    // Absent, the option is not serialised: every identity and cache key stays what it was.
    let plain = serde_json::to_string(&EvalOptions::default()).unwrap();
    assert!(!plain.contains("eagle3_tree"), "{plain}");
    let opts = EvalOptions {
        eagle3_tree: Some(TreeShape {
            topk: 4,
            total_tokens: 8,
        }),
        ..EvalOptions::default()
    };
    let json = serde_json::to_value(&opts).unwrap();
    assert_eq!(
        json["eagle3_tree"],
        serde_json::json!({"topk": 4, "total_tokens": 8})
    );
    let back: EvalOptions = serde_json::from_str(&plain).unwrap();
    assert_eq!(back.eagle3_tree, None);
}
