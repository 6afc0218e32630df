//! Recorded decode steps ([`Backend::record_step`](crate::backend::Backend::record_step)): one
//! decode step of a batch captured as a CUDA graph, then replayed for the batch's next steps with
//! one host-to-device copy and one graph launch each, instead of ~20 launches a layer from the
//! host (docs/cuda.md, "Recorded decode steps").
//!
//! What changes from one step to the next is small and lives in one device buffer, the step's
//! *arena*, which the kernels read instead of kernel parameters:
//! - the token ids the embedding gathers (rewritten at every replay);
//! - the RoPE positions and each decode attention's table of (K cache, V cache, length,
//!   position) per row: the lengths and positions grow by one per step and the caches stay where
//!   they are (the caller reserves their rows before recording), so a replay writes the recorded
//!   image with those words advanced by the number of steps since the recording.
//!
//! While a step is recorded the backend routes those three uploads into the arena
//! ([`CudaBackend::recording_ids`], [`CudaBackend::recording_positions`],
//! [`CudaBackend::recording_table`]) and sizes the decode attention's grid and scratch for the
//! longest length the recording will see. Anything else that would copy host data to the device,
//! read the device from the host, or grow a buffer the backend keeps across calls fails the
//! recording ([`CudaBackend::not_recording`]); the caller then runs the step as usual. The step's
//! temporaries are allocated and freed inside the graph (stream-ordered allocations are captured
//! as graph memory nodes), and its output is copied into a buffer of the recording's own.
//!
//! The backend has one stream, and a capture takes whatever is queued on it: a recording assumes
//! that no other thread queues work on the backend meanwhile (the engine issues GPU work from one
//! thread; the background threads hash, store and write records on the host).
//!
//! **A step that feeds itself** (greedy decoding, [`CudaBackend::feed_greedy`]): the recorded
//! step ends with the top-1 of its rows' logits written over the arena's token ids and its
//! growing words advanced by one (`step_arena_advance`), so the next step needs nothing from the
//! host: [`CudaBackend::replay_step_fed`] is one graph launch, and each launch of such a recording
//! queues a copy of its tokens to page-locked memory that [`CudaBackend::take_fed_tokens`] reads
//! later. The caller can so launch step n + 1 before it reads step n's tokens, and the GPU does
//! not wait on the host between steps.
//!
//! Replays run the same kernels on the same addresses with the same arguments as the recorded
//! step would with that step's lengths, so a replayed step gives the bits of the eager one
//! (`cuda_step_graph` asserts it); the decode attention's grid (blocks per sequence) may be
//! larger than the eager launch's, which changes which block walks a chunk and no arithmetic
//! (kernels/decode_attention.cu).

use super::{derr, CudaBackend, CudaMatrix, CudaTensor};
use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::driver::{sys, CudaGraph, CudaSlice};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// 4-byte words of a recording's arena: ids, positions and one 1 536-byte table per attention
/// layer at 64 rows fill ~50 K words for a 128-layer model.
const ARENA_WORDS: usize = 1 << 16;

/// Words a table starts on (64 bytes: the kernel reads its u64 addresses aligned).
const TABLE_ALIGN: usize = 16;

/// The environment variable that turns recorded decode steps off (`off`); on by default.
pub const STEP_GRAPHS_ENV: &str = "DRAFTLENS_STEP_GRAPHS";

/// The environment variable that lets greedy recordings feed themselves (`on`); without it the
/// host reads each step's tokens before it launches the next. Opt-in until a GPU run has tested
/// and timed it (docs/cuda.md, "Recorded decode steps").
pub const STEP_FEED_ENV: &str = "DRAFTLENS_STEP_FEED";

/// The recording in progress: the arena's host image as the recorded step wrote it.
pub(super) struct Recording {
    /// Device address of the arena (allocated before the capture).
    base: u64,
    /// The arena's words as of the recorded step.
    image: Vec<u32>,
    /// Words that grow by one per step (lengths and positions).
    advancing: Vec<usize>,
    /// Where the token ids are (first word, count).
    ids: Option<(usize, usize)>,
    /// The positions last placed, and where (one array serves every layer of a step).
    positions: Option<(Vec<u32>, usize)>,
    /// The most steps a replay is ahead of the recorded one (lengths grow by up to this).
    max_advance: usize,
    /// The step feeds itself ([`CudaBackend::feed_greedy`] was called in it).
    feeds: bool,
}

