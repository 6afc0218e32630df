//! Test support: the built-in plugins (the bytes embedded in draftlens-plugin-host, written to
//! files) and the hostile test guests, built for wasm32-unknown-unknown (and wasm32-wasip2 for
//! the WASI probe; once per test process, cargo caches across runs).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use draftlens_plugin_host::{Limits, Runtime, RuntimeConfig};

/// Built-in plugins: (crate directory under plugins/, wasm file stem).
pub const BUILTINS: &[&str] = &[
    "accept-length",
    "acceptance",
    "ddtree",
    "masked-accuracy",
    "replayed-tau",
    "sampling",
    "top1-accuracy",
    "topk",
];
pub const GUESTS: &[&str] = &[
    "hostile",
    "contract-v020",
    "contract-v011",
    "imports-wasi",
    "liar",
    "bigname",
    "imports-other",
    "describe-loop",
];
/// Test guests built for wasm32-wasip2 (Rust std imports WASI).
pub const WASIP2_GUESTS: &[&str] = &["wasi-probe"];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Folder holding the built components.
fn built() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // A target dir of its own: the outer `cargo test` holds the lock of the main one.
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../wasm-guests");
        std::fs::create_dir_all(&target).unwrap();
        let target = target.canonicalize().unwrap();
        let sysroot = String::from_utf8(
            Command::new("rustc")
                .args(["--print", "sysroot"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let vv =
            String::from_utf8(Command::new("rustc").arg("-vV").output().unwrap().stdout).unwrap();
        let host = vv
            .lines()
            .find_map(|l| l.strip_prefix("host: "))
            .unwrap()
            .to_string();
        let ld = Path::new(sysroot.trim())
            .join("lib/rustlib")
            .join(&host)
            .join("bin/wasm-component-ld");
        assert!(
            ld.exists(),
            "{} is missing: the toolchain must ship wasm-component-ld",
            ld.display()
        );
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace_root())
            .args(["build", "--release", "--target", "wasm32-unknown-unknown"])
            .env("CARGO_TARGET_DIR", &target)
            .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", &ld)
            // The outer test build's flags (coverage, profiles) must not leak into the guests.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS");
        for g in GUESTS {
            cmd.args(["-p", &format!("guest-{g}")]);
        }
        let out = cmd.output().expect("running cargo for the wasm guests");
        assert!(
            out.status.success(),
            "building the wasm guests failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // wasm32-wasip2 links with rustup's wasm-component-ld by default.
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace_root())
            .args(["build", "--release", "--target", "wasm32-wasip2"])
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS");
        for g in WASIP2_GUESTS {
            cmd.args(["-p", &format!("guest-{g}")]);
        }
        let out = cmd.output().expect("running cargo for the wasip2 guests");
        assert!(
            out.status.success(),
            "building the wasm32-wasip2 guests failed (rustup target add wasm32-wasip2):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target
    })
}

/// Path of built-in plugin `name` (e.g. "accept-length"): the embedded bytes, in a file.
pub fn builtin(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("builtins-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        for b in draftlens_plugin_host::builtins::builtins() {
            std::fs::write(d.join(format!("{}.wasm", b.name)), b.wasm).unwrap();
        }
        d
    });
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.is_file(), "no built-in plugin {name}");
    p
}

/// Path of test guest `name` (e.g. "hostile", "wasi-probe").
pub fn guest(name: &str) -> PathBuf {
    let target = if WASIP2_GUESTS.contains(&name) {
        "wasm32-wasip2"
    } else {
        "wasm32-unknown-unknown"
    };
    built()
        .join(target)
        .join("release")
        .join(format!("guest_{}.wasm", name.replace('-', "_")))
}

/// A runtime with test-friendly limits and no cache.
pub fn runtime(time_limit: Duration, memory_mib: usize) -> Runtime {
    Runtime::new(RuntimeConfig {
        limits: Limits {
            time_limit: Some(time_limit),
            memory_bytes: memory_mib << 20,
            ..Limits::default()
        },
        cache_dir: None,
        cache_key_file: None,
    })
    .unwrap()
}
