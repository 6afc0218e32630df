//! `inspect`, `generate`, `extract`: the target model on its own.

use crate::args::TargetArgs;
use crate::common::Global;
use anyhow::Result;
use clap::Args;
use draftlens_engine::backend::{dispatch, Backend, BackendJob, DEFAULT_CUDA_DEVICE};
use draftlens_engine::model::config::LayerType;
use draftlens_engine::model::{Capture, TargetFiles};
use draftlens_engine::session::{Packer, Session, SessionOptions};
use draftlens_results::shard::Shard;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

// The argument group is in args.rs; the session it describes is built here, beside the commands
// that run the target.
impl TargetArgs {
    /// The session options these flags set (the others at their defaults).
    pub fn session_options(&self) -> SessionOptions {
        SessionOptions {
            gen_batch: self.gen_batch,
            gdn_profile: self.gdn_profile,
            ..Default::default()
        }
    }

    /// The target loaded on `be` with these options.
    pub fn session<B: Backend>(&self, be: B, g: &Global) -> Result<Session<B>> {
        self.session_with(be, g, self.session_options())
    }

    /// The target loaded on `be` with `opts` (a command's own on top of
    /// [`TargetArgs::session_options`]).
    pub fn session_with<B: Backend>(
        &self,
        be: B,
        g: &Global,
        opts: SessionOptions,
    ) -> Result<Session<B>> {
        Session::load(be, &g.target(&self.target)?, g.cache()?, opts)
    }
}

#[derive(Args)]
pub struct InspectArgs {
    /// A .gguf file or a Hugging Face model folder.
    pub model: PathBuf,
    /// List every tensor.
    #[arg(long)]
    pub tensors: bool,
    /// Also compute the weights' sha256 (the model's identity) when the identity store does not
    /// remember it yet: reads every weight byte once (~40 s for 16 GB), then remembered.
    #[arg(long)]
    pub hash: bool,
    /// The CUDA memory estimate's decode batch (docs/loading.md, "Memory checks").
    #[arg(long, default_value_t = draftlens_engine::session::DEFAULT_GEN_BATCH)]
    pub gen_batch: usize,
    /// The CUDA memory estimate's prompt length in tokens.
    #[arg(long, default_value_t = 1024)]
    pub prompt_tokens: usize,
    /// The CUDA memory estimate's new tokens per prompt.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
}

#[derive(Serialize)]
struct InspectOut {
    path: PathBuf,
    format: &'static str,
    /// The identity when the identity store remembers every weight file's hash (inspect reads
    /// headers only and never hashes); `null` until a command that needs it has run.
    weights_sha256: Option<String>,
    spec: draftlens_engine::model::ModelSpec,
    /// Which decoder layers are which kind (hybrids mix them).
    layer_mix: LayerMix,
    /// Mixture-of-experts facts (experts per layer, active per token, active parameters); null
    /// for dense targets, which are all this version loads. docs/json.md.
    experts: Option<Experts>,
    parameters: u64,
    dtypes: std::collections::BTreeMap<String, (usize, u64)>,
    loaded_as: &'static str,
    /// What the CUDA backend would hold at `--gen-batch`, `--prompt-tokens`,
    /// `--max-new-tokens` (the rule the memory checks apply; docs/loading.md).
    cuda_memory: draftlens_engine::backend::memory::Estimate,
    tokenizer: Option<TokInfo>,
    tensors: Option<Vec<draftlens_engine::formats::TensorInfo>>,
    /// How a `random:DIR` target's weights are generated; left out for targets read from files
    /// (docs/loading.md §7).
    #[serde(skip_serializing_if = "Option::is_none")]
    random: Option<RandomInfo>,
}

/// `inspect`'s view of a `random:DIR` target's generator.
#[derive(Serialize)]
struct RandomInfo {
    seed: u64,
    /// Matrices are uniform in ± this; norm weights in 1 ± `norm_spread`.
    matrix_half_width: f32,
    norm_spread: f32,
    /// The generator version hashed into `weights_sha256` (with config.json and the above).
    identity: &'static str,
}

/// The decoder layers by token mixer: each kind's layer ids (0-based, as `--layers` takes them).
#[derive(Serialize)]
struct LayerMix {
    /// Softmax attention with a KV cache: every layer of a dense target.
    full_attention: Vec<usize>,
    /// Gated DeltaNet (linear attention with a recurrent state) of a hybrid.
    linear_attention: Vec<usize>,
    /// Softmax attention over the last `sliding_window` positions (gpt-oss); left out of the
    /// JSON when empty, so other targets' output is unchanged.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    sliding_attention: Vec<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sliding_window: Option<usize>,
}

