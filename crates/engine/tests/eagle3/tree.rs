//! EAGLE-3's dynamic draft tree (`run --eagle3-tree TOPK,TOTAL`, docs/eagle3.md §3.1), each part
//! checked against an independent expectation:
//!
//! (a) golden: on the CPU backend, the trees of tools/golden/make_eagle3_tree_golden.py (SGLang's
//!     draft loop for one request in float64 PyTorch, tree attention by an explicit mask) at every
//!     completion anchor of both golden prompts, for TOPK,TOTAL = 1,6 / 4,8 / 3,16: the same nodes
//!     (token paths) with scores to 1e-4, the same candidate numbering, the same accepted lengths on
//!     the target's continuation and on one planted along the tree's chain, and the same replayed
//!     τ; anchors where the reference finds a near tie (a log-gap below 1e-4) are left out where the
//!     tie could matter;
//! (b) known answers: TOPK 1 is the chain (its nodes are the chain's drafts at every anchor, its
//!     accepted lengths and τ the chain's); the successor drafter's tree accepts all K drafts every
//!     round (τ = K + 1 but for the last round) whatever the shape, and with the feature one
//!     position late nothing (TOPK 1) or far less;
//! (c) `run --eagle3-tree` end to end: the tree's τ stored next to the chain's (equal for TOPK 1),
//!     the shape in the run's settings and identity, every prompt drafted again on a rerun; bad
//!     shapes and drafters refused before the run exists;
//! On CUDA the trees are checked through the CLI (tools/bench/families_known_answer.py, steps
//! `tree-1` and `tree-4`): these fixtures' 16-wide heads are below the CUDA attention kernels'
//! smallest head dim (64).

use super::*;
use draftlens_engine::drafter::eagle3::tree::{replayed, tree_accepted, PromptTree};
use draftlens_engine::drafter::eagle3::TreeShape;
use draftlens_results::metrics::PromptInfo;
use safetensors::SafeTensors;
use std::collections::{BTreeMap, BTreeSet};

fn tree_golden_dir() -> PathBuf {
    repo_root().join("tests/fixtures/golden/eagle3_tree")
}

/// The values of an I64 tensor (parents hold −1).
fn i64s(bytes: &[u8], name: &str) -> Vec<i64> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    t.data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every node of a tree as its token path from the root, with its score.
fn paths(
    tokens: &[u32],
    parents: &[Option<u32>],
    nodes: &[u32],
    scores: &[f64],
) -> BTreeMap<Vec<u32>, f64> {
    nodes
        .iter()
        .zip(scores)
        .map(|(&c, &s)| {
            let mut path = vec![];
            let mut at = Some(c);
            while let Some(n) = at {
                path.push(tokens[n as usize]);
                at = parents[n as usize];
            }
            path.reverse();
            (path, s)
        })
        .collect()
}

/// A sequence whose labels (the target's "greedy tokens") are `labels`: the trees do not read
/// them, only the accepted lengths do.
fn target_topk_of(labels: &[u32]) -> TopK {
    let len = labels.len();
    TopK {
        rows: len,
        k: 1,
        ids: (0..len)
            .map(|t| labels.get(t + 1).copied().unwrap_or(0))
            .collect(),
        logprobs: vec![0.0; len],
    }
}

fn info(plen: usize, len: usize) -> PromptInfo {
    PromptInfo {
        index: 0,
        prompt_len: plen,
        seq_len: len,
        category: None,
    }
}

// ---------------------------------------------------------------------------------------------
// (a) golden
// ---------------------------------------------------------------------------------------------

