//! GEMMs of the CUDA backend through cuBLASLt, with a per-shape algorithm choice.
//!
//! Length (~1000 lines, over the ~800 guideline on purpose): the cuBLASLt descriptors, the per-shape
//! algorithm tuning and the persisted choices must agree field for field, so they stay in one file;
//! the lab's sustained-load timing is behind the `kernel-lab` feature.
//!
//! `y[rows, out] = x[rows, inp] · W[out, inp]ᵀ (+ y)` with bf16 operands, fp32 accumulation
//! (`CUBLAS_COMPUTE_32F`, fp32 alpha/beta) and bf16 or fp32 output — the same arithmetic as the
//! `cublasGemmEx` fallback at the end of this file. Split-K partial sums may only be reduced in fp32
//! (`CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE`, never in place or in the bf16 output type), which
//! is what `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION` asks of `cublasGemmEx`.
//!
//! Modes ([`GemmMode`]): `GemmEx` (plain cuBLAS, its own heuristic), `LtHeuristic` (cuBLASLt's
//! first heuristic answer with a 32 MiB workspace), `LtTuned` (at the first use of a shape, up to
//! [`CANDIDATES`] heuristic answers and `cublasGemmEx` itself are timed on the real operands —
//! output into a scratch buffer — in [`TUNE_ROUNDS`] interleaved rounds, each candidate's best
//! round counts, and the fastest is kept for that shape; interleaving and the best-of-rounds keep
//! the choice from following the card's power-limited clock swings). Small GEMMs (under
//! [`TUNE_MIN_FLOPS`]) take the first heuristic answer: timing them costs more than it saves.
//! Different algorithms sum in different orders, so results may differ between modes by fp32
//! rounding of the accumulation, never by bf16 rounding. A tuned choice is remembered on disk per
//! machine and shape ([`super::gemm_choices`]): later processes on the machine run the same
//! algorithm (the same bits) without timing again.

use super::decode::{self, MAX_DECODE_ROWS};
use super::decode_lt::{DecodeChoiceRecord, DecodeKey, DecodeRoute};
use super::gemm_choices::{Choice, ChoiceStore, FILE_NAME};
use super::{blas_err, CudaBackend, CudaMatrix, CudaTensor};
use anyhow::{anyhow, ensure, Result};
use cudarc::cublas::{result as blas_result, sys as blas_sys};
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How [`super::CudaBackend`] runs its GEMMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum GemmMode {
    /// `cublasGemmEx` with `CUBLAS_GEMM_DEFAULT`.
    GemmEx,
    /// cuBLASLt, first heuristic answer.
    LtHeuristic,
    /// cuBLASLt, fastest of several heuristic answers timed at the first use of each shape.
    LtTuned,
}

/// Heuristic answers timed per shape in [`GemmMode::LtTuned`].
pub const CANDIDATES: usize = 12;
/// Timing rounds over all candidates (each candidate's fastest round counts).
pub const TUNE_ROUNDS: usize = 2;
/// Smallest GEMM (2·rows·out·inp) that is tuned; smaller ones take the first heuristic answer.
pub const TUNE_MIN_FLOPS: f64 = 1e10;
/// Fewest rows whose shapes are tuned. Plans are keyed by the exact row count, and a prompt's own
/// prefill (`generate`'s first forward) has a new row count for almost every prompt: timing 12
/// candidates × 2 rounds for each of its four projection shapes cost more than the prefill itself
/// (the first 32 prompts of an 8B `extract` took several times as long as each later 32:
/// docs/benchmarks-cuda.md, "End to end, first round"). Packed forwards (thousands of rows, where
/// tuning pays) are still tuned.
pub const TUNE_MIN_ROWS: usize = 2048;
const WORKSPACE_BYTES: usize = 32 << 20;

/// Output element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum OutType {
    Bf16,
    F32,
}

impl OutType {
    fn lt(self) -> lt::cudaDataType {
        match self {
            OutType::Bf16 => lt::cudaDataType::CUDA_R_16BF,
            OutType::F32 => lt::cudaDataType::CUDA_R_32F,
        }
    }
    pub(super) fn bytes(self) -> usize {
        match self {
            OutType::Bf16 => 2,
            OutType::F32 => 4,
        }
    }
}

/// The operands of `y[rows, out] = x[rows, inp] · W[out, inp]ᵀ` as device addresses: `x` and `W`
/// row-major bf16, `y` of the call's output type with row stride `out`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmOperands {
    pub x: u64,
    pub rows: usize,
    pub w: u64,
    pub out: usize,
    pub inp: usize,
    pub y: u64,
}

