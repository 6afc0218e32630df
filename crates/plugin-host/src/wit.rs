//! Host bindings of the contract `draftlens:metric` (plugins/wit/metric.wit; released versions
//! are frozen in plugins/wit-frozen/). Its version is read from the WIT file itself.

use wasmtime::component::{ComponentType, Lower};

wasmtime::component::bindgen!({
    path: "../../plugins/wit",
    world: "metric-plugin",
});

pub use self::draftlens::metric::host::Level;
pub use self::draftlens::metric::types::{
    Metadata, MetricValue, Param, ParamValue, PluginError, SeriesKind,
};

/// The contract's WIT source: the one place its version is written (its `package` line).
pub const WIT_SOURCE: &str = include_str!("../../../plugins/wit/metric.wit");

/// The contract version this host implements, read from [`WIT_SOURCE`] at compile time.
pub const VERSION: (u64, u64, u64) = package_version(WIT_SOURCE.as_bytes());

/// The interface the host looks up in a plugin (`draftlens:metric/evaluator@<VERSION>`).
pub fn evaluator() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let (a, b, c) = VERSION;
        format!("draftlens:metric/evaluator@{a}.{b}.{c}")
    })
}

/// `X.Y.Z` of the `package draftlens:metric@X.Y.Z;` line (a compile error when absent).
const fn package_version(src: &[u8]) -> (u64, u64, u64) {
    let key = b"package draftlens:metric@";
    let mut i = 0;
    'search: while i + key.len() <= src.len() {
        let mut j = 0;
        while j < key.len() {
            if src[i + j] != key[j] {
                i += 1;
                continue 'search;
            }
            j += 1;
        }
        let mut p = i + key.len();
        let mut parts = [0u64; 3];
        let mut n = 0;
        while n < 3 {
            let start = p;
            while p < src.len() && src[p].is_ascii_digit() {
                parts[n] = parts[n] * 10 + (src[p] - b'0') as u64;
                p += 1;
            }
            assert!(p > start, "metric.wit: malformed package version");
            n += 1;
            if n < 3 {
                assert!(src[p] == b'.', "metric.wit: malformed package version");
                p += 1;
            }
        }
        return (parts[0], parts[1], parts[2]);
    }
    panic!("metric.wit: no `package draftlens:metric@X.Y.Z;` line")
}

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

/// Field for field: the WIT record is the plugin contract, so its fields are written out (the
/// test `wit_batch_lists_the_record_columns` checks them against `draftlens_records::COLUMNS`,
/// and the destructuring below stops compiling when the view gains a field).
impl<'a> From<::draftlens_records::BatchView<'a>> for BatchRef<'a> {
    fn from(v: ::draftlens_records::BatchView<'a>) -> Self {
        let ::draftlens_records::BatchView {
            block_size,
            top_k,
            prompt_index,
            anchor,
            region,
            target,
            valid,
            loss_mask,
            draft_ids,
            draft_logprobs,
            target_ids,
            target_logprobs,
        } = v;
        BatchRef {
            block_size,
            top_k,
            prompt_index,
            anchor,
            region,
            target,
            valid,
            loss_mask,
            draft_ids,
            draft_logprobs,
            target_ids,
            target_logprobs,
        }
    }
}

impl<'a> BatchRef<'a> {
    /// Blocks `range` of `batch` (whose columns were checked with `RecordBatch::check`), with
    /// every column (the slicing arithmetic is the record contract's, `BatchView::slice`).
    pub fn slice(
        batch: &'a ::draftlens_records::RecordBatch,
        range: std::ops::Range<usize>,
    ) -> BatchRef<'a> {
        BatchRef::from(batch.view().slice(range))
    }

    /// Blocks `range` with only what `inputs` asks for: fewer candidates are gathered into
    /// `buf`, unread log-probs are sent empty and an unread target top-K as none.
    pub fn project(
        batch: &'a ::draftlens_records::RecordBatch,
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
    use ::draftlens_records::RecordBatch;

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

    /// The WIT `record batch` is B, K and then the record columns in the order of the record
    /// contract's table, each a list of its element type (an option of one when optional).
    #[test]
    fn wit_batch_lists_the_record_columns() {
        use ::draftlens_records::{Element, COLUMNS};
        let body = WIT_SOURCE
            .split("record batch {")
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .expect("metric.wit has a `record batch`");
        let fields: Vec<String> = body
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .map(|l| l.trim_end_matches(',').to_string())
            .collect();
        let mut want = vec!["block-size: u32".to_string(), "top-k: u32".to_string()];
        for c in COLUMNS {
            let element = match c.element {
                Element::U8 => "u8",
                Element::U32 => "u32",
                Element::F32 => "f32",
            };
            let list = format!("list<{element}>");
            let ty = if c.is_optional() {
                format!("option<{list}>")
            } else {
                list
            };
            want.push(format!("{}: {ty}", c.wit_name()));
        }
        assert_eq!(fields, want);
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
