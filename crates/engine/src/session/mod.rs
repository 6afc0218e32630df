//! A loaded target on one backend, with the two cached steps every evaluation starts from:
//! the target's greedy continuation of a prompt, and one teacher-forced target pass over
//! prompt + continuation that yields the captured hidden states and the target's own top-K.
//!
//! The target's weights are uploaded lazily: [`Session::load`] opens the files (headers,
//! tokenizer) only, and the first cache miss loads the model ([`Session::model`]). A rerun whose
//! continuations, hidden states and top-K are all cached never reads a weight byte; a DFlash
//! drafter then needs only the embedding and LM head ([`Session::draft_target`]).
//!
//! How the session runs its work (pack size, decode batch, memory figures, GDN profile) is a
//! [`SessionOptions`] fixed at [`Session::load`]; memory planning is `memory.rs`, the cache keys
//! `keys.rs`, the cache entries' layout `entries.rs`, the taps kept on the device `resident.rs`. Which backend runs
//! is chosen before a session exists (`crate::backend::dispatch`).

mod entries;
mod keys;
mod memory;
mod resident;

pub use entries::Packer;
use entries::{continuation_tensors, decode_continuation, decode_pass, PassEntry};
pub use keys::MODEL_CODE_VERSION;
pub use resident::ResidentPass;
use resident::ResidentTaps;

use crate::backend::memory::gib;
use crate::backend::{Backend, GdnProfile, HostRows, TopK};
use crate::chat::ChatMessage;
use crate::generate::{greedy_batch, Continuation};
use crate::hidden_cache::writer::CacheWriter;
use crate::hidden_cache::{CacheKey, CachedTensor, HiddenCache, Lookup};
use crate::identity::IdentityStore;
use crate::model::{Capture, EmbedHead, TargetFiles, TargetHead, TargetModel};
use crate::prompts::Prompt;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Default token budget of one packed target forward ([`SessionOptions::pack_tokens`]): 16k rows fill
/// an H200 (docs/cuda.md) and keep the CPU's activations small.
pub const DEFAULT_PACK_TOKENS: usize = 16384;

/// Most prompts decoded together by [`Session::continuations`] on a backend whose rows are
/// independent (at most [`Backend::max_independent_rows`]). Each decode step reads every weight
/// once for the whole batch, so the batch is as large as the CUDA decode kernels allow (64): on
/// the H200 an 8B target's step takes 17.5 ms for 64 prompts against 12.7 ms for 32
/// (docs/benchmarks-cuda.md, "Decode"), a third less decode time per prompt, and on the 2-core
/// CPU 64 HumanEval prompts × 128 tokens
/// take 87 / 73 / 67 s at 16 / 32 / 64 (docs/benchmarks.md). The KV caches of 64 prompts are small
/// next to the weights; the memory check lowers the batch where they are not.
pub const DEFAULT_GEN_BATCH: usize = 64;

/// How a session runs its target work, given to [`Session::load`] and read-only afterwards (the
/// GDN profile aside: [`Session::set_gdn_profile`]). None of them changes a cache key but the
/// GDN profile.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Most tokens per packed target forward in [`Session::target_passes`] (a longer sequence
    /// runs alone). Packing changes only f32 summation order, never the cache key.
    pub pack_tokens: usize,
    /// Most prompts decoded together by [`Session::continuations`] where the backend allows it
    /// (see [`Session::gen_batch`]).
    pub gen_batch: usize,
    /// Free device memory (bytes) the memory checks assume instead of asking the backend: tests
    /// on the CPU, or a user capping what a run may take.
    pub free_memory_override: Option<u64>,
    /// Numeric profile of the hybrids' Gated DeltaNet core (docs/hybrid-models.md). Part of the
    /// cache key and recorded with every run, because a drafter evaluated on the other profile
    /// sees other hidden states.
    pub gdn_profile: GdnProfile,
    /// Bytes of device memory for taps kept between a target pass and the drafters that read
    /// them ([`Session::target_passes_for_drafting`]). None: an eighth of the device's free
    /// memory once the model is loaded, where the backend reports device memory (CUDA); nothing
    /// on the CPU, whose "device" memory is the host's.
    pub resident_tap_bytes: Option<usize>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            pack_tokens: DEFAULT_PACK_TOKENS,
            gen_batch: DEFAULT_GEN_BATCH,
            free_memory_override: None,
            gdn_profile: GdnProfile::Reference,
            resident_tap_bytes: None,
        }
    }
}