impl GemmOperands {
    /// Alignment (bytes, ≤ 256) that every operand pointer has: algorithms are chosen for it.
    fn align(&self) -> u32 {
        [self.x, self.w, self.y]
            .iter()
            .map(|p| 1u32 << p.trailing_zeros().min(8))
            .min()
            .unwrap_or(256)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    rows: usize,
    out: usize,
    inp: usize,
    accumulate: bool,
    out_type: OutType,
    /// Alignment (bytes, ≤ 256) that every operand pointer has: algorithms are chosen for it.
    align: u32,
    tuned: bool,
}

impl PlanKey {
    /// The shape's key in the remembered choices ([`ChoiceStore`]).
    fn choice_key(&self) -> String {
        format!(
            "rows {} out {} in {} acc {} {:?} align {}",
            self.rows, self.out, self.inp, self.accumulate as u8, self.out_type, self.align
        )
    }
}

/// Descriptors and the chosen algorithm of one GEMM shape.
pub(super) struct Plan {
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    c: lt::cublasLtMatrixLayout_t,
    /// None: cuBLASLt offered nothing for this shape, or `cublasGemmEx` timed faster; the caller
    /// then runs `cublasGemmEx`.
    algo: Option<lt::cublasLtMatmulAlgo_t>,
}

// SAFETY: a plan's descriptors are written once while it is built and afterwards only read by
// cuBLASLt calls (which do not modify them); the plan is destroyed once, when the last Arc drops.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by this module, destroyed once.
        unsafe {
            let _ = lt::cublasLtMatrixLayoutDestroy(self.a);
            let _ = lt::cublasLtMatrixLayoutDestroy(self.b);
            let _ = lt::cublasLtMatrixLayoutDestroy(self.c);
            let _ = lt::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}

impl Plan {
    /// Descriptors of `y[rows, out] = x[rows, inp] · W[out, inp]ᵀ` (fp32 compute, bf16 operands,
    /// `out_type` output), no algorithm yet. Column-major view as in `gemm_raw`:
    /// yᵀ[out, rows] = op_T(W as [inp, out]) · xᵀ[inp, rows].
    pub(super) fn new(rows: usize, out: usize, inp: usize, out_type: OutType) -> Result<Plan> {
        let bf = lt::cudaDataType::CUDA_R_16BF;
        let mut desc: lt::cublasLtMatmulDesc_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        unsafe {
            check(
                "creating a matmul descriptor",
                lt::cublasLtMatmulDescCreate(
                    &mut desc,
                    lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    lt::cudaDataType::CUDA_R_32F,
                ),
            )?;
        }
        let layout = |t: lt::cudaDataType, r: usize, c: usize, ld: usize| -> Result<_> {
            let mut l: lt::cublasLtMatrixLayout_t = std::ptr::null_mut();
            // SAFETY: out-pointer to a local.
            check("creating a matrix layout", unsafe {
                lt::cublasLtMatrixLayoutCreate(&mut l, t, r as u64, c as u64, ld as i64)
            })?;
            Ok(l)
        };
        let plan = Plan {
            desc,
            a: layout(bf, inp, out, inp)?,
            b: layout(bf, inp, rows, inp)?,
            c: layout(out_type.lt(), out, rows, out)?,
            algo: None,
        };
        // op(A) = Aᵀ (CUBLAS_OP_T = 1).
        let trans_t: i32 = 1;
        // SAFETY: live descriptor, 4-byte attribute value.
        check("setting TRANSA", unsafe {
            lt::cublasLtMatmulDescSetAttribute(
                plan.desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &trans_t as *const i32 as *const c_void,
                4,
            )
        })?;
        Ok(plan)
    }
}

/// One line per tuned shape, for the benchmarks.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TuneRecord {
    pub rows: usize,
    pub out: usize,
    pub inp: usize,
    pub accumulate: bool,
    pub candidates: usize,
    /// Milliseconds per GEMM (best of [`TUNE_ROUNDS`] runs of [`TUNE_REPS`] launches) of
    /// `cublasGemmEx`, of cuBLASLt's first heuristic answer, and of the chosen one.
    pub gemm_ex_ms: f64,
    pub first_ms: f64,
    pub best_ms: f64,
    /// Index of the chosen heuristic answer; None: `cublasGemmEx` was fastest.
    pub best_index: Option<usize>,
}

const TUNE_REPS: usize = 2;

