//! The mixture of experts on the device (`kernels/moe.cu`, `kernels/moe_gemm.cu`): the combine
//! ([`crate::backend::Backend::add_weighted_rows`], the host reference's arithmetic per element)
//! and the whole routed layer without the host in the loop ([`CudaBackend::moe_routed_on_device`]).
//!
//! A decode step of a Qwen3-30B-A3B-shaped model routed on the host waited for the router logits
//! of every layer (a download and a stream sync), then launched a gather and two GEMMs per expert
//! that had rows: up to 128 experts × 3 launches per layer (docs/benchmarks-cuda.md, session 20:
//! 61 % GPU-busy in decode), and each expert's prefill GEMM had its own row count, so cuBLAS
//! tuned hundreds of shapes. Here a call is nine launches per layer whatever the experts and rows:
//! route, the plan's three, gather, the grouped gate|up GEMM, SwiGLU, the grouped down GEMM, the
//! combine; eleven with gpt-oss's expert biases (one launch after each grouped GEMM), whose router
//! rule (top-k, then softmax) and clamped SwiGLU are the other instances of the same steps.

use super::decode::{features_per_block, row_tiling};
use super::{derr, CudaBackend, CudaMatrix, CudaTensor, MAX_DECODE_ROWS};
use crate::backend::moe::{ExpertActivation, MoeExperts, MoeRouting, RoutingRule};
use anyhow::{ensure, Result};
use cudarc::driver::{CudaSlice, LaunchConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Most experts per token the route kernel keeps (`MOE_MAX_TOP_K` in `kernels/moe.cu`).
const MAX_TOP_K: usize = 16;
/// Threads of the route kernel (`MOE_ROUTE_THREADS`).
const ROUTE_THREADS: u32 = 128;

/// The device routing's state: whether decode steps route on the device (on unless
/// `DRAFTLENS_MOE_ROUTING=host`, the A/B switch of docs/benchmarks-cuda.md), and the experts'
/// weight- and bias-pointer tables, keyed by the pointers they hold (so a table is never stale);
/// and how MXFP4 experts are uploaded (`mxfp4.rs`: `DRAFTLENS_MXFP4`, read here once, its error
/// kept for the first MXFP4 upload); whether a plan of few routes is built by one block
/// (`DRAFTLENS_MOE_PLAN=block`; off until a GPU run has tested and timed it: docs/cuda.md).
pub(crate) struct MoeState {
    on_device: AtomicBool,
    one_block_plan: AtomicBool,
    tables: Mutex<HashMap<Vec<u64>, ExpertTables>>,
    pub(super) mxfp4_packed: Mutex<std::result::Result<bool, String>>,
}

impl Default for MoeState {
    fn default() -> Self {
        MoeState {
            on_device: AtomicBool::new(
                std::env::var("DRAFTLENS_MOE_ROUTING").map_or(true, |v| v != "host"),
            ),
            one_block_plan: AtomicBool::new(
                std::env::var("DRAFTLENS_MOE_PLAN").is_ok_and(|v| v == "block"),
            ),
            tables: Mutex::new(HashMap::new()),
            mxfp4_packed: Mutex::new(
                crate::backend::mxfp4::packed_mode_from_env().map_err(|e| e.to_string()),
            ),
        }
    }
}

/// A device array of the experts' weight (or bias) addresses, shared by every call on them.
type PointerTable = Arc<CudaSlice<u64>>;

/// The device tables of one set of experts: expert e's gate|up and down weights (and biases) at
/// entry e.
#[derive(Clone)]
struct ExpertTables {
    gate_up: PointerTable,
    down: PointerTable,
    /// `(gate|up bias, down bias)` (gpt-oss), or none.
    biases: Option<(PointerTable, PointerTable)>,
    /// The weights are packed MXFP4 (every one of them: `moe_tables` checks), read by the packed
    /// grouped GEMM (`mxfp4.rs`).
    mxfp4: bool,
}

/// The grouped GEMM instance with `nt` row tiles (its MT follows from NT as in
/// [`row_tiling`]): `MOE_GG_ENTRY` in `kernels/moe_gemm.cu` on bf16 weights, its twin
/// `MOE_GG_MX_ENTRY` in `kernels/mxfp4.cu` on packed MXFP4 ones (same tiling, chunks and order).
fn grouped_kernel_name(nt: usize, mxfp4: bool) -> &'static str {
    const BF16: [&str; 8] = [
        "moe_grouped_gemm_n1_m1",
        "moe_grouped_gemm_n2_m1",
        "moe_grouped_gemm_n3_m2",
        "moe_grouped_gemm_n4_m2",
        "moe_grouped_gemm_n5_m2",
        "moe_grouped_gemm_n6_m2",
        "moe_grouped_gemm_n7_m2",
        "moe_grouped_gemm_n8_m2",
    ];
    const MXFP4: [&str; 8] = [
        "moe_grouped_gemm_mxfp4_n1_m1",
        "moe_grouped_gemm_mxfp4_n2_m1",
        "moe_grouped_gemm_mxfp4_n3_m2",
        "moe_grouped_gemm_mxfp4_n4_m2",
        "moe_grouped_gemm_mxfp4_n5_m2",
        "moe_grouped_gemm_mxfp4_n6_m2",
        "moe_grouped_gemm_mxfp4_n7_m2",
        "moe_grouped_gemm_mxfp4_n8_m2",
    ];
    (if mxfp4 { MXFP4 } else { BF16 })[nt.clamp(1, 8) - 1]
}

