//! Decode GEMMs through cuBLASLt with one algorithm per weight shape for every row count, used
//! only where it is proven row-invariant on this GPU (docs/cuda.md, "Batch-invariant decode").
//!
//! Why: cuBLAS streams a decode step's weights faster at 64 rows than the backend's own kernel
//! (docs/cuda.md, "Batch-invariant decode"; docs/benchmarks-cuda.md, "Session 11"), but left to
//! itself cuBLAS picks its
//! algorithm (tile, split-K) by the row count, so a row's bits would depend on its batch-mates.
//! A fixed algorithm fixes every output element's order of summation: its tile covers the row
//! dimension, but the reduction over K (and the split-K partials, reduced in fp32 in a fixed
//! order) does not depend on which or how many rows share the call. That argument is not a proof
//! for a closed library, so each weight shape's candidate is proven on the real weights before
//! use: the rows of a 64-row product must equal, bit for bit, the same rows computed alone at
//! every row count of [`PROOF_ROWS`] (row-tile boundaries of 8, 16, 32), with and without the
//! residual add, and twice the same. A candidate that fails is never used.
//!
//! Per weight shape the route is chosen once per process, at its first decode GEMM: cuBLASLt's
//! heuristic answers for 64 rows and for 1 row that fit every row count 1..=64, timed at
//! [`TIMED_ROWS`] against the own kernel; the fastest proven cuBLASLt answer runs when its summed
//! time beats the own kernel's. The choice is remembered per machine like the prefill GEMMs'
//! (`gemm-choices-v1.json`, [`super::gemm_choices`]), so later processes run the same algorithm
//! (the same bits) without timing; a remembered algorithm is still proven again.

use super::decode::{Epilogue, MAX_DECODE_ROWS};
use super::gemm::{algo_fits, heuristic, launch, GemmOperands, LtState, OutType, Plan};
use super::gemm_choices::Choice;
use super::{derr, CudaBackend};
use anyhow::Result;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::result::{memcpy_dtod_async, memcpy_dtoh_async};
use cudarc::driver::{sys, CudaSlice};
use std::sync::Arc;

/// Row counts at which candidates are timed.
pub const TIMED_ROWS: [usize; 4] = [1, 8, 32, 64];
/// Row counts whose rows are compared with the same rows of a 64-row product: every row-tile
/// boundary of 8, 16 and 32 rows.
pub const PROOF_ROWS: [usize; 13] = [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63];
/// Heuristic answers asked for at 64 rows and at 1 row.
const CANDIDATES: usize = 8;
/// Launches per timing round and rounds (each candidate's best round counts).
const REPS: usize = 4;
const ROUNDS: usize = 2;

/// A decode GEMM's weight shape and output type. The residual add shares the route of the plain
/// product: both epilogues are within one bf16 rounding of the product followed by the add
/// (cuBLASLt's rounds `y + sum` once, the own kernel's rounds the sum first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct DecodeKey {
    out: usize,
    inp: usize,
    out_type: OutType,
}

impl DecodeKey {
    fn choice_key(&self) -> String {
        format!(
            "decode out {} in {} {:?} align 16",
            self.out, self.inp, self.out_type
        )
    }
}

/// How one weight shape's decode GEMMs run.
pub(crate) struct DecodeRoute {
    /// The proven cuBLASLt algorithm and its descriptors per row count (`plans[r - 1]`), if one
    /// was found; whether it runs in [`super::DecodeGemmKernel::Auto`] is `use_lt`.
    lt: Option<(lt::cublasLtMatmulAlgo_t, Vec<Plan>)>,
    use_lt: bool,
}

// SAFETY: as `Plan` (descriptors only read after construction); the algorithm is plain data.
unsafe impl Send for DecodeRoute {}
unsafe impl Sync for DecodeRoute {}

/// What choosing one shape's route measured (microseconds per GEMM at [`TIMED_ROWS`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodeChoiceRecord {
    pub out: usize,
    pub inp: usize,
    pub f32_out: bool,
    pub own_us: Vec<f64>,
    /// The chosen (or best-timed) cuBLASLt answer's times; None: none fit every row count.
    pub lt_us: Option<Vec<f64>>,
    /// Heuristic answers that fit every row count, and how many were proven row-invariant
    /// before one passed (or all failed).
    pub candidates: usize,
    pub proofs_failed: usize,
    /// `cublaslt` or `own`.
    pub chosen: &'static str,
    /// Taken from the remembered choices (not timed).
    pub remembered: bool,
}

