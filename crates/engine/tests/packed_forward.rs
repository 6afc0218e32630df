//! `TargetModel::forward_packed` (several whole sequences in one forward, varlen attention) against
//! one `forward` per sequence, and the packed target passes that `extract` and `run` use against
//! one pass per sequence, on the CPU backend.
//!
//! Models: the random Qwen3 fixture (tests/fixtures/golden/qwen3: q/k norm, explicit head_dim,
//! untied head) and SmolLM2-135M (models/SmolLM2-135M-Instruct.Q4_1.gguf, installed by
//! scripts/setup-fixtures.sh).

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::Backend;
use draftlens_engine::hidden_cache::HiddenCache;
use draftlens_engine::model::{Capture, TargetFiles, TargetModel};
use draftlens_engine::session::{Packer, Session, SessionOptions, TargetPass, DEFAULT_PACK_TOKENS};
use golden_util::*;
use std::path::Path;

/// ‖packed − separate‖/‖separate‖ per captured layer. Packing computes the same operations row
/// for row; only the matmul's blocking over more rows may reorder f32 sums (≈ 1e-7 relative
/// per layer; on the build machine the results are bit-identical). A real packing bug —
/// attention leaking across sequences, rows split at the wrong place — gives errors ≥ 1e-1
/// (measured 0.45 – 1.4 with a causal mask over the whole pack).
const REL_TOL: f64 = 1e-5;