/// Most routes (rows × top-k) whose plan one block builds (`moe_plan_one_block`): every decode
/// step of ≤ 64 rows and top-k ≤ 16; more take the count / groups / fill launches.
const PLAN_ONE_BLOCK_ROUTES: usize = 1024;
/// Threads of that block.
const PLAN_ONE_BLOCK_THREADS: u32 = 256;

impl CudaBackend {
    /// Decode steps route on the device (`true`, the default) or on the host (tests and A/B
    /// benchmarks; the two give the same experts, and outputs equal to bf16 rounding).
    pub fn set_moe_device_routing(&self, on: bool) {
        self.moe.on_device.store(on, Ordering::Relaxed);
    }

    /// A device-routed step of at most `PLAN_ONE_BLOCK_ROUTES` routes builds its plan in one
    /// block (`true`; `DRAFTLENS_MOE_PLAN=block`) or in the count / groups / fill launches of
    /// larger steps (`false`, the default)
    /// (tests and A/B benchmarks; the same plan up to the order of rows within an expert's group,
    /// which no output depends on).
    pub fn set_moe_plan_one_block(&self, on: bool) {
        self.moe.one_block_plan.store(on, Ordering::Relaxed);
    }

    /// `acc[r] += Σ_j weights[r·n + j] · src[index[r·n + j]]`, one thread per element (shapes checked
    /// by the trait). The term lists go up with the call (a few KB per layer).
    pub(super) fn moe_add_weighted_rows(
        &self,
        acc: &mut CudaTensor,
        src: &CudaTensor,
        index: &[u32],
        weights: &[f32],
    ) -> Result<()> {
        if acc.rows == 0 || acc.cols == 0 {
            return Ok(());
        }
        let n = index.len() / acc.rows;
        let (idx, w) = (self.upload(index)?, self.upload(weights)?);
        self.moe_combine(acc, src, (self.ptr(&idx), self.ptr(&w)), n)
    }

    /// The combine with its term lists on the device (their addresses: `n` terms per row of
    /// `acc`).
    fn moe_combine(
        &self,
        acc: &mut CudaTensor,
        src: &CudaTensor,
        (index, weights): (u64, u64),
        n: usize,
    ) -> Result<()> {
        let f = self
            .kernels
            .get("elementwise", "moe_add_weighted_rows_bf16")?;
        let (cols, n) = (acc.cols as i64, n as i32);
        let mut b = self.launch_builder(&f);
        b.arg(&mut acc.buf)
            .arg(&src.buf)
            .arg(&index)
            .arg(&weights)
            .arg(&cols)
            .arg(&n);
        // SAFETY: (bf16*, const bf16*, const u32*, const float*, ll, int): acc holds rows · cols
        // values, index and weights rows · n entries, every index below src's row count (the
        // trait's check, or moe_plan's construction), src holds cols values per row; blocks past
        // a row's last column return.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (acc.rows as u32, acc.cols.div_ceil(256) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("moe_add_weighted_rows_bf16"))?;
        Ok(())
    }

