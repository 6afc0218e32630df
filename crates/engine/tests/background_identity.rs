//! The target's identity hashed on background threads (issue 38 item 6, docs/loading.md §2):
//! `TargetIdentity::hash_in_background`, started by `Session::load` on first sight of the weight
//! files and joined by the first need of the identity, while the weights upload.
//!
//! - the identity is the value the sequential hash gives, and the value computed independently
//!   (Python's hashlib over the golden manifest's file hash);
//! - a session on weights never seen uploads them when the identity is first needed (the upload
//!   overlaps the hash), and decodes its continuations before keying them (so does the
//!   decoding); a second session finds the identity remembered, hashes nothing (its
//!   identity survives bytes swapped behind an unchanged stamp) and uploads nothing;
//! - a weight file that changes while it is hashed is one error naming it, every later ask
//!   gives the same error, nothing is cached, and the store never answers a wrong identity;
//! - a weight file that cannot be read is one error naming it.

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::hidden_cache::HiddenCache;
use draftlens_engine::identity::{IdentityStore, BACKGROUND_PHASE, WAIT_PHASE};
use draftlens_engine::model::TargetFiles;
use draftlens_engine::session::{Session, SessionOptions};
use draftlens_engine::util::{sha256_bytes, sha256_file};
use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

mod golden_util;
use golden_util::{golden_model_copy, repo_root};

/// The qwen3 golden folder's identity: sha256 of the hex sha256 of its one `model.safetensors`
/// (`d7b53bd2…` in tests/fixtures/golden/qwen3/manifest.json), computed with Python's hashlib:
/// `hashlib.sha256(b"d7b53bd243542b2187efe83d60316663068fe88dabf7e47bcd6ede7e7f71ead9").hexdigest()`.
const QWEN3_FOLDER_IDENTITY: &str =
    "ea98a2677060520e6ba9d4a28840ca43e087692d83de015180b57b17bd05469a";

/// A copy of the Qwen3.5 golden GGUF (it carries a tokenizer, so a session can key entries).
fn gguf_copy(dir: &Path) -> PathBuf {
    let dst = dir.join("model.gguf");
    fs::copy(
        repo_root().join("tests/fixtures/golden/qwen3_5/model.gguf"),
        &dst,
    )
    .unwrap();
    dst
}

fn open(model: &Path, store: &IdentityStore) -> TargetFiles {
    TargetFiles::open(model)
        .unwrap()
        .with_identity_store(store.clone())
}

fn session(model: &Path, cache: &Path) -> Session<CpuBackend> {
    Session::load(
        CpuBackend::new(),
        model,
        HiddenCache::open(cache).unwrap(),
        SessionOptions::default(),
    )
    .unwrap()
}

/// The identity the way it was always computed, one file after another.
fn sequential_identity(files: &[PathBuf]) -> String {
    let hashes: Vec<String> = files.iter().map(|f| sha256_file(f).unwrap()).collect();
    sha256_bytes(hashes.concat().as_bytes())
}

fn append(path: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

/// Flip one byte near the end of `path` (tensor data), keeping size, mtime and inode.
fn flip_byte_in_place(path: &Path) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = f.metadata().unwrap().len();
    let b = fs::read(path).unwrap()[len as usize - 10] ^ 0x5a;
    f.seek(SeekFrom::Start(len - 10)).unwrap();
    f.write_all(&[b]).unwrap();
    f.set_modified(mtime).unwrap();
}

const PROMPT_LEN: u32 = 24;

fn prompt() -> Vec<u32> {
    (1..PROMPT_LEN).map(|i| (i * 37) % 512).collect()
}

