//! Builds the built-in metric plugins (plugins/<name>/) for wasm32-unknown-unknown and embeds
//! them in this crate (see src/builtins.rs), so `draftlens` has its built-in plugins wherever it
//! runs and after `cargo install`, without plugins/dist.
//!
//! A nested `cargo build` with its own target folder (`<target>/wasm-builtins`; the outer build
//! holds the lock of the main one), linked by the wasm-component-ld that rustup ships, with the
//! same settings as plugins/build.sh (which uses the same folder, so each reuses the other's
//! work and plugins/dist holds the very bytes embedded here).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The built-in plugins: crate folders under plugins/ (crate `metric-NAME`).
const BUILTINS: &[&str] = &[
    "accept-length",
    "acceptance",
    "ddtree",
    "masked-accuracy",
    "replayed-tau",
    "sampling",
    "top1-accuracy",
    "topk",
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("../..").canonicalize().unwrap();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for dir in [
        "plugins/sdk",
        "plugins/wit",
        "crates/records/src",
        "crates/records/Cargo.toml",
        "Cargo.lock",
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    for b in BUILTINS {
        println!(
            "cargo:rerun-if-changed={}",
            root.join("plugins").join(b).display()
        );
    }
    println!("cargo:rerun-if-env-changed=DRAFTLENS_WASM_TARGET_DIR");

    // <target>/<profile>/build/<pkg>-<hash>/out → <target>; overridable for odd layouts.
    let target = match std::env::var_os("DRAFTLENS_WASM_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => out
            .ancestors()
            .find(|p| p.join("CACHEDIR.TAG").is_file())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| out.join("target"))
            .join("wasm-builtins"),
    };

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let text = |args: &[&str]| -> String {
        Command::new(&rustc)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let sysroot = text(&["--print", "sysroot"]);
    let host = text(&["-vV"])
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .unwrap_or_default();
    // A missing prerequisite is one `error:` line saying what to do, never a panic: cargo shows
    // a `cargo::error=` line as "error: draftlens-plugin-host@…: MESSAGE" and then fails the build
    // with "build script logged errors" (a non-zero exit or a panic would add cargo's "Caused by:
    // process didn't exit successfully" block, the script's whole output and a note about
    // backtraces). scripts/check-first-command.sh runs this script without the target to check it.
    let fail = |msg: String| -> ! {
        println!("cargo::error={msg}");
        std::process::exit(0);
    };
    if !Path::new(&sysroot)
        .join("lib/rustlib/wasm32-unknown-unknown")
        .is_dir()
    {
        fail(
            "the wasm32-unknown-unknown target is not installed, and draftlens embeds its built-in \
             metric plugins built for it: run `rustup target add wasm32-unknown-unknown` and build again"
                .into(),
        );
    }
    let ld = Path::new(&sysroot)
        .join("lib/rustlib")
        .join(&host)
        .join("bin/wasm-component-ld");
    if !ld.is_file() {
        fail(format!(
            "{} is missing: this toolchain does not ship wasm-component-ld (Rust >= 1.82 does), which links \
             the built-in metric plugins",
            ld.display()
        ));
    }

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--release", "--target", "wasm32-unknown-unknown"])
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", &ld)
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        // The outer build's flags and target must not leak into the plugins.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    for b in BUILTINS {
        cmd.args(["-p", &format!("metric-{b}")]);
    }
    // Build-script stdout is read by cargo for directives: cargo's own output goes to stderr.
    let status = cmd.stdout(std::io::stderr()).status().unwrap_or_else(|e| {
        fail(format!(
            "cannot run cargo to build the built-in plugins: {e}"
        ))
    });
    if !status.success() {
        fail(format!(
            "building the built-in metric plugins for wasm32-unknown-unknown failed (cargo's output is above; \
             target folder {})",
            target.display()
        ));
    }

    let mut list = String::from("&[\n");
    for b in BUILTINS {
        let built = target
            .join("wasm32-unknown-unknown/release")
            .join(format!("metric_{}.wasm", b.replace('-', "_")));
        let copy = out.join(format!("{b}.wasm"));
        std::fs::copy(&built, &copy).unwrap_or_else(|e| fail(format!("{}: {e}", built.display())));
        list += &format!(
            "    Builtin {{ name: {b:?}, wasm: include_bytes!({:?}) }},\n",
            copy.display().to_string()
        );
    }
    list += "]\n";
    std::fs::write(out.join("builtins.rs"), list).unwrap();
}
