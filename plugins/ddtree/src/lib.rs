//! DDTree-N (Diffusion Draft Tree, Ringel & Romano; docs/dflash.md §4): per block, a draft tree of N
//! non-root nodes built best-first from the per-depth top-K of the drafter, verified greedily
//! against the target tokens.
//!
//! Construction (`build_ddtree_tree`): the score of a prefix (r_1..r_d) is Σ_j ℓ_j[r_j], the log
//! of the product of the drafter's per-depth probabilities (depth-j candidates are the same for
//! every branch: DFlash marginals are not conditioned on the branch). A max-heap seeded with
//! (depth 1, rank 0) pops the best prefix, creates its node and pushes its next sibling (rank r+1)
//! and its first child (depth d+1, rank 0). Both moves never increase the score, so the first N
//! pops are the N best prefixes and are prefix-closed. Depth ≤ B−1. The pop order does not depend
//! on N, so one construction with the largest budget serves every smaller budget (its first N
//! pops).
//!
//! Acceptance: from the root, move to the child whose token is the target token while one
//! exists (and the position is valid); τ = 1 + accepted depth. The surrogate 1 + Σ_{v∈T} Π q(u)
//! is the objective the tree maximises; realised vs surrogate shows the drafter's calibration.
//!
//! Stored K: the construction wants top-min(N, V) per depth but only K candidates are stored. A
//! missing candidate of rank K at depth d scores at most min(ℓ_d[K−1], ln(1 − Σ_r exp ℓ_d[r])) (it
//! is no likelier than rank K−1 and than the mass left outside the top-K). When such a bound
//! reaches the score of the N-th node, the tree may differ from the unrestricted one: the block
//! counts in `ddtree_k_limited_N`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use draftlens_plugin_sdk::{
    export_metric, log, region_param, Accumulator, Batch, Block, Inputs, Level, Metadata, Metric,
    MetricSpec, MetricValue, ParamSpec, ParamValue, Params, PluginError, RegionFilter,
};

pub struct DdTree;

/// One heap entry: a prefix waiting to become a node.
#[derive(Clone, Copy, Debug)]
struct Item {
    score: f64,
    depth: u32,
    rank: u32,
    /// Index of the parent node in pop order; `ROOT` for depth 1.
    parent: u32,
}

const ROOT: u32 = u32::MAX;

impl PartialEq for Item {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Item {
    /// Higher score first; ties broken deterministically (shallower, lower rank, older parent)
    /// so that native and wasm builds pop the same sequence.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.depth.cmp(&self.depth))
            .then_with(|| other.rank.cmp(&self.rank))
            .then_with(|| other.parent.cmp(&self.parent))
    }
}

/// The result of building one block's tree with the largest budget.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tree {
    /// Score (log product of draft probabilities) of each node, in pop order.
    pub scores: Vec<f64>,
    /// Pop index of the node on the target path at depth 1, 2, ... (increasing).
    pub path: Vec<usize>,
    /// (pop index of a rank-(K−1) node, upper bound of its missing next sibling's score).
    pub limit_events: Vec<(usize, f64)>,
}

impl Tree {
    /// Accepted drafts with budget `n` (the walk stays inside the first `n` pops).
    pub fn accepted(&self, n: usize) -> usize {
        self.path.iter().take_while(|&&i| i < n).count()
    }
    /// Σ over the first `n` nodes of Π q(u) along their path.
    pub fn surrogate(&self, n: usize) -> f64 {
        self.scores.iter().take(n).map(|s| s.exp()).sum()
    }
    /// Whether the stored K may have changed the tree of budget `n`.
    pub fn k_limited(&self, n: usize) -> bool {
        if self.scores.len() < n {
            // The tree ran out of nodes: any missing candidate would have been added.
            return !self.limit_events.is_empty();
        }
        let last = self.scores[n - 1];
        self.limit_events
            .iter()
            .any(|&(j, bound)| j + 1 < n && bound >= last)
    }
}

/// Reusable buffers for [`build`].
#[derive(Default)]
pub struct Builder {
    heap: BinaryHeap<Item>,
    on_path: Vec<bool>,
    ranks: Vec<Option<u32>>,
    ub: Vec<f64>,
}