impl LayerMix {
    fn of(spec: &draftlens_engine::model::ModelSpec) -> LayerMix {
        let mut mix = LayerMix {
            full_attention: Vec::new(),
            linear_attention: Vec::new(),
            sliding_attention: Vec::new(),
            sliding_window: None,
        };
        for id in 0..spec.num_layers {
            if let Some(w) = spec.gpt_oss.as_ref().and_then(|g| g.window(id)) {
                mix.sliding_attention.push(id);
                mix.sliding_window = Some(w);
                continue;
            }
            let kind = spec.hybrid.as_ref().and_then(|h| h.layer_types.get(id));
            match kind {
                Some(LayerType::LinearAttention) => mix.linear_attention.push(id),
                Some(LayerType::FullAttention) | None => mix.full_attention.push(id),
            }
        }
        mix
    }

    /// `  layer mix     2 full attention [3,7]   6 Gated DeltaNet (linear attention) [0-2,4-6]`.
    fn render(&self) -> String {
        let mut kinds = vec![format!(
            "{} full attention [{}]",
            self.full_attention.len(),
            id_ranges(&self.full_attention)
        )];
        if let (false, Some(w)) = (self.sliding_attention.is_empty(), self.sliding_window) {
            kinds.push(format!(
                "{} sliding-window attention ({w} positions) [{}]",
                self.sliding_attention.len(),
                id_ranges(&self.sliding_attention)
            ));
        }
        if !self.linear_attention.is_empty() {
            kinds.push(format!(
                "{} Gated DeltaNet (linear attention) [{}]",
                self.linear_attention.len(),
                id_ranges(&self.linear_attention)
            ));
        }
        format!("  layer mix     {}\n", kinds.join("   "))
    }
}

/// A mixture-of-experts target's facts in `inspect` (text and `--json`), from its spec.
#[derive(Serialize)]
struct Experts {
    /// Decoder layers whose feed-forward is a mixture of experts.
    layers: Vec<usize>,
    /// Routed experts per such layer.
    experts: usize,
    /// Experts each token runs through (top-k routing).
    active_per_token: usize,
    /// Parameters one token's forward uses (the rest of `parameters` sits in idle experts).
    active_parameters: u64,
    /// Width of the shared expert every token also runs (sigmoid-gated); null without one.
    shared_expert_intermediate_size: Option<usize>,
    /// gpt-oss only (absent otherwise): how the experts are stored ("mxfp4" blocks dequantised
    /// at load, "fused" unquantised tensors, or "gguf": a llama.cpp file's gate / up / down
    /// stacks, any GGML type) and its routing rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    storage: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    routing: Option<&'static str>,
}

impl Experts {
    fn of(spec: &draftlens_engine::model::ModelSpec) -> Option<Experts> {
        let m = spec.moe.as_ref()?;
        Some(Experts {
            layers: (0..spec.num_layers).filter(|&i| m.is_sparse(i)).collect(),
            experts: m.num_experts,
            active_per_token: m.num_experts_per_tok,
            active_parameters: spec.active_params_per_token(),
            shared_expert_intermediate_size: m.shared_expert_intermediate_size,
            storage: spec
                .gpt_oss
                .as_ref()
                .map(|g| match (g.per_expert, g.mxfp4()) {
                    (true, _) => "gguf",
                    (false, true) => "mxfp4",
                    (false, false) => "fused",
                }),
            routing: spec
                .gpt_oss
                .as_ref()
                .map(|_| "top-k of the biased router logits, then softmax over the k"),
        })
    }
}

