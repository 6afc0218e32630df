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
    })
    .unwrap()
}

#[test]
fn compiled_once_then_loaded_from_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    let wasm = common::builtin("accept-length");
    let batch = random(3, &Shape::new(16, 8, 4, 10, 100), 0.7, 0.2);

    let rt = runtime(cache.path(), None);
    let cold = rt.load(&wasm).unwrap();
    assert!(!cold.from_cache);
    let artifact = rt.cache_path(cache.path(), &cold.sha256);
    assert!(artifact.is_file(), "{} written", artifact.display());
    let name = artifact.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with(&cold.sha256) && name.ends_with(".cwasm"),
        "{name}"
    );
    let want = rt.evaluate(&cold, &[], &batch).unwrap();

    // A new runtime (a later draftlens process) finds it.
    let rt2 = runtime(cache.path(), None);
    let warm = rt2.load(&wasm).unwrap();
    assert!(warm.from_cache);
    assert_eq!(rt2.evaluate(&warm, &[], &batch).unwrap(), want);

    // A fuel-instrumented engine compiles different code: different key, no reuse.
    let rt3 = runtime(cache.path(), Some(1 << 40));
    let fueled = rt3.load(&wasm).unwrap();
    assert!(!fueled.from_cache);
    assert_ne!(rt3.cache_path(cache.path(), &fueled.sha256), artifact);
    assert_eq!(rt3.evaluate(&fueled, &[], &batch).unwrap(), want);

    // A damaged artifact is ignored and rewritten.
    std::fs::write(&artifact, b"garbage").unwrap();
    let rt4 = runtime(cache.path(), None);
    let again = rt4.load(&wasm).unwrap();
    assert!(!again.from_cache);
    assert_eq!(rt4.evaluate(&again, &[], &batch).unwrap(), want);
    assert!(
        runtime(cache.path(), None).load(&wasm).unwrap().from_cache,
        "rewritten"
    );
}