impl Recording {
    /// Reserves `n` words aligned to `align` and returns the first one's index.
    fn take(&mut self, n: usize, align: usize) -> Result<usize> {
        let at = self.image.len().next_multiple_of(align);
        ensure!(
            at + n <= ARENA_WORDS,
            "a recorded step needs more than {ARENA_WORDS} words of per-step tables"
        );
        self.image.resize(at + n, 0);
        Ok(at)
    }

    fn address(&self, word: usize) -> u64 {
        self.base + 4 * word as u64
    }
}

/// A recorded step and what a replay needs.
struct StepGraph {
    graph: CudaGraph,
    arena: CudaSlice<u32>,
    /// The step's output, copied here by the graph.
    out: CudaTensor,
    image: Vec<u32>,
    advancing: Vec<usize>,
    ids: (usize, usize),
    /// Steps replayed so far (the recorded one is step 0).
    steps: usize,
    max_advance: usize,
    /// A step that feeds itself: its launches' tokens on their way to the host.
    fed: Option<FedTokens>,
}

/// The greedy tokens of a self-feeding recording's launches, copied to page-locked memory after
/// each launch: two slots, so that one launch can run ahead of the tokens the host has read.
struct FedTokens {
    slots: [cudarc::driver::PinnedHostSlice<u32>; 2],
    /// Recorded again after each copy into the slot (made once; one never recorded is complete).
    copied: [cudarc::driver::CudaEvent; 2],
    launched: usize,
    taken: usize,
}

impl StepGraph {
    /// Counts one more step past the recorded one; an error once all it serves have run.
    fn take_step(&mut self) -> Result<()> {
        ensure!(
            self.steps < self.max_advance,
            "recorded decode step: all {} steps it was recorded for have run",
            self.max_advance + 1
        );
        self.steps += 1;
        Ok(())
    }

    /// The tokens of the oldest launch not taken yet, once its copy has landed.
    fn take_tokens(&mut self, id: u64) -> Result<Vec<u32>> {
        let fed = self
            .fed
            .as_mut()
            .with_context(|| format!("recorded decode step {id} does not feed itself"))?;
        ensure!(
            fed.taken < fed.launched,
            "recorded decode step {id}: every launch's tokens were taken"
        );
        let slot = fed.taken % 2;
        fed.copied[slot]
            .synchronize()
            .map_err(derr("waiting for a step's tokens"))?;
        fed.taken += 1;
        Ok(fed.slots[slot]
            .as_slice()
            .map_err(derr("page-locked tokens"))?
            .to_vec())
    }
}

// SAFETY: a CudaGraph holds raw driver handles; every use goes through the backend's mutex on the
// map of recorded steps, one thread at a time, as the driver requires of graph objects.
unsafe impl Send for StepGraph {}

/// The backend's recorded steps, and the recording in progress.
pub(super) struct StepGraphs {
    recording: Mutex<Option<Recording>>,
    graphs: Mutex<HashMap<u64, StepGraph>>,
    next_id: AtomicU64,
    enabled: AtomicBool,
    feeds: AtomicBool,
}

impl Default for StepGraphs {
    fn default() -> Self {
        StepGraphs {
            recording: Mutex::new(None),
            graphs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            enabled: AtomicBool::new(
                std::env::var(STEP_GRAPHS_ENV).map_or(true, |v| v.trim() != "off"),
            ),
            feeds: AtomicBool::new(std::env::var(STEP_FEED_ENV).is_ok_and(|v| v.trim() == "on")),
        }
    }
}

impl CudaBackend {
    /// [`Backend::records_steps`](crate::backend::Backend::records_steps).
    pub(super) fn records_steps(&self) -> bool {
        self.step_graphs.enabled.load(Ordering::Relaxed)
    }

    /// Whether greedy recordings feed themselves ([`CudaBackend::feed_greedy`]): while steps are
    /// recorded, when `DRAFTLENS_STEP_FEED=on`.
    pub(super) fn feeds_steps(&self) -> bool {
        self.records_steps() && self.step_graphs.feeds.load(Ordering::Relaxed)
    }

