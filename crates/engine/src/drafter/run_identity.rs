//! Which evaluation a run is, defined once (docs/scale-out.md §2). [`RunIdentity`] is read from
//! the session, the drafter, the prompt set and the run's options, and gives everything a run
//! stores about itself: the run row ([`RunIdentity::new_run`], whose settings JSON is
//! [`RunIdentity::config`]) and the evaluation identity ([`RunIdentity::eval_identity`], whose
//! sha256 `draftlens merge` compares across shards and machines). An option that can change a
//! number of a run is added here, to all three at once.
//!
//! The stored forms are pinned byte for byte (`crates/cli/tests/cli_run_identity.rs`): changing a
//! field's text or order changes every identity, and shards computed before the change would no
//! longer merge with shards computed after it.

use super::config::DrafterFamily;
use super::eval::{EvalOptions, Labels};
use crate::backend::Backend;
use crate::identity::IdentityStore;
use crate::prompts::PromptSet;
use crate::session::Session;
use anyhow::{Context, Result};
use draftlens_results::shard::{code_version, EvalIdentity, Shard, SHARD_NAME_SEP};
use draftlens_results::store::{NewRun, RunEval, RunMode, TrainStyle};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What to evaluate.
#[derive(Clone, Debug)]
pub enum DrafterSpec {
    Checkpoint {
        dir: PathBuf,
        step: Option<u64>,
        series: String,
    },
    Oracle {
        block_size: usize,
    },
    AntiOracle {
        block_size: usize,
    },
    /// The target's own MTP head drafting `steps` tokens a round (`--drafter target:mtp[:K]`,
    /// docs/mtp.md).
    Mtp {
        steps: usize,
    },
}

impl DrafterSpec {
    /// The kind stored with a run: a checkpoint's is its family, from its config.json.
    pub fn kind(&self) -> Result<DrafterKind> {
        Ok(match self {
            DrafterSpec::Checkpoint { dir, .. } => match DrafterFamily::detect(dir)? {
                DrafterFamily::DFlash => DrafterKind::Checkpoint,
                DrafterFamily::Eagle3 => DrafterKind::Eagle3,
                DrafterFamily::DFlash2 => DrafterKind::DFlash2,
            },
            DrafterSpec::Oracle { .. } => DrafterKind::Oracle,
            DrafterSpec::AntiOracle { .. } => DrafterKind::AntiOracle,
            DrafterSpec::Mtp { .. } => DrafterKind::Mtp,
        })
    }

    /// The built-in drafter `--drafter NAME` names (`builtin:oracle`, `builtin:anti-oracle`,
    /// with blocks of `block_size`; `target:mtp[:K]`, the target's MTP head); `Ok(None)` when
    /// `name` is not one (a checkpoint path), an error for a `target:mtp:K` whose K is invalid.
    pub fn builtin(name: &str, block_size: usize) -> anyhow::Result<Option<DrafterSpec>> {
        if let Some(steps) = super::mtp::steps_of_name(name) {
            return Ok(Some(DrafterSpec::Mtp { steps: steps? }));
        }
        Ok(DrafterKind::builtin(name).and_then(|kind| match kind {
            DrafterKind::Oracle => Some(DrafterSpec::Oracle { block_size }),
            DrafterKind::AntiOracle => Some(DrafterSpec::AntiOracle { block_size }),
            DrafterKind::Checkpoint
            | DrafterKind::Eagle3
            | DrafterKind::DFlash2
            | DrafterKind::Mtp => None,
        }))
    }
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub name: Option<String>,
    pub mode: RunMode,
    pub eval: EvalOptions,
    pub max_new_tokens: usize,
    /// Stop after this many prompts (used by tests that interrupt a run part-way).
    pub fail_after: Option<usize>,
}

