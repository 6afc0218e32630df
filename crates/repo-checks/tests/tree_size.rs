//! The tracked tree stays small enough to travel to the GPU machine: every device call copies the
//! tracked files (plus untracked ones and what it carries) and refuses a tree over 64 MiB. The
//! shipped drafter series (`drafters/`, demo data the device never needs) stay home during device
//! calls (`tools/device/drafters-stay-home.sh on|off`), so the budget below counts every tracked
//! file outside `drafters/`; it keeps 24 MiB of the 64 free for what a call carries (a compressed
//! release binary is ~25 MB, a GGUF part 33 MB). `drafters/` has its own budget: it is cloned by
//! every user and compiled into the release binary (`crates/cli/src/setup/assets.rs`).
//! Run: `cargo test -p draftlens-repo-checks --test tree_size`.

use std::path::Path;
use std::process::Command;

/// At most this many bytes of tracked files outside `drafters/` (the device transfer's limit is 64 MiB).
const TRACKED_BUDGET: u64 = 40 << 20;
/// At most this many bytes under `drafters/` (a clone's size, and the binary's).
const DRAFTERS_BUDGET: u64 = 100 << 20;

#[test]
fn tracked_files_fit_the_device_transfer_budget() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = match Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&root)
        .output()
    {
        Ok(o) if o.status.success() => o.stdout,
        // A source tarball without git (or without the git binary) has nothing to measure.
        _ => return eprintln!("tree_size: not a git checkout, nothing checked"),
    };
    let mut sizes: Vec<(u64, String)> = out
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let path = String::from_utf8_lossy(p).into_owned();
            // A file deleted in the working tree but not yet in the index does not travel.
            let len = std::fs::metadata(root.join(&path)).ok()?.len();
            Some((len, path))
        })
        .collect();
    let drafters: u64 = sizes
        .iter()
        .filter(|(_, p)| p.starts_with("drafters/"))
        .map(|(len, _)| len)
        .sum();
    sizes.retain(|(_, p)| !p.starts_with("drafters/"));
    let total: u64 = sizes.iter().map(|(len, _)| len).sum();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let largest: Vec<String> = sizes
        .iter()
        .take(8)
        .map(|(len, path)| format!("  {:>6.2} MiB  {path}", *len as f64 / (1u64 << 20) as f64))
        .collect();
    assert!(
        total <= TRACKED_BUDGET,
        "tracked files outside drafters/ weigh {:.2} MiB, over the budget of {} MiB (the GPU \
         machine's transfer limit is 64 MiB for the whole tree): make the new fixture smaller, or \
         store it compressed.\n\
         largest tracked files:\n{}",
        total as f64 / (1u64 << 20) as f64,
        TRACKED_BUDGET >> 20,
        largest.join("\n")
    );
    assert!(
        drafters <= DRAFTERS_BUDGET,
        "drafters/ weighs {:.2} MiB, over its budget of {} MiB: ship fewer checkpoints per series",
        drafters as f64 / (1u64 << 20) as f64,
        DRAFTERS_BUDGET >> 20
    );
}
