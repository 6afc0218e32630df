//! A loaded target on one backend, with the two cached steps every evaluation starts from:
//! the target's greedy continuation of a prompt, and one teacher-forced target pass over
//! prompt + continuation that yields the captured hidden states and the target's own top-K.

use crate::backend::{Backend, TopK};
use crate::cache::{CacheKey, CachedData, CachedTensor, HiddenCache, Lookup};
use crate::chat::ChatMessage;
use crate::generate::{greedy_batch, Continuation, StopReason};
use crate::model::{Capture, TargetFiles, TargetModel};
use crate::prompts::Prompt;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// Bumped whenever model code or kernels change numerics, so cached entries are recomputed.
/// 3: CUDA GEMMs of ≤ 64 rows and decode attention on the batch-invariant decode kernels.
pub const MODEL_CODE_VERSION: &str = "3";

/// Default token budget of one packed target forward ([`Session::pack_tokens`]): 16k rows fill
/// an H200 (docs/cuda.md) and keep the CPU's activations small.
pub const DEFAULT_PACK_TOKENS: usize = 16384;

/// Most prompts decoded together by [`Session::continuations`] on a backend whose rows are
/// independent (at most [`Backend::max_independent_rows`]). On the 2-core CPU, 64 HumanEval prompts × 128
/// tokens take 87 / 73 / 67 s at 16 / 32 / 64 (docs/benchmarks.md): 32 keeps most of the gain
/// at half the KV-cache memory of 64.
pub const DEFAULT_GEN_BATCH: usize = 32;

/// Which backend to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl BackendKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// Work that runs on whichever backend the user picked (static dispatch, no trait objects).
pub trait BackendJob {
    type Output;
    fn run<B: Backend>(self, be: B) -> Result<Self::Output>;
}

/// Run `job` on the backend `kind`, or explain why that backend is unavailable.
pub fn dispatch<J: BackendJob>(kind: BackendKind, job: J) -> Result<J::Output> {
    match kind {
        BackendKind::Cpu => job.run(crate::backend::cpu::CpuBackend::new()),
        BackendKind::Cuda => dispatch_cuda(job),
    }
}

#[cfg(feature = "cuda")]
fn dispatch_cuda<J: BackendJob>(job: J) -> Result<J::Output> {
    job.run(crate::backend::cuda::CudaBackend::new(0)?)
}

#[cfg(not(feature = "cuda"))]
fn dispatch_cuda<J: BackendJob>(_job: J) -> Result<J::Output> {
    bail!("CUDA unavailable: this draftlens binary was built without the `cuda` feature")
}

/// The teacher-forced target pass over one sequence.
pub struct TargetPass {
    /// The sequence (prompt + continuation).
    pub ids: Vec<u32>,
    /// Captured hidden states, `(HF index, [T × D] row-major)`, in the order asked for.
    pub hidden: Vec<(usize, Vec<f32>)>,
    pub hidden_size: usize,
    /// The target's own top-K next-token prediction at every position (row t predicts t+1).
    pub topk: TopK,
    /// True when the pass came from the cache.
    pub cached: bool,
}

impl TargetPass {
    pub fn hidden(&self, index: usize) -> Option<&[f32]> {
        self.hidden
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, h)| h.as_slice())
    }
}

/// A target loaded on a backend, with its tokenizer and the hidden-state cache.
pub struct Session<B: Backend> {
    pub be: B,
    pub files: TargetFiles,
    pub model: TargetModel<B>,
    pub cache: HiddenCache,
    /// Most tokens per packed target forward in [`Session::target_passes`] (a longer sequence
    /// runs alone). Packing changes only f32 summation order, never the cache key.
    pub pack_tokens: usize,
    /// Most prompts decoded together by [`Session::continuations`] where the backend allows it
    /// (see [`Session::gen_batch`]).
    pub gen_batch: usize,
}