#[test]
fn the_background_identity_is_the_sequential_one() {
    let tmp = tempfile::tempdir().unwrap();
    let model = golden_model_copy("qwen3", tmp.path());
    let store = IdentityStore::new(&tmp.path().join("cache"));

    // One shard: the pinned value.
    let f = open(&model, &store);
    f.identity.hash_in_background();
    assert!(f.identity.hashing_in_background());
    assert_eq!(f.identity.weights_sha256().unwrap(), QWEN3_FOLDER_IDENTITY);
    assert!(!f.identity.hashing_in_background(), "joined");
    assert_eq!(store.files_hashed(), 1);

    // Two shards (a second *.safetensors file counts, in name order): the sequential value, and
    // the value of the hash done on the spot as before (no store, no background).
    fs::copy(
        repo_root().join("tests/fixtures/golden/qwen3/golden.safetensors"),
        model.join("zz-extra.safetensors"),
    )
    .unwrap();
    let files = [
        model.join("model.safetensors"),
        model.join("zz-extra.safetensors"),
    ];
    let want = sequential_identity(&files);
    assert_ne!(want, QWEN3_FOLDER_IDENTITY);
    let f = open(&model, &store);
    assert_eq!(f.identity.weight_files, files);
    f.identity.hash_in_background();
    assert_eq!(f.identity.weights_sha256().unwrap(), want);
    // The first shard's hash was remembered: only the new one was read.
    assert_eq!(store.files_hashed(), 2);
    let on_the_spot = TargetFiles::open(&model).unwrap();
    assert_eq!(on_the_spot.identity.weights_sha256().unwrap(), want);
    // Remembered now: a later open starts nothing.
    let f = open(&model, &store);
    f.identity.hash_in_background();
    assert!(!f.identity.hashing_in_background());
    assert_eq!(f.identity.weights_sha256().unwrap(), want);
    assert_eq!(store.files_hashed(), 2);

    // GGUF: the file's own hash.
    let gguf = gguf_copy(tmp.path());
    let f = open(&gguf, &store);
    f.identity.hash_in_background();
    assert!(f.identity.hashing_in_background());
    assert_eq!(
        f.identity.weights_sha256().unwrap(),
        sha256_file(&gguf).unwrap()
    );
}

#[test]
fn a_session_on_new_weights_uploads_them_while_they_hash_and_a_second_hashes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = gguf_copy(tmp.path());
    let cache = tmp.path().join("cache");
    let want = sha256_file(&model).unwrap();

    let first = session(&model, &cache);
    assert!(first.files.identity.hashing_in_background());
    assert!(!first.model_loaded(), "opening uploads nothing");
    // The identity's first need uploads the model (while the hash runs), then waits for it.
    assert_eq!(first.target_sha256().unwrap(), want);
    assert!(first.model_loaded());
    assert!(!first.files.identity.hashing_in_background());
    let computed = first.continuation(&prompt(), 6).unwrap();
    first.flush_cache().unwrap();

    // The timeline shows the hash as work in the background, and the main thread's wait.
    let report = draftlens_engine::timeline::report();
    assert!(
        report.background.iter().any(|p| p.name == BACKGROUND_PHASE),
        "{}",
        report.render()
    );
    assert!(
        report.phases.iter().any(|p| p.name == WAIT_PHASE),
        "{}",
        report.render()
    );

    // Bytes swapped behind an unchanged stamp: a second session still answers the remembered
    // identity, which it could only do without reading the file; it starts no hash and, its
    // entries cached, uploads nothing.
    drop(first);
    flip_byte_in_place(&model);
    assert_ne!(sha256_file(&model).unwrap(), want);
    let second = session(&model, &cache);
    assert!(!second.files.identity.hashing_in_background());
    assert_eq!(second.target_sha256().unwrap(), want);
    assert_eq!(second.continuation(&prompt(), 6).unwrap().ids, computed.ids);
    assert!(!second.model_loaded(), "everything was cached");
}

/// On first sight of the weights, `continuations` decodes first and keys its entries afterwards
/// (the hash overlaps the decoding instead of being waited for before it): the continuations
/// equal those of a session that keyed first (on another copy, its identity joined up front), and
/// the entries land under the identity the hash gives: a second session, the identity remembered,
/// keys first and finds every one without uploading the model.
#[test]
fn on_first_sight_continuations_are_decoded_first_and_keyed_under_the_identity() {
    let tmp = tempfile::tempdir().unwrap();
    let model = gguf_copy(tmp.path());
    let cache = tmp.path().join("cache");
    let other: Vec<u32> = (1..PROMPT_LEN + 9).map(|i| (i * 53) % 509).collect();
    let prompts = [prompt(), other];
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();

    let first = session(&model, &cache);
    assert!(first.keys_after_decoding(), "first sight: decode, then key");
    let decoded_first = first.continuations(&refs, 6).unwrap();
    assert!(
        !first.keys_after_decoding(),
        "the entries' keys joined the hash"
    );
    first.flush_cache().unwrap();
    drop(first);

    let copy_dir = tmp.path().join("copy");
    fs::create_dir(&copy_dir).unwrap();
    let keyed = session(&gguf_copy(&copy_dir), &copy_dir.join("cache"));
    keyed.target_sha256().unwrap();
    assert!(!keyed.keys_after_decoding());
    let keyed_first = keyed.continuations(&refs, 6).unwrap();

    let second = session(&model, &cache);
    assert!(
        !second.keys_after_decoding(),
        "identity remembered: look up first"
    );
    let cached = second.continuations(&refs, 6).unwrap();
    assert!(
        !second.model_loaded(),
        "every entry was found under its key"
    );
    for ((a, b), c) in decoded_first.iter().zip(&keyed_first).zip(&cached) {
        assert_eq!(a.ids, b.ids);
        assert_eq!(a.ids, c.ids);
    }
}