    /// [`crate::backend::Backend::moe_routed_acc`] for any number of rows (`Ok(false)` with
    /// device routing off). Nothing waits for the host: `moe_route` picks each row's experts and
    /// weights, `moe_plan_*` build the gather list, the group table and the combine's terms (the
    /// host's `RoutingPlan`), and the two grouped GEMMs run every expert of the layer in one
    /// launch each. Every step is per row or reduces in an order fixed by the weights' shapes
    /// (`kernels/moe_gemm.cu`), so a row's result does not depend on the other rows: decode steps
    /// are batch-invariant, and a prompt's prefill is the same bits alone or packed.
    pub(super) fn moe_routed_on_device(
        &self,
        x: &CudaTensor,
        logits: &CudaTensor,
        experts: &MoeExperts<'_, CudaMatrix, CudaTensor>,
        shared_out: Option<&CudaTensor>,
        routing: &MoeRouting,
        h: &mut CudaTensor,
    ) -> Result<bool> {
        let t = x.rows;
        if t == 0 || !self.moe.on_device.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let (e, k, d) = (routing.num_experts, routing.top_k, x.cols);
        let Some(&(_, down0)) = experts.weights.first() else {
            return Ok(false);
        };
        if k > MAX_TOP_K {
            return Ok(false); // more experts a token than the route kernel keeps: the host plan
        }
        ensure!(
            experts.weights.len() == e && (1..=e).contains(&k),
            "mixture of experts: {} expert weights for {e} experts, top-k {k}",
            experts.weights.len()
        );
        let inter = down0.inp;
        let tables = self.moe_tables(experts, d)?;
        let width = e + usize::from(shared_out.is_some());
        ensure!(
            (logits.rows, logits.cols) == (t, width) && (h.rows, h.cols) == (t, d),
            "mixture of experts: router logits [{}, {}] and output [{}, {}] for {t} rows of {e} experts",
            logits.rows,
            logits.cols,
            h.rows,
            h.cols
        );
        if let Some(s) = shared_out {
            ensure!(
                (s.rows, s.cols) == (t, d),
                "mixture of experts: shared expert output [{}, {}] for [{t}, {d}]",
                s.rows,
                s.cols
            );
        }

        // The routing plan's arrays (4-byte values, below) in one allocation: a decode step plans
        // every layer, and eleven allocations and frees a layer cost the host more time than the
        // small kernels they feed take on the GPU, which then waits for the next launch.
        let n = t * k;
        let max_rows = t.min(MAX_DECODE_ROWS);
        let max_groups = e.min(n)
            + if t > MAX_DECODE_ROWS {
                n.div_ceil(MAX_DECODE_ROWS)
            } else {
                0
            };
        if max_groups > 65_535 {
            return Ok(false); // past the grid's z limit (over 4 M routes): the host plan
        }
        let terms = k + usize::from(shared_out.is_some());
        let (
            _plan,
            [route_expert, route_weight, shared_gate, counts, start, cursor, gather, groups, n_groups, term_index, term_weight],
        ) = self.alloc_carved([n, n, t, e, e, e, n, 3 * max_groups, 1, t * terms, t * terms])?;

        // 1. Route: each row's top-k (expert, weight), and the shared gate.
        let f = self
            .kernels
            .get_with_smem("elementwise", "moe_route", e * 4)?;
        // (renormalise, top-k first): the kernel's two rules.
        let (renorm, topk_first) = match routing.rule {
            RoutingRule::SoftmaxTopK { renormalise } => (renormalise as i32, 0i32),
            RoutingRule::TopKSoftmax => (0, 1),
        };
        let (w32, e32, k32) = (width as i32, e as i32, k as i32);
        let mut b = self.launch_builder(&f);
        b.arg(&logits.buf)
            .arg(&w32)
            .arg(&e32)
            .arg(&k32)
            .arg(&renorm)
            .arg(&topk_first)
            .arg(&route_expert)
            .arg(&route_weight)
            .arg(&shared_gate);
        // SAFETY: (const bf16*, int, int, int, int, int, int*, float*, float*): logits hold t rows of
        // width values, the routes t · k entries, shared_gate t; e floats of dynamic shared memory.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (t as u32, 1, 1),
                block_dim: (ROUTE_THREADS, 1, 1),
                shared_mem_bytes: (e * 4) as u32,
            })
        }
        .map_err(derr("moe_route"))?;

        // 2. Plan: gather list, groups, the combine's terms. Each expert's rows are cut into
        // groups of at most MAX_DECODE_ROWS (the grouped GEMM's largest row tiling); an expert
        // appears at most once per row, so a step of ≤ 64 rows has one group per expert that runs.
        let (n32, t32, max_rows32) = (n as i32, t as i32, max_rows as i32);
        let gate_ptr = if shared_out.is_some() {
            shared_gate
        } else {
            0u64
        };
        if n <= PLAN_ONE_BLOCK_ROUTES && self.moe.one_block_plan.load(Ordering::Relaxed) {
            let f = self.kernels.get("elementwise", "moe_plan_one_block")?;
            let mut b = self.launch_builder(&f);
            b.arg(&route_expert)
                .arg(&route_weight)
                .arg(&gate_ptr)
                .arg(&t32)
                .arg(&k32)
                .arg(&e32)
                .arg(&max_rows32)
                .arg(&counts)
                .arg(&start)
                .arg(&cursor)
                .arg(&groups)
                .arg(&n_groups)
                .arg(&gather)
                .arg(&term_index)
                .arg(&term_weight);
            // SAFETY: (const int*, const float*, const float* or null, int ×4, int* ×5, u32*,
            // u32*, float*): n = t · k routes (each an expert below e) and weights, t shared
            // gates, e counts, starts and cursors, 3 · max_groups group entries, gather n slots,
            // t · terms terms; the kernel zeroes the counts itself.
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (PLAN_ONE_BLOCK_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr("moe_plan_one_block"))?;
        } else {
            // SAFETY: `counts` is e 4-byte values of the plan's allocation, alive until the kernels
            // queued after this on the stream have run (its free is stream-ordered).
            unsafe { cudarc::driver::sys::cuMemsetD32Async(counts, 0, e, self.stream.cu_stream()) }
                .result()
                .map_err(derr("zeroing expert counts"))?;
            let per_route = LaunchConfig {
                grid_dim: (n.div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let f = self.kernels.get("elementwise", "moe_plan_count")?;
            let mut b = self.launch_builder(&f);
            b.arg(&route_expert).arg(&n32).arg(&counts);
            // SAFETY: (const int*, int, int*): n routes, each an expert below e (moe_route), e counts.
            unsafe { b.launch(per_route) }.map_err(derr("moe_plan_count"))?;
            let f = self.kernels.get("elementwise", "moe_plan_groups")?;
            let mut b = self.launch_builder(&f);
            b.arg(&counts)
                .arg(&e32)
                .arg(&max_rows32)
                .arg(&start)
                .arg(&cursor)
                .arg(&groups)
                .arg(&n_groups);
            // SAFETY: (const int*, int, int, int*, int*, int*, int*): e counts summing to n, e starts
            // and cursors, 3 · max_groups group entries (Σ_e ceil(count_e / max_rows) ≤ max_groups).
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr("moe_plan_groups"))?;
            let f = self.kernels.get("elementwise", "moe_plan_fill")?;
            let mut b = self.launch_builder(&f);
            b.arg(&route_expert)
                .arg(&route_weight)
                .arg(&gate_ptr)
                .arg(&t32)
                .arg(&k32)
                .arg(&start)
                .arg(&cursor)
                .arg(&gather)
                .arg(&term_index)
                .arg(&term_weight);
            // SAFETY: (const int*, const float*, const float* or null, int, int, const int*, int*,
            // u32*, u32*, float*): n = t · k routes and weights, t shared gates, e starts and zeroed
            // cursors (each expert's slots stay within its count), gather n slots, t · terms terms.
            unsafe { b.launch(per_route) }.map_err(derr("moe_plan_fill"))?;
        }

        // 3. Gather: the rows of x, expert after expert.
        let mut xg = self.new_tensor(n, d)?;
        let f = self.kernels.get("elementwise", "moe_gather_rows_bf16")?;
        let cols = d as i64;
        let mut b = self.launch_builder(&f);
        b.arg(&x.buf).arg(&gather).arg(&mut xg.buf).arg(&cols);
        // SAFETY: (const bf16*, const u32*, bf16*, ll): x holds t rows of d values, every gather
        // entry is below t (moe_plan writes row ids), xg n rows.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (n as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("moe_gather_rows_bf16"))?;

        // 4. The experts: gate|up (+ bias), the activation, down (+ bias); the routed outputs,
        // then the shared expert's. The biases are added in the grouped GEMMs' epilogue.
        let (gu_bias, down_bias) = match &tables.biases {
            Some((gu, down)) => (Some(&**gu), Some(&**down)),
            None => (None, None),
        };
        let group_plan = (groups, n_groups, max_groups);
        let mut gu = self.new_tensor(n, 2 * inter)?;
        self.moe_grouped_gemm(
            &xg,
            (&tables.gate_up, tables.mxfp4),
            gu_bias,
            &mut gu,
            group_plan,
            max_rows,
        )?;
        drop(xg);
        let act = match experts.activation {
            ExpertActivation::SwiGlu => self.swiglu_packed(&gu)?,
            ExpertActivation::ClampedSwiGlu { alpha, limit } => {
                self.clamped_swiglu_packed_on_device(&gu, alpha, limit)?
            }
        };
        drop(gu);
        let mut stacked = self.new_tensor(n + shared_out.map_or(0, |s| s.rows), d)?;
        self.moe_grouped_gemm(
            &act,
            (&tables.down, tables.mxfp4),
            down_bias,
            &mut stacked,
            group_plan,
            t,
        )?;
        if let Some(s) = shared_out {
            self.stream
                .memcpy_dtod(
                    &s.buf.slice(0..t * d),
                    &mut stacked.buf.slice_mut(n * d..(n + t) * d),
                )
                .map_err(derr("device copy"))?;
        }

        // 5. The combine, in the host plan's term order.
        self.moe_combine(h, &stacked, (term_index, term_weight), terms)?;
        Ok(true)
    }

    /// One grouped GEMM launch (`kernels/moe_gemm.cu`): `y[rows of group i] = x[rows of group i]
    /// · W_eᵀ (+ b_e)` for every group of the device table (`table`: the weights' addresses, and
    /// whether they are packed MXFP4, which the twin kernel of `mxfp4.rs` reads; `biases`: a table
    /// of the experts' bias addresses, added with [`crate::backend::Backend::add_row_bias`]'s
    /// rounding), groups of at most `max_rows` rows; `groups`: the plan's group table, its length
    /// on the device, and the launch's bound on it.
    pub(super) fn moe_grouped_gemm(
        &self,
        x: &CudaTensor,
        (table, mxfp4): (&CudaSlice<u64>, bool),
        biases: Option<&CudaSlice<u64>>,
        y: &mut CudaTensor,
        (groups, n_groups, max_groups): (u64, u64, usize),
        max_rows: usize,
    ) -> Result<()> {
        let (n_out, k_in) = (y.cols, x.cols);
        ensure!(
            n_out < i32::MAX as usize && k_in < i32::MAX as usize / 2,
            "grouped GEMM: weight [{n_out}, {k_in}] too large"
        );
        // The packed kernel dequantises through the code × scale table (`mxfp4.rs`), a whole
        // group of 32 columns at a time.
        let lut = if mxfp4 {
            ensure!(
                k_in % 32 == 0,
                "grouped GEMM: a packed MXFP4 weight [{n_out}, {k_in}] (columns are whole groups of 32)"
            );
            Some(self.mxfp4_table()?)
        } else {
            None
        };
        let (nt, mt) = row_tiling(max_rows);
        let func = grouped_kernel_name(nt, mxfp4);
        let feature_blocks = n_out.div_ceil(features_per_block(mt));
        let f = self.kernels.get("decode", func)?;
        let (n32, k32) = (n_out as i32, k_in as i32);
        let mut b = self.launch_builder(&f);
        b.arg(&x.buf).arg(table);
        if let Some(lut) = &lut {
            b.arg(lut);
        }
        let bias_table = biases.map_or(0u64, |t| self.ptr(t));
        b.arg(&bias_table)
            .arg(&mut y.buf)
            .arg(&groups)
            .arg(&n_groups)
            .arg(&n32)
            .arg(&k32);
        // SAFETY: (const bf16*, const u64*, [const float*,] const u64* or null, bf16*, const
        // int*, const int*, int, int): every table entry is an expert's [n_out, k_in] weight, bf16
        // or (mxfp4) its packed buffer (blocks then scales, k_in a multiple of 32) with lut the
        // table's MX_LUT_LEN floats; every bias entry (moe_tables' check) n_out bf16 values; the
        // groups' rows lie within x's and y's rows (moe_plan), each group at most max_rows rows,
        // which the instance's row tiles cover; blocks past n_groups return.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (feature_blocks as u32, 1, max_groups as u32),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr(func))?;
        Ok(())
    }

    /// The device tables of the experts' gate|up and down weight addresses (and bias addresses),
    /// made once per set of weights: their shapes (`[2·I, d]` and `[d, I]`, the same for every
    /// expert; biases of 2·I and d values) are checked then, not on every call.
    fn moe_tables(
        &self,
        experts: &MoeExperts<'_, CudaMatrix, CudaTensor>,
        d: usize,
    ) -> Result<ExpertTables> {
        let weights = experts.weights;
        let biases = experts.biases.unwrap_or(&[]);
        let ptrs: Vec<u64> = weights
            .iter()
            .map(|(g, _)| self.weight_ptr(g))
            .chain(weights.iter().map(|(_, d)| self.weight_ptr(d)))
            .chain(biases.iter().map(|(g, _)| self.ptr(&g.buf)))
            .chain(biases.iter().map(|(_, d)| self.ptr(&d.buf)))
            .collect();
        let mut tables = self.moe.tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = tables.get(&ptrs) {
            return Ok(found.clone());
        }
        let inter = weights.first().map_or(0, |(_, down)| down.inp);
        let mxfp4 = weights.first().is_some_and(|(gu, _)| gu.mxfp4.is_some());
        for (i, (gu, down)) in weights.iter().enumerate() {
            ensure!(
                gu.mxfp4.is_some() == mxfp4 && down.mxfp4.is_some() == mxfp4,
                "mixture of experts: expert {i}'s weights are not all {} as expert 0's",
                if mxfp4 { "packed MXFP4" } else { "bf16" }
            );
            ensure!(
                (gu.out, gu.inp, down.out, down.inp) == (2 * inter, d, d, inter),
                "mixture of experts: expert {i}'s weights are [{}, {}] and [{}, {}], not [{}, {d}] and [{d}, {inter}]",
                gu.out,
                gu.inp,
                down.out,
                down.inp,
                2 * inter
            );
        }
        if let Some(biases) = experts.biases {
            ensure!(
                biases.len() == weights.len(),
                "mixture of experts: {} expert biases for {} experts",
                biases.len(),
                weights.len()
            );
            for (i, (gu, down)) in biases.iter().enumerate() {
                ensure!(
                    (gu.rows, gu.cols, down.rows, down.cols) == (1, 2 * inter, 1, d),
                    "mixture of experts: expert {i}'s biases are [{}, {}] and [{}, {}], not [1, {}] and [1, {d}]",
                    gu.rows,
                    gu.cols,
                    down.rows,
                    down.cols,
                    2 * inter
                );
            }
        }
        let table = |part: &[u64]| -> Result<PointerTable> { Ok(Arc::new(self.upload(part)?)) };
        let e = weights.len();
        let found = ExpertTables {
            gate_up: table(&ptrs[..e])?,
            down: table(&ptrs[e..2 * e])?,
            biases: if experts.biases.is_some() {
                Some((table(&ptrs[2 * e..3 * e])?, table(&ptrs[3 * e..])?))
            } else {
                None
            },
            mxfp4,
        };
        tables.insert(ptrs, found.clone());
        Ok(found)
    }
}
