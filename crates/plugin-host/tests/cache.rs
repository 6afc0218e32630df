//! Precompiled artifacts: cached by sha256 of the .wasm plus the engine's compatibility hash,
//! reused on the next load, and rebuilt when damaged.

mod common;

use std::time::Duration;

use draftlens_plugin_host::sdk::testdata::{random, Shape};
use draftlens_plugin_host::{Limits, Runtime, RuntimeConfig};

fn runtime(cache: &std::path::Path, fuel: Option<u64>) -> Runtime {
    Runtime::new(RuntimeConfig {
        limits: Limits {
            time_limit: Some(Duration::from_secs(30)),
            fuel,
            ..Limits::default()
        },
        cache_dir: Some(cache.to_path_buf()),
        // The key lives outside the cache folder (here: next to it, in the test's own folder).
        cache_key_file: Some(cache.join("../cache.key")),
    })
    .unwrap()
}

#[test]
fn compiled_once_then_loaded_from_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let cache = cache.as_path();
    let wasm = common::builtin("accept-length");
    let batch = random(3, &Shape::new(16, 8, 4, 10, 100), 0.7, 0.2);

    let rt = runtime(cache, None);
    let cold = rt.load(&wasm).unwrap();
    assert!(!cold.from_cache);
    let artifact = rt.cache_path(cache, &cold.sha256);
    assert!(artifact.is_file(), "{} written", artifact.display());
    let name = artifact.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with(&cold.sha256) && name.ends_with(".cwasm"),
        "{name}"
    );
    let want = rt.evaluate(&cold, &[], &batch).unwrap();

    // A new runtime (a later draftlens process) finds it.
    let rt2 = runtime(cache, None);
    let warm = rt2.load(&wasm).unwrap();
    assert!(warm.from_cache);
    assert_eq!(rt2.evaluate(&warm, &[], &batch).unwrap(), want);

    // A fuel-instrumented engine compiles different code: different key, no reuse.
    let rt3 = runtime(cache, Some(1 << 40));
    let fueled = rt3.load(&wasm).unwrap();
    assert!(!fueled.from_cache);
    assert_ne!(rt3.cache_path(cache, &fueled.sha256), artifact);
    assert_eq!(rt3.evaluate(&fueled, &[], &batch).unwrap(), want);

    // A damaged artifact is ignored and rewritten.
    std::fs::write(&artifact, b"garbage").unwrap();
    let rt4 = runtime(cache, None);
    let again = rt4.load(&wasm).unwrap();
    assert!(!again.from_cache);
    assert_eq!(rt4.evaluate(&again, &[], &batch).unwrap(), want);
    assert!(
        runtime(cache, None).load(&wasm).unwrap().from_cache,
        "rewritten"
    );
}

/// Flipped bytes in a cached artifact (same length, valid header, so wasmtime's own checks
/// pass: this crashed the host with SIGSEGV before artifacts carried a tag) are never
/// deserialized: the plugin is recompiled, gives the same values, and the artifact is rewritten.
/// An artifact tagged under another key (another account's, or a forger's) is refused alike.
#[test]
fn a_tampered_artifact_is_recompiled_never_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let wasm = common::builtin("ddtree");
    let batch = random(4, &Shape::new(16, 8, 4, 10, 100), 0.7, 0.2);
    let rt = runtime(&cache, None);
    let cold = rt.load(&wasm).unwrap();
    let want = rt.evaluate(&cold, &[], &batch).unwrap();
    let artifact = rt.cache_path(&cache, &cold.sha256);
    let good = std::fs::read(&artifact).unwrap();

    // Flip bytes in the code, past the header.
    let mut bad = good.clone();
    for i in (good.len() / 3..good.len() / 3 + 4096).step_by(7) {
        bad[i] ^= 0xa5;
    }
    std::fs::write(&artifact, &bad).unwrap();
    let rt2 = runtime(&cache, None);
    let p = rt2.load(&wasm).unwrap();
    assert!(!p.from_cache, "a tampered artifact must not be used");
    assert_eq!(rt2.evaluate(&p, &[], &batch).unwrap(), want);
    assert_eq!(std::fs::read(&artifact).unwrap(), good, "rewritten");

    // The same artifact with a tag made under another key: refused.
    let other = Runtime::new(RuntimeConfig {
        limits: Limits {
            time_limit: Some(Duration::from_secs(30)),
            ..Limits::default()
        },
        cache_dir: Some(cache.clone()),
        cache_key_file: Some(tmp.path().join("other.key")),
    })
    .unwrap();
    assert!(!other.load(&wasm).unwrap().from_cache);
    // ... and it rewrote the artifact under its key, which the first key refuses in turn.
    assert_ne!(std::fs::read(&artifact).unwrap(), good);
    assert!(!runtime(&cache, None).load(&wasm).unwrap().from_cache);
    assert!(runtime(&cache, None).load(&wasm).unwrap().from_cache);
}
