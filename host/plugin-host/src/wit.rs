//! Host bindings of the contract `draftlens:metric@0.1.0` (plugins/wit/metric.wit).

use wasmtime::component::{ComponentType, Lower};

wasmtime::component::bindgen!({
    path: "../../plugins/wit",
    world: "metric-plugin",
});

pub use self::draftlens::metric::host::Level;
pub use self::draftlens::metric::types::{
    Metadata, MetricValue, Param, ParamValue, PluginError, SeriesKind,
};

/// The contract version this host implements and the interface it looks up.
pub const VERSION: (u64, u64, u64) = (0, 1, 0);
pub const EVALUATOR: &str = "draftlens:metric/evaluator@0.1.0";

/// A borrowed view of a batch, lowered straight from the host's columns into the guest's memory
/// (the generated `Batch` owns `Vec`s, which would cost one more copy of every column). Field
/// names and order mirror `record batch` in metric.wit; wasmtime type-checks this against the
/// component's own type when the function is looked up.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub struct BatchRef<'a> {
    #[component(name = "block-size")]
    pub block_size: u32,
    #[component(name = "top-k")]
    pub top_k: u32,
    #[component(name = "prompt-index")]
    pub prompt_index: &'a [u32],
    #[component(name = "anchor")]
    pub anchor: &'a [u32],
    #[component(name = "region")]
    pub region: &'a [u8],
    #[component(name = "target")]
    pub target: &'a [u32],
    #[component(name = "valid")]
    pub valid: &'a [u8],
    #[component(name = "loss-mask")]
    pub loss_mask: &'a [u8],
    #[component(name = "draft-ids")]
    pub draft_ids: &'a [u32],
    #[component(name = "draft-logprobs")]
    pub draft_logprobs: &'a [f32],
    #[component(name = "target-ids")]
    pub target_ids: Option<&'a [u32]>,
    #[component(name = "target-logprobs")]
    pub target_logprobs: Option<&'a [f32]>,
}

/// Reusable buffers for candidate columns cut to fewer candidates than stored.
#[derive(Default)]
pub struct ProjectionBuf {
    ids: Vec<u32>,
    lps: Vec<f32>,
    tids: Vec<u32>,
    tlps: Vec<f32>,
}

/// The first `keep` of every `k` entries.
fn gather<T: Copy>(src: &[T], k: usize, keep: usize, out: &mut Vec<T>) {
    out.clear();
    out.reserve(src.len() / k * keep);
    if keep == 1 {
        out.extend(src.iter().step_by(k).copied());
    } else {
        for c in src.chunks_exact(k) {
            out.extend_from_slice(&c[..keep]);
        }
    }
}