/// What kind of drafter a run evaluates, named as the evaluation identity's `drafter_kind`
/// stores it. A built-in drafter's name is also what `--drafter` takes and what its runs store
/// as their drafter path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrafterKind {
    /// A DFlash checkpoint folder.
    #[serde(rename = "checkpoint")]
    Checkpoint,
    /// An EAGLE-3 checkpoint folder (docs/eagle3.md).
    #[serde(rename = "eagle3")]
    Eagle3,
    /// A DFlash2 checkpoint folder (docs/dflash2.md).
    #[serde(rename = "dflash2")]
    DFlash2,
    /// The known-answer drafter whose top-1 is always the target token.
    #[serde(rename = "builtin:oracle")]
    Oracle,
    /// The known-answer drafter whose top-1 is never the target token.
    #[serde(rename = "builtin:anti-oracle")]
    AntiOracle,
    /// The target's own MTP head (docs/mtp.md).
    #[serde(rename = "mtp")]
    Mtp,
}

impl DrafterKind {
    /// The drafters `--drafter` names instead of a checkpoint folder.
    pub const BUILTIN: [DrafterKind; 2] = [DrafterKind::Oracle, DrafterKind::AntiOracle];

    pub fn as_str(self) -> &'static str {
        match self {
            DrafterKind::Checkpoint => "checkpoint",
            DrafterKind::Eagle3 => "eagle3",
            DrafterKind::DFlash2 => "dflash2",
            DrafterKind::Oracle => "builtin:oracle",
            DrafterKind::AntiOracle => "builtin:anti-oracle",
            DrafterKind::Mtp => "mtp",
        }
    }

    /// The built-in drafter called `name` (`builtin:oracle`, `builtin:anti-oracle`), if it is one.
    pub fn builtin(name: &str) -> Option<DrafterKind> {
        Self::BUILTIN.into_iter().find(|k| k.as_str() == name)
    }
}

/// Hashes (or finds remembered) the target's weight files and every checkpoint's weights at once,
/// in parallel, so that the runs of a series do not each stop to hash their checkpoint (an 8B
/// target's 5-layer drafter is 2 GB, about 2 s of sha256 per checkpoint, one after another) and
/// the target's identity is ready for the first cache key. Errors are left for the step that
/// needs the hash, which reports them with its own context.
pub fn prewarm_identities<B: Backend>(s: &Session<B>, specs: &[DrafterSpec]) {
    use rayon::prelude::*;
    let _phase = crate::timeline::phase("identity hashing");
    let store = IdentityStore::new(s.cache.root());
    let files: Vec<PathBuf> = specs
        .iter()
        .filter_map(|spec| match spec {
            DrafterSpec::Checkpoint { dir, .. } => Some(super::gguf::weights_file(dir)),
            _ => None,
        })
        .filter(|w| w.exists())
        .collect();
    let target = &s.files.identity;
    rayon::join(
        || {
            // Left running when hashed in the background since `Session::load`: the first need
            // (`Session::target_sha256`) joins it while the weights upload.
            if !target.hashing_in_background() {
                let _ = target.weights_sha256();
            }
        },
        || {
            files.par_iter().for_each(|w| {
                let _ = store.file_sha256(w);
            })
        },
    );
}

/// The drafter's part of a run's identity.
#[derive(Clone, Debug)]
pub struct DrafterIdentity {
    pub kind: DrafterKind,
    /// The checkpoint folder as given, or the built-in drafter's name.
    pub path: String,
    /// sha256 of the checkpoint's `model.safetensors`, from the identity store ("" for a
    /// built-in drafter or a checkpoint without that file).
    pub weights_sha256: String,
    /// sha256 of the checkpoint's `config.json` ("" for a built-in drafter).
    pub config_sha256: String,
    /// The series its runs belong to (a built-in drafter's is its name without `builtin:`).
    pub series: String,
    pub step: Option<i64>,
    pub block_size: usize,
}