pub(super) struct LtState {
    handle: lt::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// None: planning failed for this shape (the GEMM then runs on `cublasGemmEx`).
    plans: Mutex<HashMap<PlanKey, Option<Arc<Plan>>>>,
    tuned: Mutex<Vec<TuneRecord>>,
    /// Tuned choices remembered across processes, under this machine's name (device, driver,
    /// cuBLASLt version); `Arc` so a test can point it elsewhere.
    choices: Mutex<Arc<ChoiceStore>>,
    /// Tuned shapes planned from a remembered choice instead of timing.
    reused: AtomicUsize,
    /// The first planning error, for diagnostics.
    plan_error: Mutex<Option<String>>,
    /// Decode GEMM routes per weight shape ([`super::decode_lt`]).
    pub(super) decode: Mutex<HashMap<DecodeKey, Arc<DecodeRoute>>>,
    /// What choosing each decode route measured, for the benchmarks.
    pub(super) decode_records: Mutex<Vec<DecodeChoiceRecord>>,
}

impl LtState {
    pub(super) fn choices(&self) -> Arc<ChoiceStore> {
        self.choices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for LtState {
    fn drop(&mut self) {
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.decode
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        // SAFETY: the handle was created by `Gemms::new` and every plan using it is gone.
        unsafe {
            let _ = lt::cublasLtDestroy(self.handle);
        }
    }
}

pub(crate) struct Gemms {
    mode: AtomicU8,
    lt: Option<LtState>,
    /// Why cuBLASLt is not in use, when it is not.
    lt_error: Option<String>,
}

// SAFETY: the raw cuBLASLt handle and descriptors are only used under the backend's one stream;
// the mutable state (plan cache, records) is behind mutexes. cuBLASLt handles are thread-safe
// for use with one stream at a time, which is the backend's documented contract.
unsafe impl Send for Gemms {}
unsafe impl Sync for Gemms {}

fn lt_err(what: &str, s: lt::cublasStatus_t) -> anyhow::Error {
    anyhow!("cuBLASLt: {what}: {s:?}")
}

pub(super) fn check(what: &str, s: lt::cublasStatus_t) -> Result<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(lt_err(what, s))
    }
}