impl<'a> BatchRef<'a> {
    /// Blocks `range` of `batch` (whose columns were checked with `RecordBatch::check`), with
    /// every column.
    pub fn slice(
        batch: &'a ::draftlens::records::RecordBatch,
        range: std::ops::Range<usize>,
    ) -> BatchRef<'a> {
        let p = batch.positions_per_block();
        let k = batch.top_k as usize;
        let pos = range.start * p..range.end * p;
        let cand = pos.start * k..pos.end * k;
        BatchRef {
            block_size: batch.block_size,
            top_k: batch.top_k,
            prompt_index: &batch.prompt_index[range.clone()],
            anchor: &batch.anchor[range.clone()],
            region: &batch.region[range],
            target: &batch.target[pos.clone()],
            valid: &batch.valid[pos.clone()],
            loss_mask: &batch.loss_mask[pos],
            draft_ids: &batch.draft_ids[cand.clone()],
            draft_logprobs: &batch.draft_logprobs[cand.clone()],
            target_ids: batch.target_ids.as_deref().map(|c| &c[cand.clone()]),
            target_logprobs: batch.target_logprobs.as_deref().map(|c| &c[cand]),
        }
    }

    /// Blocks `range` with only what `inputs` asks for: fewer candidates are gathered into
    /// `buf`, unread log-probs are sent empty and an unread target top-K as none.
    pub fn project(
        batch: &'a ::draftlens::records::RecordBatch,
        range: std::ops::Range<usize>,
        inputs: &crate::types::Inputs,
        buf: &'a mut ProjectionBuf,
    ) -> BatchRef<'a> {
        let full = BatchRef::slice(batch, range);
        let k = batch.top_k as usize;
        let keep = if inputs.candidates == 0 {
            k
        } else {
            (inputs.candidates as usize).min(k)
        };
        let target =
            inputs.target_topk && full.target_ids.is_some() && full.target_logprobs.is_some();
        if keep < k {
            gather(full.draft_ids, k, keep, &mut buf.ids);
            if inputs.draft_logprobs {
                gather(full.draft_logprobs, k, keep, &mut buf.lps);
            }
            if target {
                gather(full.target_ids.unwrap_or_default(), k, keep, &mut buf.tids);
                gather(
                    full.target_logprobs.unwrap_or_default(),
                    k,
                    keep,
                    &mut buf.tlps,
                );
            }
        }
        let buf: &'a ProjectionBuf = buf;
        let cut = keep < k;
        BatchRef {
            top_k: keep as u32,
            draft_ids: if cut { &buf.ids } else { full.draft_ids },
            draft_logprobs: match (inputs.draft_logprobs, cut) {
                (false, _) => &[],
                (true, true) => &buf.lps,
                (true, false) => full.draft_logprobs,
            },
            target_ids: match (target, cut) {
                (false, _) => None,
                (true, true) => Some(&buf.tids),
                (true, false) => full.target_ids,
            },
            target_logprobs: match (target, cut) {
                (false, _) => None,
                (true, true) => Some(&buf.tlps),
                (true, false) => full.target_logprobs,
            },
            ..full
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.anchor.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Inputs;
    use ::draftlens::records::RecordBatch;

    fn batch() -> RecordBatch {
        // B = 3 (P = 2), K = 3, two blocks: candidate c of position i = 10 i + c.
        let mut b = RecordBatch::new(3, 3);
        b.prompt_index = vec![0, 1];
        b.anchor = vec![4, 5];
        b.region = vec![0, 0];
        b.target = vec![1, 2, 3, 4];
        b.valid = vec![1; 4];
        b.loss_mask = vec![1; 4];
        b.draft_ids = (0..4)
            .flat_map(|i| (0..3).map(move |c| 10 * i + c))
            .collect();
        b.draft_logprobs = b.draft_ids.iter().map(|&x| -(x as f32)).collect();
        b.target_ids = Some(b.draft_ids.iter().map(|x| x + 100).collect());
        b.target_logprobs = Some(b.draft_logprobs.clone());
        b.check().unwrap();
        b
    }

    #[test]
    fn projection_sends_only_what_was_asked_for() {
        let b = batch();
        let mut buf = ProjectionBuf::default();
        let top1 = Inputs {
            candidates: 1,
            draft_logprobs: false,
            target_topk: false,
        };
        let r = BatchRef::project(&b, 0..2, &top1, &mut buf);
        assert_eq!((r.top_k, r.draft_ids), (1, &[0, 10, 20, 30][..]));
        assert!(
            r.draft_logprobs.is_empty() && r.target_ids.is_none() && r.target_logprobs.is_none()
        );

        let two = Inputs {
            candidates: 2,
            draft_logprobs: true,
            target_topk: true,
        };
        let r = BatchRef::project(&b, 1..2, &two, &mut buf);
        assert_eq!((r.top_k, r.draft_ids), (2, &[20, 21, 30, 31][..]));
        assert_eq!(r.draft_logprobs, &[-20.0, -21.0, -30.0, -31.0][..]);
        assert_eq!(r.target_ids, Some(&[120, 121, 130, 131][..]));
        assert_eq!((r.prompt_index, r.target), (&[1][..], &[3, 4][..]));

        // All candidates: borrowed as they are, no copy.
        let r = BatchRef::project(&b, 0..2, &Inputs::default(), &mut buf);
        assert_eq!(r.draft_ids.as_ptr(), b.draft_ids.as_ptr());
        assert_eq!(r.top_k, 3);
    }
}
