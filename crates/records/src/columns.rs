//! The record columns, listed once (`docs/metrics.md` §1).
//!
//! [`COLUMNS`] is the table that every encoding of a batch iterates: the SQL store's
//! `record_chunk` rows, the records cache's entries, the report bundle's JSON, and the batch's
//! own slicing, concatenation and checks. Each column is named once here, in snake_case: the
//! batch field, the SQL column, the cache tensor and the bundle key (the WIT field and the
//! plugin-facing messages use it in kebab-case, [`Column::wit_name`]).
//!
//! Adding a column: a field of [`RecordBatch`] and [`BatchView`], a row of [`COLUMNS`] and its
//! arms in the accessors below (all in this crate), and a migration that adds it to the store's
//! `record_chunk` table (`crates/results/src/store/schema.rs`); no encoder changes. Since
//! `RecordBatch` is the guest type of the WIT `record batch` (`plugins/sdk/src/guest.rs`), the
//! plugin contract (`plugins/wit/metric.wit`) gains the field too, in a new contract version.

use crate::batch::{BatchView, LayoutError, RecordBatch};
use std::ops::Range;

/// How many entries a column has per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// One per block.
    Block,
    /// P = B − 1 per block: one per drafted position, k = 1..P in order.
    Position,
    /// P·K per block: the K candidates of every position, best first.
    Candidate,
}

impl Level {
    /// Entries per block of a batch of block size `block_size` (B) and `top_k` (K).
    pub fn per_block(self, block_size: u32, top_k: u32) -> usize {
        let positions = block_size.saturating_sub(1) as usize;
        match self {
            Level::Block => 1,
            Level::Position => positions,
            Level::Candidate => positions * top_k as usize,
        }
    }
    /// The entries of blocks `blocks` in a column of this level.
    pub fn entries(self, blocks: Range<usize>, block_size: u32, top_k: u32) -> Range<usize> {
        let n = self.per_block(block_size, top_k);
        blocks.start * n..blocks.end * n
    }
}

/// The element type of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// A byte holding 0 or 1 (the flags and the region; [`BatchView::check`] enforces it).
    U8,
    U32,
    F32,
}

/// Whether a column is always there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Always present and complete.
    Required,
    /// Always stored; sent to a plugin empty when it does not read it (the drafter's log-probs).
    EmptyWhenUnread,
    /// `None` when the run did not keep it (the target's top-K, whose columns come together).
    Optional,
}

/// One record column: a row of [`COLUMNS`].
#[derive(Debug, PartialEq, Eq)]
pub struct Column {
    /// snake_case: the batch field, the SQL column, the cache tensor and the bundle key.
    pub name: &'static str,
    pub level: Level,
    pub element: Element,
    pub presence: Presence,
    /// Which batch field holds it (the accessors below match on it).
    field: Field,
}

impl Column {
    /// The name in the WIT contract and in plugin-facing messages (kebab-case).
    pub fn wit_name(&self) -> String {
        self.name.replace('_', "-")
    }
    pub fn is_optional(&self) -> bool {
        self.presence == Presence::Optional
    }
}

/// The batch fields that are columns (one per row of [`COLUMNS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    PromptIndex,
    Anchor,
    Region,
    Target,
    Valid,
    LossMask,
    DraftIds,
    DraftLogprobs,
    TargetIds,
    TargetLogprobs,
}

const fn column(
    name: &'static str,
    field: Field,
    level: Level,
    element: Element,
    presence: Presence,
) -> Column {
    Column {
        name,
        level,
        element,
        presence,
        field,
    }
}

/// Every record column, in the order of the batch's fields, the WIT record, the SQL table and
/// the bundle's keys. [`PROMPT_INDEX`] comes first.
#[rustfmt::skip]
pub const COLUMNS: &[Column] = {
    use Element::*;
    use Level::*;
    use Presence::*;
    &[
        //     name              field                  level      element  presence
        column("prompt_index",   Field::PromptIndex,    Block,     U32,     Required),
        column("anchor",         Field::Anchor,         Block,     U32,     Required),
        column("region",         Field::Region,         Block,     U8,      Required),
        column("target",         Field::Target,         Position,  U32,     Required),
        column("valid",          Field::Valid,          Position,  U8,      Required),
        column("loss_mask",      Field::LossMask,       Position,  U8,      Required),
        column("draft_ids",      Field::DraftIds,       Candidate, U32,     Required),
        column("draft_logprobs", Field::DraftLogprobs,  Candidate, F32,     EmptyWhenUnread),
        column("target_ids",     Field::TargetIds,      Candidate, U32,     Optional),
        column("target_logprobs", Field::TargetLogprobs, Candidate, F32,    Optional),
    ]
};