    /// Turns self-feeding greedy recordings on or off (A/B benchmarks and tests).
    pub fn set_step_feed(&self, on: bool) {
        self.step_graphs.feeds.store(on, Ordering::Relaxed);
    }

    /// Turns recorded steps on or off (tests and benchmarks compare both).
    pub fn set_step_graphs(&self, on: bool) {
        self.step_graphs.enabled.store(on, Ordering::Relaxed);
    }

    fn recording(&self) -> std::sync::MutexGuard<'_, Option<Recording>> {
        self.step_graphs
            .recording
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// An error while a step is being recorded: `what` would copy host data to the device, read
    /// the device or keep a buffer allocated inside the graph.
    pub(super) fn not_recording(&self, what: &str) -> Result<()> {
        if self.recording().is_some() {
            bail!("{what} cannot be part of a recorded decode step");
        }
        Ok(())
    }

    /// While recording: the device address of `ids` placed in the arena (rewritten at every
    /// replay). `None` when no step is being recorded.
    pub(super) fn recording_ids(&self, ids: &[u32]) -> Result<Option<u64>> {
        let mut rec = self.recording();
        let Some(rec) = rec.as_mut() else {
            return Ok(None);
        };
        ensure!(rec.ids.is_none(), "a recorded step embeds its tokens once");
        let at = rec.take(ids.len(), 1)?;
        rec.image[at..at + ids.len()].copy_from_slice(ids);
        rec.ids = Some((at, ids.len()));
        Ok(Some(rec.address(at)))
    }

    /// While recording: the device address of `positions` in the arena, which advance by one per
    /// replayed step (every layer's call with the same positions shares one array).
    pub(super) fn recording_positions(&self, positions: &[u32]) -> Result<Option<u64>> {
        let mut rec = self.recording();
        let Some(rec) = rec.as_mut() else {
            return Ok(None);
        };
        if let Some((p, at)) = &rec.positions {
            if p.as_slice() == positions {
                return Ok(Some(rec.address(*at)));
            }
        }
        let at = rec.take(positions.len(), 1)?;
        rec.image[at..at + positions.len()].copy_from_slice(positions);
        rec.advancing.extend(at..at + positions.len());
        rec.positions = Some((positions.to_vec(), at));
        Ok(Some(rec.address(at)))
    }

    /// While recording: the decode attention table `words` (its C layout as 4-byte words) placed
    /// in the arena, with `advancing` its words that grow by one per step (relative to its
    /// start), and the most steps a replay runs ahead of the recorded one. `None` when no step is
    /// being recorded.
    pub(super) fn recording_table(
        &self,
        words: &[u32],
        advancing: impl Iterator<Item = usize>,
    ) -> Result<Option<(u64, usize)>> {
        let mut rec = self.recording();
        let Some(rec) = rec.as_mut() else {
            return Ok(None);
        };
        let at = rec.take(words.len(), TABLE_ALIGN)?;
        rec.image[at..at + words.len()].copy_from_slice(words);
        rec.advancing.extend(advancing.map(|w| at + w));
        Ok(Some((rec.address(at), rec.max_advance)))
    }