impl Gemms {
    /// cuBLASLt handle and workspace; when either fails, every GEMM stays on `cublasGemmEx`.
    /// `device` names the GPU and driver for the remembered choices, kept in `cache_dir` (none:
    /// not remembered beyond the process).
    pub(crate) fn new(stream: &Arc<CudaStream>, device: &str, cache_dir: Option<PathBuf>) -> Gemms {
        let make = || -> Result<LtState> {
            let mut handle: lt::cublasLtHandle_t = std::ptr::null_mut();
            // SAFETY: out-pointer to a local.
            check("creating a handle", unsafe {
                lt::cublasLtCreate(&mut handle)
            })?;
            // SAFETY: the workspace is only handed to cuBLASLt, which writes before reading.
            let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
                .map_err(|e| anyhow!("cuBLASLt workspace: {e}"))?;
            // SAFETY: no arguments; the library is loaded (the handle exists).
            let machine = format!("{device} cublasLt {}", unsafe { lt::cublasLtGetVersion() });
            let store = ChoiceStore::open(cache_dir.map(|d| d.join(FILE_NAME)), machine);
            Ok(LtState {
                handle,
                workspace,
                plans: Mutex::new(HashMap::new()),
                tuned: Mutex::new(Vec::new()),
                choices: Mutex::new(Arc::new(store)),
                reused: AtomicUsize::new(0),
                plan_error: Mutex::new(None),
                decode: Mutex::new(HashMap::new()),
                decode_records: Mutex::new(Vec::new()),
            })
        };
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(make))
            .unwrap_or_else(|_| Err(anyhow!("cuBLASLt initialisation panicked")));
        match made {
            Ok(s) => Gemms {
                mode: AtomicU8::new(GemmMode::LtTuned as u8),
                lt: Some(s),
                lt_error: None,
            },
            Err(e) => Gemms {
                mode: AtomicU8::new(GemmMode::GemmEx as u8),
                lt: None,
                lt_error: Some(e.to_string()),
            },
        }
    }

    pub(crate) fn mode(&self) -> GemmMode {
        match self.mode.load(Ordering::Relaxed) {
            0 => GemmMode::GemmEx,
            1 => GemmMode::LtHeuristic,
            _ => GemmMode::LtTuned,
        }
    }

    pub(crate) fn set_mode(&self, m: GemmMode) -> Result<()> {
        if m != GemmMode::GemmEx && self.lt.is_none() {
            return Err(anyhow!(
                "cuBLASLt is unavailable: {}",
                self.lt_error.as_deref().unwrap_or("unknown reason")
            ));
        }
        self.mode.store(m as u8, Ordering::Relaxed);
        Ok(())
    }

    /// "cuBLASLt unavailable: …", or the number of shapes planned and how many of them run on
    /// cublasGemmEx, with the first planning error if any.
    pub(crate) fn lt_status(&self) -> String {
        let Some(st) = self.lt.as_ref() else {
            return format!(
                "cuBLASLt unavailable: {}",
                self.lt_error.as_deref().unwrap_or("unknown reason")
            );
        };
        let plans = st.plans.lock().unwrap_or_else(|e| e.into_inner());
        let fallback = plans
            .values()
            .filter(|p| p.as_ref().map(|p| p.algo.is_none()).unwrap_or(true))
            .count();
        let err = st.plan_error.lock().unwrap_or_else(|e| e.into_inner());
        format!(
            "cuBLASLt: {} shapes planned, {fallback} of them on cublasGemmEx (timed faster, or no cuBLASLt algorithm), {} tuned shapes from remembered choices{}",
            plans.len(),
            st.reused.load(Ordering::Relaxed),
            err.as_ref()
                .map(|e| format!(" (first planning error: {e})"))
                .unwrap_or_default()
        )
    }

    /// Tuned shapes planned from a remembered choice, not timed.
    pub(crate) fn reused_choices(&self) -> usize {
        self.lt
            .as_ref()
            .map_or(0, |s| s.reused.load(Ordering::Relaxed))
    }

    /// Drops every plan (descriptors and choices in memory), as a new process starts.
    pub(crate) fn forget_plans(&self) {
        if let Some(st) = self.lt.as_ref() {
            st.plans.lock().unwrap_or_else(|e| e.into_inner()).clear();
            st.decode.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// The cuBLASLt state when GEMMs are tuned ([`GemmMode::LtTuned`]): decode GEMMs only leave
    /// the backend's own kernel in that mode.
    pub(super) fn tuned_lt(&self) -> Option<&LtState> {
        self.lt
            .as_ref()
            .filter(|_| self.mode() == GemmMode::LtTuned)
    }

    /// What choosing each decode route measured so far.
    pub(crate) fn decode_records(&self) -> Vec<DecodeChoiceRecord> {
        self.lt
            .as_ref()
            .map(|s| {
                s.decode_records
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            })
            .unwrap_or_default()
    }

    /// Where tuned choices are remembered from now on (None: nowhere beyond this process);
    /// shapes already planned keep their plans.
    pub(crate) fn set_choices_file(&self, path: Option<PathBuf>) {
        if let Some(st) = self.lt.as_ref() {
            let store = st.choices().reopen(path);
            *st.choices.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(store);
        }
    }

    pub(crate) fn tune_records(&self) -> Vec<TuneRecord> {
        self.lt
            .as_ref()
            .map(|s| s.tuned.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default()
    }

    /// Runs the GEMM through cuBLASLt. Returns Ok(false) when the caller must use `cublasGemmEx`
    /// instead (mode `GemmEx`, or no cuBLASLt algorithm for this shape).
    pub(crate) fn run(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        g: GemmOperands,
        out_type: OutType,
        beta: f32,
        gemm_ex: &dyn Fn(u64, f32) -> Result<()>,
    ) -> Result<bool> {
        let GemmOperands { rows, out, inp, .. } = g;
        let mode = self.mode();
        let Some(st) = self.lt.as_ref() else {
            return Ok(false);
        };
        if mode == GemmMode::GemmEx {
            return Ok(false);
        }
        let flops = 2.0 * rows as f64 * out as f64 * inp as f64;
        let align = g.align();
        let key = PlanKey {
            rows,
            out,
            inp,
            accumulate: beta != 0.0,
            out_type,
            align,
            tuned: mode == GemmMode::LtTuned && flops >= TUNE_MIN_FLOPS && rows >= TUNE_MIN_ROWS,
        };
        let cached = st
            .plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let plan = match cached {
            Some(p) => p,
            None => {
                // A shape cuBLASLt cannot plan stays on cublasGemmEx (the error is kept for
                // `lt_status`), so a cuBLASLt quirk never stops a forward.
                let p = match self.plan(ctx, stream, st, key, &g, gemm_ex) {
                    Ok(p) => Some(Arc::new(p)),
                    Err(e) => {
                        st.plan_error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert_with(|| e.to_string());
                        None
                    }
                };
                st.plans
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, p.clone());
                p
            }
        };
        let Some(plan) = plan else {
            return Ok(false);
        };
        let Some(algo) = plan.algo.as_ref() else {
            return Ok(false);
        };
        launch(st, stream, &plan, algo, &g, beta)?;
        Ok(true)
    }

    /// Descriptors for `key` and its algorithm: the heuristic's first answer, or (tuned) the
    /// fastest of its first [`CANDIDATES`] answers and `cublasGemmEx` (`gemm_ex(y, beta)`) on the
    /// real operands.
    fn plan(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        st: &LtState,
        key: PlanKey,
        g: &GemmOperands,
        gemm_ex: &dyn Fn(u64, f32) -> Result<()>,
    ) -> Result<Plan> {
        let mut plan = Plan::new(key.rows, key.out, key.inp, key.out_type)?;
        // A tuned shape this machine has timed before runs what was chosen then (checked by
        // cuBLASLt against these descriptors; a choice that no longer fits is timed again).
        if key.tuned {
            // Some(None): cublasGemmEx was chosen.
            let remembered = match st.choices().get(&key.choice_key()) {
                Some(Choice::GemmEx) => Some(None),
                // Only decode routes remember the own kernel; a prefill shape times again.
                Some(Choice::Own) => None,
                Some(Choice::Lt(data)) => Some(lt::cublasLtMatmulAlgo_t { data })
                    .filter(|a| algo_fits(st, &plan, a))
                    .map(Some),
                None => None,
            };
            if let Some(algo) = remembered {
                plan.algo = algo;
                st.reused.fetch_add(1, Ordering::Relaxed);
                return Ok(plan);
            }
        }
        let want = if key.tuned { CANDIDATES } else { 1 };
        let cands = heuristic(st, &plan, key.align, want)?;
        if cands.is_empty() {
            return Ok(plan);
        }
        if !key.tuned {
            plan.algo = Some(cands[0]);
            return Ok(plan);
        }
        // Shown apart in `--timeline`: timing is a per-process cost of every new shape.
        let _phase = crate::timeline::phase("gemm tuning");
        // Time every candidate on the real inputs, writing a scratch output (accumulating GEMMs
        // accumulate into the scratch, which starts at zero).
        let bytes = key.rows * key.out * key.out_type.bytes();
        // SAFETY: zero-filled right below, before any read.
        let mut scratch = unsafe { stream.alloc::<u8>(bytes) }
            .map_err(|e| anyhow!("cuBLASLt tuning scratch of {bytes} bytes: {e}"))?;
        stream
            .memset_zeros(&mut scratch)
            .map_err(|e| anyhow!("cuBLASLt tuning scratch: {e}"))?;
        let y = scratch.device_ptr(stream).0;
        let beta = if key.accumulate { 1.0 } else { 0.0 };
        let ev = |what| {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| anyhow!("cuBLASLt tuning: {what} event: {e}"))
        };
        let (e0, e1) = (ev("start")?, ev("end")?);
        // Candidate i < cands.len() is a cuBLASLt algorithm, i == cands.len() is cublasGemmEx.
        let run_one = |i: usize| -> Result<()> {
            match cands.get(i) {
                Some(algo) => launch(st, stream, &plan, algo, &GemmOperands { y, ..*g }, beta),
                None => gemm_ex(y, beta),
            }
        };
        let n_cand = cands.len() + 1;
        // One untimed launch each (also rejects candidates that fail at run time).
        let usable: Vec<bool> = (0..n_cand).map(|i| run_one(i).is_ok()).collect();
        let mut best_ms = vec![f64::INFINITY; n_cand];
        for _ in 0..TUNE_ROUNDS {
            for i in (0..n_cand).filter(|&i| usable[i]) {
                e0.record(stream)
                    .map_err(|e| anyhow!("cuBLASLt tuning: record: {e}"))?;
                let mut ok = true;
                for _ in 0..TUNE_REPS {
                    ok &= run_one(i).is_ok();
                }
                e1.record(stream)
                    .map_err(|e| anyhow!("cuBLASLt tuning: record: {e}"))?;
                let ms = e0
                    .elapsed_ms(&e1)
                    .map_err(|e| anyhow!("cuBLASLt tuning: elapsed: {e}"))?
                    as f64
                    / TUNE_REPS as f64;
                if ok {
                    best_ms[i] = best_ms[i].min(ms);
                }
            }
        }
        drop(scratch);
        let best = (0..n_cand)
            .min_by(|&a, &b| best_ms[a].total_cmp(&best_ms[b]))
            .expect("at least cublasGemmEx is a candidate");
        if !best_ms[best].is_finite() {
            return Ok(plan);
        }
        plan.algo = cands.get(best).copied();
        st.choices().remember(
            &key.choice_key(),
            plan.algo.map_or(Choice::GemmEx, |a| Choice::Lt(a.data)),
        );
        st.tuned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(TuneRecord {
                rows: key.rows,
                out: key.out,
                inp: key.inp,
                accumulate: key.accumulate,
                candidates: cands.len(),
                gemm_ex_ms: best_ms[cands.len()],
                first_ms: best_ms[0],
                best_ms: best_ms[best],
                best_index: (best < cands.len()).then_some(best),
            });
        Ok(plan)
    }
}