/// The teacher-forced target pass over one sequence.
pub struct TargetPass {
    /// The sequence (prompt + continuation).
    pub ids: Vec<u32>,
    /// Captured hidden states, `(HF index, [T × D] row-major)`, in the order asked for, in the
    /// backend's compute dtype (bf16 on CUDA: taps are never widened on their way to the drafter).
    /// Shared with the cache entry being written ([`PassEntry`]) instead of copied for it.
    pub hidden: Vec<(usize, Arc<HostRows>)>,
    pub hidden_size: usize,
    /// The target's own top-K next-token prediction at every position (row t predicts t+1).
    pub topk: TopK,
    /// True when the pass came from the cache.
    pub cached: bool,
}

impl TargetPass {
    pub fn hidden(&self, index: usize) -> Option<&HostRows> {
        self.hidden
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, h)| h.as_ref())
    }
}

/// A target opened on a backend, with its tokenizer and the hidden-state cache; the weights are
/// uploaded on first need. `be`, `files` and `cache` are public for reading (callers run the
/// drafter on `be`, read the spec and tokenizer from `files`, find the identity store beside
/// `cache`); nothing assigns them after [`Session::load`].
pub struct Session<B: Backend> {
    pub be: B,
    pub files: TargetFiles,
    /// The whole target, loaded by the first [`Session::model`] call.
    model: OnceLock<TargetModel<B>>,
    /// Embedding + LM head only, loaded by [`Session::draft_target`] while the whole model is not.
    head: OnceLock<TargetHead<B>>,
    /// Serialises the two loads above (a `OnceLock` cannot run a fallible initialiser).
    loading: Mutex<()>,
    pub cache: HiddenCache,
    opts: SessionOptions,
    /// Stores the target passes' cache entries on a background thread ([`Session::flush_cache`]
    /// reports its errors).
    writer: CacheWriter,
    /// Token ids of the prompts tokenized so far, by [`Prompt::hash`] (what the model sees):
    /// the runs of a series tokenize each prompt once.
    prompt_ids_memo: Mutex<std::collections::HashMap<String, Vec<u32>>>,
    /// Continuations decoded by this session, by cache-key digest: their entries go to the disk
    /// through the background writer, and a later lookup must not miss one still queued.
    recent_continuations: Mutex<std::collections::HashMap<String, Continuation>>,
    /// Taps kept on the device for the next drafter ([`SessionOptions::resident_tap_bytes`]).
    resident: Mutex<ResidentTaps<B::Tensor>>,
}

/// A target pass and, when its taps are still on the device, those taps.
pub type DraftingPass<T> = (TargetPass, Option<Arc<ResidentPass<T>>>);

impl<B: Backend> Session<B> {
    /// Open `target` (headers and tokenizer; no weights are read or uploaded yet) to run with
    /// `opts`. Weight hashes are remembered in `cache`'s identity store.
    pub fn load(be: B, target: &Path, cache: HiddenCache, opts: SessionOptions) -> Result<Self> {
        let _phase = crate::timeline::phase("open target");
        let files =
            TargetFiles::open(target)?.with_identity_store(IdentityStore::new(cache.root()));
        // A tensor the loader cannot read is refused now, not after part of the model is uploaded.
        crate::model::load::check_readable(files.weights.as_ref())?;
        // On first sight of the weight files their hash starts now, on background threads, and
        // overlaps whatever comes before the first cache key ([`Session::target_sha256`]).
        // `DRAFTLENS_IDENTITY_HASH=foreground` keeps the old order (hash, then upload): the A/B
        // switch of the cold-start measurement (tools/bench/cold_identity_device.sh).
        if std::env::var("DRAFTLENS_IDENTITY_HASH").as_deref() != Ok("foreground") {
            files.identity.hash_in_background();
        }
        Ok(Session {
            be,
            files,
            model: OnceLock::new(),
            head: OnceLock::new(),
            loading: Mutex::new(()),
            opts,
            writer: CacheWriter::new(cache.clone()),
            cache,
            prompt_ids_memo: Mutex::new(Default::default()),
            recent_continuations: Mutex::new(Default::default()),
            resident: Mutex::new(ResidentTaps::default()),
        })
    }