fn load(path: &Path) -> (CpuBackend, TargetFiles, TargetModel<CpuBackend>) {
    let files = TargetFiles::open(path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let be = CpuBackend::new();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    (be, files, model)
}

/// Deterministic token ids in `0..vocab` (`draftlens_engine::util::DetRng`).
fn ids(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut r = draftlens_engine::util::DetRng::new(seed);
    (0..n).map(|_| r.below(vocab as u64) as u32).collect()
}

/// Concatenate `seqs` and return (ids, seq_starts).
fn pack(seqs: &[Vec<u32>]) -> (Vec<u32>, Vec<usize>) {
    let mut all = Vec::new();
    let mut starts = vec![0];
    for s in seqs {
        all.extend(s);
        starts.push(all.len());
    }
    (all, starts)
}

/// Check forward_packed over `seqs` against one forward per sequence at every hidden-state
/// index, the pre-norm output and the final hidden state; returns the worst relative error.
fn packed_matches_separate(
    be: &CpuBackend,
    model: &TargetModel<CpuBackend>,
    seqs: &[Vec<u32>],
    name: &str,
) -> f64 {
    let nl = model.spec.num_layers;
    let capture = Capture {
        prenorm: true,
        ..Capture::hf_indices((0..=nl).collect(), nl).unwrap()
    };
    let (all, starts) = pack(seqs);
    let packed = model
        .forward_packed(be, &all, &starts, &capture)
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let d = model.spec.hidden_size;
    let host = |t: &<CpuBackend as Backend>::Tensor| be.to_host(t).unwrap();
    let mut worst = 0f64;
    for (n, s) in seqs.iter().enumerate() {
        let alone = model
            .forward(be, s, &mut model.new_cache(), &capture)
            .unwrap();
        let rows = starts[n] * d..starts[n + 1] * d;
        let mut pairs: Vec<(String, Vec<f32>, Vec<f32>)> = (0..=nl)
            .map(|i| {
                (
                    format!("hs{i}"),
                    host(packed.captured.get(i).unwrap())[rows.clone()].to_vec(),
                    host(alone.captured.get(i).unwrap()),
                )
            })
            .collect();
        pairs.push((
            "prenorm".into(),
            host(packed.captured.prenorm.as_ref().unwrap())[rows.clone()].to_vec(),
            host(alone.captured.prenorm.as_ref().unwrap()),
        ));
        pairs.push((
            "last_hidden".into(),
            host(&packed.last_hidden)[rows.clone()].to_vec(),
            host(&alone.last_hidden),
        ));
        for (what, p, a) in &pairs {
            let e = diff(p, a);
            eprintln!(
                "{name} seq {n} ({} tokens) {what}: rel {:.2e} max_abs {:.2e}",
                s.len(),
                e.rel,
                e.max_abs
            );
            assert!(
                e.rel <= REL_TOL,
                "{name}: sequence {n} ({} tokens) {what}: packed vs separate rel {:.3e} > {REL_TOL:e}",
                s.len(),
                e.rel
            );
            worst = worst.max(e.rel);
        }
    }
    worst
}

#[test]
fn packed_forward_equals_separate_forwards_on_random_qwen3() {
    let (be, files, model) = load(&repo_root().join("tests/fixtures/golden/qwen3"));
    let v = files.spec.vocab_size;
    // Three lengths, the shortest in the middle so that neither the first nor the last
    // sequence is the only one that could be right.
    let seqs = vec![ids(37, 1, v), ids(5, 2, v), ids(70, 3, v)];
    let worst = packed_matches_separate(&be, &model, &seqs, "qwen3");
    eprintln!("qwen3: worst rel {worst:.2e}");
}

#[test]
fn packed_forward_equals_separate_forwards_on_smollm2() {
    let (be, files, model) = load(&default_model());
    let tok = files.tokenizer().unwrap();
    let seqs: Vec<Vec<u32>> = [
        "The capital of France is Paris, and the capital of Italy is",
        "def f(x):",
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many \
         clips in May. How many clips did Natalia sell altogether in April and May? Let's \
         think step by step. In April she sold 48 clips. In May she sold half as many,",
    ]
    .iter()
    .map(|t| tok.encode(t, true).unwrap())
    .collect();
    let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
    assert!(
        lens[0] != lens[1] && lens[1] != lens[2] && lens[0] != lens[2],
        "{lens:?}"
    );
    let worst = packed_matches_separate(&be, &model, &seqs, "smollm2");
    eprintln!("smollm2 ({lens:?} tokens): worst rel {worst:.2e}");
}

#[test]
fn packing_does_not_leak_across_sequences() {
    // The same sequence packed behind two different neighbours gives the same rows: if
    // attention crossed sequence boundaries or positions did not restart, its rows would
    // depend on what precedes it.
    let (be, files, model) = load(&repo_root().join("tests/fixtures/golden/qwen3"));
    let v = files.spec.vocab_size;
    let target = ids(20, 9, v);
    let capture = Capture::hf_indices(vec![model.spec.num_layers], model.spec.num_layers).unwrap();
    let rows_of_last = |before: Vec<u32>| {
        let (all, starts) = pack(&[before, target.clone()]);
        let out = model.forward_packed(&be, &all, &starts, &capture).unwrap();
        let h = be.to_host(&out.last_hidden).unwrap();
        h[starts[1] * model.spec.hidden_size..].to_vec()
    };
    let a = rows_of_last(ids(3, 10, v));
    let b = rows_of_last(ids(50, 11, v));
    let e = diff(&a, &b);
    assert!(
        e.rel <= REL_TOL,
        "rows depend on the preceding sequence: rel {:.3e}",
        e.rel
    );
}

#[test]
fn bad_seq_starts_are_clear_errors() {
    let (be, files, model) = load(&repo_root().join("tests/fixtures/golden/qwen3"));
    let all = ids(12, 4, files.spec.vocab_size);
    let capture = Capture::none();
    for (starts, why) in [
        (vec![1, 5, 12], "must begin at 0"),
        (vec![0, 5, 11], "must end at the row count 12"),
        (vec![0, 5, 13], "must end at the row count 12"),
        (vec![0, 8, 5, 12], "must strictly increase"),
        (vec![0, 5, 5, 12], "must strictly increase"),
        (vec![0], "hold no sequence"),
        (vec![], "hold no sequence"),
    ] {
        let err = match model.forward_packed(&be, &all, &starts, &capture) {
            Ok(_) => panic!("seq_starts {starts:?} were accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            err.contains("sequence starts") && err.contains(why),
            "seq_starts {starts:?}: {err}"
        );
    }
    // A packed sequence longer than the model's context is refused like a long forward.
    let limit = files.spec.max_position_embeddings;
    let long = ids(limit + 2, 5, files.spec.vocab_size);
    let err = model
        .forward_packed(&be, &long, &[0, 1, limit + 2], &capture)
        .err()
        .map(|e| format!("{e:#}"));
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("max_position_embeddings")),
        "{err:?}"
    );
}

