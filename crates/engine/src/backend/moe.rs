//! What the mixture-of-experts ops of [`super::Backend`] take: the router's rule ([`MoeRouting`])
//! and the routed experts ([`MoeExperts`]) of [`super::Backend::moe_routed_acc`]; and the host
//! reference of [`super::Backend::add_weighted_rows`], the op with which a mixture of experts adds
//! each token's weighted expert outputs to the residual stream (`crate::model::moe`,
//! docs/moe-models.md). The CPU backend runs it; the trait's default runs it on downloaded copies;
//! the CUDA kernel (`kernels/moe.cu`) does the same arithmetic per element.

use rayon::prelude::*;

/// How a router picks each token's experts and their weights from its logits
/// ([`super::Backend::moe_routed_acc`]; the host rules are in `crate::model::moe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutingRule {
    /// Qwen's (`crate::model::moe::route`): softmax over every expert's logit in f32, the top-k
    /// probabilities, divided by their sum when `renormalise` (`norm_topk_prob`).
    SoftmaxTopK { renormalise: bool },
    /// gpt-oss's (`crate::model::moe::route_topk_softmax`): the top-k logits, then softmax over
    /// those k values in f32.
    TopKSoftmax,
}

/// What [`super::Backend::moe_routed_acc`] needs of a router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeRouting {
    /// Routed experts (`num_experts`): the logits' first columns.
    pub num_experts: usize,
    /// Experts per token (`num_experts_per_tok`).
    pub top_k: usize,
    pub rule: RoutingRule,
}

/// The routed experts' activation on their fused gate|up output (gate columns first).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) · up`, as [`super::Backend::swiglu`] on the two halves (Qwen).
    SwiGlu,
    /// gpt-oss's clamped SwiGLU ([`super::gpt_oss::clamped_swiglu`], as
    /// [`super::Backend::clamped_swiglu_packed`]).
    ClampedSwiGlu { alpha: f32, limit: f32 },
}

/// A layer's routed experts as [`super::Backend::moe_routed_acc`] takes them: expert e computes
/// `down_e(act(x · gate_up_eᵀ + b_gu,e)) + b_down,e`, each bias added to the projection's
/// activation-dtype output and rounded once (as [`super::Backend::add_row_bias`]).
pub struct MoeExperts<'a, M, T> {
    /// Per expert, `(gate_up [2·I, D], down [D, I])`, as `crate::model::transformer::Mlp`
    /// holds them.
    pub weights: &'a [(&'a M, &'a M)],
    /// Per expert, `(gate|up bias [1, 2·I], down bias [1, D])` (gpt-oss), or no biases (Qwen).
    pub biases: Option<&'a [(&'a T, &'a T)]>,
    pub activation: ExpertActivation,
}

/// `acc[r] += Σ_j weights[r·n + j] · src[index[r·n + j]]` over rows of `cols` values, n =
/// `index.len() / rows`: each product rounded to f32, then added to a running f32 sum in j order
/// (transformers' order: `current_hidden_states * routing_weight` then `index_add_`, experts
/// ascending, then `+ shared_expert_output`), and the sum added to `acc[r]` once (`residual +
/// mlp_output`). Shapes are checked by the caller.
pub fn add_weighted_rows(
    acc: &mut [f32],
    src: &[f32],
    cols: usize,
    index: &[u32],
    weights: &[f32],
) {
    if cols == 0 || acc.is_empty() {
        return;
    }
    let n = index.len() / (acc.len() / cols);
    acc.par_chunks_mut(cols).enumerate().for_each(|(r, out)| {
        let terms = r * n..(r + 1) * n;
        for (c, o) in out.iter_mut().enumerate() {
            let mut sum = 0f32;
            for j in terms.clone() {
                sum += weights[j] * src[index[j] as usize * cols + c];
            }
            *o += sum;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::Backend;

    /// Two rows of 3 columns, each with two terms from a 3-row source.
    #[test]
    fn adds_each_rows_weighted_terms() {
        let mut acc = vec![1.0, 2.0, 3.0, 10.0, 20.0, 30.0];
        let src = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0];
        add_weighted_rows(&mut acc, &src, 3, &[0, 2, 1, 1], &[0.5, 0.25, 2.0, -1.0]);
        assert_eq!(acc, vec![1.5, 2.0, 3.5, 10.0, 21.0, 30.0]);
    }

    /// The trait's checks, and the CPU backend against the default (download, host, upload).
    #[test]
    fn backend_op_checks_its_operands() {
        let be = CpuBackend::new();
        let mut acc = be.from_host(&[0.0; 4], 2, 2).unwrap();
        let src = be.from_host(&[1.0, 2.0, 3.0, 4.0], 2, 2).unwrap();
        let err = |r: anyhow::Result<()>| format!("{:#}", r.unwrap_err());
        assert!(
            err(be.add_weighted_rows(&mut acc, &src, &[0, 2], &[1.0, 1.0]))
                .contains("row 2 of a source of 2 rows")
        );
        assert!(
            err(be.add_weighted_rows(&mut acc, &src, &[0, 1, 0], &[1.0; 3]))
                .contains("3 terms for 2 rows")
        );
        assert!(err(be.add_weighted_rows(&mut acc, &src, &[0, 1], &[1.0]))
            .contains("2 indices and 1 weights"));
        be.add_weighted_rows(&mut acc, &src, &[1, 0], &[1.0, 0.5])
            .unwrap();
        assert_eq!(be.to_host(&acc).unwrap(), vec![3.0, 4.0, 0.5, 1.0]);
    }
}