    /// The options this session was loaded with (the GDN profile as last set).
    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    /// Wait until every cache entry computed so far is on disk; the first error of any of them.
    /// Commands call it before reporting success (entries are written in the background).
    pub fn flush_cache(&self) -> Result<()> {
        let _phase = crate::timeline::phase("cache write (wait)");
        self.writer.flush()
    }

    /// The target on the backend, uploading its weights on the first call (refused first, with
    /// the numbers, when its weights cannot fit in the device's free memory:
    /// [`Session::check_model_fits`]; commands that run prompts check that earlier, at their batch
    /// and longest prompt).
    pub fn model(&self) -> Result<&TargetModel<B>> {
        if let Some(m) = self.model.get() {
            return Ok(m);
        }
        let _guard = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = self.model.get() {
            return Ok(m);
        }
        self.check_model_fits(0, 0, 0, 0)?;
        let _phase = crate::timeline::phase("load target");
        let t = Instant::now();
        let mut m = TargetModel::load(&self.be, &self.files.spec, self.files.weights.as_ref())?;
        m.set_gdn_profile(self.opts.gdn_profile);
        tracing::info!(
            "loaded the target {} on {} in {:.1} s",
            self.files.identity.path.display(),
            self.be.name(),
            t.elapsed().as_secs_f64()
        );
        Ok(self.model.get_or_init(|| m))
    }

    /// The target's identity (what cache keys and runs store), for a caller that will need the
    /// model should its lookups miss, its memory already checked (`run` after
    /// `check_prompts_fit`): on first sight of the weights their upload overlaps the hash
    /// ([`Session::load_while_hashing`]).
    pub fn target_sha256(&self) -> Result<String> {
        self.load_while_hashing();
        self.files.identity.weights_sha256()
    }

    /// On first sight of the weight files, which are being hashed in the background since
    /// [`Session::load`], upload the model now, while the hash runs, instead of after it: the
    /// lookups the identity is needed for will miss and load it anyway, because cache entries
    /// are keyed by the hash of the bytes and bytes never hashed before have none, unless the
    /// same bytes were hashed under another path or stamp (a copy, a `touch`, a wiped identity
    /// store: docs/loading.md §2), the one case where this upload is not needed. Callers call it
    /// only where their work's memory check passes with every lookup missing, so that a
    /// refusal still comes before anything is uploaded. An upload that fails here is left to
    /// the step that needs the model, which reports it.
    fn load_while_hashing(&self) {
        if self.files.identity.hashing_in_background() && !self.model_loaded() {
            if let Err(e) = self.model() {
                tracing::debug!("target not loaded while its weights were hashed: {e:#}");
            }
        }
    }

    /// Whether the target's weights have been uploaded (a fully cached command never does).
    pub fn model_loaded(&self) -> bool {
        self.model.get().is_some()
    }

    /// Whether the embedding/LM-head-only part ([`TargetHead`]) has been uploaded.
    pub fn head_loaded(&self) -> bool {
        self.head.get().is_some()
    }

    /// What a drafter needs of the target (embedding and LM head): the whole model when it is
    /// loaded, else just those two matrices, loaded on first call. (Should a later cache miss
    /// load the whole model, both copies stay on the device; the drafter keeps using this one.)
    pub fn draft_target(&self) -> Result<&dyn EmbedHead<B>> {
        if let Some(m) = self.model.get() {
            return Ok(m);
        }
        if let Some(h) = self.head.get() {
            return Ok(h);
        }
        let _guard = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = self.head.get() {
            return Ok(h);
        }
        let _phase = crate::timeline::phase("load target head");
        let t = Instant::now();
        let h = TargetHead::load(&self.be, &self.files.spec, self.files.weights.as_ref())?;
        tracing::info!(
            "loaded the target's embedding and LM head on {} in {:.1} s",
            self.be.name(),
            t.elapsed().as_secs_f64()
        );
        Ok(self.head.get_or_init(|| h))
    }