/// Up to `want` of cuBLASLt's heuristic answers for `plan` (best first) within the workspace,
/// for operands aligned to `align` bytes, with split-K partial sums reduced in fp32 only.
pub(super) fn heuristic(
    st: &LtState,
    plan: &Plan,
    align: u32,
    want: usize,
) -> Result<Vec<lt::cublasLtMatmulAlgo_t>> {
    let mut pref: lt::cublasLtMatmulPreference_t = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    check("creating a preference", unsafe {
        lt::cublasLtMatmulPreferenceCreate(&mut pref)
    })?;
    struct PrefGuard(lt::cublasLtMatmulPreference_t);
    impl Drop for PrefGuard {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once.
            unsafe {
                let _ = lt::cublasLtMatmulPreferenceDestroy(self.0);
            }
        }
    }
    let pref = PrefGuard(pref);
    let ws: u64 = WORKSPACE_BYTES as u64;
    // fp32 (compute type) split-K reductions only: no in-place or bf16-output reductions.
    let schemes: u32 = lt::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
    // SAFETY: live preference, attribute values of the documented sizes.
    unsafe {
        use lt::cublasLtMatmulPreferenceAttributes_t as P;
        let set = |a: P, v: *const c_void, n: usize| {
            check(
                "setting a preference",
                lt::cublasLtMatmulPreferenceSetAttribute(pref.0, a, v, n),
            )
        };
        set(
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const u64 as *const c_void,
            8,
        )?;
        set(
            P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
            &schemes as *const u32 as *const c_void,
            4,
        )?;
        for a in [
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ] {
            set(a, &align as *const u32 as *const c_void, 4)?;
        }
    }
    // SAFETY: zeroed plain-data structs are valid inputs for the out-array.
    let mut results: Vec<lt::cublasLtMatmulHeuristicResult_t> =
        vec![unsafe { std::mem::zeroed() }; want];
    let mut n: i32 = 0;
    // SAFETY: live descriptors; `results` holds `want` entries.
    let s = unsafe {
        lt::cublasLtMatmulAlgoGetHeuristic(
            st.handle,
            plan.desc,
            plan.a,
            plan.b,
            plan.c,
            plan.c,
            pref.0,
            want as i32,
            results.as_mut_ptr(),
            &mut n,
        )
    };
    let cands: Vec<lt::cublasLtMatmulAlgo_t> = if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        results[..(n.max(0) as usize).min(want)]
            .iter()
            .filter(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .filter(|r| r.workspaceSize <= WORKSPACE_BYTES)
            .map(|r| r.algo)
            .collect()
    } else {
        Vec::new()
    };
    Ok(cands)
}

