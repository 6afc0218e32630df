//! The tracked tree stays small enough to travel to the GPU machine: every device call copies all
//! tracked files (plus untracked ones and what it carries) and refuses a tree over 64 MiB, so a
//! tree near that limit leaves no room for the release binary a CUDA check carries, and one more
//! fixture blocks every device call. The budget keeps 2 MiB free for untracked work files; a CUDA
//! check that carries release binaries (~25 MB compressed) moves `drafters/` aside for that call.
//! At 61.6 MiB (session 20: the MoE, gpt-oss and EAGLE-3 goldens) the next large fixture needs a
//! decision: the leaky series' two intermediate checkpoints (13.7 MB, read by no test) are the
//! largest thing that could leave the tree.
//! Run: `cargo test -p draftlens-repo-checks --test tree_size`.

use std::path::Path;
use std::process::Command;

/// At most this many bytes of tracked files (the device transfer's limit is 64 MiB).
const TRACKED_BUDGET: u64 = 62 << 20;

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
    let total: u64 = sizes.iter().map(|(len, _)| len).sum();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let largest: Vec<String> = sizes
        .iter()
        .take(8)
        .map(|(len, path)| format!("  {:>6.2} MiB  {path}", *len as f64 / (1u64 << 20) as f64))
        .collect();
    assert!(
        total <= TRACKED_BUDGET,
        "tracked files weigh {:.2} MiB, over the budget of {} MiB (the GPU machine's transfer \
         limit is 64 MiB for the whole tree): make the new fixture smaller, or store it compressed.\n\
         largest tracked files:\n{}",
        total as f64 / (1u64 << 20) as f64,
        TRACKED_BUDGET >> 20,
        largest.join("\n")
    );
}
