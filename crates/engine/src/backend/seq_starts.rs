//! Sequences packed row-wise into one tensor: where each begins. One type, validated where it is
//! built (the model's packed forward, a decode step, a test), so the backend operations that take
//! it check only that it fits their own rows and states, never the layout itself again.

use anyhow::{bail, ensure, Result};
use std::ops::{Deref, Range};

/// `[0, s₁, …, rows]`: sequence i is rows `starts[i]..starts[i + 1]`.
///
/// Invariant, checked by the constructors: at least one sequence, the first begins at row 0, and
/// the starts never decrease. An empty sequence (`sᵢ = sᵢ₊₁`) is valid for the backend
/// operations (its recurrent state passes through unchanged, which the CUDA delta-rule kernels
/// rely on when they plan a batch); a model forward asks for [`SeqStarts::non_empty`], since a
/// prompt has at least one token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SeqStarts(Vec<usize>);

impl SeqStarts {
    /// Validate `starts`; empty sequences allowed.
    pub fn new(starts: Vec<usize>) -> Result<Self> {
        Self::validate(starts, true)
    }

    /// Validate `starts`; every sequence must hold at least one row.
    pub fn non_empty(starts: Vec<usize>) -> Result<Self> {
        Self::validate(starts, false)
    }

    fn validate(starts: Vec<usize>, allow_empty: bool) -> Result<Self> {
        if starts.len() < 2 {
            bail!("sequence starts {starts:?} hold no sequence (need at least [0, len])");
        }
        if starts[0] != 0 {
            bail!("sequence starts {starts:?} must begin at 0");
        }
        let bad = |w: &&[usize]| w[0] > w[1] || (!allow_empty && w[0] == w[1]);
        if let Some(w) = starts.windows(2).find(bad) {
            if allow_empty {
                bail!(
                    "sequence starts {starts:?} must not decrease (found {} then {})",
                    w[0],
                    w[1]
                );
            }
            bail!(
                "sequence starts {starts:?} must strictly increase (found {} then {}; every sequence needs at least one token)",
                w[0],
                w[1]
            );
        }
        Ok(Self(starts))
    }

    /// One sequence of `rows` rows.
    pub fn one(rows: usize) -> Self {
        Self(vec![0, rows])
    }

    /// `n` sequences of one row each (a batched decode step).
    pub fn each_row(n: usize) -> Self {
        Self((0..=n).collect())
    }

    /// Sequences of the given lengths, packed in order (a length may be 0).
    pub fn from_lengths(lengths: impl IntoIterator<Item = usize>) -> Self {
        let mut starts = vec![0];
        for len in lengths {
            starts.push(starts[starts.len() - 1] + len);
        }
        Self(starts)
    }

    /// The row count of the packed tensor (the last start).
    pub fn rows(&self) -> usize {
        self.0[self.0.len() - 1]
    }

    /// How many sequences.
    pub fn count(&self) -> usize {
        self.0.len() - 1
    }

    /// Each sequence's rows, in order.
    pub fn ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.0.windows(2).map(|w| w[0]..w[1])
    }

    /// That these starts pack exactly `rows` rows (`what` names the operation in the error).
    pub fn check_rows(&self, what: &str, rows: usize) -> Result<()> {
        ensure!(
            self.rows() == rows,
            "{what}: sequence starts {:?} must end at the row count {rows}",
            self.0
        );
        Ok(())
    }

    /// [`SeqStarts::check_rows`], and one recurrent state per sequence.
    pub fn check_rows_and_states(&self, what: &str, rows: usize, n_states: usize) -> Result<()> {
        self.check_rows(what, rows)?;
        ensure!(
            n_states == self.count(),
            "{what}: {n_states} states for {} sequences",
            self.count()
        );
        Ok(())
    }
}

impl Deref for SeqStarts {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_and_its_messages() {
        for (starts, allow_empty, why) in [
            (vec![], true, "hold no sequence"),
            (vec![0], false, "hold no sequence"),
            (vec![1, 5], true, "must begin at 0"),
            (vec![0, 8, 5], true, "must not decrease"),
            (vec![0, 8, 5], false, "must strictly increase"),
            (vec![0, 5, 5], false, "must strictly increase"),
        ] {
            let r = SeqStarts::validate(starts.clone(), allow_empty);
            let e = r.expect_err(&format!("{starts:?} accepted")).to_string();
            assert!(e.contains(why), "{starts:?}: {e}");
        }
        let s = SeqStarts::new(vec![0, 5, 5, 9]).unwrap();
        assert_eq!((s.rows(), s.count()), (9, 3));
        assert_eq!(s.ranges().collect::<Vec<_>>(), vec![0..5, 5..5, 5..9]);
        assert_eq!(SeqStarts::from_lengths([5, 0, 4]), s);
        assert_eq!(*SeqStarts::each_row(3), [0, 1, 2, 3]);
        let e = s.check_rows("op", 8).unwrap_err().to_string();
        assert!(
            e.contains("op: sequence starts") && e.contains("row count 8"),
            "{e}"
        );
        let e = s.check_rows_and_states("op", 9, 2).unwrap_err().to_string();
        assert!(e.contains("2 states for 3 sequences"), "{e}");
        s.check_rows_and_states("op", 9, 3).unwrap();
    }
}
