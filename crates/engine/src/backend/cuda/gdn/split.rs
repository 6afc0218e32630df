//! The split and three-phase chunked delta rule (docs/gdn-cuda.md, "Kernel variants" and
//! "Three-phase kernels"): `gdn_prep_*` computes every chunk's state-independent work at once;
//! then either `gdn_walk_*` (split: the per-sequence walk also writes the output) or `gdn_hwalk_*`
//! (the walk carries only the state, over 32- or 16-column slices, storing every chunk's start state
//! and V′) followed by `gdn_hout_*` (the output of every chunk at once).

use super::{DeltaInputs, Launch, PhaseClock, Walk, CHUNK, HEAD_DIM, SPLIT_COLUMNS};
use crate::backend::cuda::{derr, CudaBackend, CudaTensor};
use anyhow::{ensure, Result};
use cudarc::driver::{CudaSlice, LaunchConfig};

/// Value columns per `gdn_hout_*` block (`GDN_HO_DVS`).
pub const HOUT_COLUMNS: usize = 32;
/// Dynamic shared memory of a `gdn_hwalk_*` block of `columns` value columns (16 or 32): the W
/// and K tiles (64 × 132), the state slice (128 × columns), the decayed V′ and U (64 × columns
/// each), γ.
pub const fn hwalk_smem_bytes(columns: usize) -> usize {
    (2 * 64 * 132 + 128 * columns + 2 * 64 * columns + 64) * 4
}
/// Dynamic shared memory of `gdn_hwalk_engine_tc`: the f32 W staging tile (64 × 132), U (64 × 32)
/// and γ, then bf16 W and K (64 × 136 each), the state as the products read it (128 × 40) and the
/// decayed V′ (64 × 40).
pub const HWALK_TC_SMEM_BYTES: usize =
    (64 * 132 + 64 * 32 + 64) * 4 + (2 * 64 * 136 + 128 * 40 + 64 * 40) * 2;
/// Dynamic shared memory of `gdn_hout_*`, the larger of its two layouts (the FMA one's): Q
/// (64 × 132), h_c (128 × 32), the scores (64 × 68), V′ (64 × 32), Q·h_c (64 × 33), γ.
pub const HOUT_SMEM_BYTES: usize =
    (64 * 132 + 128 * HOUT_COLUMNS + 64 * 68 + 64 * HOUT_COLUMNS + 64 * (HOUT_COLUMNS + 1) + 64)
        * 4;
/// Dynamic shared memory of `gdn_hout_engine_ldm`: bf16 Q (64 × 136), h_c (128 × 40), the scores
/// (64 × 72), V′ (64 × 40); f32 Q·h_c (64 × 33), γ.
pub const HOUT_LDM_SMEM_BYTES: usize =
    (64 * 136 + 128 * 40 + 64 * 72 + 64 * 40) * 2 + (64 * (HOUT_COLUMNS + 1) + 64) * 4;

/// Where the chunked kernels find their chunks: every multi-row sequence of a call cut into
/// chunks of [`CHUNK`] rows (the last one shorter), in sequence order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkPlan {
    /// (start, end) row pairs, one per chunk (`chunk_rows` of the kernels).
    pub rows: Vec<i64>,
    /// Per sequence, the index of its first chunk (`seq_chunk0` of `gdn_hwalk_*`): the state at
    /// the start of its i-th chunk is h[seq_chunk0 + i].
    pub seq_chunk0: Vec<i64>,
}

impl ChunkPlan {
    /// The chunks of the sequences `which` (indices into `seq_starts` windows).
    pub fn new(seq_starts: &[usize], which: &[usize]) -> Self {
        let mut rows = Vec::new();
        let mut seq_chunk0 = Vec::with_capacity(which.len());
        for &i in which {
            seq_chunk0.push((rows.len() / 2) as i64);
            let (s, e) = (seq_starts[i], seq_starts[i + 1]);
            for c in (s..e).step_by(CHUNK) {
                rows.extend([c as i64, (c + CHUNK).min(e) as i64]);
            }
        }
        ChunkPlan { rows, seq_chunk0 }
    }
    pub fn len(&self) -> usize {
        self.rows.len() / 2
    }
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// f32 words of the three-phase scratch beyond the prep's: V′ `[T, Hv, 128]` (f32) and the
    /// state at every chunk start `[chunks, Hv, 128, 128]` (f32; `engine`: bf16, two per word).
    pub fn three_phase_scratch(&self, rows: usize, hv: usize, engine: bool) -> (usize, usize) {
        let h = self.len() * hv * HEAD_DIM * HEAD_DIM;
        (rows * hv * HEAD_DIM, if engine { h / 2 } else { h })
    }
}