impl<B: Backend> Session<B> {
    pub fn load(be: B, target: &Path, cache: HiddenCache) -> Result<Self> {
        let files = TargetFiles::open(target)?;
        let model = TargetModel::load(&be, &files.spec, files.weights.as_ref())?;
        Ok(Session {
            be,
            files,
            model,
            cache,
            pack_tokens: DEFAULT_PACK_TOKENS,
            gen_batch: DEFAULT_GEN_BATCH,
        })
    }

    fn kernel_version(&self) -> String {
        format!(
            "{}-{}-v{MODEL_CODE_VERSION}",
            self.be.name(),
            self.be.dtype()
        )
    }

    fn key(
        &self,
        kind: &str,
        token_ids: &[u32],
        layers: Vec<usize>,
        extra: String,
    ) -> Result<CacheKey> {
        Ok(CacheKey {
            kind: kind.into(),
            weights: self.files.identity.weights_sha256.clone(),
            tokenizer: self.files.tokenizer()?.fingerprint(),
            token_ids: token_ids.to_vec(),
            layers,
            backend: self.be.name().into(),
            dtype: self.be.dtype().into(),
            kernel_version: self.kernel_version(),
            extra,
        })
    }

    /// Token ids of a prompt: chat prompts go through the model's own chat template with the
    /// generation prompt; raw prompts are encoded as they are (BOS as the tokenizer says).
    pub fn prompt_ids(&self, p: &Prompt) -> Result<Vec<u32>> {
        let tok = self.files.tokenizer()?;
        let ids = match (&p.messages, &p.text) {
            (Some(ms), _) => {
                let ms: Vec<ChatMessage> = ms
                    .iter()
                    .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
                    .collect();
                tok.encode_chat(&ms, true)
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

    /// How many prompts [`Session::continuations`] decodes together: [`Session::gen_batch`],
    /// capped by [`Backend::max_independent_rows`] (up to that many rows a continuation cannot
    /// depend on its batch-mates; CPU: no cap, CUDA: 64).
    pub fn gen_batch(&self) -> usize {
        self.gen_batch
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
        let ids = prompts
            .iter()
            .map(|p| self.prompt_ids(p))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        let conts = self.continuations(&refs, max_new)?;
        Ok(ids.into_iter().zip(conts).collect())
    }

    /// The greedy continuations of several prompts, in order. Each is looked up in the cache under
    /// the same key as [`Session::continuation`]; the misses are decoded
    /// [`Session::gen_batch`] at a time ([`greedy_batch`]) and stored one entry per prompt.
    pub fn continuations(&self, prompts: &[&[u32]], max_new: usize) -> Result<Vec<Continuation>> {
        let eos = self.eos_ids();
        let mut out: Vec<Option<Continuation>> = Vec::with_capacity(prompts.len());
        let mut misses = Vec::new();
        for (n, prompt) in prompts.iter().enumerate() {
            let key = self.key(
                "greedy",
                prompt,
                vec![],
                format!("max_new={max_new};eos={eos:?}"),
            )?;
            let hit = match self.cache.lookup(&key)? {
                Lookup::Hit(t) => decode_continuation(&t),
                _ => None,
            };
            if hit.is_none() {
                misses.push((n, key));
            }
            out.push(hit);
        }
        for group in misses.chunks(self.gen_batch()) {
            let group_prompts: Vec<&[u32]> = group.iter().map(|(n, _)| prompts[*n]).collect();
            let decoded = greedy_batch(&self.be, &self.model, &group_prompts, max_new, &eos)?;
            for ((n, key), c) in group.iter().zip(decoded) {
                self.cache.put(key, &continuation_tensors(&c))?;
                out[*n] = Some(c);
            }
        }
        out.into_iter()
            .collect::<Option<Vec<_>>>()
            .context("continuation missing")
    }

    fn pass_key(&self, ids: &[u32], capture: &Capture, k: usize) -> Result<CacheKey> {
        self.key("taps", ids, capture.indices.clone(), format!("topk={k}"))
    }

    /// One target pass over `ids` capturing `capture` and the target's top-`k` (cached).
    pub fn target_pass(&self, ids: &[u32], capture: &Capture, k: usize) -> Result<TargetPass> {
        let mut passes = self.target_passes(&[ids], capture, k)?;
        passes.pop().context("target pass missing")
    }

    /// Target passes over many sequences, in order. Each is looked up in the cache under the
    /// same key as [`Session::target_pass`]; the misses run packed, at most
    /// [`Session::pack_tokens`] tokens per [`TargetModel::forward_packed`], and are stored one
    /// entry per sequence.
    pub fn target_passes(
        &self,
        seqs: &[&[u32]],
        capture: &Capture,
        k: usize,
    ) -> Result<Vec<TargetPass>> {
        let d = self.files.spec.hidden_size;
        let mut passes: Vec<Option<TargetPass>> = Vec::with_capacity(seqs.len());
        let mut packer = Packer::new(self.pack_tokens);
        let mut packs = Vec::new();
        for (n, ids) in seqs.iter().enumerate() {
            if ids.is_empty() {
                bail!("target pass: sequence {n} has no tokens");
            }
            let key = self.pass_key(ids, capture, k)?;
            if let Lookup::Hit(t) = self.cache.lookup(&key)? {
                if let Some(p) = decode_pass(&t, ids, capture, d, k) {
                    passes.push(Some(p));
                    continue;
                }
            }
            passes.push(None);
            packs.extend(packer.push((n, key), ids.len()));
        }
        packs.push(packer.finish());
        for pack in packs.iter().filter(|p| !p.is_empty()) {
            let seq_ids: Vec<&[u32]> = pack.iter().map(|(n, _)| seqs[*n]).collect();
            let computed = self.packed_pass(&seq_ids, capture, k)?;
            for ((n, key), pass) in pack.iter().zip(computed) {
                self.cache.put(key, &pass_tensors(&pass))?;
                passes[*n] = Some(pass);
            }
        }
        passes
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .context("target pass missing")
    }

    /// One packed forward over `seqs`, split back into one pass per sequence.
    fn packed_pass(&self, seqs: &[&[u32]], capture: &Capture, k: usize) -> Result<Vec<TargetPass>> {
        let d = self.files.spec.hidden_size;
        let mut ids = Vec::new();
        let mut starts = vec![0];
        for s in seqs {
            ids.extend_from_slice(s);
            starts.push(ids.len());
        }
        let out = self
            .model
            .forward_packed(&self.be, &ids, &starts, capture)?;
        let topk = self.model.logits_topk(&self.be, &out.last_hidden, k)?;
        let kk = topk.k;
        seqs.iter()
            .zip(starts.windows(2))
            .map(|(s, w)| {
                let mut hidden = Vec::new();
                for &i in &capture.indices {
                    let t = out.captured.get(i).context("captured state missing")?;
                    hidden.push((i, self.be.to_host(&self.be.slice_rows(t, w[0], w[1])?)?));
                }
                Ok(TargetPass {
                    ids: s.to_vec(),
                    hidden,
                    hidden_size: d,
                    topk: TopK {
                        rows: s.len(),
                        k: kk,
                        ids: topk.ids[w[0] * kk..w[1] * kk].to_vec(),
                        logprobs: topk.logprobs[w[0] * kk..w[1] * kk].to_vec(),
                    },
                    cached: false,
                })
            })
            .collect()
    }
}

/// Groups consecutive items into packs of at most `budget` tokens; an item longer than the
/// budget forms a pack of its own. Order is kept, so packs are deterministic.
pub struct Packer<T> {
    budget: usize,
    tokens: usize,
    items: Vec<T>,
}

impl<T> Packer<T> {
    pub fn new(budget: usize) -> Self {
        Packer {
            budget,
            tokens: 0,
            items: Vec::new(),
        }
    }

    /// Add an item of `len` tokens. Returns the pack so far when the item does not fit in it
    /// (the item then starts the next pack).
    pub fn push(&mut self, item: T, len: usize) -> Option<Vec<T>> {
        let full =
            (!self.items.is_empty() && self.tokens + len > self.budget).then(|| self.finish());
        self.tokens += len;
        self.items.push(item);
        full
    }

    /// Take the pack being filled (possibly empty) and start a new one.
    pub fn finish(&mut self) -> Vec<T> {
        self.tokens = 0;
        std::mem::take(&mut self.items)
    }
}

/// The cache entry of one pass (the layout [`decode_pass`] reads).
fn pass_tensors(p: &TargetPass) -> Vec<CachedTensor> {
    let (t, d) = (p.ids.len(), p.hidden_size);
    let mut tensors: Vec<CachedTensor> = p
        .hidden
        .iter()
        .map(|(i, h)| CachedTensor {
            name: format!("hs.{i}"),
            shape: vec![t, d],
            data: CachedData::F32(h.clone()),
        })
        .collect();
    tensors.push(CachedTensor {
        name: "topk_ids".into(),
        shape: vec![t, p.topk.k],
        data: CachedData::U32(p.topk.ids.clone()),
    });
    tensors.push(CachedTensor {
        name: "topk_logprobs".into(),
        shape: vec![t, p.topk.k],
        data: CachedData::F32(p.topk.logprobs.clone()),
    });
    tensors
}

fn find<'a>(t: &'a [CachedTensor], name: &str) -> Option<&'a CachedTensor> {
    t.iter().find(|x| x.name == name)
}

/// The cache entry of a continuation: its ids and the stop reason (0 EOS, 1 length, 2 context).
fn continuation_tensors(c: &Continuation) -> Vec<CachedTensor> {
    let stop = match c.stop {
        StopReason::Eos => 0u32,
        StopReason::Length => 1,
        StopReason::Context => 2,
    };
    vec![
        CachedTensor {
            name: "ids".into(),
            shape: vec![c.ids.len()],
            data: CachedData::U32(c.ids.clone()),
        },
        CachedTensor {
            name: "stop".into(),
            shape: vec![1],
            data: CachedData::U32(vec![stop]),
        },
    ]
}

fn decode_continuation(t: &[CachedTensor]) -> Option<Continuation> {
    let ids = match &find(t, "ids")?.data {
        CachedData::U32(v) => v.clone(),
        _ => return None,
    };
    let stop = match &find(t, "stop")?.data {
        CachedData::U32(v) => match v.first()? {
            0 => StopReason::Eos,
            1 => StopReason::Length,
            _ => StopReason::Context,
        },
        _ => return None,
    };
    Some(Continuation { ids, stop })
}

fn decode_pass(
    t: &[CachedTensor],
    ids: &[u32],
    capture: &Capture,
    d: usize,
    k: usize,
) -> Option<TargetPass> {
    let mut hidden = Vec::new();
    for &i in &capture.indices {
        match &find(t, &format!("hs.{i}"))?.data {
            CachedData::F32(v) if v.len() == ids.len() * d => hidden.push((i, v.clone())),
            _ => return None,
        }
    }
    let tid = match &find(t, "topk_ids")?.data {
        CachedData::U32(v) => v.clone(),
        _ => return None,
    };
    let tlp = match &find(t, "topk_logprobs")?.data {
        CachedData::F32(v) => v.clone(),
        _ => return None,
    };
    if tid.len() != ids.len() * k || tlp.len() != tid.len() {
        return None;
    }
    Some(TargetPass {
        ids: ids.to_vec(),
        hidden,
        hidden_size: d,
        topk: TopK {
            rows: ids.len(),
            k,
            ids: tid,
            logprobs: tlp,
        },
        cached: true,
    })
}