/// Whether cuBLASLt accepts `algo` for `plan`'s descriptors within the workspace, with split-K
/// partial sums reduced in fp32 only (what the tuner's preference asks of fresh answers).
pub(super) fn algo_fits(st: &LtState, plan: &Plan, algo: &lt::cublasLtMatmulAlgo_t) -> bool {
    // SAFETY: zeroed plain-data struct as an out-parameter.
    let mut result: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
    // SAFETY: live handle and descriptors; `algo` and `result` are live locals.
    let s = unsafe {
        lt::cublasLtMatmulAlgoCheck(
            st.handle,
            plan.desc,
            plan.a,
            plan.b,
            plan.c,
            plan.c,
            algo,
            &mut result,
        )
    };
    if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS || result.workspaceSize > WORKSPACE_BYTES {
        return false;
    }
    let attr = |a: lt::cublasLtMatmulAlgoConfigAttributes_t| -> Option<u32> {
        let (mut v, mut written) = (0u32, 0usize);
        // SAFETY: a 4-byte buffer for a 4-byte attribute.
        let s = unsafe {
            lt::cublasLtMatmulAlgoConfigGetAttribute(
                algo,
                a,
                &mut v as *mut u32 as *mut c_void,
                4,
                &mut written,
            )
        };
        (s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS && written == 4).then_some(v)
    };
    use lt::cublasLtMatmulAlgoConfigAttributes_t as A;
    let splits = attr(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    let scheme = attr(A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    let compute = lt::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
    matches!(splits, Some(n) if n <= 1) || scheme == Some(compute)
}

/// One `cublasLtMatmul` of `plan` with `algo` (the plan fixes the shapes; `g`'s pointers are used).
pub(super) fn launch(
    st: &LtState,
    stream: &Arc<CudaStream>,
    plan: &Plan,
    algo: &lt::cublasLtMatmulAlgo_t,
    g: &GemmOperands,
    beta: f32,
) -> Result<()> {
    let GemmOperands { x, w, y, .. } = *g;
    let alpha = 1f32;
    let ws = st.workspace.device_ptr(stream).0;
    // SAFETY: pointers address buffers of the plan's shapes (checked by `gemm_raw` below);
    // C and D are the same buffer with the same layout (in-place accumulation is allowed); the
    // workspace is WORKSPACE_BYTES long and the algorithm was chosen for at most that.
    check("cublasLtMatmul", unsafe {
        lt::cublasLtMatmul(
            st.handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            w as *const c_void,
            plan.a,
            x as *const c_void,
            plan.b,
            &beta as *const f32 as *const c_void,
            y as *const c_void,
            plan.c,
            y as *mut c_void,
            plan.c,
            algo,
            ws as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as lt::cudaStream_t,
        )
    })
}

// ---------------------------------------------------------------------------------------------
// The backend's GEMM entry points: cuBLASLt through [`Gemms`] when it has a plan, else
// `cublasGemmEx`.

impl CudaBackend {
    /// How GEMMs run from now on (see [`GemmMode`]; the default is [`GemmMode::LtTuned`] when
    /// cuBLASLt loads, else [`GemmMode::GemmEx`]).
    pub fn set_gemm_mode(&self, mode: GemmMode) -> Result<()> {
        self.gemm.set_mode(mode)
    }

    pub fn gemm_mode(&self) -> GemmMode {
        self.gemm.mode()
    }

    /// cuBLASLt availability, shapes planned and fallbacks to `cublasGemmEx` (diagnostics).
    pub fn gemm_status(&self) -> String {
        self.gemm.lt_status()
    }

    /// The shapes tuned so far in [`GemmMode::LtTuned`] (first heuristic answer vs the chosen one).
    pub fn gemm_tune_records(&self) -> Vec<TuneRecord> {
        self.gemm.tune_records()
    }

    /// Tuned shapes that ran a choice remembered from an earlier process instead of timing.
    pub fn gemm_reused_choices(&self) -> usize {
        self.gemm.reused_choices()
    }

    /// Forgets every GEMM plan, so the next GEMM of each shape is planned again (from a
    /// remembered choice, or timed), as in a new process. For tests.
    pub fn forget_gemm_plans(&self) {
        self.gemm.forget_plans()
    }

    /// Where tuned GEMM choices are remembered from now on (default: `gemm-choices-v1.json` in
    /// the kernel cache folder; None: nowhere beyond this process). For tests and benchmarks.
    pub fn set_gemm_choices_file(&self, path: Option<PathBuf>) {
        self.gemm.set_choices_file(path)
    }

    /// The operands of `x · Wᵀ` written to `y`.
    pub(super) fn operands(&self, x: &CudaTensor, w: &CudaMatrix, y: u64) -> GemmOperands {
        GemmOperands {
            x: self.ptr(&x.buf),
            rows: x.rows,
            w: self.ptr(&w.buf),
            out: w.out,
            inp: w.inp,
            y,
        }
    }

    /// `y = x · Wᵀ (+ beta · y)` with bf16 operands and fp32 accumulation. Raw pointers so the
    /// LM head can write fp32 logits for a slice of rows.
    pub(super) fn gemm_raw(
        &self,
        g: GemmOperands,
        y_type: blas_sys::cudaDataType,
        beta: f32,
    ) -> Result<()> {
        let GemmOperands { rows, out, inp, .. } = g;
        if rows == 0 || out == 0 {
            return Ok(());
        }
        ensure!(
            rows <= i32::MAX as usize && out <= i32::MAX as usize && inp <= i32::MAX as usize,
            "matmul too large for cuBLAS: [{rows}, {inp}] x [{out}, {inp}]"
        );
        let out_type = if y_type == blas_sys::cudaDataType::CUDA_R_32F {
            OutType::F32
        } else {
            OutType::Bf16
        };
        // cuBLASLt (the tuner also times cublasGemmEx on the shape, into its own scratch output).
        let gemm_ex = |y_scratch: u64, b: f32| {
            self.gemm_ex_raw(GemmOperands { y: y_scratch, ..g }, y_type, b)
        };
        if self
            .gemm
            .run(&self.ctx, &self.stream, g, out_type, beta, &gemm_ex)?
        {
            return Ok(());
        }
        self.gemm_ex_raw(g, y_type, beta)
    }

    /// `cublasGemmEx` for [`CudaBackend::gemm_raw`] (shapes checked there).
    pub(super) fn gemm_ex_raw(
        &self,
        g: GemmOperands,
        y_type: blas_sys::cudaDataType,
        beta: f32,
    ) -> Result<()> {
        let GemmOperands {
            x,
            rows,
            w,
            out,
            inp,
            y,
        } = g;
        let alpha = 1f32;
        // Column-major view: yᵀ[out, rows] = W[out, inp] · xᵀ[inp, rows]; W row-major [out, inp]
        // is column-major [inp, out] (lda = inp), hence op(A) = T.
        // SAFETY: the pointers address buffers of at least rows*inp, out*inp and rows*out elements.
        unsafe {
            blas_result::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                out as i32,
                rows as i32,
                inp as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16BF,
                inp as i32,
                x as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16BF,
                inp as i32,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                y_type,
                out as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("cublasGemmEx"))
    }

    /// `acc += x · Wᵀ` in one cuBLAS call (beta = 1): the residual add fused into the GEMM
    /// epilogue, one bf16 rounding of `acc + fp32 product` instead of HF's two.
    pub fn matmul_acc(&self, x: &CudaTensor, w: &CudaMatrix, acc: &mut CudaTensor) -> Result<()> {
        ensure!(
            x.cols == w.inp,
            "matmul: input has {} columns, weight expects {}",
            x.cols,
            w.inp
        );
        ensure!(
            (acc.rows, acc.cols) == (x.rows, w.out),
            "matmul_acc: accumulator is [{}, {}], product is [{}, {}]",
            acc.rows,
            acc.cols,
            x.rows,
            w.out
        );
        if x.rows <= MAX_DECODE_ROWS {
            // Batch-invariant, the add in the epilogue as below (decode.rs).
            let g = self.operands(x, w, self.ptr(&acc.buf));
            return self.decode_gemm_raw(g, decode::Epilogue::AddBf16);
        }
        let g = self.operands(x, w, self.ptr(&acc.buf));
        self.gemm_raw(g, blas_sys::cudaDataType::CUDA_R_16BF, 1.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Candidates under sustained load (benchmarks; the kernel lab)

#[cfg(feature = "kernel-lab")]
impl CudaBackend {
    /// Milliseconds per GEMM of every heuristic candidate for `x · Wᵀ` (bf16 out, `beta` 0 or 1)
    /// under sustained load: `heat_ms` of the first candidate back to back first (the H200 is
    /// power-limited, and a cold card runs a short burst at a higher clock than a forward keeps),
    /// then `rounds` interleaved rounds of `reps` launches per candidate, each candidate's mean
    /// over the rounds. The tuner ([`Gemms::plan`]) times bursts instead; this measures whether
    /// its ranking survives; candidate i is the tuner's candidate i (`TuneRecord::best_index`).
    pub fn gemm_candidates_sustained(
        &self,
        x: &CudaTensor,
        w: &CudaMatrix,
        beta: f32,
        heat_ms: f64,
        rounds: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        let st = self
            .gemm
            .lt
            .as_ref()
            .ok_or_else(|| anyhow!("cuBLASLt is not in use"))?;
        let y = self.alloc::<half::bf16>(x.rows * w.out)?;
        let g = self.operands(x, w, self.ptr(&y));
        let plan = Plan::new(g.rows, g.out, g.inp, OutType::Bf16)?;
        let cands = heuristic(st, &plan, g.align(), CANDIDATES)?;
        ensure!(!cands.is_empty(), "no cuBLASLt candidate");
        let ev = || {
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| anyhow!("event: {e}"))
        };
        let (e0, e1) = (ev()?, ev()?);
        let time = |i: usize, n: usize| -> Result<f64> {
            e0.record(&self.stream)
                .map_err(|e| anyhow!("record: {e}"))?;
            for _ in 0..n {
                launch(st, &self.stream, &plan, &cands[i], &g, beta)?;
            }
            e1.record(&self.stream)
                .map_err(|e| anyhow!("record: {e}"))?;
            Ok(e0.elapsed_ms(&e1).map_err(|e| anyhow!("elapsed: {e}"))? as f64 / n as f64)
        };
        let one = time(0, 2)?;
        time(0, ((heat_ms / one) as usize).max(1))?;
        let usable: Vec<bool> = (0..cands.len()).map(|i| time(i, 1).is_ok()).collect();
        let mut sum = vec![0.0; cands.len()];
        for _ in 0..rounds {
            for i in (0..cands.len()).filter(|&i| usable[i]) {
                sum[i] += time(i, reps)?;
            }
        }
        Ok(sum
            .iter()
            .zip(&usable)
            .map(|(s, u)| if *u { s / rounds as f64 } else { f64::NAN })
            .collect())
    }
}
