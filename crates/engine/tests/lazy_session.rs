//! Lazy target loading (crates/engine/src/session/mod.rs) and the memory checks (crates/engine/src/session/memory.rs, estimates in crates/engine/src/backend/memory.rs):
//!
//! - a cached rerun never uploads the target: `Session::model_loaded` stays false, and the rerun
//!   still succeeds after the weight file's tensor data were overwritten in place (stamp kept, so
//!   the identity store still vouches for the file; a loader would now read garbage);
//! - an oracle evaluation over cached passes loads nothing either;
//! - with a (fake) small free-memory figure a prompt that cannot fit is refused up front with the
//!   prompt's name and the numbers, before anything is computed; packs are split to fit.

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::memory::WORKSPACE_BYTES;
use draftlens_engine::backend::Backend;
use draftlens_engine::drafter::run::{run_eval, DrafterSpec, RunOptions};
use draftlens_engine::hidden_cache::HiddenCache;
use draftlens_engine::model::Capture;
use draftlens_engine::prompts::PromptSet;
use draftlens_engine::session::{Session, SessionOptions};
use draftlens_results::store::{RunMode, Store};
use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gguf() -> PathBuf {
    root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

const TEXTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived",
];

fn session(model: &Path, cache: &Path) -> Session<CpuBackend> {
    capped(model, cache, None)
}

/// A session whose memory checks assume `free` bytes of free device memory.
fn capped(model: &Path, cache: &Path, free: Option<u64>) -> Session<CpuBackend> {
    let opts = SessionOptions {
        free_memory_override: free,
        ..Default::default()
    };
    Session::load(
        CpuBackend::new(),
        model,
        HiddenCache::open(cache).unwrap(),
        opts,
    )
    .unwrap()
}

fn prompt_ids(s: &Session<CpuBackend>) -> Vec<Vec<u32>> {
    let tok = s.files.tokenizer().unwrap();
    TEXTS.iter().map(|t| tok.encode(t, true).unwrap()).collect()
}

/// Continuations (4 tokens) and target passes (taps 2 and 9, top-8) of [`TEXTS`], as plain data.
type Outcome = (
    Vec<Vec<u32>>,
    Vec<(
        Vec<(usize, std::sync::Arc<draftlens_engine::backend::HostRows>)>,
        Vec<u32>,
    )>,
    Vec<bool>,
);

fn work(s: &Session<CpuBackend>) -> Outcome {
    let prompts = prompt_ids(s);
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let conts = s.continuations(&refs, 4).unwrap();
    let seqs: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&conts)
        .map(|(p, c)| p.iter().chain(&c.ids).copied().collect())
        .collect();
    let srefs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let capture = Capture::hf_indices(vec![2, 9], s.files.spec.num_layers).unwrap();
    let passes = s.target_passes(&srefs, &capture, 8).unwrap();
    (
        conts.into_iter().map(|c| c.ids).collect(),
        passes
            .iter()
            .map(|p| (p.hidden.clone(), p.topk.ids.clone()))
            .collect(),
        passes.iter().map(|p| p.cached).collect(),
    )
}

/// Overwrite the last quarter of the file (tensor data) in place, keeping size, mtime and inode.
fn clobber_tensor_data(path: &Path) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let mut f = OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.seek(SeekFrom::Start(len - len / 4)).unwrap();
    f.write_all(&vec![0xffu8; (len / 4) as usize]).unwrap();
    f.set_modified(mtime).unwrap();
}