impl CudaBackend {
    /// The split or three-phase chunked delta rule over the multi-row sequences `which`: `prep`
    /// (`gdn_prep_*`) over every chunk of them (grid: chunks × value heads), then the `walk`:
    /// `gdn_walk_*` per sequence (grid: value column slices × value heads × sequences), or the
    /// three-phase kernels' state walk and output ([`CudaBackend::three_phase_rest`]). `engine`:
    /// the kernel computes the engine profile. Scratch f32: W and U `[T, Hv, 128]`, the decayed
    /// scores `[T, Hv, 64]`, γ `[T, Hv]`: 1.3 KB per token and value head (62 KB per token at
    /// Hv = 48, 1 GB for 16k tokens).
    pub(super) fn split_delta_rule(
        &self,
        prep: Launch,
        walk: Walk,
        engine: bool,
        inputs: &DeltaInputs<'_>,
        out: &mut CudaTensor,
        clock: &mut PhaseClock,
    ) -> Result<()> {
        let &DeltaInputs {
            qkv: (q, k, v),
            ld,
            gates: (g, beta),
            seq_starts,
            which,
            per_seq: (pairs, ptrs),
            shape,
        } = inputs;
        let (rows, hv) = (out.rows, shape.v_heads);
        let plan = ChunkPlan::new(seq_starts, which);
        let n_chunks = plan.len();
        ensure!(
            n_chunks <= i32::MAX as usize,
            "gated_delta_rule: {n_chunks} chunks in one call"
        );
        let chunks = self.upload(&plan.rows)?;
        let mut wg = self.alloc::<f32>(rows * hv * HEAD_DIM)?;
        let mut ug = self.alloc::<f32>(rows * hv * HEAD_DIM)?;
        let mut ag = self.alloc::<f32>(rows * hv * CHUNK)?;
        let mut gg = self.alloc::<f32>(rows * hv)?;
        let (hv32, ratio) = (hv as i32, shape.group() as i32);
        let scale = (shape.k_dim as f32).powf(-0.5);
        let (prep, prep_smem) = prep;
        let f = self.kernels.get_with_smem("gdn", prep, prep_smem)?;
        clock.mark(self, "setup")?;
        let mut lb = self.launch_builder(&f);
        lb.arg(&q)
            .arg(&k)
            .arg(&v)
            .arg(&ld)
            .arg(&ld)
            .arg(g)
            .arg(beta)
            .arg(&chunks)
            .arg(&mut wg)
            .arg(&mut ug)
            .arg(&mut ag)
            .arg(&mut gg)
            .arg(&hv32)
            .arg(&ratio)
            .arg(&scale);
        // SAFETY: (const bf16* q, k, v, ll, ll, const float* g, beta, const ll* chunk rows,
        // float* W, U, A, G, int, int, float); the chunks lie inside 0..rows, the scratch holds
        // rows·hv·{128, 128, 64, 1} f32.
        unsafe {
            lb.launch(LaunchConfig {
                grid_dim: (n_chunks as u32, hv as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: prep_smem as u32,
            })
        }
        .map_err(derr(prep))?;
        clock.mark(self, "prep")?;
        let (walk, walk_smem) = match walk {
            Walk::WithOutput(walk) => walk,
            Walk::StateOnly {
                walk,
                columns,
                output,
            } => {
                let scratch = PrepScratch {
                    wu: (&wg, &ug),
                    ag: &ag,
                    gg: &gg,
                };
                let phases = ThreePhaseRest {
                    walk,
                    columns,
                    output,
                    engine,
                };
                return self.three_phase_rest(phases, inputs, &plan, &chunks, scratch, out, clock);
            }
        };
        let f = self.kernels.get_with_smem("gdn", walk, walk_smem)?;
        let mut lb = self.launch_builder(&f);
        lb.arg(&q)
            .arg(&k)
            .arg(&ld)
            .arg(&wg)
            .arg(&ug)
            .arg(&ag)
            .arg(&gg)
            .arg(pairs)
            .arg(&mut out.buf)
            .arg(ptrs)
            .arg(&hv32)
            .arg(&ratio)
            .arg(&scale);
        // SAFETY: (const bf16* q, k, ll, const float* W, U, A, G, const ll* rows, bf16* out,
        // const u64* states, int, int, float); as above, every state holds Hv·128·128 f32.
        unsafe {
            lb.launch(LaunchConfig {
                grid_dim: (
                    (HEAD_DIM / SPLIT_COLUMNS) as u32,
                    hv as u32,
                    which.len() as u32,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: walk_smem as u32,
            })
        }
        .map_err(derr(walk))?;
        clock.mark(self, "walk")?;
        Ok(())
    }
}

/// The last two launches of a three-phase kernel ([`Walk::StateOnly`]) and its profile.
struct ThreePhaseRest {
    walk: Launch,
    columns: usize,
    output: Launch,
    engine: bool,
}

/// The prep's outputs, as the later phases read them.
struct PrepScratch<'a> {
    /// W and U `[T, Hv, 128]`.
    wu: (&'a CudaSlice<f32>, &'a CudaSlice<f32>),
    /// The decayed scores `[T, Hv, 64]`.
    ag: &'a CudaSlice<f32>,
    /// γ `[T, Hv]`.
    gg: &'a CudaSlice<f32>,
}

impl CudaBackend {
    /// Phases 2 and 3 of the three-phase kernels, after `gdn_prep_*`: `gdn_hwalk_*` (grid:
    /// slices of 32 or 16 value columns × value heads × sequences) stores V′ and every chunk's start
    /// state h and carries the states to the end; `gdn_hout_*` (grid: chunks × value heads × 4
    /// slices of 32 value columns) writes the output. Scratch f32 beyond the prep's: V′ 512 B per
    /// token and value head, h 64 KB (engine: 32 KB) per chunk and value head (800 / 400 MB for
    /// 16k tokens at Hv = 48).
    // One more than clippy's limit: the clock threads the benchmark's phase marks through.
    #[allow(clippy::too_many_arguments)]
    fn three_phase_rest(
        &self,
        phases: ThreePhaseRest,
        inputs: &DeltaInputs<'_>,
        plan: &ChunkPlan,
        chunks: &CudaSlice<i64>,
        prep: PrepScratch<'_>,
        out: &mut CudaTensor,
        clock: &mut PhaseClock,
    ) -> Result<()> {
        let &DeltaInputs {
            qkv: (q, k, _),
            ld,
            which,
            per_seq: (pairs, ptrs),
            shape,
            ..
        } = inputs;
        let (rows, hv) = (out.rows, shape.v_heads);
        let (hv32, ratio) = (hv as i32, shape.group() as i32);
        let scale = (shape.k_dim as f32).powf(-0.5);
        let ThreePhaseRest {
            walk: (walk, walk_smem),
            columns,
            output: (output, out_smem),
            engine,
        } = phases;
        let (v_len, h_len) = plan.three_phase_scratch(rows, hv, engine);
        let mut vg = self.alloc::<f32>(v_len)?;
        let mut hg = self.alloc::<f32>(h_len)?;
        let chunk0 = self.upload(&plan.seq_chunk0)?;
        let f = self.kernels.get_with_smem("gdn", walk, walk_smem)?;
        clock.mark(self, "setup")?;
        let mut lb = self.launch_builder(&f);
        lb.arg(&k)
            .arg(&ld)
            .arg(prep.wu.0)
            .arg(prep.wu.1)
            .arg(prep.gg)
            .arg(pairs)
            .arg(&chunk0)
            .arg(&mut hg)
            .arg(&mut vg)
            .arg(ptrs)
            .arg(&hv32)
            .arg(&ratio);
        // SAFETY: (const bf16* k, ll, const float* W, U, G, const ll* rows, const ll* chunk0,
        // float* H, V, const u64* states, int, int); the row pairs lie inside 0..rows, the
        // sequences' chunks are numbered chunk0[n] .. as in `plan` (H holds plan.len()·hv·128·128
        // f32, or bf16 for the engine kernels),
        // V′ holds rows·hv·128, every state hv·128·128 f32.
        unsafe {
            lb.launch(LaunchConfig {
                grid_dim: ((HEAD_DIM / columns) as u32, hv as u32, which.len() as u32),
                block_dim: (256, 1, 1),
                shared_mem_bytes: walk_smem as u32,
            })
        }
        .map_err(derr(walk))?;
        clock.mark(self, "walk")?;
        let f = self.kernels.get_with_smem("gdn", output, out_smem)?;
        let mut lb = self.launch_builder(&f);
        lb.arg(&q)
            .arg(&ld)
            .arg(&hg)
            .arg(&vg)
            .arg(prep.ag)
            .arg(prep.gg)
            .arg(chunks)
            .arg(&mut out.buf)
            .arg(&hv32)
            .arg(&ratio)
            .arg(&scale);
        // SAFETY: (const bf16* q, ll, const float* H, V, A, G, const ll* chunk rows, bf16* out,
        // int, int, float); chunk i's state is H[i] (written above), out holds rows·hv·128.
        unsafe {
            lb.launch(LaunchConfig {
                grid_dim: (
                    plan.len() as u32,
                    hv as u32,
                    (HEAD_DIM / HOUT_COLUMNS) as u32,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: out_smem as u32,
            })
        }
        .map_err(derr(output))?;
        clock.mark(self, "output")?;
        Ok(())
    }
}