impl CudaBackend {
    /// Runs `g` on its weight shape's proven cuBLASLt algorithm when the route says so (planning
    /// the route at the shape's first use). Ok(false): the caller runs the own kernel.
    pub(crate) fn decode_gemm_lt(
        &self,
        g: GemmOperands,
        epilogue: Epilogue,
        force: bool,
    ) -> Result<bool> {
        let Some(st) = self.gemm.tuned_lt() else {
            return Ok(false);
        };
        // Every operand of a decode GEMM is 16-byte aligned when its widths are multiples of 8
        // (row offsets then are); the route is chosen for that alignment only, so a shape never
        // switches kernels with a buffer's address.
        if !(g.out.is_multiple_of(8) && g.inp.is_multiple_of(8))
            || [g.x, g.w, g.y].iter().any(|p| p % 16 != 0)
            || g.rows > MAX_DECODE_ROWS
        {
            return Ok(false);
        }
        let (out_type, beta) = match epilogue {
            Epilogue::Bf16 => (OutType::Bf16, 0.0),
            Epilogue::AddBf16 => (OutType::Bf16, 1.0),
            Epilogue::F32 => (OutType::F32, 0.0),
        };
        let key = DecodeKey {
            out: g.out,
            inp: g.inp,
            out_type,
        };
        let known = st
            .decode
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let route = match known {
            Some(r) => r,
            None => {
                let r = Arc::new(self.plan_decode_route(st, key, g.w)?);
                st.decode
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, r.clone());
                r
            }
        };
        match &route.lt {
            Some((algo, plans)) if route.use_lt || force => {
                launch(st, &self.stream, &plans[g.rows - 1], algo, &g, beta)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Chooses `key`'s route for the weight at `w` (see the module docs).
    fn plan_decode_route(&self, st: &LtState, key: DecodeKey, w: u64) -> Result<DecodeRoute> {
        let _phase = crate::timeline::phase("gemm tuning");
        let DecodeKey { out, inp, out_type } = key;
        let remembered = st.choices().get(&key.choice_key());
        let mut record = DecodeChoiceRecord {
            out,
            inp,
            f32_out: out_type == OutType::F32,
            own_us: Vec::new(),
            lt_us: None,
            candidates: 0,
            proofs_failed: 0,
            chosen: "own",
            remembered: remembered.is_some(),
        };
        let keep = |record: DecodeChoiceRecord| {
            st.decode_records
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(record)
        };
        if matches!(remembered, Some(Choice::Own) | Some(Choice::GemmEx)) {
            // The own kernel was chosen on this machine: nothing to plan, time or prove.
            keep(record);
            return Ok(DecodeRoute {
                lt: None,
                use_lt: false,
            });
        }
        let plans: Vec<Plan> = (1..=MAX_DECODE_ROWS)
            .map(|r| Plan::new(r, out, inp, out_type))
            .collect::<Result<_>>()?;
        let fits_all = |a: &lt::cublasLtMatmulAlgo_t| plans.iter().all(|p| algo_fits(st, p, a));
        let mut cands: Vec<lt::cublasLtMatmulAlgo_t> = Vec::new();
        if let Some(Choice::Lt(data)) = remembered {
            let a = lt::cublasLtMatmulAlgo_t { data };
            if fits_all(&a) {
                cands.push(a);
            }
        } else {
            for rows in [MAX_DECODE_ROWS, 1] {
                for a in heuristic(st, &plans[rows - 1], 16, CANDIDATES)? {
                    if !cands.iter().any(|c| c.data == a.data) && fits_all(&a) {
                        cands.push(a);
                    }
                }
            }
        }
        record.candidates = cands.len();
        let epilogue = match out_type {
            OutType::Bf16 => Epilogue::Bf16,
            OutType::F32 => Epilogue::F32,
        };
        let bytes = out_type.bytes();
        let x = self.random_tensor(MAX_DECODE_ROWS, inp, 1.0, 0.0, 0x5eed)?;
        let xp = self.ptr(&x.buf);
        let y: CudaSlice<u8> = self.alloc(MAX_DECODE_ROWS * out * bytes)?;
        let yp = self.ptr(&y);
        let op = |rows: usize, y: u64| GemmOperands {
            x: xp,
            rows,
            w,
            out,
            inp,
            y,
        };
        let run_lt = |a: &lt::cublasLtMatmulAlgo_t, rows: usize, y: u64, beta: f32| {
            launch(st, &self.stream, &plans[rows - 1], a, &op(rows, y), beta)
        };
        // A remembered choice is not timed again; a fresh one times every candidate and the
        // own kernel at TIMED_ROWS.
        let mut order: Vec<(f64, usize)> = (0..cands.len()).map(|i| (0.0, i)).collect();
        let mut own_total = f64::INFINITY;
        if remembered.is_none() {
            let mut lt_us = vec![vec![f64::INFINITY; TIMED_ROWS.len()]; cands.len()];
            let mut own_us = vec![f64::INFINITY; TIMED_ROWS.len()];
            for _ in 0..ROUNDS {
                for (ti, &rows) in TIMED_ROWS.iter().enumerate() {
                    let t = self.time_us(|| self.decode_gemm_own(op(rows, yp), epilogue))?;
                    own_us[ti] = own_us[ti].min(t);
                    for (ci, a) in cands.iter().enumerate() {
                        if let Ok(t) = self.time_us(|| run_lt(a, rows, yp, 0.0)) {
                            lt_us[ci][ti] = lt_us[ci][ti].min(t);
                        }
                    }
                }
            }
            order = lt_us
                .iter()
                .enumerate()
                .map(|(i, t)| (t.iter().sum::<f64>(), i))
                .filter(|(t, _)| t.is_finite())
                .collect();
            order.sort_by(|a, b| a.0.total_cmp(&b.0));
            own_total = own_us.iter().sum();
            record.own_us = own_us;
            record.lt_us = order.first().map(|&(_, i)| lt_us[i].clone());
        }
        // The fastest candidate that proves row-invariant.
        let mut proven = None;
        for &(total, i) in &order {
            if self.proves_row_invariant(&cands[i], &run_lt, out, bytes, yp)? {
                proven = Some((i, total));
                break;
            }
            record.proofs_failed += 1;
        }
        // Remembered here means remembered as cuBLASLt (the own kernel returned above).
        let use_lt = match remembered {
            Some(_) => proven.is_some(),
            None => proven.is_some_and(|(_, t)| t < own_total),
        };
        record.chosen = if use_lt { "cublaslt" } else { "own" };
        if remembered.is_none() {
            let choice = match (use_lt, proven) {
                (true, Some((i, _))) => Choice::Lt(cands[i].data),
                _ => Choice::Own,
            };
            st.choices().remember(&key.choice_key(), choice);
        } else if proven.is_none() {
            tracing::warn!(
                "the remembered decode GEMM algorithm for [{out}, {inp}] no longer proves row-invariant; using the own kernel"
            );
        }
        keep(record);
        Ok(DecodeRoute {
            lt: proven.map(|(i, _)| (cands[i], plans)),
            use_lt,
        })
    }

    /// Whether `a` gives the rows of a 64-row product bit for bit at every [`PROOF_ROWS`] count,
    /// twice the same, with beta = 0 and (bf16 output) with the residual add on a random start.
    fn proves_row_invariant(
        &self,
        a: &lt::cublasLtMatmulAlgo_t,
        run: &dyn Fn(&lt::cublasLtMatmulAlgo_t, usize, u64, f32) -> Result<()>,
        out: usize,
        bytes: usize,
        y: u64,
    ) -> Result<bool> {
        let full = MAX_DECODE_ROWS * out * bytes;
        let y_slice = |n: usize| -> Result<Vec<u8>> {
            let mut host = vec![0u8; n];
            // SAFETY: `y` addresses the planning buffer of `full` ≥ n bytes, written by the
            // launches queued before on this stream; the host waits for the copy below.
            unsafe { memcpy_dtoh_async(&mut host, y, self.stream.cu_stream()) }
                .map_err(derr("decode GEMM proof download"))?;
            self.synchronize()?;
            Ok(host)
        };
        // The residual add's starting values (bf16 output only: the LM head never adds).
        let start = if bytes == 2 {
            Some(self.random_tensor(MAX_DECODE_ROWS, out, 0.5, 0.0, 0xacc)?)
        } else {
            None
        };
        let mut betas = vec![0.0f32];
        if start.is_some() {
            betas.push(1.0);
        }
        for beta in betas {
            let reset = |n: usize| -> Result<()> {
                if let Some(s) = &start {
                    debug_assert!(n <= full);
                    // SAFETY: both buffers hold at least `n` ≤ `full` bytes.
                    unsafe { memcpy_dtod_async(y, self.ptr(&s.buf), n, self.stream.cu_stream()) }
                        .map_err(derr("decode GEMM proof reset"))?;
                }
                Ok(())
            };
            let product = |rows: usize| -> Result<Option<Vec<u8>>> {
                if beta != 0.0 {
                    reset(rows * out * bytes)?;
                }
                if run(a, rows, y, beta).is_err() {
                    return Ok(None);
                }
                y_slice(rows * out * bytes).map(Some)
            };
            let Some(reference) = product(MAX_DECODE_ROWS)? else {
                return Ok(false);
            };
            if product(MAX_DECODE_ROWS)?.as_ref() != Some(&reference) {
                return Ok(false);
            }
            for rows in PROOF_ROWS {
                match product(rows)? {
                    Some(p) if p[..] == reference[..rows * out * bytes] => {}
                    _ => return Ok(false),
                }
            }
        }
        Ok(true)
    }

    /// Microseconds per launch of `f` ([`REPS`] launches between two events).
    fn time_us(&self, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let ev = || {
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(derr("decode GEMM timing event"))
        };
        let (e0, e1) = (ev()?, ev()?);
        f()?;
        e0.record(&self.stream).map_err(derr("event record"))?;
        for _ in 0..REPS {
            f()?;
        }
        e1.record(&self.stream).map_err(derr("event record"))?;
        let ms = e0.elapsed_ms(&e1).map_err(derr("event elapsed"))? as f64;
        Ok(ms * 1e3 / REPS as f64)
    }

    /// What choosing each decode GEMM route measured in this process (benchmarks).
    pub fn decode_gemm_records(&self) -> Vec<DecodeChoiceRecord> {
        self.gemm.decode_records()
    }
}
