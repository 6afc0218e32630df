//! Memory planning of a session's target work: the memory model of this target on this backend,
//! the device memory free for it, the up-front refusals of a model or prompts that cannot fit,
//! and the budgets derived from it (tokens per packed forward, bytes of taps kept on the device).
//! The estimates themselves are `backend/memory.rs`'s (one rule, `MemoryModel::estimate`).

use super::Session;
use crate::backend::memory::{does_not_fit, gib, Estimate, MemoryModel};
use crate::backend::Backend;
use crate::prompts::Prompt;
use anyhow::{bail, Result};

impl<B: Backend> Session<B> {
    /// The memory estimates' view of this target on this backend (`backend/memory.rs`): the
    /// weights counted from the config (what the loader uploads), in the backend's dtype (MXFP4
    /// experts, a folder's or a GGUF's, packed where the backend keeps them so).
    pub fn memory_model(&self) -> MemoryModel {
        MemoryModel::with_mxfp4_experts(
            &self.files.spec,
            self.be.dtype(),
            self.be.mxfp4_packed(),
            self.files.mxfp4_experts(),
        )
    }

    /// [`MemoryModel::estimate`] of this target on this backend: decoding `batch` prompts of up
    /// to `prompt` tokens by `new` tokens, then the target pass capturing `taps` states.
    pub fn memory_estimate(
        &self,
        batch: usize,
        prompt: usize,
        new: usize,
        taps: usize,
    ) -> Estimate {
        self.memory_model()
            .estimate(batch as u64, prompt as u64, new as u64, taps as u64)
    }

    /// The backend's free device memory ([`super::SessionOptions::free_memory_override`] when
    /// set: the tests' seam); `None` when the backend cannot tell (CPU): no check is made.
    fn free_memory(&self) -> Option<u64> {
        self.opts
            .free_memory_override
            .or_else(|| self.be.free_memory())
    }

    /// Device bytes free for activations and KV caches once the weights are uploaded: the
    /// backend's free memory less the weights not uploaded yet. `None` when the backend cannot
    /// tell (CPU): no check is made.
    pub fn available_memory(&self) -> Option<u64> {
        let free = self.free_memory()?;
        let pending = if self.model_loaded() {
            0
        } else {
            self.memory_model().weights
        };
        Some(free.saturating_sub(pending))
    }

    /// Refuse, before anything is uploaded, a target whose weights and workspace alone exceed
    /// the free device memory: no batch, pack or prompt length could make it fit. The one-line
    /// error names the model and gives [`Session::memory_estimate`] at `batch`, `prompt`, `new`,
    /// `taps` term by term, and the free memory. Nothing to check once the model is loaded or
    /// when the backend cannot tell its free memory.
    pub fn check_model_fits(
        &self,
        batch: usize,
        prompt: usize,
        new: usize,
        taps: usize,
    ) -> Result<()> {
        let Some(free) = self.free_memory().filter(|_| !self.model_loaded()) else {
            return Ok(());
        };
        let est = self.memory_estimate(batch, prompt, new, taps);
        if est.weights_exceed(free) {
            let path = &self.files.identity.path;
            let name = path
                .file_name()
                .unwrap_or(path.as_os_str())
                .to_string_lossy();
            let model = format!("{name} ({})", self.files.spec.arch.as_str());
            bail!(does_not_fit(&model, self.be.name(), &est, free));
        }
        Ok(())
    }

