//! Progress bars for long steps. Hidden when stderr is not a terminal or when `--json` is used, so
//! scripted output stays clean.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::atomic::{AtomicBool, Ordering};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Turn every progress bar off (the CLI calls this for `--json`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A progress bar with a label and a known length.
pub fn bar(len: u64, label: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    if QUIET.load(Ordering::Relaxed) {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(label.to_string());
    pb
}