#[test]
fn a_cached_rerun_never_loads_the_target() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("smol.gguf");
    fs::copy(gguf(), &model).unwrap();
    let cache = tmp.path().join("cache");

    let first = session(&model, &cache);
    assert!(!first.model_loaded(), "opening uploads nothing");
    let computed = work(&first);
    assert!(first.model_loaded());
    assert_eq!(computed.2, [false, false, false]);

    let second = session(&model, &cache);
    let cached = work(&second);
    assert!(!second.model_loaded(), "everything was cached");
    assert!(!second.head_loaded());
    assert_eq!(cached.2, [true, true, true]);
    assert_eq!((&cached.0, &cached.1), (&computed.0, &computed.1));

    // The weights are now garbage behind an unchanged stamp: the rerun still succeeds with the
    // same results because it never reads them.
    clobber_tensor_data(&model);
    let third = session(&model, &cache);
    let again = work(&third);
    assert!(!third.model_loaded());
    assert_eq!((&again.0, &again.1), (&computed.0, &computed.1));

    // An oracle evaluation over cached passes needs no target weights at all (its passes
    // capture no layers: a first evaluation, on a fresh session, computes them).
    let prompts = tmp.path().join("p.jsonl");
    let lines: Vec<String> = TEXTS
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": format!("p{i}"), "prompt": t}).to_string())
        .collect();
    fs::write(&prompts, lines.join("\n")).unwrap();
    let set = PromptSet::load_path(&prompts).unwrap();
    let store = Store::open(&tmp.path().join("runs.sqlite")).unwrap();
    let opts = RunOptions {
        name: None,
        mode: RunMode::Deployment,
        eval: Default::default(),
        max_new_tokens: 4,
        fail_after: None,
    };
    let oracle = DrafterSpec::Oracle { block_size: 4 };
    fs::copy(gguf(), &model).unwrap();
    let fresh = session(&model, &cache);
    let computed = run_eval(&fresh, &oracle, &set, &opts, &store).unwrap();
    assert!(
        fresh.model_loaded(),
        "the layer-less passes were not cached yet"
    );
    clobber_tensor_data(&model);
    let third = session(&model, &cache);
    let out = run_eval(&third, &oracle, &set, &opts, &store).unwrap();
    assert_eq!(out.prompts, 3);
    assert_eq!(out.metrics, computed.metrics);
    assert!(!third.model_loaded() && !third.head_loaded());
}

#[test]
fn a_prompt_too_long_for_device_memory_is_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let s = session(&gguf(), &cache);
    let mm = s.memory_model();
    // SmolLM2-135M on the CPU: f32 weights, ~135 M parameters.
    assert_eq!(mm.elem, 4);
    assert!(
        (500 << 20..560 << 20).contains(&mm.weights),
        "{}",
        mm.weights
    );
    let ids = prompt_ids(&s);

    // The weights plus the fixed workspace and 100 KiB: not even a short prompt fits.
    let s = capped(
        &gguf(),
        &cache,
        Some(mm.weights + WORKSPACE_BYTES + (100 << 10)),
    );
    let lens: Vec<(&str, usize)> = vec![("short", ids[0].len()), ("story", ids[2].len())];
    let e = s.check_memory(&lens, 64, 2).unwrap_err().to_string();
    assert!(e.starts_with("prompt short: "), "{e}");
    assert!(e.contains(&format!("{} tokens", ids[0].len() + 64)), "{e}");
    assert!(
        e.contains("GiB of device memory") && e.contains("free on cpu"),
        "{e}"
    );
    // The same refusal from the work itself, before the model is loaded.
    let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    let e = s.continuations(&refs, 64).unwrap_err().to_string();
    assert!(
        e.contains("greedy decoding: prompt") && e.contains("nothing was computed"),
        "{e}"
    );
    let capture = Capture::hf_indices(vec![2], s.files.spec.num_layers).unwrap();
    let e = s
        .target_passes(&refs, &capture, 8)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("does not fit in device memory"), "{e}");
    assert!(!s.model_loaded(), "refused before loading anything");

    // Room for the longest sequence alone: the packs are split, and the passes equal those of a
    // session without the limit.
    let longest = ids.iter().map(Vec::len).max().unwrap() as u64;
    // (Decoding it by 0 tokens still holds its KV cache next to the prefill.)
    let need = mm
        .forward_bytes(longest, 1)
        .max(mm.decode_bytes(1, longest, 0));
    let s = capped(&gguf(), &cache, Some(mm.weights + need + 1));
    assert!(s.check_memory(&[("story", longest as usize)], 0, 1).is_ok());
    let budget = s.pack_budget(1);
    assert!(
        budget >= longest as usize && budget < 2 * longest as usize,
        "{budget}"
    );
    let split = s.target_passes(&refs, &capture, 8).unwrap();
    let free = session(&gguf(), &tmp.path().join("cache2"));
    let whole = free.target_passes(&refs, &capture, 8).unwrap();
    for (a, b) in split.iter().zip(&whole) {
        assert_eq!(a.topk.ids, b.topk.ids);
        let (x, y) = (a.hidden[0].1.to_f32(), b.hidden[0].1.to_f32());
        let (x, y) = (x.as_ref(), y.as_ref());
        let num: f32 = x.iter().zip(y).map(|(p, q)| (p - q) * (p - q)).sum();
        let den: f32 = y.iter().map(|q| q * q).sum();
        // Packing changes only f32 summation order.
        assert!((num / den).sqrt() < 1e-5);
    }
    assert_eq!(s.be.name(), "cpu");
}