    /// [`Backend::record_step`](crate::backend::Backend::record_step): records `step` (a
    /// `[rows, cols]` output) as a graph that serves `steps` steps, runs it once for this step,
    /// and returns its id with the output. `None` when the step cannot be recorded (what it
    /// tried is logged); nothing ran then, and the caller runs the step itself.
    pub(super) fn record_step_graph(
        &self,
        (rows, cols): (usize, usize),
        steps: usize,
        step: &mut dyn FnMut() -> Result<CudaTensor>,
    ) -> Result<Option<(u64, CudaTensor)>> {
        ensure!(steps >= 1, "a recorded step serves at least one step");
        ensure!(
            self.recording().is_none(),
            "a step is already being recorded"
        );
        // Everything the graph keeps is allocated before the capture, outside it.
        let mut arena = self
            .stream
            .alloc_zeros::<u32>(ARENA_WORDS)
            .map_err(derr("allocating a step arena"))?;
        let mut out = self.new_tensor(rows, cols)?;
        // Arrival counters for the longest lengths the graph will see: the recorded step must
        // not grow them.
        self.decode_attention_counters(super::MAX_DECODE_ROWS * 16)?;
        *self.recording() = Some(Recording {
            base: self.ptr(&arena),
            image: Vec::new(),
            advancing: Vec::new(),
            ids: None,
            positions: None,
            max_advance: steps - 1,
            feeds: false,
        });
        let captured = self.capture(&mut out, step);
        let rec = self.recording().take().expect("set above");
        let graph = match captured {
            Ok(graph) => graph,
            Err(e) => {
                // A failed capture leaves its error in the context; the eager step must not see it.
                let _ = self.ctx.check_err();
                tracing::debug!("decode step not recorded: {e:#}");
                return Ok(None);
            }
        };
        let Some(ids) = rec.ids else {
            tracing::debug!("decode step not recorded: it embedded no token ids");
            return Ok(None);
        };
        let fed = if rec.feeds {
            // SAFETY: page-locked memory only written by device copies before it is read.
            let slot = || {
                unsafe { self.ctx.alloc_pinned_with_flags::<u32>(ids.1, 0) }
                    .map_err(derr("page-locked tokens"))
            };
            let event = || self.ctx.new_event(None).map_err(derr("an event"));
            Some(FedTokens {
                slots: [slot()?, slot()?],
                copied: [event()?, event()?],
                launched: 0,
                taken: 0,
            })
        } else {
            None
        };
        self.write_arena(&mut arena, &rec.image)?;
        let mut g = StepGraph {
            graph,
            arena,
            out,
            image: rec.image,
            advancing: rec.advancing,
            ids,
            steps: 0,
            max_advance: rec.max_advance,
            fed,
        };
        self.launch_step(&mut g)?;
        let result = self.clone_tensor(&g.out)?;
        let id = self.step_graphs.next_id.fetch_add(1, Ordering::Relaxed);
        self.graphs().insert(id, g);
        Ok(Some((id, result)))
    }

