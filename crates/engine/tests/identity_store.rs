//! The identity store (crates/engine/src/identity.rs): a model is hashed once, not per open; a changed
//! stamp re-hashes; bytes changed in place behind an unchanged stamp are caught by `verify`.
//!
//! "Not re-hashed" is shown two ways: the store's hash counter stays put, and — the honest
//! version — after the file's bytes are swapped in place with size, mtime and inode kept, an open
//! still reports the *old* identity, which it could only do without reading the file.

use draftlens_engine::identity::{IdentityStatus, IdentityStore};
use draftlens_engine::model::TargetFiles;
use draftlens_engine::util::{sha256_bytes, sha256_file};
use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

mod golden_util;
use golden_util::{golden_model_copy, repo_root};

/// The identity of a one-shard folder, computed independently of the store.
fn direct_identity(weights: &Path) -> String {
    sha256_bytes(sha256_file(weights).unwrap().as_bytes())
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
    let mut b = fs::read(path).unwrap()[len as usize - 10];
    b ^= 0x5a;
    f.seek(SeekFrom::Start(len - 10)).unwrap();
    f.write_all(&[b]).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(fs::metadata(path).unwrap().modified().unwrap(), mtime);
}

fn open(model: &Path, store: &IdentityStore) -> TargetFiles {
    TargetFiles::open(model)
        .unwrap()
        .with_identity_store(store.clone())
}

#[test]
fn a_second_open_reuses_the_remembered_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let model = golden_model_copy("qwen3", tmp.path());
    let weights = model.join("model.safetensors");
    let store = IdentityStore::new(&tmp.path().join("cache"));
    let want = direct_identity(&weights);

    // Opening reads headers only: nothing hashed, nothing remembered yet.
    let f = open(&model, &store);
    assert_eq!(store.files_hashed(), 0);
    assert_eq!(f.identity.remembered_sha256(), None);
    assert_eq!(f.identity.weights_sha256().unwrap(), want);
    assert_eq!(store.files_hashed(), 1);
    // Asked again in the same process: kept.
    assert_eq!(f.identity.weights_sha256().unwrap(), want);
    assert_eq!(store.files_hashed(), 1);

    // A new open (another command) finds the record: no read of the weights.
    let f = open(&model, &store);
    assert_eq!(
        f.identity.remembered_sha256().as_deref(),
        Some(want.as_str())
    );
    assert_eq!(f.identity.weights_sha256().unwrap(), want);
    assert_eq!(store.files_hashed(), 1);

    // Bytes swapped in place behind the same stamp: the store still answers the old hash —
    // proof that the open did not read the file. `verify` re-hashes, reports and repairs it.
    flip_byte_in_place(&weights);
    let changed = direct_identity(&weights);
    assert_ne!(changed, want);
    let f = open(&model, &store);
    assert_eq!(f.identity.weights_sha256().unwrap(), want);
    assert_eq!(store.files_hashed(), 1);
    let checks = store.verify().unwrap();
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].path, fs::canonicalize(&weights).unwrap());
    match &checks[0].status {
        IdentityStatus::Repaired { old, new } => {
            // `old` is the file's hash before the flip (the folder identity is its hash).
            assert_eq!(sha256_bytes(old.as_bytes()), want);
            assert_eq!(new, &sha256_file(&weights).unwrap());
        }
        other => panic!("expected a repaired stale identity, got {other:?}"),
    }
    // After the repair the next open reports the real identity, still without hashing.
    let hashed = store.files_hashed();
    assert_eq!(
        open(&model, &store).identity.weights_sha256().unwrap(),
        changed
    );
    assert_eq!(store.files_hashed(), hashed);
    // A second verify finds nothing stale.
    assert_eq!(store.verify().unwrap()[0].status, IdentityStatus::Ok);
}

#[test]
fn a_touched_or_rewritten_file_is_hashed_again() {
    let tmp = tempfile::tempdir().unwrap();
    let model = golden_model_copy("qwen3", tmp.path());
    let weights = model.join("model.safetensors");
    let store = IdentityStore::new(&tmp.path().join("cache"));
    let want = direct_identity(&weights);
    assert_eq!(
        open(&model, &store).identity.weights_sha256().unwrap(),
        want
    );
    assert_eq!(store.files_hashed(), 1);

    // touch: same bytes, new mtime → re-hashed, same identity.
    let f = OpenOptions::new().write(true).open(&weights).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    let files = open(&model, &store);
    assert_eq!(files.identity.remembered_sha256(), None, "stamp changed");
    assert_eq!(files.identity.weights_sha256().unwrap(), want);
    assert_eq!(store.files_hashed(), 2);

    // Rewritten (new inode, different bytes) → re-hashed, new identity.
    let mut bytes = fs::read(&weights).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 1;
    fs::remove_file(&weights).unwrap();
    fs::write(&weights, &bytes).unwrap();
    let got = open(&model, &store).identity.weights_sha256().unwrap();
    assert_eq!(got, direct_identity(&weights));
    assert_ne!(got, want);
    assert_eq!(store.files_hashed(), 3);
}

#[test]
fn the_gguf_identity_is_the_files_own_hash_and_verify_drops_vanished_files() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let store = IdentityStore::new(&tmp.path().join("cache"));
    let f = TargetFiles::open(&gguf)
        .unwrap()
        .with_identity_store(store.clone());
    assert_eq!(
        f.identity.weights_sha256().unwrap(),
        sha256_file(&gguf).unwrap()
    );
    // A copy of a model that is then deleted: its record goes, the other stays.
    let model = golden_model_copy("qwen3", tmp.path());
    open(&model, &store).identity.weights_sha256().unwrap();
    fs::remove_dir_all(&model).unwrap();
    let mut statuses: Vec<IdentityStatus> = store
        .verify()
        .unwrap()
        .into_iter()
        .map(|c| c.status)
        .collect();
    statuses.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(statuses, [IdentityStatus::Missing, IdentityStatus::Ok]);
    assert_eq!(store.verify().unwrap().len(), 1);
}
