//! `plugins new`: the scaffolded crate passes its own test, builds to a component, and that
//! component loads and runs in the sandbox.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use draftlens_plugin_host::scaffold::{new_plugin, write_lock_file};
use draftlens_plugin_host::sdk::testdata::{oracle, Shape};

fn cargo(dir: &Path, args: &[&str], envs: &[(&str, &Path)]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args(args)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    // Match the workspace's release profile, so the wasm dependencies built for the test guests
    // (same target folder) are reused instead of rebuilt with LTO.
    for (k, v) in [
        ("CARGO_PROFILE_RELEASE_LTO", "false"),
        ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16"),
        ("CARGO_PROFILE_RELEASE_STRIP", "none"),
    ] {
        cmd.env(k, v);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "cargo {args:?} in {} failed:\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn scaffolded_plugin_builds_passes_its_test_and_runs() {
    // The guests' target folder also holds the wasm build of wit-bindgen: build them first.
    let hostile = common::guest("hostile");
    let target = hostile
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    // The default: the SDK vendored into the crate, by a relative path, and a lock file.
    let krate = new_plugin("my-metric", dir.path(), None).unwrap();
    write_lock_file(&krate).unwrap();
    let lock = std::fs::read_to_string(krate.join("Cargo.lock")).unwrap();
    assert!(
        lock.contains("name = \"draftlens-plugin-sdk\"") && lock.contains("name = \"wit-bindgen\""),
        "{lock}"
    );

    cargo(
        &krate,
        &["test", "--quiet"],
        &[("CARGO_TARGET_DIR", &target)],
    );

    let sysroot = String::from_utf8(
        Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let vv = String::from_utf8(Command::new("rustc").arg("-vV").output().unwrap().stdout).unwrap();
    let host = vv.lines().find_map(|l| l.strip_prefix("host: ")).unwrap();
    let ld = Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(host)
        .join("bin/wasm-component-ld");
    cargo(
        &krate,
        &["build", "--release", "--target", "wasm32-unknown-unknown"],
        &[
            ("CARGO_TARGET_DIR", &target),
            ("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", &ld),
        ],
    );
    let wasm = target.join("wasm32-unknown-unknown/release/my_metric.wasm");

    let rt = common::runtime(Duration::from_secs(30), 64);
    let plugin = rt.load(&wasm).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.metadata.name, "my-metric");
    assert!(
        plugin
            .imports
            .iter()
            .all(|i| i.starts_with("draftlens:metric/")),
        "{:?}",
        plugin.imports
    );
    // B = 8: τ = 8 except for the 7 last anchors of each prompt, cut by the sequence end.
    let batch = oracle(&Shape::new(8, 2, 2, 5, 100));
    let v = rt.evaluate(&plugin, &[], &batch).unwrap();
    let tau = v.iter().find(|v| v.name == "tau").unwrap();
    assert_eq!(tau.count, 200);
    assert!(
        tau.value.unwrap() > 7.0 && tau.value.unwrap() < 8.0,
        "{tau:?}"
    );
}