impl DrafterIdentity {
    /// The identity of `spec`, whose block size is `block_size`; a checkpoint's weights are
    /// hashed once per file version (`store`), like the target's.
    /// `target_weights_sha256` is what an MTP head's weights hash is (its tensors are the
    /// target's; unused for other drafters).
    pub fn of(
        spec: &DrafterSpec,
        block_size: usize,
        store: &IdentityStore,
        target_weights_sha256: &str,
    ) -> Result<Self> {
        let kind = spec.kind()?;
        Ok(match spec {
            DrafterSpec::Checkpoint { dir, step, series } => {
                // A GGUF drafter is one file: its weights hash is the file's, its config the
                // translated config.json (`super::gguf`).
                let weights = super::gguf::weights_file(dir);
                let weights_sha256 = if weights.exists() {
                    store.file_sha256(&weights)?
                } else {
                    String::new()
                };
                let config_bytes = if super::gguf::is_gguf(dir) {
                    super::gguf::GgufDrafter::open(dir)?.config_bytes()
                } else {
                    let config = dir.join("config.json");
                    std::fs::read(&config)
                        .with_context(|| format!("{}: cannot read", config.display()))?
                };
                DrafterIdentity {
                    kind,
                    path: dir.display().to_string(),
                    weights_sha256,
                    config_sha256: crate::util::sha256_bytes(&config_bytes),
                    series: series.clone(),
                    step: step.map(|s| s as i64),
                    block_size,
                }
            }
            DrafterSpec::Oracle { .. } | DrafterSpec::AntiOracle { .. } => DrafterIdentity {
                kind,
                path: kind.as_str().into(),
                weights_sha256: String::new(),
                config_sha256: String::new(),
                series: kind.as_str().trim_start_matches("builtin:").into(),
                step: None,
                block_size,
            },
            // The head is stored in the target's files, which the run's identity already holds:
            // its records are cached under the target's weights and K.
            DrafterSpec::Mtp { steps } => DrafterIdentity {
                kind,
                path: super::mtp::drafter_name(*steps),
                weights_sha256: target_weights_sha256.to_owned(),
                config_sha256: crate::util::sha256_bytes(
                    super::mtp::drafter_name(*steps).as_bytes(),
                ),
                series: "mtp".into(),
                step: None,
                block_size,
            },
        })
    }

    /// What a checkpoint's records are cached under: the hash of its weights and of its config.
    /// `None` for the built-in drafters (never cached) and a checkpoint without weights file.
    pub fn records_sha(&self) -> Option<String> {
        let checkpoint = matches!(
            self.kind,
            DrafterKind::Checkpoint | DrafterKind::Eagle3 | DrafterKind::DFlash2 | DrafterKind::Mtp
        );
        (checkpoint && !self.weights_sha256.is_empty())
            .then(|| format!("{}+config:{}", self.weights_sha256, self.config_sha256))
    }
}

/// Everything a run stores about which evaluation it is (see the module doc).
#[derive(Clone, Debug)]
pub struct RunIdentity {
    /// `--name`, else `SERIES/CHECKPOINT · PROMPT SET · MODE`; a shard's ends with ` · shard I/N`.
    pub name: String,
    pub drafter: DrafterIdentity,
    pub mode: RunMode,
    pub eval: EvalOptions,
    pub max_new_tokens: usize,
    pub shard: Option<Shard>,
    target_path: String,
    target_sha256: String,
    target_arch: String,
    /// The target's identity as the settings store it (`TargetIdentity::to_json`).
    target_json: serde_json::Value,
    /// The tokenizer's fingerprint (vocabulary, special tokens, chat template).
    tokenizer: String,
    prompt_set_name: String,
    /// The prompt file, or `builtin:NAME`.
    prompt_source: PathBuf,
    /// sha256 of the whole prompt file (before `--limit`).
    prompt_set_sha256: String,
    /// Prompts of the evaluated set (after `--limit`): the prompts the shards partition.
    set_prompts: u32,
    /// Prompts this run evaluates (its shard's; the whole set when unsharded).
    run_prompts: u32,
    backend: &'static str,
    dtype: &'static str,
    /// The Gated DeltaNet profile of a hybrid target (`None` for a dense one).
    gdn_profile: Option<&'static str>,
    /// The workload slice of the prompts (docs/slices.md); stored only when not the default.
    slice: crate::slices::Slice,
}

