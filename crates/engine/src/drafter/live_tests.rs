//! Live decoding against plain greedy decoding: lossless on the CPU reference, and where a
//! verify pass rounds a near-tie the other way (a backend made to do so on purpose),
//! [`first_divergence`] finds the place, the two tokens and the target's margin between them;
//! the one loop every family goes through gives the known answers of the oracle drafters.

use super::*;
use crate::backend::cpu::{CpuBackend, CpuMatrix, CpuTensor};
use crate::backend::{AttnMask, AttnShape, Rope, TopK};
use crate::drafter::eval::Drafter;
use crate::drafter::model::DFlashDrafter;
use crate::drafter::random::{write_random_checkpoint, RandomDrafter};
use crate::generate::greedy;
use crate::model::random::{qwen3_8b_spec, RandomWeights};
use crate::model::ModelSpec;

/// The CPU reference, except that an LM-head call over more than one row — a verify pass or a
/// draft, never a prefill's last row nor a one-prompt decode step — puts the runner-up first
/// wherever it is within `eps` (log-probability) of the top token: what a low-precision verify
/// pass does to near-ties that the decode step rounds the other way. Every other op is the
/// CPU's, so hidden states, caches and everything else stay the reference's bits.
struct FlipsNearTiesWhenVerifying {
    cpu: CpuBackend,
    eps: f32,
}

impl Backend for FlipsNearTiesWhenVerifying {
    type Tensor = CpuTensor;
    type Matrix = CpuMatrix;
    type F32Buf = crate::backend::HostF32;

    fn name(&self) -> &'static str {
        "cpu-flips-near-ties-when-verifying"
    }
    fn dtype(&self) -> &'static str {
        self.cpu.dtype()
    }
    fn to_host(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        self.cpu.to_host(t)
    }
    fn dims(&self, t: &CpuTensor) -> (usize, usize) {
        self.cpu.dims(t)
    }
    fn matrix_dims(&self, m: &CpuMatrix) -> (usize, usize) {
        self.cpu.matrix_dims(m)
    }
    fn from_host_impl(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor> {
        self.cpu.from_host_impl(data, rows, cols)
    }
    fn matrix_impl(&self, data: &[f32], out: usize, inp: usize) -> Result<CpuMatrix> {
        self.cpu.matrix_impl(data, out, inp)
    }
    fn matmul_impl(&self, x: &CpuTensor, w: &CpuMatrix) -> Result<CpuTensor> {
        self.cpu.matmul_impl(x, w)
    }
    fn add_row_bias_impl(&self, x: &mut CpuTensor, bias: &CpuTensor) -> Result<()> {
        self.cpu.add_row_bias_impl(x, bias)
    }
    fn add_inplace_impl(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        self.cpu.add_inplace_impl(x, y)
    }
    fn rms_norm_impl(
        &self,
        x: &CpuTensor,
        weight: &CpuTensor,
        eps: f32,
        group: usize,
    ) -> Result<CpuTensor> {
        self.cpu.rms_norm_impl(x, weight, eps, group)
    }
    fn rope_inplace_impl(&self, x: &mut CpuTensor, positions: &[u32], rope: &Rope) -> Result<()> {
        self.cpu.rope_inplace_impl(x, positions, rope)
    }
    fn attention_impl(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        shape: AttnShape,
        mask: &AttnMask,
    ) -> Result<CpuTensor> {
        self.cpu.attention_impl(q, k, v, shape, mask)
    }
    fn swiglu_impl(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        self.cpu.swiglu_impl(gate, up)
    }
    fn embed_impl(&self, table: &CpuMatrix, ids: &[u32]) -> Result<CpuTensor> {
        self.cpu.embed_impl(table, ids)
    }
    fn append_rows_impl(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        self.cpu.append_rows_impl(x, y)
    }
    fn max_independent_rows(&self) -> usize {
        self.cpu.max_independent_rows()
    }
    fn concat_rows_impl(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        self.cpu.concat_rows_impl(parts)
    }
    fn concat_cols_impl(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        self.cpu.concat_cols_impl(parts)
    }
    fn split_cols_impl(&self, x: &CpuTensor, widths: &[usize]) -> Result<Vec<CpuTensor>> {
        self.cpu.split_cols_impl(x, widths)
    }
    fn slice_rows_impl(&self, x: &CpuTensor, start: usize, end: usize) -> Result<CpuTensor> {
        self.cpu.slice_rows_impl(x, start, end)
    }
    fn gather_rows_impl(&self, x: &CpuTensor, rows: &[u32]) -> Result<CpuTensor> {
        self.cpu.gather_rows_impl(x, rows)
    }
    fn lm_head_topk_impl(&self, x: &CpuTensor, head: &CpuMatrix, k: usize) -> Result<TopK> {
        let rows = self.cpu.dims(x).0;
        if rows < 2 {
            return self.cpu.lm_head_topk_impl(x, head, k);
        }
        let wide = self.cpu.lm_head_topk_impl(x, head, k.max(2))?;
        let mut out = TopK {
            rows,
            k,
            ids: Vec::with_capacity(rows * k),
            logprobs: Vec::with_capacity(rows * k),
        };
        for r in 0..rows {
            let (mut ids, mut lps) = (wide.row_ids(r).to_vec(), wide.row_logprobs(r).to_vec());
            if lps[0] - lps[1] < self.eps {
                ids.swap(0, 1);
                lps.swap(0, 1);
            }
            out.ids.extend_from_slice(&ids[..k]);
            out.logprobs.extend_from_slice(&lps[..k]);
        }
        Ok(out)
    }
}