    /// Captures `step` on the stream and instantiates the graph; the output is copied to `out`
    /// inside it. The capture is always ended once begun.
    fn capture(
        &self,
        out: &mut CudaTensor,
        step: &mut dyn FnMut() -> Result<CudaTensor>,
    ) -> Result<CudaGraph> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(derr("begin capture"))?;
        let ran = step().and_then(|h| {
            ensure!(
                (h.rows, h.cols) == (out.rows, out.cols),
                "the step's output is [{}, {}], expected [{}, {}]",
                h.rows,
                h.cols,
                out.rows,
                out.cols
            );
            let n = h.rows * h.cols;
            self.stream
                .memcpy_dtod(&h.buf.slice(0..n), &mut out.buf.slice_mut(0..n))
                .map_err(derr("device copy"))
            // `h` is freed here, inside the graph.
        });
        // An op that failed inside the capture (or a free after it) left its error in the
        // context, where cudarc's next call would return it instead of ending the capture: take it
        // first, so that the capture always ends and the stream works again.
        let pending = self.ctx.check_err().map_err(derr("inside the capture"));
        let ended = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(derr("end capture"));
        ran?;
        pending?;
        ended?.ok_or_else(|| anyhow!("the capture recorded nothing"))
    }

    /// [`Backend::replay_step`](crate::backend::Backend::replay_step): the next step of recording
    /// `id` with these token ids.
    pub(super) fn replay_step_graph(&self, id: u64, ids: &[u32]) -> Result<CudaTensor> {
        self.with_step_graph(id, |g| {
            let (at, n) = g.ids;
            ensure!(
                ids.len() == n,
                "recorded decode step: {} tokens for a batch of {n}",
                ids.len()
            );
            g.take_step()?;
            let mut image = g.image.clone();
            for &w in &g.advancing {
                image[w] += g.steps as u32;
            }
            image[at..at + n].copy_from_slice(ids);
            self.write_arena(&mut g.arena, &image)?;
            self.launch_step(g)?;
            self.clone_tensor(&g.out)
        })
    }

    /// While a step is being recorded, after it: the recorded step ends by writing the greedy
    /// next token of each row of `hidden` under `head` over the arena's token ids and by
    /// advancing the arena's growing words by one, so that the next replay needs no host data
    /// ([`CudaBackend::replay_step_fed`]).
    pub(super) fn feed_greedy(&self, hidden: &CudaTensor, head: &CudaMatrix) -> Result<()> {
        let (ids_at, words) = {
            let mut rec = self.recording();
            let rec = rec
                .as_mut()
                .context("a step feeds itself only while it is being recorded")?;
            ensure!(!rec.feeds, "a recorded step feeds itself once");
            let (at, n) = rec
                .ids
                .context("a step that feeds itself embeds token ids first")?;
            ensure!(
                n == hidden.rows,
                "a step of {n} tokens fed by {} rows",
                hidden.rows
            );
            // The advancing words' list, in the arena: [count, index...].
            let list: Vec<u32> = std::iter::once(rec.advancing.len())
                .chain(rec.advancing.iter().copied())
                .map(|w| w as u32)
                .collect();
            let list_at = rec.take(list.len(), 1)?;
            rec.image[list_at..].copy_from_slice(&list);
            rec.feeds = true;
            (rec.address(at), (rec.base, rec.address(list_at)))
        };
        self.lm_head_top1_to(hidden, head, ids_at)?;
        let f = self.kernels.get("elementwise", "step_arena_advance")?;
        let mut b = self.launch_builder(&f);
        b.arg(&words.0).arg(&words.1);
        // SAFETY: (u32*, const u32*): the arena and its list of in-arena word indices.
        unsafe {
            b.launch(cudarc::driver::LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("step_arena_advance"))
    }

    /// The next step of self-feeding recording `id`, its tokens the last launch's greedy ones:
    /// queued, not waited for. Its tokens come from [`CudaBackend::take_fed_tokens`].
    pub(super) fn replay_step_fed(&self, id: u64) -> Result<()> {
        self.with_step_graph(id, |g| {
            ensure!(
                g.fed.is_some(),
                "recorded decode step {id} does not feed itself"
            );
            g.take_step()?;
            self.launch_step(g)
        })
    }

    /// The greedy tokens of the oldest launch of self-feeding recording `id` whose tokens have not
    /// been taken yet, once that launch has finished (the launch after it may still run).
    pub(super) fn take_fed_tokens(&self, id: u64) -> Result<Vec<u32>> {
        self.with_step_graph(id, |g| g.take_tokens(id))
    }

    /// `f` on recorded step `id`, under the lock of the map of recorded steps.
    fn with_step_graph<R>(
        &self,
        id: u64,
        f: impl FnOnce(&mut StepGraph) -> Result<R>,
    ) -> Result<R> {
        let mut graphs = self.graphs();
        let g = graphs
            .get_mut(&id)
            .with_context(|| format!("no recorded decode step {id}"))?;
        f(g)
    }

    /// Launches `g`'s graph; a self-feeding one's tokens are then copied to the next free slot.
    fn launch_step(&self, g: &mut StepGraph) -> Result<()> {
        if let Some(fed) = &g.fed {
            ensure!(
                fed.launched - fed.taken < 2,
                "a self-feeding step runs at most one launch ahead of the tokens taken"
            );
        }
        g.graph.launch().map_err(derr("graph launch"))?;
        let Some(fed) = g.fed.as_mut() else {
            return Ok(());
        };
        let (at, n) = g.ids;
        let slot = fed.launched % 2;
        self.stream
            .memcpy_dtoh(&g.arena.slice(at..at + n), &mut fed.slots[slot])
            .map_err(derr("copying a step's tokens"))?;
        fed.copied[slot]
            .record(&self.stream)
            .map_err(derr("recording a step's tokens"))?;
        fed.launched += 1;
        Ok(())
    }

    /// [`Backend::forget_step`](crate::backend::Backend::forget_step).
    pub(super) fn forget_step_graph(&self, id: u64) {
        // An executable graph still running is freed when it completes (cuGraphExecDestroy); the
        // page-locked slots of a self-feeding one are not, so their last copies finish first.
        if let Some(g) = self.graphs().remove(&id) {
            for copied in g.fed.iter().flat_map(|f| &f.copied) {
                if let Err(e) = copied.synchronize() {
                    tracing::warn!("a recorded step's token copy: {e}");
                }
            }
        }
    }

    fn graphs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, StepGraph>> {
        self.step_graphs
            .graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn write_arena(&self, arena: &mut CudaSlice<u32>, image: &[u32]) -> Result<()> {
        if image.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_htod(image, &mut arena.slice_mut(0..image.len()))
            .map_err(derr("step arena upload"))
    }
}