#[test]
fn a_weight_file_changed_while_hashed_is_one_error_and_no_wrong_identity_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let model = golden_model_copy("qwen3", tmp.path());
    // A second shard, hashed for the identity but not read by the loader (the folder's
    // model.safetensors holds every tensor): it may change without breaking the open.
    let extra = model.join("zz-extra.safetensors");
    fs::copy(
        repo_root().join("tests/fixtures/golden/qwen3/golden.safetensors"),
        &extra,
    )
    .unwrap();
    let files = [model.join("model.safetensors"), extra.clone()];
    let before = sequential_identity(&files);
    let store = IdentityStore::new(&tmp.path().join("cache"));
    let size = fs::metadata(&extra).unwrap().len();

    // Stamped when the hash starts; grown by 16 bytes before it is joined.
    let f = open(&model, &store);
    f.identity.hash_in_background();
    append(&extra, &[0u8; 16]);
    let e = f.identity.weights_sha256().unwrap_err().to_string();
    assert!(
        e.contains("zz-extra.safetensors: the file changed while"),
        "{e}"
    );
    assert!(
        e.contains(&format!("size {size} → {} bytes", size + 16)),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    // Asked again: the same error, never an identity.
    assert_eq!(f.identity.weights_sha256().unwrap_err().to_string(), e);
    assert!(f.identity.to_json().is_err());
    // A new open hashes the file as it is now: the store never answers the old bytes' hash
    // for the new stamp.
    let now = sequential_identity(&files);
    assert_ne!(now, before);
    assert_eq!(open(&model, &store).identity.weights_sha256().unwrap(), now);

    // Through a session: the work fails with that error and nothing is cached.
    let gguf = gguf_copy(tmp.path());
    let cache = tmp.path().join("session-cache");
    let s = session(&gguf, &cache);
    append(&gguf, &[0u8; 32]);
    let e = format!("{:#}", s.continuation(&prompt(), 4).unwrap_err());
    assert!(e.contains("model.gguf: the file changed while"), "{e}");
    s.flush_cache().unwrap();
    assert!(HiddenCache::open(&cache)
        .unwrap()
        .list()
        .unwrap()
        .is_empty());
}

#[test]
fn an_unreadable_weight_file_is_one_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let model = golden_model_copy("qwen3", tmp.path());
    let extra = model.join("zz-extra.safetensors");
    let store = IdentityStore::new(&tmp.path().join("cache"));

    // A shard that cannot be read (a folder by that name: it opens, but reading fails, also for
    // root).
    fs::create_dir(&extra).unwrap();
    let f = open(&model, &store);
    f.identity.hash_in_background();
    assert!(f.identity.hashing_in_background());
    let e = f.identity.weights_sha256().unwrap_err().to_string();
    assert!(e.contains("zz-extra.safetensors: read failed"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert_eq!(f.identity.weights_sha256().unwrap_err().to_string(), e);

    // A shard gone between the open and the hash: nothing starts in the background, and the
    // identity's first need says which file.
    fs::remove_dir(&extra).unwrap();
    fs::write(&extra, b"not read").unwrap();
    let f = open(&model, &store);
    fs::remove_file(&extra).unwrap();
    f.identity.hash_in_background();
    assert!(!f.identity.hashing_in_background());
    let e = format!("{:#}", f.identity.weights_sha256().unwrap_err());
    assert!(
        e.contains("zz-extra.safetensors: cannot resolve the path"),
        "{e}"
    );
}