/// A small dense Qwen3-shaped target whose logits are spread enough that only some positions
/// are near-ties.
fn tiny_target() -> (ModelSpec, RandomWeights) {
    let spec = ModelSpec {
        vocab_size: 96,
        hidden_size: 32,
        intermediate_size: 48,
        num_layers: 4,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        max_position_embeddings: 256,
        ..qwen3_8b_spec()
    };
    let weights = RandomWeights::new(&spec, 11).with_init(0.3, 0.5);
    (spec, weights)
}

/// A random DFlash drafter for `spec`, block size 4.
fn tiny_drafter<B: Backend>(be: &B, spec: &ModelSpec, dir: &std::path::Path) -> DFlashDrafter<B> {
    let r = RandomDrafter {
        layers: 1,
        block_size: 4,
        target_layer_ids: vec![0, 2],
        intermediate_size: 48,
        mask_token_id: 95,
        sliding_layers: 0,
        sliding_window: 0,
        seed: 4,
    };
    write_random_checkpoint(dir, spec, &r).unwrap();
    DFlashDrafter::load(be, dir, spec.hidden_size).unwrap()
}

const PROMPT: [u32; 9] = [3, 17, 42, 8, 66, 23, 5, 91, 30];
const MAX_NEW: usize = 48;

#[test]
fn live_decoding_on_the_cpu_reference_equals_greedy_and_reports_no_divergence() {
    let (spec, weights) = tiny_target();
    let be = CpuBackend::new();
    let target = TargetModel::load(&be, &spec, &weights).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let drafter = tiny_drafter(&be, &spec, dir.path());
    let plain = greedy(&be, &target, &PROMPT, MAX_NEW, &[]).unwrap();
    let live = live_decode(&be, &target, &drafter, &PROMPT, MAX_NEW, &[]).unwrap();
    assert_eq!(live.ids, plain.ids);
    assert_eq!(
        first_divergence(&be, &target, &PROMPT, &live.ids, &plain.ids).unwrap(),
        None
    );
}