    /// Refuse, before any work, a model that cannot fit at all ([`Session::check_model_fits`],
    /// its estimate shown at the decode batch and the longest prompt), then prompts whose target
    /// work cannot fit in device memory: each `(name, prompt tokens)` is decoded by up to
    /// `max_new` tokens ([`Session::continuations`]) and then run through one forward of
    /// `prompt + max_new` rows capturing `taps` hidden states ([`Session::target_passes`]; packs
    /// are split to fit, but one sequence cannot be). The error names the prompt and the numbers.
    pub fn check_memory(
        &self,
        prompts: &[(&str, usize)],
        max_new: usize,
        taps: usize,
    ) -> Result<()> {
        let Some(avail) = self.available_memory() else {
            return Ok(());
        };
        let longest = prompts.iter().map(|p| p.1).max().unwrap_or(0);
        self.check_model_fits(self.gen_batch(), longest, max_new, taps)?;
        let mm = self.memory_model();
        for &(name, len) in prompts {
            let rows = (len + max_new) as u64;
            let forward = mm.forward_bytes(rows, taps as u64);
            let decode = mm.decode_bytes(1, len as u64, max_new as u64);
            let (what, need) = if forward >= decode {
                ("one target forward over", forward)
            } else {
                ("greedy decoding of", decode)
            };
            if need > avail {
                bail!(
                    "prompt {name}: {what} its {rows} tokens ({len} prompt + up to {max_new} new) needs about {} of device memory, but only {} are free on {} after the weights ({}); nothing was computed. Shorten or drop the prompt, or lower --max-new-tokens (at most about {} tokens fit)",
                    gib(need),
                    gib(avail),
                    self.be.name(),
                    gib(mm.weights),
                    mm.max_rows(avail, taps as u64)
                );
            }
        }
        Ok(())
    }

    /// [`Session::check_memory`] for a prompt set (tokenized here; nothing to do when the
    /// backend cannot tell its free memory).
    pub fn check_prompts_fit(&self, prompts: &[Prompt], max_new: usize, taps: usize) -> Result<()> {
        if self.available_memory().is_none() {
            return Ok(());
        }
        let ids = self.prompt_ids_many(prompts)?;
        let lens: Vec<(&str, usize)> = prompts
            .iter()
            .zip(&ids)
            .map(|(p, ids)| (p.id.as_str(), ids.len()))
            .collect();
        self.check_memory(&lens, max_new, taps)
    }

    /// The most tokens one packed forward capturing `taps` states may take:
    /// [`super::SessionOptions::pack_tokens`], lowered to what fits in
    /// [`Session::available_memory`].
    pub fn pack_budget(&self, taps: usize) -> usize {
        match self.available_memory() {
            Some(avail) => {
                let fit = self.memory_model().max_rows(avail, taps as u64) as usize;
                self.opts.pack_tokens.min(fit.max(1))
            }
            None => self.opts.pack_tokens,
        }
    }

    /// Bytes the resident store may hold ([`super::SessionOptions::resident_tap_bytes`]), decided
    /// at its first use (after the model is loaded, so that the device's free memory is what is
    /// left beside the weights).
    pub(super) fn resident_budget(&self) -> usize {
        let mut r = self.resident();
        *r.budget.get_or_insert_with(|| {
            self.opts.resident_tap_bytes.unwrap_or_else(|| {
                self.be
                    .free_memory()
                    .map(|free| (free / 8) as usize)
                    .unwrap_or(0)
            })
        })
    }

    /// [`Session::gen_batch`] lowered so that decoding the missed prompts (`misses`: indices
    /// into `prompts`) together fits in device memory; an error naming the prompt when even one
    /// alone does not fit.
    pub(super) fn decode_batch(
        &self,
        prompts: &[&[u32]],
        misses: &[usize],
        max_new: usize,
    ) -> Result<usize> {
        let batch = self.gen_batch();
        let (Some(avail), Some(longest)) = (
            self.available_memory(),
            misses.iter().map(|n| prompts[*n].len()).max(),
        ) else {
            return Ok(batch);
        };
        let mm = self.memory_model();
        let need = |b: usize| mm.decode_bytes(b as u64, longest as u64, max_new as u64);
        if need(1) > avail {
            // A model whose weights alone do not fit is named as such, with its numbers.
            self.check_model_fits(batch, longest, max_new, 0)?;
            let n = misses
                .iter()
                .find(|n| prompts[**n].len() == longest)
                .map_or(0, |n| *n);
            bail!(
                "greedy decoding: prompt {n} ({longest} tokens + up to {max_new} new) needs about {} of device memory, only {} are free after the weights; nothing was computed",
                gib(need(1)),
                gib(avail)
            );
        }
        Ok((1..=batch).rev().find(|&b| need(b) <= avail).unwrap_or(1))
    }
}