    /// Switch the Gated DeltaNet profile, also of an already loaded model, so one upload can
    /// serve both profiles (`draftlens parity`); the one option that changes after
    /// [`Session::load`]. Cache keys follow the profile.
    pub fn set_gdn_profile(&mut self, profile: GdnProfile) {
        self.opts.gdn_profile = profile;
        if let Some(m) = self.model.get_mut() {
            m.set_gdn_profile(profile);
        }
    }

    /// The GDN profile's name as runs record it (`None` for a dense target, which has no GDN).
    pub fn gdn_profile_name(&self) -> Option<&'static str> {
        self.files
            .spec
            .hybrid
            .as_ref()
            .map(|_| match self.opts.gdn_profile {
                GdnProfile::Reference => "reference",
                GdnProfile::Engine => "engine",
            })
    }

    /// Look up many entries at once, on all cores (after this session's queued writes of
    /// these keys; other queued writes go on).
    pub fn cache_get_many(&self, keys: &[CacheKey]) -> Result<Vec<Option<Vec<CachedTensor>>>> {
        use rayon::prelude::*;
        self.writer.wait_for(keys);
        keys.par_iter().map(|k| self.cache.get(k)).collect()
    }

    /// Queue an entry for the background cache writer ([`Session::flush_cache`] reports errors).
    pub fn cache_put(
        &self,
        key: CacheKey,
        tensors: impl FnOnce() -> Vec<CachedTensor> + Send + 'static,
    ) -> Result<()> {
        self.writer.put(&self.cache, key, tensors)
    }

    /// Token ids of a prompt: chat prompts go through the model's own chat template with the
    /// generation prompt; raw prompts are encoded as they are (BOS as the tokenizer says).
    pub fn prompt_ids(&self, p: &Prompt) -> Result<Vec<u32>> {
        let mut ids = self.prompt_ids_many(std::slice::from_ref(p))?;
        Ok(ids.pop().expect("one prompt, one sequence"))
    }

    /// [`Session::prompt_ids`] of several prompts: those not tokenized before in this session
    /// are tokenized in parallel (a 151k-token BPE over hundreds of chat prompts is a visible
    /// part of a cached run otherwise).
    pub fn prompt_ids_many(&self, prompts: &[Prompt]) -> Result<Vec<Vec<u32>>> {
        use rayon::prelude::*;
        let _phase = crate::timeline::phase("tokenize");
        let hashes: Vec<String> = prompts.iter().map(Prompt::hash).collect();
        let missing: Vec<usize> = {
            let memo = self
                .prompt_ids_memo
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            (0..prompts.len())
                .filter(|&i| !memo.contains_key(&hashes[i]))
                .collect()
        };
        if !missing.is_empty() {
            let tok = self.files.tokenizer()?;
            let fresh = missing
                .par_iter()
                .map(|&i| tokenize_prompt(tok, &prompts[i]))
                .collect::<Result<Vec<_>>>()?;
            let mut memo = self
                .prompt_ids_memo
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for (&i, ids) in missing.iter().zip(fresh) {
                memo.insert(hashes[i].clone(), ids);
            }
        }
        let memo = self
            .prompt_ids_memo
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Ok(hashes.iter().map(|h| memo[h].clone()).collect())
    }

    /// Tokens that end generation.
    pub fn eos_ids(&self) -> Vec<u32> {
        let mut e = self
            .files
            .tokenizer
            .as_ref()
            .map(|t| t.eos_ids())
            .unwrap_or_default();
        e.extend(&self.files.spec.eos_token_ids);
        e.sort_unstable();
        e.dedup();
        e
    }

    /// The target's greedy continuation of `prompt` (cached by prompt ids and `max_new`).
    pub fn continuation(&self, prompt: &[u32], max_new: usize) -> Result<Continuation> {
        let mut c = self.continuations(&[prompt], max_new)?;
        c.pop().context("continuation missing")
    }

    /// How many prompts [`Session::continuations`] decodes together: [`SessionOptions::gen_batch`],
    /// capped by [`Backend::max_independent_rows`] (up to that many rows a continuation cannot
    /// depend on its batch-mates; CPU: no cap, CUDA: 64).
    pub fn gen_batch(&self) -> usize {
        self.opts
            .gen_batch
            .max(1)
            .min(self.be.max_independent_rows().max(1))
    }

    /// Each prompt's token ids ([`Session::prompt_ids`]) with its greedy continuation
    /// ([`Session::continuations`], decoded together).
    pub fn prompts_with_continuations(
        &self,
        prompts: &[Prompt],
        max_new: usize,
    ) -> Result<Vec<(Vec<u32>, Continuation)>> {
        let ids = self.prompt_ids_many(prompts)?;
        let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        let conts = self.continuations(&refs, max_new)?;
        Ok(ids.into_iter().zip(conts).collect())
    }

    /// The greedy continuations of several prompts, in order. Each is looked up in the cache under
    /// the same key as [`Session::continuation`]; the misses are decoded
    /// [`Session::gen_batch`] at a time ([`greedy_batch`]) and stored one entry per prompt.
    ///
    /// On first sight of the weights ([`Session::keys_after_decoding`]) nothing is looked up: the
    /// prompts are decoded and their entries keyed afterwards (each batch's once the hash is done,
    /// the rest at the end), so that the weights' hash, running in the background since
    /// [`Session::load`], overlaps the decoding instead of being waited for.
    pub fn continuations(&self, prompts: &[&[u32]], max_new: usize) -> Result<Vec<Continuation>> {
        let eos = self.eos_ids();
        let key_of = |prompt: &[u32]| {
            self.key(
                "greedy",
                prompt,
                vec![],
                format!("max_new={max_new};eos={eos:?}"),
            )
        };
        // First sight of the weights: upload them while they hash if decoding every prompt fits.
        let every: Vec<usize> = (0..prompts.len()).collect();
        let fits = !prompts.is_empty() && self.decode_batch(prompts, &every, max_new).is_ok();
        let decode_first = fits && self.keys_after_decoding();
        if fits {
            self.load_while_hashing();
        }
        let mut out: Vec<Option<Continuation>> = vec![None; prompts.len()];
        // (prompt, its key when it was looked up)
        let mut misses: Vec<(usize, Option<CacheKey>)> = Vec::new();
        if decode_first {
            misses.extend(every.iter().map(|&n| (n, None)));
        } else {
            let _lookups = crate::timeline::phase("cache read");
            for (n, prompt) in prompts.iter().enumerate() {
                let key = key_of(prompt)?;
                // Decoded earlier in this session (its entry may still be queued for the disk).
                let recent = self
                    .recent_continuations
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key.digest())
                    .cloned();
                let hit = match recent {
                    Some(c) => Some(c),
                    None => match self.cache.lookup(&key)? {
                        Lookup::Hit(t) => decode_continuation(&t),
                        _ => None,
                    },
                };
                if hit.is_none() {
                    misses.push((n, Some(key)));
                }
                out[n] = hit;
            }
        }
        let missed: Vec<usize> = misses.iter().map(|(n, _)| *n).collect();
        let batch = self.decode_batch(prompts, &missed, max_new)?;
        let groups = misses.len().div_ceil(batch);
        let mut unkeyed = Vec::new();
        for (g, group) in misses.chunks(batch).enumerate() {
            let group_prompts: Vec<&[u32]> = group.iter().map(|(n, _)| prompts[*n]).collect();
            let decoded = greedy_batch(&self.be, self.model()?, &group_prompts, max_new, &eos)?;
            for ((n, key), c) in group.iter().zip(decoded) {
                match key {
                    Some(key) => self.store_continuation(key.clone(), &c)?,
                    None => unkeyed.push(*n),
                }
                out[*n] = Some(c);
            }
            // First sight: stored once the hash is done, as soon as that costs no wait (decoding
            // on a CPU outlasts it, and a long call then keeps what it decoded if interrupted),
            // the rest after the last batch, the hash having run beside the decoding.
            if !unkeyed.is_empty()
                && (g + 1 == groups || self.files.identity.background_hash_done())
            {
                for n in std::mem::take(&mut unkeyed) {
                    let c = out[n].as_ref().context("continuation missing")?;
                    self.store_continuation(key_of(prompts[n])?, c)?;
                }
            }
        }
        out.into_iter()
            .collect::<Option<Vec<_>>>()
            .context("continuation missing")
    }

    /// Queue continuation `c`'s cache entry under `key` and remember it for this session.
    fn store_continuation(&self, key: CacheKey, c: &Continuation) -> Result<()> {
        // Written by the background writer: each entry's fsync can wait behind the disk's
        // writeback of gigabytes (a target just written, the hidden states of a pass).
        let _phase = crate::timeline::phase("cache write (continuations)");
        let tensors = continuation_tensors(c);
        self.cache_put(key.clone(), move || tensors)?;
        self.recent_continuations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.digest(), c.clone());
        Ok(())
    }

    /// Whether [`Session::continuations`] decodes before it keys: while the weights are hashed in
    /// the background, i.e. on first sight of their files (some file's stamp unknown to the
    /// identity store). Their entries are keyed by the hash of the bytes, which bytes never
    /// hashed before have none under, so every lookup would miss after waiting for the hash.
    /// The exception is the same bytes under another path or stamp (a copy of a model already
    /// used, a `touch`, a wiped identity store: docs/loading.md §2), whose entries are then
    /// decoded again and rewritten with the same values instead of read.
    pub fn keys_after_decoding(&self) -> bool {
        self.files.identity.hashing_in_background()
    }

    /// One target pass over `ids` capturing `capture` and the target's top-`k` (cached).
    pub fn target_pass(&self, ids: &[u32], capture: &Capture, k: usize) -> Result<TargetPass> {
        let mut passes = self.target_passes(&[ids], capture, k)?;
        passes.pop().context("target pass missing")
    }

    /// Target passes over many sequences, in order. Each is looked up in the cache under the
    /// same key as [`Session::target_pass`]; the misses run packed, at most
    /// [`SessionOptions::pack_tokens`] tokens per [`TargetModel::forward_packed`], and are stored one
    /// entry per sequence.
    pub fn target_passes(
        &self,
        seqs: &[&[u32]],
        capture: &Capture,
        k: usize,
    ) -> Result<Vec<TargetPass>> {
        self.target_passes_keeping(seqs, capture, k, true)
    }

    /// [`Session::target_passes`]; with `keep_hidden` false the computed passes come back
    /// without their hidden states, which move into their cache entries instead of being copied
    /// (a caller that only caches them, like `extract`, then holds them once).
    pub fn target_passes_keeping(
        &self,
        seqs: &[&[u32]],
        capture: &Capture,
        k: usize,
        keep_hidden: bool,
    ) -> Result<Vec<TargetPass>> {
        Ok(self
            .passes(seqs, capture, k, keep_hidden, false)?
            .into_iter()
            .map(|(p, _)| p)
            .collect())
    }

    /// [`Session::target_passes`] for a drafter: a pass whose taps are still on the device
    /// (computed by this session for an earlier checkpoint, see `session/resident.rs`) comes
    /// with them and without host copies (`hidden` empty), read neither from the disk nor
    /// uploaded again; computed passes keep device copies of their taps for the next drafter
    /// while the budget allows ([`SessionOptions::resident_tap_bytes`]).
    pub fn target_passes_for_drafting(
        &self,
        seqs: &[&[u32]],
        capture: &Capture,
        k: usize,
    ) -> Result<Vec<DraftingPass<B::Tensor>>> {
        self.passes(seqs, capture, k, true, true)
    }

    fn resident(&self) -> std::sync::MutexGuard<'_, ResidentTaps<B::Tensor>> {
        self.resident.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn passes(
        &self,
        seqs: &[&[u32]],
        capture: &Capture,
        k: usize,
        keep_hidden: bool,
        resident: bool,
    ) -> Result<Vec<DraftingPass<B::Tensor>>> {
        let d = self.files.spec.hidden_size;
        let mut passes: Vec<Option<DraftingPass<B::Tensor>>> = Vec::with_capacity(seqs.len());
        let mut budget = self.pack_budget(capture.indices.len());
        if budget < self.opts.pack_tokens && self.resident().used() > 0 {
            // Device memory is short: the forward comes before taps kept for later drafters.
            self.resident().clear();
            budget = self.pack_budget(capture.indices.len());
        }
        // First sight of the weights: upload them while they hash if the checks below pass with
        // every lookup missing (no empty sequence, each fits a forward).
        let fits = |ids: &&[u32]| {
            !ids.is_empty() && (ids.len() <= budget || budget >= self.opts.pack_tokens)
        };
        if !seqs.is_empty() && seqs.iter().all(fits) {
            self.load_while_hashing();
        }
        let mut packer = Packer::new(budget);
        let mut packs = Vec::new();
        let lookups = crate::timeline::phase("cache read");
        if let Some(n) = seqs.iter().position(|ids| ids.is_empty()) {
            bail!("target pass: sequence {n} has no tokens");
        }
        // Entries are read and checksummed in parallel: a cached `run` over an 8B target reads
        // gigabytes of hidden states, and one core hashes about 1.5 GB/s.
        use rayon::prelude::*;
        let keys = seqs
            .iter()
            .map(|ids| self.pass_key(ids, capture, k))
            .collect::<Result<Vec<_>>>()?;
        let held: Vec<Option<Arc<ResidentPass<B::Tensor>>>> = if resident {
            let r = self.resident();
            keys.iter().map(|key| r.get(&key.digest())).collect()
        } else {
            vec![None; seqs.len()]
        };
        // Entries this session queued earlier for these keys must be visible to these lookups
        // (a sequence passed twice, or again for the next checkpoint); the writes of other
        // entries go on (waiting for all of them made a run's second checkpoint wait ~2.5 s for
        // the first one's hidden states to reach the disk).
        let on_disk: Vec<CacheKey> = keys
            .iter()
            .zip(&held)
            .filter(|(_, h)| h.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        self.writer.wait_for(&on_disk);
        let cache = &self.cache;
        let found = seqs
            .par_iter()
            .zip(keys)
            .zip(held)
            .map(|((ids, key), held)| {
                let hit = match held {
                    // Still on the device: no disk read, no host copy of the taps.
                    Some(r) => Some((
                        TargetPass {
                            ids: ids.to_vec(),
                            hidden: Vec::new(),
                            hidden_size: d,
                            topk: r.topk.clone(),
                            cached: true,
                        },
                        Some(r),
                    )),
                    None => match cache.lookup(&key)? {
                        Lookup::Hit(t) => decode_pass(t, ids, capture, d, k).map(|p| (p, None)),
                        _ => None,
                    },
                };
                Ok((key, hit))
            })
            .collect::<Result<Vec<_>>>()?;
        for (n, (key, hit)) in found.into_iter().enumerate() {
            if hit.is_none() {
                packs.extend(packer.push((n, key), seqs[n].len()));
            }
            passes.push(hit);
        }
        packs.push(packer.finish());
        drop(lookups);
        // Before any compute: a sequence longer than what fits cannot be split.
        if budget < self.opts.pack_tokens {
            if let Some((n, len)) = seqs
                .iter()
                .enumerate()
                .map(|(n, s)| (n, s.len()))
                .find(|&(n, len)| passes[n].is_none() && len > budget)
            {
                // A model whose weights alone do not fit is named as such, with its numbers.
                self.check_model_fits(1, len, 0, 0)?;
                bail!(
                    "target pass: sequence {n} of {len} tokens does not fit in device memory ({} free after the weights; at most about {budget} tokens per forward); nothing was computed",
                    gib(self.available_memory().unwrap_or(0))
                );
            }
        }
        for pack in packs.iter().filter(|p| !p.is_empty()) {
            let seq_ids: Vec<&[u32]> = pack.iter().map(|(n, _)| seqs[*n]).collect();
            let mut computed = self.packed_pass(&seq_ids, capture, k, resident)?;
            // Cache entries hold the hidden states in the backend's compute dtype: bf16 on CUDA
            // (exact, half the bytes of f32), f32 on the CPU. Shared with the pass, or moved:
            // never copied here, where the GPU would wait (PassEntry::tensors, on the writer's
            // thread, copies what the pass still holds).
            let entries: Vec<PassEntry> = if keep_hidden {
                computed.iter().map(|(p, _)| PassEntry::of(p)).collect()
            } else {
                computed
                    .iter_mut()
                    .map(|(p, _)| PassEntry::take(p))
                    .collect()
            };
            for (((n, key), (pass, device)), entry) in pack.iter().zip(computed).zip(entries) {
                self.writer
                    .put_sized(&self.cache, key.clone(), entry.bytes(), move || {
                        entry.tensors()
                    })?;
                let device = device.and_then(|taps| self.resident().insert(key.digest(), taps));
                passes[*n] = Some((pass, device));
            }
        }
        passes
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .context("target pass missing")
    }

    /// One packed forward over `seqs`, split back into one pass per sequence; with `keep_device`
    /// (and room in the resident store) each pass also comes with device copies of its taps.
    fn packed_pass(
        &self,
        seqs: &[&[u32]],
        capture: &Capture,
        k: usize,
        keep_device: bool,
    ) -> Result<Vec<(TargetPass, Option<ResidentPass<B::Tensor>>)>> {
        let d = self.files.spec.hidden_size;
        let mut ids = Vec::new();
        let mut starts = vec![0];
        for s in seqs {
            ids.extend_from_slice(s);
            starts.push(ids.len());
        }
        let model = self.model()?;
        let forward = crate::timeline::phase("target forward");
        let out = model.forward_packed(&self.be, &ids, &starts, capture)?;
        let topk = model.logits_topk(&self.be, &out.last_hidden, k)?;
        drop(forward);
        let kk = topk.k;
        let seq_topk = |w: &[usize], rows: usize| TopK {
            rows,
            k: kk,
            ids: topk.ids[w[0] * kk..w[1] * kk].to_vec(),
            logprobs: topk.logprobs[w[0] * kk..w[1] * kk].to_vec(),
        };
        // Device copies of each sequence's taps for the drafters that read them next (queued
        // before the download below, which waits for them).
        let mut device: Vec<Option<Vec<(usize, B::Tensor)>>> = seqs.iter().map(|_| None).collect();
        if keep_device && self.resident_budget() > 0 {
            for (slot, w) in device.iter_mut().zip(starts.windows(2)) {
                let mut taps = Vec::with_capacity(capture.indices.len());
                for &i in &capture.indices {
                    let t = out.captured.get(i).context("captured state missing")?;
                    taps.push((i, self.be.slice_rows(t, w[0], w[1])?));
                }
                *slot = Some(taps);
            }
        }
        // One download per tap for the whole pack (not one per sequence and tap: each is a
        // synchronising copy), cut into sequences by the backend (Backend::to_host_rows_split),
        // so that host memory holds the pack's hidden states once.
        let _download = crate::timeline::phase("tap download");
        let mut hidden: Vec<Vec<(usize, Arc<HostRows>)>> = seqs
            .iter()
            .map(|_| Vec::with_capacity(capture.indices.len()))
            .collect();
        for &i in &capture.indices {
            let t = out.captured.get(i).context("captured state missing")?;
            let parts = self.be.to_host_rows_split(t, &starts)?;
            for (h, part) in hidden.iter_mut().zip(parts) {
                h.push((i, Arc::new(part)));
            }
        }
        Ok(seqs
            .iter()
            .zip(starts.windows(2))
            .zip(hidden)
            .zip(device)
            .map(|(((s, w), hidden), device)| {
                let pass = TargetPass {
                    ids: s.to_vec(),
                    hidden,
                    hidden_size: d,
                    topk: seq_topk(w, s.len()),
                    cached: false,
                };
                // The device copies hold what the host copies were downloaded from: as many bytes.
                let device = device.map(|taps| ResidentPass {
                    taps,
                    topk: pass.topk.clone(),
                    bytes: pass.hidden.iter().map(|(_, h)| h.byte_len()).sum(),
                });
                (pass, device)
            })
            .collect())
    }
}

/// A prompt's token ids: its chat messages through the template (generation prompt on), or its
/// raw text; never empty. Public for what tokenizes prompts without a session (`trace import`).
pub fn tokenize_prompt(tok: &crate::tokenizer::TextTokenizer, p: &Prompt) -> Result<Vec<u32>> {
    let ids = match (&p.messages, &p.text) {
        (Some(ms), _) => {
            let ms: Vec<ChatMessage> = ms
                .iter()
                .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
                .collect();
            match p.enable_thinking {
                None => tok.encode_chat(&ms, true),
                Some(on) => crate::slices::encode_chat_thinking(tok, &ms, on),
            }
            .with_context(|| format!("prompt {}", p.id))?
        }
        (None, Some(t)) => tok.encode(t, true)?,
        (None, None) => bail!("prompt {} has neither text nor messages", p.id),
    };
    if ids.is_empty() {
        bail!("prompt {} tokenizes to nothing", p.id);
    }
    Ok(ids)
}