/// `0-2,4-6,8` for [0, 1, 2, 4, 5, 6, 8].
fn id_ranges(ids: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(if j == i {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

#[derive(Serialize)]
struct TokInfo {
    vocab: usize,
    bos: Option<u32>,
    eos: Vec<u32>,
    chat_template_chars: Option<usize>,
}

pub fn inspect(g: &Global, a: InspectArgs) -> Result<()> {
    // Headers only: no weight byte is read (the hash is shown when already remembered).
    let f = TargetFiles::open(&a.model)?.with_identity_store(
        draftlens_engine::identity::IdentityStore::new(g.cache()?.root()),
    );
    let infos = f.weights.tensors();
    let experts_mxfp4 = f.mxfp4_experts();
    let mut dtypes = std::collections::BTreeMap::new();
    let mut params = 0u64;
    for t in &infos {
        // MXFP4 blocks hold two parameters per byte; their scales none.
        params += draftlens_engine::formats::mxfp4::parameters(t);
        let e = dtypes.entry(t.dtype.clone()).or_insert((0usize, 0u64));
        e.0 += 1;
        e.1 += t.bytes;
    }
    let out = InspectOut {
        path: a.model.clone(),
        format: f.identity.format,
        weights_sha256: if a.hash {
            Some(f.identity.weights_sha256()?)
        } else {
            f.identity.remembered_sha256()
        },
        spec: f.spec.clone(),
        layer_mix: LayerMix::of(&f.spec),
        experts: Experts::of(&f.spec),
        parameters: params,
        dtypes,
        loaded_as: if f.spec.gpt_oss.is_some() {
            "f32 on cpu (dequantised at load); bf16 on cuda (MXFP4 experts kept packed unless DRAFTLENS_MXFP4=bf16)"
        } else {
            "f32 on cpu (dequantised at load); bf16 on cuda"
        },
        // MXFP4 experts (a folder's or a GGUF's) as the CUDA backend will hold them (packed
        // unless DRAFTLENS_MXFP4=bf16).
        cuda_memory: draftlens_engine::backend::memory::MemoryModel::with_mxfp4_experts(
            &f.spec,
            "bf16",
            draftlens_engine::backend::mxfp4::packed_mode_from_env()?,
            experts_mxfp4,
        )
        .estimate(
            a.gen_batch as u64,
            a.prompt_tokens as u64,
            a.max_new_tokens as u64,
            0,
        ),
        tokenizer: f.tokenizer.as_ref().map(|t| TokInfo {
            vocab: t.vocab_size(),
            bos: t.bos_id(),
            eos: t.eos_ids(),
            chat_template_chars: t.chat_template().map(|s| s.chars().count()),
        }),
        tensors: a.tensors.then(|| infos.clone()),
        random: f.random.as_ref().map(|r| {
            let (matrix_half_width, norm_spread) = r.ranges();
            RandomInfo {
                seed: r.seed,
                matrix_half_width,
                norm_spread,
                identity: draftlens_engine::model::random_target::IDENTITY_VERSION,
            }
        }),
    };
    g.emit(&out, || {
        let s = &out.spec;
        let mut o = format!(
            "{}\n  format        {} ({})\n  architecture  {}\n  layers        {}   hidden {}   ffn {}   heads {}/{} kv   head_dim {}\n",
            out.path.display(),
            out.format,
            out.weights_sha256.as_deref().map_or("sha256 not computed yet: --hash".to_string(), |h| format!("sha256 {}", &h[..16])),
            s.arch.as_str(),
            s.num_layers,
            s.hidden_size,
            s.intermediate_size,
            s.num_heads,
            s.num_kv_heads,
            s.head_dim,
        );
        o += &out.layer_mix.render();
        if let Some(e) = &out.experts {
            o += &format!(
                "  experts       {} per layer on layers [{}], {} active per token{}, {} active parameters\n",
                e.experts,
                id_ranges(&e.layers),
                e.active_per_token,
                e.shared_expert_intermediate_size
                    .map_or(String::new(), |w| format!(" + a gated shared expert (width {w})")),
                e.active_parameters
            );
            if let (Some(storage), Some(routing)) = (e.storage, e.routing) {
                let stored = match storage {
                    "mxfp4" => "MXFP4 blocks (dequantised to f32 at load)",
                    "gguf" if experts_mxfp4 => "llama.cpp's MXFP4 stacks (repacked at load: packed on cuda unless DRAFTLENS_MXFP4=bf16, f32 on cpu)",
                    "gguf" => "llama.cpp's gate / up / down stacks (dequantised at load)",
                    _ => "fused tensors",
                };
                o += &format!("                experts stored as {stored}; routing: {routing}\n");
            }
        }
        o += &format!(
            "  vocab         {}   rope θ {}   rms eps {}   context {}   tied embeddings {}\n  parameters    {}\n  stored dtypes ",
            s.vocab_size,
            s.rope_theta,
            s.rms_norm_eps,
            s.max_position_embeddings,
            s.tie_word_embeddings,
            out.parameters,
        );
        let parts: Vec<String> = out.dtypes.iter().map(|(k, (n, b))| format!("{k}: {n} tensors, {:.1} MiB", *b as f64 / 1048576.0)).collect();
        o += &parts.join("; ");
        o += &format!("\n  loaded as     {}\n", out.loaded_as);
        if let Some(r) = &out.random {
            o += &format!(
                "  weights       generated at load, nothing read from disk: seed {}, matrices U(±{}), norm weights 1 ± {}; identity: sha256 of \"{}\", config.json and these (docs/loading.md §7)\n",
                r.seed, r.matrix_half_width, r.norm_spread, r.identity
            );
        }
        o += &format!("  cuda memory   needs {}\n", out.cuda_memory.describe());
        if let Some(t) = &out.tokenizer {
            o += &format!("  tokenizer     {} ids, bos {:?}, end-of-generation {:?}, chat template {}\n", t.vocab, t.bos, t.eos, t.chat_template_chars.map_or("none".to_string(), |c| format!("{c} chars")));
        }
        if let Some(ts) = &out.tensors {
            for t in ts {
                o += &format!("  {:<48} {:<6} {:?}\n", t.name, t.dtype, t.shape);
            }
        }
        o
    })
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Only shard I of N (0-based) of the prompt set, by content hash (docs/scale-out.md).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
}

#[derive(Serialize)]
pub struct GeneratedPrompt {
    pub id: String,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub stop: draftlens_engine::generate::StopReason,
    pub text: String,
    pub seconds: f64,
}

struct GenerateJob<'a> {
    g: &'a Global,
    a: &'a TargetArgs,
    shard: Option<Shard>,
}

impl BackendJob for GenerateJob<'_> {
    type Output = Vec<GeneratedPrompt>;
    fn run<B: Backend>(self, be: B) -> Result<Self::Output> {
        let set = self.a.shard_prompt_set(self.shard)?;
        let s = self.a.session(be, self.g)?;
        s.check_prompts_fit(&set.prompts, self.a.max_new_tokens, 0)?;
        let pb = draftlens_engine::progress::bar(set.prompts.len() as u64, "generate");
        let mut out = Vec::new();
        // Prompts are decoded a batch at a time (Session::continuations); each reports its
        // share of its batch's time.
        for chunk in set.prompts.chunks(s.gen_batch()) {
            let t0 = Instant::now();
            let done = s.prompts_with_continuations(chunk, self.a.max_new_tokens)?;
            let seconds = t0.elapsed().as_secs_f64() / chunk.len() as f64;
            for (p, (ids, c)) in chunk.iter().zip(done) {
                out.push(GeneratedPrompt {
                    id: p.id.clone(),
                    prompt_tokens: ids.len(),
                    new_tokens: c.ids.len(),
                    stop: c.stop,
                    text: s.files.tokenizer()?.decode(&c.ids)?,
                    seconds,
                });
                pb.inc(1);
            }
        }
        pb.finish_and_clear();
        // The continuations' cache entries are written in the background: a failure to store
        // one is this command's error, as it was when they were written inline.
        s.flush_cache()?;
        log_loaded(&s);
        Ok(out)
    }
}

/// `-v`: whether the command needed the target's weights (a fully cached rerun does not).
fn log_loaded<B: Backend>(s: &Session<B>) {
    tracing::info!(
        "target weights uploaded: {}",
        if s.model_loaded() {
            "yes"
        } else {
            "no (everything came from the cache)"
        }
    );
}

pub fn generate(g: &Global, a: GenerateArgs) -> Result<()> {
    let job = GenerateJob {
        g,
        a: &a.target,
        shard: a.shard,
    };
    let out = dispatch(a.target.backend.select(g), DEFAULT_CUDA_DEVICE, job)?;
    g.emit(&out, || {
        out.iter()
            .map(|r| {
                format!(
                    "=== {} ({} prompt tokens, {} new, stop: {:?}, {:.2}s)\n{}\n",
                    r.id, r.prompt_tokens, r.new_tokens, r.stop, r.seconds, r.text
                )
            })
            .collect()
    })
}

#[derive(Args)]
pub struct ExtractArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Decoder-layer output ids to capture (0-based; id i = Hugging Face hidden_states[i+1],
    /// the convention of DFlash target_layer_ids). See docs/hidden-states.md.
    #[arg(long, value_delimiter = ',', default_value = "1,8,15,22,27")]
    pub layers: Vec<usize>,
    /// Write the captured states of every prompt to this safetensors file as well: one f32
    /// tensor `PROMPT.layerL` [tokens, hidden] per prompt id and `--layers` id L (that is Hugging
    /// Face hidden_states[L+1]; docs/hidden-states.md).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Most tokens (prompt + continuation, summed over prompts) per packed target forward: the
    /// hidden states of consecutive prompts are computed in one forward of up to N tokens (a
    /// longer sequence runs alone). Larger fills a GPU better and needs more memory; the
    /// results and the cache entries do not depend on it beyond f32 summation order.
    #[arg(long, value_name = "N", default_value_t = draftlens_engine::session::DEFAULT_PACK_TOKENS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub pack_tokens: usize,
    /// Only shard I of N (0-based) of the prompt set, by content hash (docs/scale-out.md).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
}

#[derive(Serialize)]
pub struct Extracted {
    pub id: String,
    pub tokens: usize,
    pub cached: bool,
    /// The prompt's continuation plus its token share of its pack's target forward.
    pub seconds: f64,
}

/// A prompt whose sequence is known and whose target pass waits for its pack.
struct PendingExtract {
    id: String,
    ids: Vec<u32>,
    seconds: f64,
}

struct ExtractJob<'a> {
    g: &'a Global,
    a: &'a ExtractArgs,
}