/// The prompt index of each block. The store and the records cache keep the blocks of one
/// prompt together and write it once per chunk or entry, not as a column
/// ([`columns_per_prompt`]).
pub const PROMPT_INDEX: &Column = &COLUMNS[0];

/// Every column but [`PROMPT_INDEX`]: what a store of one prompt's blocks keeps per block.
pub fn columns_per_prompt() -> &'static [Column] {
    &COLUMNS[1..]
}

/// A borrowed column.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ColumnRef<'a> {
    U8(&'a [u8]),
    U32(&'a [u32]),
    F32(&'a [f32]),
}

impl<'a> ColumnRef<'a> {
    pub fn len(&self) -> usize {
        match self {
            ColumnRef::U8(v) => v.len(),
            ColumnRef::U32(v) => v.len(),
            ColumnRef::F32(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn element(&self) -> Element {
        match self {
            ColumnRef::U8(_) => Element::U8,
            ColumnRef::U32(_) => Element::U32,
            ColumnRef::F32(_) => Element::F32,
        }
    }
    /// Entries `range`, or `None` when it is out of bounds.
    pub fn get(&self, range: Range<usize>) -> Option<ColumnRef<'a>> {
        Some(match self {
            ColumnRef::U8(v) => ColumnRef::U8(v.get(range)?),
            ColumnRef::U32(v) => ColumnRef::U32(v.get(range)?),
            ColumnRef::F32(v) => ColumnRef::F32(v.get(range)?),
        })
    }
    /// Entries `range` (panics when out of bounds, as slice indexing does).
    pub fn slice(&self, range: Range<usize>) -> ColumnRef<'a> {
        match self {
            ColumnRef::U8(v) => ColumnRef::U8(&v[range]),
            ColumnRef::U32(v) => ColumnRef::U32(&v[range]),
            ColumnRef::F32(v) => ColumnRef::F32(&v[range]),
        }
    }
    pub fn to_data(&self) -> ColumnData {
        match self {
            ColumnRef::U8(v) => ColumnData::U8(v.to_vec()),
            ColumnRef::U32(v) => ColumnData::U32(v.to_vec()),
            ColumnRef::F32(v) => ColumnData::F32(v.to_vec()),
        }
    }
}

/// An owned column.
#[derive(Clone, Debug, PartialEq)]
pub enum ColumnData {
    U8(Vec<u8>),
    U32(Vec<u32>),
    F32(Vec<f32>),
}

impl ColumnData {
    /// An empty column of `element` with room for `capacity` entries.
    pub fn with_capacity(element: Element, capacity: usize) -> ColumnData {
        match element {
            Element::U8 => ColumnData::U8(Vec::with_capacity(capacity)),
            Element::U32 => ColumnData::U32(Vec::with_capacity(capacity)),
            Element::F32 => ColumnData::F32(Vec::with_capacity(capacity)),
        }
    }
    pub fn as_ref(&self) -> ColumnRef<'_> {
        match self {
            ColumnData::U8(v) => ColumnRef::U8(v),
            ColumnData::U32(v) => ColumnRef::U32(v),
            ColumnData::F32(v) => ColumnRef::F32(v),
        }
    }
    pub fn len(&self) -> usize {
        self.as_ref().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn element(&self) -> Element {
        self.as_ref().element()
    }
    /// Appends `more`, which must have the same element type.
    pub fn extend_from(&mut self, more: ColumnRef<'_>) -> Result<(), LayoutError> {
        match (self, more) {
            (ColumnData::U8(v), ColumnRef::U8(m)) => v.extend_from_slice(m),
            (ColumnData::U32(v), ColumnRef::U32(m)) => v.extend_from_slice(m),
            (ColumnData::F32(v), ColumnRef::F32(m)) => v.extend_from_slice(m),
            (v, m) => return Err(mismatch("appended", v.element(), m.element())),
        }
        Ok(())
    }
}

fn mismatch(what: &str, want: Element, got: Element) -> LayoutError {
    LayoutError(format!("{what}: {got:?} data for a {want:?} column"))
}

/// Why `data` does not fit column `c` (a programming error in a codec, not bad input).
fn wrong_data(c: &Column, data: Option<Element>) -> LayoutError {
    match data {
        Some(got) => mismatch(&format!("column {}", c.name), c.element, got),
        None => LayoutError(format!("column {} is required", c.name)),
    }
}

impl<'a> BatchView<'a> {
    /// Column `c`; `None` for an optional column that is absent.
    pub fn column(&self, c: &Column) -> Option<ColumnRef<'a>> {
        Some(match c.field {
            Field::PromptIndex => ColumnRef::U32(self.prompt_index),
            Field::Anchor => ColumnRef::U32(self.anchor),
            Field::Region => ColumnRef::U8(self.region),
            Field::Target => ColumnRef::U32(self.target),
            Field::Valid => ColumnRef::U8(self.valid),
            Field::LossMask => ColumnRef::U8(self.loss_mask),
            Field::DraftIds => ColumnRef::U32(self.draft_ids),
            Field::DraftLogprobs => ColumnRef::F32(self.draft_logprobs),
            Field::TargetIds => ColumnRef::U32(self.target_ids?),
            Field::TargetLogprobs => ColumnRef::F32(self.target_logprobs?),
        })
    }

    /// Sets column `c` to `data` (`None`: an optional column absent). An error when the data's
    /// element type is not the column's, or a required column gets none.
    pub fn set_column(
        &mut self,
        c: &Column,
        data: Option<ColumnRef<'a>>,
    ) -> Result<(), LayoutError> {
        use ColumnRef as R;
        match (c.field, data) {
            (Field::PromptIndex, Some(R::U32(v))) => self.prompt_index = v,
            (Field::Anchor, Some(R::U32(v))) => self.anchor = v,
            (Field::Region, Some(R::U8(v))) => self.region = v,
            (Field::Target, Some(R::U32(v))) => self.target = v,
            (Field::Valid, Some(R::U8(v))) => self.valid = v,
            (Field::LossMask, Some(R::U8(v))) => self.loss_mask = v,
            (Field::DraftIds, Some(R::U32(v))) => self.draft_ids = v,
            (Field::DraftLogprobs, Some(R::F32(v))) => self.draft_logprobs = v,
            (Field::TargetIds, Some(R::U32(v))) => self.target_ids = Some(v),
            (Field::TargetIds, None) => self.target_ids = None,
            (Field::TargetLogprobs, Some(R::F32(v))) => self.target_logprobs = Some(v),
            (Field::TargetLogprobs, None) => self.target_logprobs = None,
            (_, data) => return Err(wrong_data(c, data.map(|d| d.element()))),
        }
        Ok(())
    }
}

impl RecordBatch {
    /// Column `c`; `None` for an optional column that is absent.
    pub fn column(&self, c: &Column) -> Option<ColumnRef<'_>> {
        self.view().column(c)
    }

    /// Moves column `c` out, leaving it empty (an optional column: absent).
    pub fn take_column(&mut self, c: &Column) -> Option<ColumnData> {
        use std::mem::take;
        Some(match c.field {
            Field::PromptIndex => ColumnData::U32(take(&mut self.prompt_index)),
            Field::Anchor => ColumnData::U32(take(&mut self.anchor)),
            Field::Region => ColumnData::U8(take(&mut self.region)),
            Field::Target => ColumnData::U32(take(&mut self.target)),
            Field::Valid => ColumnData::U8(take(&mut self.valid)),
            Field::LossMask => ColumnData::U8(take(&mut self.loss_mask)),
            Field::DraftIds => ColumnData::U32(take(&mut self.draft_ids)),
            Field::DraftLogprobs => ColumnData::F32(take(&mut self.draft_logprobs)),
            Field::TargetIds => ColumnData::U32(self.target_ids.take()?),
            Field::TargetLogprobs => ColumnData::F32(self.target_logprobs.take()?),
        })
    }

    /// Sets column `c` to `data` (`None`: an optional column absent). An error when the data's
    /// element type is not the column's, or a required column gets none.
    pub fn set_column(&mut self, c: &Column, data: Option<ColumnData>) -> Result<(), LayoutError> {
        use ColumnData as D;
        match (c.field, data) {
            (Field::PromptIndex, Some(D::U32(v))) => self.prompt_index = v,
            (Field::Anchor, Some(D::U32(v))) => self.anchor = v,
            (Field::Region, Some(D::U8(v))) => self.region = v,
            (Field::Target, Some(D::U32(v))) => self.target = v,
            (Field::Valid, Some(D::U8(v))) => self.valid = v,
            (Field::LossMask, Some(D::U8(v))) => self.loss_mask = v,
            (Field::DraftIds, Some(D::U32(v))) => self.draft_ids = v,
            (Field::DraftLogprobs, Some(D::F32(v))) => self.draft_logprobs = v,
            (Field::TargetIds, Some(D::U32(v))) => self.target_ids = Some(v),
            (Field::TargetIds, None) => self.target_ids = None,
            (Field::TargetLogprobs, Some(D::F32(v))) => self.target_logprobs = Some(v),
            (Field::TargetLogprobs, None) => self.target_logprobs = None,
            (_, data) => return Err(wrong_data(c, data.map(|d| d.element()))),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field names of a batch's `Debug` output after B and K, in order.
    fn debug_fields(debug: &str) -> Vec<String> {
        let body = &debug[debug.find('{').unwrap() + 1..];
        body.split(", ")
            .filter_map(|part| {
                part.trim()
                    .split_once(": ")
                    .map(|(name, _)| name.to_string())
            })
            .filter(|name| name != "block_size" && name != "top_k")
            .collect()
    }

    #[test]
    fn the_table_lists_every_batch_field_in_order() {
        let names: Vec<&str> = COLUMNS.iter().map(|c| c.name).collect();
        assert_eq!(
            debug_fields(&format!("{:?}", RecordBatch::new(3, 2))),
            names
        );
        assert_eq!(
            debug_fields(&format!("{:?}", RecordBatch::new(3, 2).view())),
            names
        );
        assert_eq!(PROMPT_INDEX.name, "prompt_index");
        assert_eq!(columns_per_prompt().len(), COLUMNS.len() - 1);
        assert!(!columns_per_prompt().contains(PROMPT_INDEX));
        assert_eq!(COLUMNS[5].wit_name(), "loss-mask");
    }

    /// B = 3, K = 2, two blocks; column `i` holds values `100 i + j`.
    fn numbered() -> RecordBatch {
        let mut b = RecordBatch::new(3, 2);
        for (i, c) in COLUMNS.iter().enumerate() {
            let n = 2 * c.level.per_block(3, 2);
            let data = match c.element {
                Element::U8 => ColumnData::U8((0..n).map(|j| (i + j) as u8).collect()),
                Element::U32 => ColumnData::U32((0..n).map(|j| (100 * i + j) as u32).collect()),
                Element::F32 => ColumnData::F32((0..n).map(|j| (100 * i + j) as f32).collect()),
            };
            b.set_column(c, Some(data)).unwrap();
        }
        b
    }

    #[test]
    fn accessors_reach_the_field_of_their_row() {
        let mut b = numbered();
        assert_eq!(b.check(), Ok(()));
        assert_eq!(b.loss_mask, vec![5, 6, 7, 8]);
        assert_eq!(b.target_logprobs.as_ref().map(|v| v[7]), Some(907.0));
        let mut v = b.view();
        for c in COLUMNS {
            let col = b.column(c).unwrap();
            assert_eq!(col.element(), c.element, "{}", c.name);
            assert_eq!(v.column(c), Some(col));
            v.set_column(c, Some(col.slice(0..1))).unwrap();
            assert_eq!(v.column(c).map(|x| x.len()), Some(1));
        }
        for c in COLUMNS {
            let data = b.take_column(c).unwrap();
            assert_eq!(
                b.column(c).map(|x| x.len()),
                (!c.is_optional()).then_some(0)
            );
            b.set_column(c, Some(data)).unwrap();
        }
        assert_eq!(b, numbered());
    }

    #[test]
    fn setters_refuse_data_that_does_not_fit() {
        let mut b = numbered();
        let anchor = &COLUMNS[1];
        assert_eq!(
            b.set_column(anchor, Some(ColumnData::F32(vec![1.0])))
                .unwrap_err()
                .0,
            "column anchor: F32 data for a U32 column"
        );
        assert_eq!(
            b.set_column(anchor, None).unwrap_err().0,
            "column anchor is required"
        );
        let mut v = b.view();
        assert!(v.set_column(anchor, Some(ColumnRef::U8(&[1]))).is_err());
        let target_ids = COLUMNS.iter().find(|c| c.name == "target_ids").unwrap();
        v.set_column(target_ids, None).unwrap();
        assert_eq!(v.target_ids, None);
        let mut d = ColumnData::with_capacity(Element::U8, 1);
        assert!(d.extend_from(ColumnRef::U32(&[1])).is_err());
        d.extend_from(ColumnRef::U8(&[1, 0])).unwrap();
        assert_eq!(d, ColumnData::U8(vec![1, 0]));
    }

    #[test]
    fn levels_count_entries_per_block() {
        assert_eq!(
            [Level::Block, Level::Position, Level::Candidate].map(|l| l.per_block(5, 3)),
            [1, 4, 12]
        );
        assert_eq!(Level::Position.entries(2..4, 5, 3), 8..16);
        assert_eq!(Level::Candidate.per_block(1, 3), 0);
    }
}