#[test]
fn packer_keeps_order_and_budget() {
    let mut p = Packer::new(10);
    let mut packs = Vec::new();
    for (item, len) in [
        ("a", 4),
        ("b", 6),
        ("c", 1),
        ("d", 25),
        ("e", 3),
        ("f", 7),
        ("g", 1),
    ] {
        packs.extend(p.push(item, len));
    }
    packs.push(p.finish());
    // a+b fill 10 exactly; c cannot join d (26 > 10); d (longer than the budget) runs alone;
    // e+f = 10; g is the remainder.
    assert_eq!(
        packs,
        vec![
            vec!["a", "b"],
            vec!["c"],
            vec!["d"],
            vec!["e", "f"],
            vec!["g"]
        ]
    );
    assert!(p.finish().is_empty());
}

fn session(cache: &Path, pack_tokens: usize) -> Session<CpuBackend> {
    let opts = SessionOptions {
        pack_tokens,
        ..Default::default()
    };
    Session::load(
        CpuBackend::new(),
        &default_model(),
        HiddenCache::open(cache).unwrap(),
        opts,
    )
    .unwrap()
}

/// Sorted (relative entry path, key summary) of every cache entry under `root`.
fn entries(cache: &HiddenCache) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = cache
        .list()
        .unwrap()
        .into_iter()
        .map(|l| {
            (
                l.path
                    .strip_prefix(cache.root())
                    .unwrap()
                    .display()
                    .to_string(),
                l.summary(),
            )
        })
        .collect();
    v.sort();
    v
}

fn assert_passes_equal(a: &TargetPass, b: &TargetPass, what: &str) {
    assert_eq!(a.ids, b.ids, "{what}");
    assert_eq!(a.topk.ids, b.topk.ids, "{what}: top-k ids");
    let lp = diff(&a.topk.logprobs, &b.topk.logprobs);
    assert!(
        lp.max_abs <= 1e-4,
        "{what}: top-k log-probs differ by {:.3e}",
        lp.max_abs
    );
    assert_eq!(
        a.hidden.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        b.hidden.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        "{what}"
    );
    for ((i, ha), (_, hb)) in a.hidden.iter().zip(&b.hidden) {
        let e = diff(&ha.to_f32(), &hb.to_f32());
        eprintln!("{what} hs{i}: rel {:.2e} max_abs {:.2e}", e.rel, e.max_abs);
        assert!(e.rel <= REL_TOL, "{what}: hs{i} rel {:.3e}", e.rel);
    }
}

#[test]
fn extraction_caches_the_same_entries_packed_and_one_by_one() {
    let tmp = tempfile::tempdir().unwrap();
    let one_by_one = session(&tmp.path().join("one"), 1);
    let packed = session(&tmp.path().join("packed"), DEFAULT_PACK_TOKENS);
    let tok = one_by_one.files.tokenizer().unwrap();
    let seqs: Vec<Vec<u32>> = [
        "Write a haiku about the sea.",
        "List three prime numbers greater than one hundred and explain why each is prime.",
        "Hi",
        "Summarise the plot of Hamlet in two sentences.",
    ]
    .iter()
    .map(|t| tok.encode(t, true).unwrap())
    .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(|s| s.as_slice()).collect();
    let nl = one_by_one.files.spec.num_layers;
    let capture = Capture::for_layer_ids(&[1, 8, 15, 22, 27], nl).unwrap();

    // Packed: sequence 2 is cached first, so the pack holds 0, 1, 3 around a cache hit.
    let early = packed.target_pass(refs[2], &capture, 8).unwrap();
    assert!(!early.cached);
    let p = packed.target_passes(&refs, &capture, 8).unwrap();
    assert_eq!(
        p.iter().map(|x| x.cached).collect::<Vec<_>>(),
        [false, false, true, false]
    );
    let o = one_by_one.target_passes(&refs, &capture, 8).unwrap();
    assert!(o.iter().all(|x| !x.cached));

    // The same keys (file names) in both caches: packing does not change what is cached where.
    // Entries are written in the background: flush before looking at the files.
    one_by_one.flush_cache().unwrap();
    packed.flush_cache().unwrap();
    let (eo, ep) = (entries(&one_by_one.cache), entries(&packed.cache));
    assert_eq!(eo.len(), 4, "{eo:?}");
    assert_eq!(eo, ep);

    // What was computed equals what was computed one by one, and what is read back from each
    // cache equals what was computed.
    let (ro, rp) = (
        one_by_one.target_passes(&refs, &capture, 8).unwrap(),
        packed.target_passes(&refs, &capture, 8).unwrap(),
    );
    for n in 0..seqs.len() {
        assert!(
            ro[n].cached && rp[n].cached,
            "sequence {n} not read from the cache"
        );
        assert_passes_equal(&p[n], &o[n], &format!("seq {n} packed vs one by one"));
        assert_eq!(ro[n].hidden, o[n].hidden, "seq {n}: cache round trip");
        assert_eq!(rp[n].hidden, p[n].hidden, "seq {n}: cache round trip");
        assert_eq!(rp[n].topk, p[n].topk, "seq {n}: cache round trip");
    }

    // And both equal the forward `extract` ran before packing: one KV-cache forward per sequence.
    let m = packed.model().unwrap();
    for (n, s) in seqs.iter().enumerate() {
        let out = m
            .forward(&packed.be, s, &mut m.new_cache(), &capture)
            .unwrap();
        for (i, h) in &p[n].hidden {
            let want = packed.be.to_host(out.captured.get(*i).unwrap()).unwrap();
            let e = diff(&h.to_f32(), &want);
            assert!(
                e.rel <= REL_TOL,
                "seq {n} hs{i}: packed vs forward rel {:.3e}",
                e.rel
            );
        }
        let topk = m.logits_topk(&packed.be, &out.last_hidden, 8).unwrap();
        assert_eq!(p[n].topk.ids, topk.ids, "seq {n}: top-k ids vs forward");
    }
}