impl RunIdentity {
    /// The identity of a run of `drafter` on `set` (of which it evaluates `run_prompts`
    /// prompts) with `opts`, as shard `shard` when given. Reads the target's weights hash
    /// (hashing them if no earlier step did).
    pub fn new<B: Backend>(
        s: &Session<B>,
        drafter: DrafterIdentity,
        set: &PromptSet,
        opts: &RunOptions,
        shard: Option<Shard>,
        run_prompts: usize,
    ) -> Result<Self> {
        let target = &s.files.identity;
        // A slice the target's template cannot honour is refused before any run is created.
        crate::slices::check_set(set, s.files.tokenizer()?)?;
        let name = opts.name.clone().unwrap_or_else(|| {
            let checkpoint = Path::new(&drafter.path)
                .file_name()
                .map(|x| x.to_string_lossy().to_string())
                .unwrap_or(drafter.path.clone());
            let name = format!(
                "{}/{checkpoint} · {} · {}",
                drafter.series,
                set.name,
                opts.mode.as_str()
            );
            // A sliced run says its slice; a default run's name is as it always was.
            match set.slice.is_default() {
                true => name,
                false => format!("{name} · {}", set.slice),
            }
        });
        let name = match shard {
            Some(sh) => format!("{name}{SHARD_NAME_SEP}{sh}"),
            None => name,
        };
        Ok(RunIdentity {
            name,
            drafter,
            mode: opts.mode,
            eval: opts.eval.clone(),
            max_new_tokens: opts.max_new_tokens,
            shard,
            target_path: target.path.display().to_string(),
            target_json: target.to_json()?,
            target_sha256: target.weights_sha256()?,
            target_arch: target.arch.clone(),
            tokenizer: s.files.tokenizer()?.fingerprint(),
            prompt_set_name: set.name.clone(),
            prompt_source: set.source.clone(),
            prompt_set_sha256: set.sha256.clone(),
            set_prompts: set.prompts.len() as u32,
            run_prompts: run_prompts as u32,
            backend: s.be.name(),
            dtype: s.be.dtype(),
            gdn_profile: s.gdn_profile_name(),
            slice: set.slice.clone(),
        })
    }

    /// The run's settings as stored with it (`run.config_json`, the UI's config diff). The key
    /// order is part of the stored text.
    pub fn config(&self) -> serde_json::Value {
        let mut config = serde_json::json!({
            "eval": self.eval, "max_new_tokens": self.max_new_tokens, "mode": self.mode.as_str(),
            "target": self.target_json, "drafter": self.drafter.path, "prompts": self.prompt_source,
            "backend": self.backend, "gdn_profile": self.gdn_profile,
        });
        if let Some(sh) = self.shard {
            config["shard"] = serde_json::json!(sh.to_string());
        }
        // Appended last and only when set, so a default run's settings text is unchanged.
        if let Some(slice) = self.slice.to_stored() {
            config["slice"] = slice;
        }
        config
    }

    /// The evaluation identity: equal for every shard of one evaluation.
    pub fn eval_identity(&self) -> Result<EvalIdentity> {
        Ok(EvalIdentity {
            target_sha256: self.target_sha256.clone(),
            target_arch: self.target_arch.clone(),
            tokenizer: self.tokenizer.clone(),
            drafter_kind: self.drafter.kind.as_str().into(),
            drafter_sha256: self.drafter.weights_sha256.clone(),
            drafter_config_sha256: self.drafter.config_sha256.clone(),
            block_size: self.drafter.block_size as u32,
            prompt_set_sha256: self.prompt_set_sha256.clone(),
            prompts: self.set_prompts,
            mode: self.mode.as_str().into(),
            eval: serde_json::to_value(&self.eval)?,
            max_new_tokens: self.max_new_tokens as u32,
            backend: self.backend.into(),
            dtype: self.dtype.into(),
            gdn_profile: self.gdn_profile.map(String::from),
            code_version: code_version(),
            slice: self.slice.to_stored(),
        })
    }