impl Builder {
    /// Best-first construction of up to `n_max` nodes over `block`'s drafted positions.
    pub fn build(&mut self, block: &Block<'_>, k: usize, n_max: usize) -> Tree {
        let depth_max = block.len();
        let mut tree = Tree::default();
        if depth_max == 0 || n_max == 0 {
            return tree;
        }
        let lp = |d: usize, r: usize| block.draft_logprobs[(d - 1) * k + r] as f64;
        // Per depth: the target's rank among the candidates (None: absent or position invalid),
        // and the upper bound of a missing rank-K candidate.
        self.ranks.clear();
        self.ub.clear();
        for d in 1..=depth_max {
            let cands = &block.draft_ids[(d - 1) * k..d * k];
            let rank = if block.valid[d - 1] != 0 {
                cands
                    .iter()
                    .position(|&t| t == block.target[d - 1])
                    .map(|r| r as u32)
            } else {
                None
            };
            self.ranks.push(rank);
            let mass: f64 = (0..k).map(|r| lp(d, r).exp()).sum();
            let rest = 1.0 - mass;
            self.ub.push(if rest > 0.0 {
                lp(d, k - 1).min(rest.ln())
            } else {
                f64::NEG_INFINITY
            });
        }
        self.heap.clear();
        self.on_path.clear();
        self.heap.push(Item {
            score: lp(1, 0),
            depth: 1,
            rank: 0,
            parent: ROOT,
        });
        while tree.scores.len() < n_max {
            let Some(it) = self.heap.pop() else { break };
            let idx = tree.scores.len();
            let d = it.depth as usize;
            let r = it.rank as usize;
            tree.scores.push(it.score);
            let parent_on_path = it.parent == ROOT || self.on_path[it.parent as usize];
            let on_path = parent_on_path && self.ranks[d - 1] == Some(it.rank);
            self.on_path.push(on_path);
            if on_path {
                tree.path.push(idx);
            }
            if r + 1 < k {
                let score = it.score - lp(d, r) + lp(d, r + 1);
                self.heap.push(Item {
                    score,
                    depth: it.depth,
                    rank: it.rank + 1,
                    parent: it.parent,
                });
            } else if self.ub[d - 1] > f64::NEG_INFINITY {
                tree.limit_events
                    .push((idx, it.score - lp(d, r) + self.ub[d - 1]));
            }
            if d < depth_max {
                let score = it.score + lp(d + 1, 0);
                self.heap.push(Item {
                    score,
                    depth: it.depth + 1,
                    rank: 0,
                    parent: idx as u32,
                });
            }
        }
        tree
    }
}

pub struct Acc {
    region: RegionFilter,
    budgets: Vec<usize>,
    builder: Builder,
    blocks: u64,
    accepted: Vec<u64>,
    surrogate: Vec<f64>,
    limited: Vec<u64>,
    warned: bool,
}