impl BackendJob for ExtractJob<'_> {
    type Output = Vec<Extracted>;
    fn run<B: Backend>(self, be: B) -> Result<Self::Output> {
        let set = self.a.target.shard_prompt_set(self.a.shard)?;
        let opts = SessionOptions {
            pack_tokens: self.a.pack_tokens,
            ..self.a.target.session_options()
        };
        let s = self.a.target.session_with(be, self.g, opts)?;
        let capture = Capture::for_layer_ids(&self.a.layers, s.files.spec.num_layers)?;
        s.check_prompts_fit(
            &set.prompts,
            self.a.target.max_new_tokens,
            capture.indices.len(),
        )?;
        let pb = draftlens_engine::progress::bar(set.prompts.len() as u64, "extract");
        let mut out = Vec::new();
        let mut dump: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
        // Consecutive prompts' target passes run packed, one window of ≤ pack_tokens at a time.
        let mut flush = |window: Vec<PendingExtract>| -> Result<()> {
            if window.is_empty() {
                return Ok(());
            }
            let t0 = Instant::now();
            let seqs: Vec<&[u32]> = window.iter().map(|w| w.ids.as_slice()).collect();
            // Without --out the hidden states are only cached: they move into the cache
            // entries rather than being copied (host memory holds a long prompt's taps once).
            let passes = s.target_passes_keeping(&seqs, &capture, 8, self.a.out.is_some())?;
            let per_token =
                t0.elapsed().as_secs_f64() / seqs.iter().map(|q| q.len()).sum::<usize>() as f64;
            for (w, pass) in window.into_iter().zip(passes) {
                if self.a.out.is_some() {
                    // Named by the layer id the user passed (HF index i = id + 1), so that
                    // `--layers 8` is `PROMPT.layer8`.
                    for (i, h) in pass.hidden {
                        dump.push((
                            format!("{}.layer{}", w.id, i - 1),
                            vec![w.ids.len(), pass.hidden_size],
                            h.to_f32().into_owned(),
                        ));
                    }
                }
                out.push(Extracted {
                    id: w.id,
                    tokens: w.ids.len(),
                    cached: pass.cached,
                    seconds: w.seconds + per_token * w.ids.len() as f64,
                });
                pb.inc(1);
            }
            Ok(())
        };
        let mut window = Packer::new(self.a.pack_tokens);
        // On first sight of the weights the continuations are decoded before they are keyed
        // (`Session::keys_after_decoding`): asked for all at once, the weights' background hash
        // runs beside all of the decoding, not just the first batch's, before a key waits for it.
        let chunk = match s.keys_after_decoding() {
            true => set.prompts.len().max(1),
            false => s.gen_batch(),
        };
        for chunk in set.prompts.chunks(chunk) {
            let t0 = Instant::now();
            let done = s.prompts_with_continuations(chunk, self.a.target.max_new_tokens)?;
            let seconds = t0.elapsed().as_secs_f64() / chunk.len() as f64;
            for (p, (mut ids, c)) in chunk.iter().zip(done) {
                ids.extend(&c.ids);
                let len = ids.len();
                let pending = PendingExtract {
                    id: p.id.clone(),
                    ids,
                    seconds,
                };
                if let Some(full) = window.push(pending, len) {
                    flush(full)?;
                }
            }
        }
        flush(window.finish())?;
        s.flush_cache()?;
        pb.finish_and_clear();
        log_loaded(&s);
        if let Some(path) = &self.a.out {
            draftlens_engine::util::write_f32_safetensors(path, &dump)?;
        }
        Ok(out)
    }
}

pub fn extract(g: &Global, a: ExtractArgs) -> Result<()> {
    let out = dispatch(
        a.target.backend.select(g),
        DEFAULT_CUDA_DEVICE,
        ExtractJob { g, a: &a },
    )?;
    g.emit(&out, || {
        let cached = out.iter().filter(|e| e.cached).count();
        let tokens: usize = out.iter().map(|e| e.tokens).sum();
        format!(
            "extracted {} prompts ({} tokens; {} from cache) at layers {:?}\n",
            out.len(),
            tokens,
            cached,
            a.layers
        )
    })
}