    /// The run's evaluation row: the identity with its sha256, the shard and its prompt counts.
    pub fn run_eval(&self) -> Result<RunEval> {
        let identity = self.eval_identity()?;
        Ok(RunEval {
            identity: identity.sha256(),
            identity_json: serde_json::to_value(&identity)?,
            shard: self.shard,
            set_prompts: self.set_prompts,
            run_prompts: self.run_prompts,
            merged_from: None,
        })
    }

    /// The run row as created (before any record is stored).
    pub fn new_run(&self) -> NewRun {
        // Only a train-style run records its label source and mask rule.
        let train_style = (self.mode == RunMode::TrainStyle).then(|| TrainStyle {
            labels: match self.eval.labels {
                Labels::Target => "target".into(),
                Labels::Data => "data".into(),
            },
            mask_rule: if self.eval.ctx_inclusive {
                "inclusive".into()
            } else {
                "strict".into()
            },
        });
        NewRun {
            name: self.name.clone(),
            mode: self.mode,
            config: self.config(),
            target_path: self.target_path.clone(),
            target_sha256: self.target_sha256.clone(),
            target_arch: self.target_arch.clone(),
            drafter_path: self.drafter.path.clone(),
            drafter_sha256: self.drafter.weights_sha256.clone(),
            drafter_series: self.drafter.series.clone(),
            drafter_step: self.drafter.step,
            prompt_set_name: self.prompt_set_name.clone(),
            prompt_set_sha256: self.prompt_set_sha256.clone(),
            backend: self.backend.into(),
            dtype: self.dtype.into(),
            block_size: self.drafter.block_size as u32,
            top_k: self.eval.top_k as u32,
            train_style,
            tokenizer_sha256: Some(self.tokenizer.clone()),
            drafter_family: draftlens_results::store::drafter_family_of_kind(
                self.drafter.kind.as_str(),
            )
            .into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind's serde name is its `as_str`, and both are the strings stored before the kind
    /// was a type (identities stored then must still compare equal).
    #[test]
    fn drafter_kind_strings_are_the_stored_ones() {
        for (kind, s) in [
            (DrafterKind::Checkpoint, "checkpoint"),
            (DrafterKind::Eagle3, "eagle3"),
            (DrafterKind::Oracle, "builtin:oracle"),
            (DrafterKind::AntiOracle, "builtin:anti-oracle"),
        ] {
            assert_eq!(kind.as_str(), s);
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(s));
            assert_eq!(
                serde_json::from_value::<DrafterKind>(s.into()).unwrap(),
                kind
            );
        }
        assert_eq!(
            DrafterKind::builtin("builtin:oracle"),
            Some(DrafterKind::Oracle)
        );
        assert_eq!(
            DrafterKind::builtin("builtin:anti-oracle"),
            Some(DrafterKind::AntiOracle)
        );
        assert_eq!(DrafterKind::builtin("checkpoint"), None);
        assert_eq!(DrafterKind::builtin("eagle3"), None);
        assert_eq!(DrafterKind::builtin("ckpt/step-1"), None);
    }

    /// A checkpoint's records key joins its weights' and config's hashes; built-in drafters and
    /// a checkpoint without weights have none.
    #[test]
    fn records_sha_of_each_drafter() {
        let id = |kind, weights: &str| DrafterIdentity {
            kind,
            path: "p".into(),
            weights_sha256: weights.into(),
            config_sha256: "c".into(),
            series: "s".into(),
            step: None,
            block_size: 4,
        };
        assert_eq!(
            id(DrafterKind::Checkpoint, "w").records_sha().as_deref(),
            Some("w+config:c")
        );
        assert_eq!(
            id(DrafterKind::Eagle3, "w").records_sha().as_deref(),
            Some("w+config:c")
        );
        assert_eq!(id(DrafterKind::Checkpoint, "").records_sha(), None);
        assert_eq!(id(DrafterKind::Oracle, "").records_sha(), None);
    }
}