/// `extract` without `--out` only caches the hidden states: `target_passes_keeping(.., false)`
/// moves them into the cache entries (no copy) and returns the passes without them. What is
/// cached is the same as when they are kept: read back, every entry equals the kept passes.
#[test]
fn passes_that_give_up_their_hidden_states_cache_the_same_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let kept = session(&tmp.path().join("kept"), DEFAULT_PACK_TOKENS);
    let moved = session(&tmp.path().join("moved"), DEFAULT_PACK_TOKENS);
    let tok = kept.files.tokenizer().unwrap();
    let seqs: Vec<Vec<u32>> = ["Name two rivers.", "Count to five, slowly.", "Hi"]
        .iter()
        .map(|t| tok.encode(t, true).unwrap())
        .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(|s| s.as_slice()).collect();
    let capture = Capture::for_layer_ids(&[1, 15, 27], kept.files.spec.num_layers).unwrap();
    let k = kept
        .target_passes_keeping(&refs, &capture, 8, true)
        .unwrap();
    let m = moved
        .target_passes_keeping(&refs, &capture, 8, false)
        .unwrap();
    for (n, (a, b)) in k.iter().zip(&m).enumerate() {
        assert_eq!(a.hidden.len(), 3, "seq {n}: kept");
        assert!(
            b.hidden.is_empty(),
            "seq {n}: the moved pass still holds its hidden states"
        );
        assert_eq!((&a.ids, &a.topk), (&b.ids, &b.topk), "seq {n}");
    }
    kept.flush_cache().unwrap();
    moved.flush_cache().unwrap();
    assert_eq!(entries(&kept.cache), entries(&moved.cache));
    let back = moved.target_passes(&refs, &capture, 8).unwrap();
    for (n, (a, b)) in k.iter().zip(&back).enumerate() {
        assert!(b.cached, "seq {n} not read from the cache");
        assert_eq!(a.hidden, b.hidden, "seq {n}: cached hidden states");
    }
}

#[test]
fn target_passes_refuse_an_empty_sequence() {
    let tmp = tempfile::tempdir().unwrap();
    let s = session(tmp.path(), DEFAULT_PACK_TOKENS);
    let nl = s.files.spec.num_layers;
    let capture = Capture::for_layer_ids(&[1], nl).unwrap();
    let err = s
        .target_passes(&[&[1, 2, 3], &[]], &capture, 8)
        .err()
        .map(|e| format!("{e:#}"));
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("sequence 1 has no tokens")),
        "{err:?}"
    );
}