#[test]
fn trees_match_sglangs_draft_loop() {
    let be = CpuBackend::new();
    let target = qwen3();
    let d = Eagle3Drafter::load(&be, &golden_dir(), &target.spec).unwrap();
    let manifest = json(&tree_golden_dir().join("manifest.json"));
    let near_tie = manifest["near_tie"].as_f64().unwrap() as f32;
    let path = tree_golden_dir().join("tree.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let want = Golden::open(path);
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    let (mut trees_checked, mut numbered, mut left_out, mut replays, mut worst) =
        (0, 0, 0, 0, 0f64);
    for (c, meta) in manifest["shapes"].as_object().unwrap() {
        let shape = TreeShape {
            topk: meta["topk"].as_u64().unwrap() as usize,
            total_tokens: meta["total_tokens"].as_u64().unwrap() as usize,
        };
        assert_eq!(meta["depth"].as_u64().unwrap() as usize, d.cfg.steps);
        let n_sel = shape.total_tokens - 1;
        for p in 0..2 {
            let (ids, plen, taps) = golden_sequence(&g, p);
            let ctx = d
                .context(&be, None, &slices(&taps, ids.len(), 128), 128, &ids)
                .unwrap()
                .unwrap();
            let anchors: Vec<usize> = (plen..ids.len() - 1).collect();
            // Every anchor of the prompt in one forward per depth.
            let trees = d.draft_trees(&be, None, &ctx, &anchors, shape).unwrap();
            let key = |name: &str| format!("{c}.p{p}.{name}");
            let selected = i64s(&bytes, &key("selected"));
            let tokens = i64s(&bytes, &key("tokens"));
            let parents = i64s(&bytes, &key("parents"));
            let (_, log_scores) = want.f32(&key("log_scores"));
            let (_, cut_gap) = want.f32(&key("min_cut_gap"));
            let (_, order_gap) = want.f32(&key("min_order_gap"));
            let accepted = i64s(&bytes, &key("accepted"));
            let accepted_planted = i64s(&bytes, &key("accepted_planted"));
            let planted: Vec<u32> = i64s(&bytes, &key("planted_labels"))
                .iter()
                .map(|&x| x as u32)
                .collect();
            assert_eq!(planted.len(), ids.len());
            let mut near = BTreeSet::new();
            for (i, (&a, tree)) in anchors.iter().zip(&trees).enumerate() {
                let label = format!("{c} p{p} a{a}");
                assert_eq!(tree.selected.len(), n_sel, "{label}");
                if cut_gap[i] < near_tie {
                    // The reference's selection has a near tie: f32 may pick the other node.
                    near.insert(a);
                    left_out += 1;
                    continue;
                }
                // The reference's tree as candidates: index → (token, parent).
                let row = i * n_sel..(i + 1) * n_sel;
                let mut ref_tokens: BTreeMap<u32, u32> = BTreeMap::new();
                let mut ref_parents: BTreeMap<u32, Option<u32>> = BTreeMap::new();
                for j in row.clone() {
                    ref_tokens.insert(selected[j] as u32, tokens[j] as u32);
                    ref_parents.insert(selected[j] as u32, u32::try_from(parents[j]).ok());
                }
                let n_cand = *ref_tokens.keys().max().unwrap() as usize + 1;
                let (mut rt, mut rp) = (vec![0u32; n_cand], vec![None; n_cand]);
                for (&k, &t) in &ref_tokens {
                    rt[k as usize] = t;
                    rp[k as usize] = ref_parents[&k];
                }
                let ref_nodes: Vec<u32> = ref_tokens.keys().copied().collect();
                let ref_scores: Vec<f64> =
                    log_scores[row.clone()].iter().map(|&x| x as f64).collect();
                let theirs = paths(&rt, &rp, &ref_nodes, &ref_scores);
                let our_scores: Vec<f64> = tree
                    .selected
                    .iter()
                    .map(|&s| tree.scores[s as usize])
                    .collect();
                let ours = paths(&tree.tokens, &tree.parents, &tree.selected, &our_scores);
                assert_eq!(
                    ours.keys().collect::<Vec<_>>(),
                    theirs.keys().collect::<Vec<_>>(),
                    "{label}: the tree's nodes (token paths)"
                );
                for (path, s) in &ours {
                    worst = worst.max((s - theirs[path]).abs());
                    assert!(
                        (s - theirs[path]).abs() < 1e-4,
                        "{label} {path:?}: score {s} vs {}",
                        theirs[path]
                    );
                }
                if order_gap[i] >= near_tie {
                    // No near tie in any order: SGLang's numbering of the candidates too.
                    let sel: Vec<i64> = tree.selected.iter().map(|&x| x as i64).collect();
                    assert_eq!(sel, selected[row.clone()], "{label}: selected candidates");
                    let par: Vec<i64> = tree
                        .selected
                        .iter()
                        .map(|&x| tree.parents[x as usize].map_or(-1, |p| p as i64))
                        .collect();
                    assert_eq!(par, parents[row], "{label}: parents");
                    numbered += 1;
                }
                let on = |labels: &[u32]| tree.accepted_len(|m| labels.get(a + m).copied()) as i64;
                assert_eq!(on(&ids), accepted[i], "{label}: accepted");
                assert_eq!(
                    on(&planted),
                    accepted_planted[i],
                    "{label}: accepted, planted"
                );
                trees_checked += 1;
            }
            let recorded: BTreeSet<usize> = meta["prompts"][format!("p{p}")]["near_tie_anchors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(near, recorded, "{c} p{p}: near ties");
            // The run's path: the trees at every anchor (batches of 2 anchors) and the replayed
            // τ along the tree's own chain, on both continuations.
            let opts = EvalOptions {
                anchor_batch: 2 * shape.topk,
                ..EvalOptions::default()
            };
            let m = &meta["prompts"][format!("p{p}")];
            for (labels, acc_want, tau_key) in [
                (&ids, &accepted, "tree_tokens_rounds"),
                (&planted, &accepted_planted, "planted_tree_tokens_rounds"),
            ] {
                let topk = target_topk_of(labels);
                let mut seq = Sequence::new(0, &ids, plen, &topk, Labels::Target);
                seq.eagle3 = d
                    .context(&be, None, &slices(&taps, ids.len(), 128), 128, &ids)
                    .unwrap();
                let acc = tree_accepted(&be, None, &d, &seq, shape, &opts).unwrap();
                for (i, &a) in anchors.iter().enumerate() {
                    if !near.contains(&a) {
                        assert_eq!(
                            acc[&(a as u32)] as i64,
                            acc_want[i],
                            "{c} p{p} a{a} ({tau_key})"
                        );
                    }
                }
                if m["planted_chain_has_a_near_tie"] == false || tau_key == "tree_tokens_rounds" {
                    let (tokens, rounds) = replayed(
                        &info(plen, ids.len()),
                        &PromptTree {
                            index: 0,
                            accepted: acc,
                        },
                    )
                    .unwrap();
                    assert_eq!(
                        serde_json::json!([tokens, rounds]),
                        m[tau_key],
                        "{c} p{p}: {tau_key}"
                    );
                    replays += 1;
                }
            }
        }
    }
    // 3 shapes × 62 anchors; the reference's near ties are few and named in its manifest.
    assert_eq!(trees_checked + left_out, 3 * 62);
    assert!(
        left_out <= 8 && numbered >= 150,
        "{left_out} left out, {numbered} numbered"
    );
    assert!(replays >= 10, "{replays}");
    println!("eagle3 tree golden: {trees_checked} trees equal ({numbered} with SGLang's numbering), {left_out} near ties left out, max |Δ score| {worst:.2e}, {replays} replayed τ equal");
}

// ---------------------------------------------------------------------------------------------
// (b) known answers
// ---------------------------------------------------------------------------------------------

/// TOPK 1's trees on `be` at every anchor of both golden prompts are the chain's drafts on `be`.
fn topk_one_trees_are_the_chains<B: Backend>(be: &B) {
    let d = Eagle3Drafter::load(be, &golden_dir(), &qwen3().spec).unwrap();
    let steps = d.cfg.steps;
    let shape = TreeShape {
        topk: 1,
        total_tokens: steps + 1,
    };
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    for p in 0..2 {
        let (ids, _, taps) = golden_sequence(&g, p);
        let ctx = d
            .context(be, None, &slices(&taps, ids.len(), 128), 128, &ids)
            .unwrap()
            .unwrap();
        // Every anchor with a context row, prompt anchors included.
        let anchors: Vec<usize> = (1..ids.len() - 1).collect();
        let trees = d.draft_trees(be, None, &ctx, &anchors, shape).unwrap();
        let chain = d.draft(be, None, &ctx, &anchors, 1).unwrap();
        for (i, tree) in trees.iter().enumerate() {
            // One node per depth, each the child of the one before: the chain's drafts.
            assert_eq!(tree.selected, (0..steps as u32).collect::<Vec<_>>());
            let parents: Vec<Option<u32>> = (0..steps as u32).map(|s| s.checked_sub(1)).collect();
            assert_eq!(tree.parents, parents);
            assert_eq!(
                tree.tokens,
                chain.ids[i * steps..(i + 1) * steps],
                "p{p} a{}",
                anchors[i]
            );
        }
    }
}

#[test]
fn topk_one_is_the_chain() {
    let be = CpuBackend::new();
    topk_one_trees_are_the_chains(&be);
    let target = qwen3();
    let d = Eagle3Drafter::load(&be, &golden_dir(), &target.spec).unwrap();
    let steps = d.cfg.steps;
    let shape = TreeShape {
        topk: 1,
        total_tokens: steps + 1,
    };
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    // The chain golden's planted continuation: the chain accepts several drafts a round.
    let bytes = std::fs::read(tree_golden_dir().join("tree.safetensors")).unwrap();
    let mut accepted_drafts = 0;
    // The same checkpoint as the chain's drafter of `evaluate_sequence`.
    let chain_drafter =
        Drafter::Eagle3(Eagle3Drafter::load(&be, &golden_dir(), &target.spec).unwrap());
    for p in 0..2 {
        let (ids, plen, taps) = golden_sequence(&g, p);
        let ctx = d
            .context(&be, None, &slices(&taps, ids.len(), 128), 128, &ids)
            .unwrap()
            .unwrap();
        // The accepted lengths and τ of a run: the chain's records against the tree's.
        let planted: Vec<u32> = i64s(&bytes, &format!("k1t{}.p{p}.planted_labels", steps + 1))
            .iter()
            .map(|&x| x as u32)
            .collect();
        let topk = target_topk_of(&planted);
        let mut seq = Sequence::new(0, &ids, plen, &topk, Labels::Target);
        seq.eagle3 = Some(ctx);
        let opts = EvalOptions {
            top_k: 4,
            anchor_batch: 5,
            ..EvalOptions::default()
        };
        let records =
            evaluate_sequence(&be, DraftTarget::Vocab(512), &chain_drafter, &seq, &opts).unwrap();
        let acc = tree_accepted(&be, None, &d, &seq, shape, &opts).unwrap();
        let by_anchor = blocks_by_anchor(&records);
        assert_eq!(acc.len(), records.num_blocks());
        for (&a, &len) in &acc {
            assert_eq!(
                len as usize,
                records.accepted_len(by_anchor[&a]),
                "p{p} a{a}"
            );
            accepted_drafts += len;
        }
        let (tokens, rounds) = replayed(
            &info(plen, ids.len()),
            &PromptTree {
                index: 0,
                accepted: acc,
            },
        )
        .unwrap();
        let (want_rounds, want_tokens) = replay(&records, &by_anchor, plen, ids.len()).unwrap();
        assert_eq!((tokens, rounds), (want_tokens, want_rounds), "p{p}");
    }
    assert!(accepted_drafts > 50, "{accepted_drafts}");
}

#[test]
fn successor_tree_accepts_every_draft_whatever_its_shape() {
    successor_trees(&CpuBackend::new());
}

/// The successor drafter's trees on `be`.
fn successor_trees<B: Backend>(be: &B) {
    let (v, steps) = (16usize, 4usize);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("successor");
    write_successor_eagle3(&dir, v, steps);
    let d = Eagle3Drafter::load(be, &dir, &spec_of_size(v)).unwrap();
    let (len, plen) = (31usize, 6usize);
    let mut ids = vec![7u32];
    while ids.len() < len {
        ids.push(successor(*ids.last().unwrap(), v as u32));
    }
    let topk = target_topk_of(&ids);
    let taps = |shift: usize| -> Vec<Vec<f32>> {
        let mut t0 = vec![0f32; len * v];
        for j in 0..len {
            if let Some(&y) = ids.get(j + 1 + shift) {
                t0[j * v + y as usize] = 1.0;
            }
        }
        vec![t0, vec![0f32; len * v], vec![0f32; len * v]]
    };
    let opts = EvalOptions {
        anchor_batch: 8,
        ..EvalOptions::default()
    };
    // N − 1 tokens after the prefill token, K + 1 per round but the last.
    let produced = (len - plen - 1) as u64;
    let want = (produced, produced.div_ceil(steps as u64 + 1));
    for (k, total) in [(1, 5), (2, 5), (2, 9), (4, 12), (4, 53)] {
        let shape = TreeShape {
            topk: k,
            total_tokens: total,
        };
        let evaluate = |shift: usize| {
            let mut seq = Sequence::new(0, &ids, plen, &topk, Labels::Target);
            let t = taps(shift);
            seq.eagle3 = d.context(be, None, &slices(&t, len, v), v, &ids).unwrap();
            tree_accepted(be, None, &d, &seq, shape, &opts).unwrap()
        };
        let acc = evaluate(0);
        for (&a, &n) in &acc {
            assert_eq!(
                n as usize,
                steps.min(len - 1 - a as usize),
                "{k},{total} a{a}"
            );
        }
        let tree = PromptTree {
            index: 0,
            accepted: acc,
        };
        assert_eq!(replayed(&info(plen, len), &tree), Some(want), "{k},{total}");
        // Reading the feature one position late drafts two tokens ahead: the chain of TOPK 1
        // accepts nothing; wider trees only where a runner-up (a tie among the rest of the
        // vocabulary) happens to be the next token.
        let late = PromptTree {
            index: 0,
            accepted: evaluate(1),
        };
        if k == 1 {
            assert!(late.accepted.values().all(|&n| n == 0), "{k},{total}");
        }
        let (tokens, rounds) = replayed(&info(plen, len), &late).unwrap();
        assert!(
            rounds > 2 * want.1,
            "{k},{total}: {tokens} tokens in {rounds} rounds"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (c) run end to end
// ---------------------------------------------------------------------------------------------

#[test]
fn run_stores_the_trees_tau_next_to_the_chains() {
    use draftlens_engine::drafter::run::{run_eval, DrafterSpec, RunOptions};
    use draftlens_engine::hidden_cache::HiddenCache;
    use draftlens_engine::prompts::PromptSet;
    use draftlens_engine::session::{Session, SessionOptions};
    use draftlens_results::store::{MetricScope, RunFilter, RunMode, Store};
    let tmp = tempfile::tempdir().unwrap();
    let model = default_model();
    let files = TargetFiles::open(&model).unwrap();
    let steps = 3;
    let dir = tmp.path().join("eagle3-smol").join("step-10");
    write_random_eagle3(
        &dir,
        files.spec.hidden_size,
        files.spec.vocab_size,
        2000,
        steps,
        7,
    );
    let prompts = tmp.path().join("p.jsonl");
    let lines: Vec<String> = ["The capital of France is", "def fibonacci(n):"]
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": format!("p{i}"), "prompt": t}).to_string())
        .collect();
    std::fs::write(&prompts, lines.join("\n")).unwrap();
    let set = PromptSet::load_path(&prompts).unwrap();
    let with_tree = |tree: Option<TreeShape>| RunOptions {
        name: None,
        mode: RunMode::Deployment,
        eval: EvalOptions {
            eagle3_tree: tree,
            ..EvalOptions::default()
        },
        max_new_tokens: 8,
        fail_after: None,
    };
    let s = Session::load(
        CpuBackend::new(),
        &model,
        HiddenCache::open(&tmp.path().join("cache")).unwrap(),
        SessionOptions::default(),
    )
    .unwrap();
    let store = Store::open(&tmp.path().join("runs.sqlite")).unwrap();
    let spec = DrafterSpec::Checkpoint {
        dir: dir.clone(),
        step: Some(10),
        series: "eagle3-smol".into(),
    };
    let shape = |topk, total_tokens| Some(TreeShape { topk, total_tokens });
    let native = |o: &draftlens_engine::drafter::run::RunOutcome, name: &str| {
        o.metrics["native"].get(name).map(|m| m.value)
    };

    // TOPK 1, TOTAL K + 1: the chain, so the tree's τ is the chain's, exactly.
    let chain = run_eval(&s, &spec, &set, &with_tree(shape(1, steps + 1)), &store).unwrap();
    for (tree, plain) in [
        ("eagle3_tree_tau_replayed_macro", "tau_replayed_macro"),
        ("eagle3_tree_tau_replayed_pooled", "tau_replayed_pooled"),
        ("eagle3_tree_tau_uniform", "tau_uniform"),
    ] {
        assert_eq!(native(&chain, tree), native(&chain, plain), "{tree}");
        assert!(native(&chain, tree).is_some(), "{tree}");
    }
    // A wider tree: its rows, per prompt too, and its shape in the run's settings and identity.
    let wide = run_eval(&s, &spec, &set, &with_tree(shape(3, 8)), &store).unwrap();
    let tau = native(&wide, "eagle3_tree_tau_replayed_macro").unwrap();
    assert!(tau >= 1.0, "{tau}");
    let per_prompt = store
        .metrics_in_scope(wide.run_id, &MetricScope::Prompt(0))
        .unwrap();
    assert!(per_prompt
        .iter()
        .any(|m| m.name == "eagle3_tree_tau_replayed"));
    let eval = store.run_eval(wide.run_id).unwrap().unwrap();
    assert_eq!(
        eval.identity_json["eval"]["eagle3_tree"],
        serde_json::json!({"topk": 3, "total_tokens": 8})
    );
    let run = store.run(wide.run_id).unwrap().unwrap().run;
    assert_eq!(
        run.config["eval"]["eagle3_tree"],
        serde_json::json!({"topk": 3, "total_tokens": 8})
    );
    // A plain run: no tree rows, another identity, and the tree's options nowhere in it.
    let plain = run_eval(&s, &spec, &set, &with_tree(None), &store).unwrap();
    assert!(native(&plain, "eagle3_tree_tau_replayed_macro").is_none());
    assert_eq!(
        native(&plain, "tau_replayed_macro"),
        native(&chain, "tau_replayed_macro")
    );
    let plain_eval = store.run_eval(plain.run_id).unwrap().unwrap();
    assert_ne!(plain_eval.identity, eval.identity);
    assert!(plain_eval.identity_json["eval"]
        .get("eagle3_tree")
        .is_none());
    // A rerun of a tree run drafts every prompt again (cached records would skip the trees).
    let again = run_eval(&s, &spec, &set, &with_tree(shape(3, 8)), &store).unwrap();
    assert_eq!(again.timings["records_cached"], 0);
    assert_eq!(again.metrics, wide.metrics);

    // Bad shapes and drafters: one error each, before a run exists.
    let runs = || store.runs(&RunFilter::default()).unwrap().1;
    let before = runs();
    let oracle = DrafterSpec::Oracle { block_size: 4 };
    for (spec, tree, says) in [
        (&spec, shape(0, 8), "TOPK 0"),
        (
            &spec,
            shape(1, steps),
            "TOTAL 3 is less than the depth K + 1 = 4",
        ),
        (
            &spec,
            shape(1, steps + 2),
            "TOTAL 5 is more than the root and the 3 candidates",
        ),
        (&spec, shape(2, 513), "above the cap of 512"),
        (&spec, shape(33, 64), "above the cap of 32"),
        (
            &oracle,
            shape(1, 4),
            "--eagle3-tree needs an EAGLE-3 checkpoint",
        ),
    ] {
        let e = format!(
            "{:#}",
            run_eval(&s, spec, &set, &with_tree(tree), &store).unwrap_err()
        );
        assert!(e.contains(says), "{says}: {e}");
        assert_eq!(runs(), before, "{says}");
    }
}