impl Metric for DdTree {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "ddtree".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "DDTree-N: best-first draft tree of N non-root nodes over the per-depth top-K, greedy walk"
                .into(),
            metrics: vec![
                MetricSpec::new(
                    "ddtree_tau_*",
                    "tokens",
                    "ddtree_tau_<N>: 1 + accepted depth of the greedy walk in the N-node tree, mean over blocks \
                     (bonus included; verify batch = N+1 tokens)",
                    true,
                ),
                MetricSpec::new(
                    "ddtree_surrogate_tau_*",
                    "tokens",
                    "ddtree_surrogate_tau_<N>: 1 + Σ_(v in tree) Π q(u), the tree's objective, mean over blocks \
                     (compare with ddtree_tau_<N> for calibration)",
                    true,
                ),
                MetricSpec::new(
                    "ddtree_k_limited_*",
                    "fraction",
                    "ddtree_k_limited_<N>: blocks whose N-node tree may differ from the unrestricted one because \
                     only K candidates per depth are stored",
                    false,
                ),
            ],
            params: vec![
                ParamSpec::new(
                    "budgets",
                    "comma-separated node budgets N (non-root nodes)",
                    ParamValue::Text("4,8,16,32,64".into()),
                ),
                region_param("completion"),
            ],
            // Every candidate with its log-prob; not the target's top-K.
            inputs: Inputs { candidates: 0, draft_logprobs: true, target_topk: false },
        }
    }

    fn begin(params: &Params) -> Result<Acc, PluginError> {
        let budgets = params.positive_int_list("budgets")?;
        if let Some(&b) = budgets.iter().find(|&&b| b > 1 << 16) {
            return Err(PluginError::InvalidParams(format!(
                "budget {b} is larger than 65536 nodes"
            )));
        }
        let n = budgets.len();
        Ok(Acc {
            region: params.region_filter("region")?,
            budgets,
            builder: Builder::default(),
            blocks: 0,
            accepted: vec![0; n],
            surrogate: vec![0.0; n],
            limited: vec![0; n],
            warned: false,
        })
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError> {
        let k = batch.top_k();
        let n_max = *self.budgets.last().expect("at least one budget");
        if !self.warned && self.budgets.iter().any(|&n| n > k) {
            self.warned = true;
            log(
                Level::Info,
                &format!(
                    "ddtree: budgets above the stored top-K ({k}) may want candidates that were not stored; \
                     see ddtree_k_limited_<N>"
                ),
            );
        }
        for block in batch.blocks().filter(|b| self.region.accepts(b.region)) {
            let tree = self.builder.build(&block, k, n_max);
            self.blocks += 1;
            for (j, &n) in self.budgets.iter().enumerate() {
                self.accepted[j] += tree.accepted(n) as u64;
                self.surrogate[j] += tree.surrogate(n);
                self.limited[j] += tree.k_limited(n) as u64;
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        let mut out = Vec::new();
        for (j, &n) in self.budgets.iter().enumerate() {
            let mut tau = MetricValue::ratio(
                &format!("ddtree_tau_{n}"),
                self.accepted[j] as f64,
                self.blocks,
            );
            tau.value += 1.0;
            let mut sur = MetricValue::ratio(
                &format!("ddtree_surrogate_tau_{n}"),
                self.surrogate[j],
                self.blocks,
            );
            sur.value += 1.0;
            out.push(tau);
            out.push(sur);
            out.push(MetricValue::ratio(
                &format!("ddtree_k_limited_{n}"),
                self.limited[j] as f64,
                self.blocks,
            ));
        }
        Ok(out)
    }
}

export_metric!(DdTree);

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_plugin_sdk::testdata::{chunks, metric, oracle, random, Rng, Shape};
    use draftlens_plugin_sdk::{
        evaluate, evaluate_chunks, OwnedBatch, Param, PositionSpec, Region,
    };

    fn budgets(s: &str) -> Vec<Param> {
        vec![Param::new("budgets", ParamValue::Text(s.into()))]
    }

    /// A block with B−1 = `depth` positions, `k` candidates per depth with random distinct
    /// log-probs (ids 10r + d), target token at the given rank per depth (None = absent).
    fn random_block(
        rng: &mut Rng,
        depth: usize,
        k: usize,
        target_rank: &[Option<usize>],
    ) -> OwnedBatch {
        let mut b = OwnedBatch::new(depth as u32 + 1, k as u32);
        let ps: Vec<PositionSpec> = (0..depth)
            .map(|d| {
                let mut w: Vec<f64> = (0..k).map(|_| 0.05 + rng.f64()).collect();
                w.sort_by(|a, b| b.partial_cmp(a).unwrap());
                let keep = 0.6 + 0.3 * rng.f64();
                let sum: f64 = w.iter().sum();
                let draft: Vec<(u32, f32)> = w
                    .iter()
                    .enumerate()
                    .map(|(r, x)| ((10 * r + d) as u32, (x / sum * keep).ln() as f32))
                    .collect();
                let target = match target_rank[d] {
                    Some(r) => (10 * r + d) as u32,
                    None => 999,
                };
                PositionSpec {
                    target: Some(target),
                    loss_mask: true,
                    draft,
                    target_top: None,
                }
            })
            .collect();
        b.push_block(0, 0, Region::Completion, &ps);
        b
    }

    /// All prefixes of the full K-ary trie of depth D, as rank sequences.
    fn trie(k: usize, depth: usize) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = Vec::new();
        let mut frontier: Vec<Vec<usize>> = vec![vec![]];
        for _ in 0..depth {
            let mut next = Vec::new();
            for p in &frontier {
                for r in 0..k {
                    let mut q = p.clone();
                    q.push(r);
                    next.push(q);
                }
            }
            out.extend(next.iter().cloned());
            frontier = next;
        }
        out
    }

    /// Brute force: the prefix-closed subset of size n with the largest Σ Π q, and its walk.
    fn brute_force(b: &OwnedBatch, n: usize) -> (f64, usize) {
        let view = b.as_batch();
        let block = view.block(0);
        let k = view.top_k();
        let nodes = trie(k, block.len());
        let score = |ranks: &[usize]| -> f64 {
            ranks
                .iter()
                .enumerate()
                .map(|(d, &r)| block.draft_logprobs[d * k + r] as f64)
                .sum::<f64>()
        };
        let mut best = (f64::NEG_INFINITY, 0usize);
        for mask in 0u32..(1 << nodes.len()) {
            if mask.count_ones() as usize != n {
                continue;
            }
            let chosen: Vec<&Vec<usize>> = (0..nodes.len())
                .filter(|i| mask >> i & 1 == 1)
                .map(|i| &nodes[i])
                .collect();
            let closed = chosen
                .iter()
                .all(|p| p.len() == 1 || chosen.iter().any(|q| q[..] == p[..p.len() - 1]));
            if !closed {
                continue;
            }
            let sur: f64 = chosen.iter().map(|p| score(p).exp()).sum();
            if sur > best.0 {
                // Walk: follow the target's rank while the prefix is in the tree.
                let mut path: Vec<usize> = Vec::new();
                for d in 0..block.len() {
                    let Some(r) = block.draft_ids[d * k..(d + 1) * k]
                        .iter()
                        .position(|&t| t == block.target[d])
                    else {
                        break;
                    };
                    path.push(r);
                    if !chosen.iter().any(|q| q[..] == path[..]) {
                        path.pop();
                        break;
                    }
                }
                best = (sur, path.len());
            }
        }
        best
    }

    #[test]
    fn best_first_equals_brute_force_on_small_trees() {
        // K = 2, depth 3: 14 trie nodes, every budget 1..=14 enumerated exhaustively.
        let mut rng = Rng::new(42);
        for trial in 0..12 {
            let ranks: Vec<Option<usize>> = (0..3)
                .map(|_| {
                    if rng.f64() < 0.85 {
                        Some(rng.below(2) as usize)
                    } else {
                        None
                    }
                })
                .collect();
            let b = random_block(&mut rng, 3, 2, &ranks);
            let view = b.as_batch();
            let tree = Builder::default().build(&view.block(0), 2, 14);
            assert_eq!(tree.scores.len(), 14, "the whole trie fits");
            for n in 1..=14 {
                let (sur, acc) = brute_force(&b, n);
                assert!(
                    (tree.surrogate(n) - sur).abs() < 1e-12,
                    "trial {trial} n {n}: {} vs {sur}",
                    tree.surrogate(n)
                );
                assert_eq!(tree.accepted(n), acc, "trial {trial} n {n} ranks {ranks:?}");
            }
        }
    }

    #[test]
    fn hand_built_tree() {
        // Depth 2, K = 2. q1 = (.6, .3), q2 = (.55, .4). Products: [0]=.6, [0,0]=.33, [1]=.3,
        // [0,1]=.24, [1,0]=.165, [1,1]=.12 — also the best-first pop order.
        let mut b = OwnedBatch::new(3, 2);
        let ln = |x: f64| x.ln() as f32;
        // Target: rank 1 at depth 1, rank 0 at depth 2 → path [1] (pop 2), [1,0] (pop 4).
        b.push_block(
            0,
            0,
            Region::Completion,
            &[
                PositionSpec {
                    target: Some(11),
                    loss_mask: true,
                    draft: vec![(10, ln(0.6)), (11, ln(0.3))],
                    target_top: None,
                },
                PositionSpec {
                    target: Some(20),
                    loss_mask: true,
                    draft: vec![(20, ln(0.55)), (21, ln(0.4))],
                    target_top: None,
                },
            ],
        );
        let tree = Builder::default().build(&b.as_batch().block(0), 2, 6);
        let want = [0.6, 0.33, 0.3, 0.24, 0.165, 0.12];
        for (s, w) in tree.scores.iter().zip(want) {
            assert!((s.exp() - w).abs() < 1e-6, "{:?}", tree.scores);
        }
        assert_eq!(tree.path, vec![2, 4]);
        assert_eq!(
            (
                tree.accepted(2),
                tree.accepted(3),
                tree.accepted(4),
                tree.accepted(5)
            ),
            (0, 1, 1, 2)
        );
        let vs = evaluate::<DdTree>(&budgets("1,3,5,7"), &b.as_batch()).unwrap();
        assert_eq!(metric(&vs, "ddtree_tau_1").value, 1.0);
        assert_eq!(metric(&vs, "ddtree_tau_3").value, 2.0);
        assert_eq!(metric(&vs, "ddtree_tau_5").value, 3.0);
        assert!((metric(&vs, "ddtree_surrogate_tau_3").value - 2.23).abs() < 1e-6);
        // A missing rank-2 candidate scores at most .1 at depth 1 and .05 × its parent at depth 2
        // (the mass left outside the top-2): below the 5th node (.165), so N = 5 is not limited.
        // N = 7 is more than the 6 stored prefixes: limited.
        assert_eq!(metric(&vs, "ddtree_k_limited_5").value, 0.0);
        assert_eq!(metric(&vs, "ddtree_k_limited_7").value, 1.0);
        assert_eq!(metric(&vs, "ddtree_tau_7").value, 3.0);
    }

    #[test]
    fn k_limit_flag_is_conservative() {
        // Build trees from K = 4 candidates and from the same data cut to K = 2: whenever the
        // two trees differ, the K = 2 tree must be flagged.
        let mut rng = Rng::new(7);
        let mut flagged = 0;
        for _ in 0..200 {
            let ranks: Vec<Option<usize>> = (0..4).map(|_| Some(rng.below(4) as usize)).collect();
            let full = random_block(&mut rng, 4, 4, &ranks);
            let mut cut = OwnedBatch::new(5, 2);
            let fv = full.as_batch();
            let fb = fv.block(0);
            let ps: Vec<PositionSpec> = fb
                .positions()
                .map(|p| PositionSpec {
                    target: Some(p.target),
                    loss_mask: true,
                    draft: (0..2)
                        .map(|r| (p.draft.ids[r], p.draft.logprobs[r]))
                        .collect(),
                    target_top: None,
                })
                .collect();
            cut.push_block(0, 0, Region::Completion, &ps);
            let t_full = Builder::default().build(&fb, 4, 12);
            let t_cut = Builder::default().build(&cut.as_batch().block(0), 2, 12);
            for n in [2, 4, 8, 12] {
                let differs = (t_full.surrogate(n) - t_cut.surrogate(n)).abs() > 1e-12;
                if differs {
                    assert!(
                        t_cut.k_limited(n),
                        "tree differs at n = {n} but not flagged"
                    );
                }
                flagged += t_cut.k_limited(n) as u32;
            }
        }
        assert!(flagged > 0, "the test must exercise the flag");
    }

    #[test]
    fn k_equal_one_is_the_chain() {
        // With one candidate per depth the tree is the chain: τ_N = 1 + min(A, N).
        let b = random(3, &Shape::new(8, 1, 3, 4, 30), 0.7, 0.0);
        let view = b.as_batch();
        let vs = evaluate::<DdTree>(&budgets("2,5,7"), &view).unwrap();
        for n in [2usize, 5, 7] {
            let want = view
                .blocks()
                .map(|bl| 1.0 + bl.accepted_len().min(n) as f64)
                .sum::<f64>()
                / view.num_blocks() as f64;
            assert!((metric(&vs, &format!("ddtree_tau_{n}")).value - want).abs() < 1e-12);
        }
    }

    #[test]
    fn oracle_and_streaming() {
        // Oracle drafter (target = top-1 everywhere), K = 2, depth 5: a budget of 62 nodes holds
        // the whole trie, so the walk reaches every valid position: τ = 1 + valid depth.
        let o = oracle(&Shape::new(6, 2, 2, 3, 20));
        let vs = evaluate::<DdTree>(&budgets("62"), &o.as_batch()).unwrap();
        let view = o.as_batch();
        let want = view
            .blocks()
            .map(|b| 1.0 + b.valid_len() as f64)
            .sum::<f64>()
            / view.num_blocks() as f64;
        assert!((metric(&vs, "ddtree_tau_62").value - want).abs() < 1e-12);
        // Budget grows → τ never drops (trees are nested).
        let b = random(5, &Shape::new(8, 4, 3, 3, 30), 0.5, 0.4);
        let p = budgets("1,2,4,8,16,32");
        let one = evaluate::<DdTree>(&p, &b.as_batch()).unwrap();
        let taus: Vec<f64> = [1, 2, 4, 8, 16, 32]
            .iter()
            .map(|n| metric(&one, &format!("ddtree_tau_{n}")).value)
            .collect();
        assert!(taus.windows(2).all(|w| w[0] <= w[1]), "{taus:?}");
        let parts = chunks(&b, 19);
        assert_eq!(
            one,
            evaluate_chunks::<DdTree>(&p, parts.iter().map(|c| c.as_batch())).unwrap()
        );
    }
}