#[test]
fn a_verify_pass_that_rounds_a_near_tie_the_other_way_is_reported_where_it_departs() {
    let (spec, weights) = tiny_target();
    let eps = 0.25;
    let cpu = CpuBackend::new();
    let be = FlipsNearTiesWhenVerifying {
        cpu: CpuBackend::new(),
        eps,
    };
    let reference = TargetModel::load(&cpu, &spec, &weights).unwrap();
    let target = TargetModel::load(&be, &spec, &weights).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let drafter = tiny_drafter(&be, &spec, dir.path());
    // Plain greedy decoding never makes a multi-row LM-head call: it is the reference's.
    let plain = greedy(&be, &target, &PROMPT, MAX_NEW, &[]).unwrap();
    assert_eq!(
        plain.ids,
        greedy(&cpu, &reference, &PROMPT, MAX_NEW, &[]).unwrap().ids
    );
    let live = live_decode(&be, &target, &drafter, &PROMPT, MAX_NEW, &[]).unwrap();
    assert_ne!(live.ids, plain.ids, "the perturbation changed nothing");
    let d = first_divergence(&be, &target, &PROMPT, &live.ids, &plain.ids)
        .unwrap()
        .expect("a divergence");

    // The first token comes from the prefill's last row, which is never perturbed.
    let k = d.position;
    assert!((1..MAX_NEW).contains(&k), "{d:?}");
    assert_eq!(
        live.ids[..k],
        plain.ids[..k],
        "the outputs differ before {k}"
    );
    // At k the verify pass took the reference's runner-up, which trails its top token by less
    // than eps: the reported tokens are those two and the margin is their logit gap.
    let mut context = PROMPT.to_vec();
    context.extend_from_slice(&plain.ids[..k]);
    let out = reference
        .forward(&cpu, &context, &mut reference.new_cache(), &Capture::none())
        .unwrap();
    let n = context.len();
    let top2 = reference
        .logits_topk(
            &cpu,
            &cpu.slice_rows(&out.last_hidden, n - 1, n).unwrap(),
            2,
        )
        .unwrap();
    let (ids, lps) = (top2.row_ids(0), top2.row_logprobs(0));
    assert_eq!(d.greedy_token, Some(plain.ids[k]));
    assert_eq!(d.greedy_token, Some(ids[0]));
    assert_eq!(d.live_token, Some(live.ids[k]));
    assert_eq!(d.live_token, Some(ids[1]));
    let margin = d.logit_margin.expect("both tokens exist");
    let want = lps[1] - lps[0];
    assert!(
        (margin - want).abs() < 1e-4,
        "margin {margin} vs the reference's log-probability gap {want}"
    );
    assert!(-eps < margin && margin <= 0.0, "{margin}");
}

#[test]
fn an_output_that_ends_early_diverges_where_it_ends_with_no_margin() {
    let (spec, weights) = tiny_target();
    let be = CpuBackend::new();
    let target = TargetModel::load(&be, &spec, &weights).unwrap();
    let d = first_divergence(&be, &target, &PROMPT, &[4, 5, 6], &[4, 5])
        .unwrap()
        .unwrap();
    assert_eq!(
        d,
        Divergence {
            position: 2,
            live_token: Some(6),
            greedy_token: None,
            logit_margin: None,
        }
    );
}

/// The loop's accounting against known answers: the oracle proposes the target's own greedy
/// tokens, so every round commits B (B − 1 accepted and the bonus) but where the budget or an EOS
/// ends it; the anti-oracle's first proposal is never the target's, so every round commits 1.
#[test]
fn oracle_drafters_give_the_known_rounds_through_the_shared_loop() {
    let (spec, weights) = tiny_target();
    let be = CpuBackend::new();
    let target = TargetModel::load(&be, &spec, &weights).unwrap();
    let b = 4;
    let plain = greedy(&be, &target, &PROMPT, MAX_NEW, &[]).unwrap();
    let oracle = Drafter::Oracle { block_size: b };
    let live = live_decode(&be, &target, &oracle, &PROMPT, MAX_NEW, &[]).unwrap();
    assert_eq!(live.ids, plain.ids);
    // 47 tokens after the prefill's: 11 rounds of 4, then 3 accepted with no room for a bonus.
    let mut want = vec![b as u32; (MAX_NEW - 1) / b];
    want.push(((MAX_NEW - 1) % b) as u32);
    assert_eq!(live.round_tokens, want);
    assert_eq!(live.accepted, [vec![3; 11], vec![3]].concat());
    assert!((live.tau() - 47.0 / 12.0).abs() < 1e-12);

    // An EOS ends the decoding where greedy decoding stops: its first occurrence, k tokens in.
    let eos = plain.ids[10];
    let k = plain.ids.iter().position(|&t| t == eos).unwrap();
    assert!(k >= 1);
    let live = live_decode(&be, &target, &oracle, &PROMPT, MAX_NEW, &[eos]).unwrap();
    assert_eq!(live.ids, plain.ids[..=k]);
    assert_eq!(live.round_tokens.len(), k.div_ceil(b));
    assert_eq!(live.round_tokens.iter().sum::<u32>() as usize, k);

    let anti = Drafter::AntiOracle { block_size: b };
    let live = live_decode(&be, &target, &anti, &PROMPT, MAX_NEW, &[]).unwrap();
    assert_eq!(live.ids, plain.ids);
    assert_eq!(live.round_tokens, vec![1; MAX_NEW - 1]);
    assert!(live.accepted.iter().all(|&a| a == 0));
    assert_eq!(live.tau(), 1.0);
}
