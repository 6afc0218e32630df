//! The draftlens record contract, written once (definitions: `docs/metrics.md` §1–§3).
//!
//! * [`RecordBatch`] (owned) and [`BatchView`] (borrowed) hold evaluated drafter blocks in
//!   columnar form: what the drafter evaluation produces, what the store keeps, what the web UI
//!   analyses and what metric plugins read. The WIT `record batch` (`plugins/wit/metric.wit`)
//!   has the same fields in the same order.
//! * [`COLUMNS`]: the record columns, listed once (name, level, element type, presence), with
//!   typed access to a batch's columns ([`ColumnRef`], [`ColumnData`]). Every encoding of a batch
//!   (the store, the records cache, the report bundle) iterates it; adding a column touches this
//!   crate and the store's schema migration only.
//! * [`ParamValue`] / [`Param`]: plugin parameters.
//! * [`BatchView::accepted_len`]: the accepted length A of a block.
//! * [`replay`]: the chain of anchors a greedy speculative decode visits and the tokens each
//!   round yields (bonus token included, none past the end of the sequence).
//! * [`sampling`]: speculative sampling at T > 0 — the temperature / top-k / top-p transform,
//!   the acceptance rule and its expectation (`docs/metrics.md` §7).
//!
//! The engine (`draftlens::records`), the plugin host, the plugin SDK, the native metrics, the web
//! UI and the `replayed-tau` plugin all use these definitions. No dependencies (an optional
//! `serde` feature for the host), so the same crate builds into every wasm32 plugin.

mod batch;
mod columns;
mod params;
mod replay;
pub mod sampling;

pub use batch::{
    BatchView, Block, Candidates, LayoutError, Position, PositionSpec, RecordBatch, Region,
};
pub use columns::{
    columns_per_prompt, Column, ColumnData, ColumnRef, Element, Level, Presence, COLUMNS,
    PROMPT_INDEX,
};
pub use params::{Param, ParamValue};
pub use replay::{next_anchor, replay, round_tokens, MissingAnchor, Round, SequenceEnd};
