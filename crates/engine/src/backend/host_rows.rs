//! Activations held on the host in the dtype the backend computed them in.
//!
//! The CUDA backend computes hidden states in bf16. Converting them to f32 on the way down (tap
//! download) and back to bf16 on the way up (the drafter's context) costs two passes over
//! gigabytes on one core and doubles the host memory of a run, without changing a bit: bf16 →
//! f32 → bf16 is the identity. So taps travel as [`HostRows`] from the device, through the cache,
//! to the drafter, and are widened only where f32 is really needed (the CPU backend, reports).

use half::bf16;
use std::borrow::Cow;

/// Row-major values of a `[rows, cols]` activation, in its compute dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum HostRows {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
}

/// A borrowed [`HostRows`] (or part of one).
#[derive(Clone, Copy, Debug)]
pub enum HostRowsRef<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
}

impl HostRows {
    pub fn len(&self) -> usize {
        self.view().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the values (4 per f32, 2 per bf16).
    pub fn byte_len(&self) -> usize {
        match self {
            HostRows::F32(v) => std::mem::size_of_val(v.as_slice()),
            HostRows::BF16(v) => std::mem::size_of_val(v.as_slice()),
        }
    }

    pub fn view(&self) -> HostRowsRef<'_> {
        match self {
            HostRows::F32(v) => HostRowsRef::F32(v),
            HostRows::BF16(v) => HostRowsRef::BF16(v),
        }
    }

    /// The values as f32 (borrowed when they already are; bf16 widens exactly).
    pub fn to_f32(&self) -> Cow<'_, [f32]> {
        self.view().to_f32()
    }
}

impl<'a> HostRowsRef<'a> {
    pub fn len(&self) -> usize {
        match self {
            HostRowsRef::F32(v) => v.len(),
            HostRowsRef::BF16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `range` (a caller slices whole rows: `r0 * cols .. r1 * cols`).
    pub fn slice(&self, range: std::ops::Range<usize>) -> HostRowsRef<'a> {
        match *self {
            HostRowsRef::F32(v) => HostRowsRef::F32(&v[range]),
            HostRowsRef::BF16(v) => HostRowsRef::BF16(&v[range]),
        }
    }

    pub fn to_owned(&self) -> HostRows {
        match *self {
            HostRowsRef::F32(v) => HostRows::F32(v.to_vec()),
            HostRowsRef::BF16(v) => HostRows::BF16(v.to_vec()),
        }
    }

    /// The values as f32 (borrowed when they already are; bf16 widens exactly).
    pub fn to_f32(&self) -> Cow<'a, [f32]> {
        match *self {
            HostRowsRef::F32(v) => Cow::Borrowed(v),
            HostRowsRef::BF16(v) => Cow::Owned(bf16_to_f32(v)),
        }
    }
}

impl<'a> From<&'a [f32]> for HostRowsRef<'a> {
    fn from(v: &'a [f32]) -> Self {
        HostRowsRef::F32(v)
    }
}

impl<'a> From<&'a [bf16]> for HostRowsRef<'a> {
    fn from(v: &'a [bf16]) -> Self {
        HostRowsRef::BF16(v)
    }
}

impl<'a> From<&'a HostRows> for HostRowsRef<'a> {
    fn from(v: &'a HostRows) -> Self {
        v.view()
    }
}

/// bf16 → f32 on all cores for large inputs (exact).
pub fn bf16_to_f32(v: &[bf16]) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = vec![0f32; v.len()];
    out.par_chunks_mut(1 << 16)
        .zip(v.par_chunks(1 << 16))
        .for_each(|(o, r)| half::slice::HalfFloatSliceExt::convert_to_f32_slice(r, o));
    out
}

/// f32 → bf16 (round to nearest even) on all cores for large inputs.
pub fn f32_to_bf16(v: &[f32]) -> Vec<bf16> {
    use rayon::prelude::*;
    let mut out = vec![bf16::ZERO; v.len()];
    out.par_chunks_mut(1 << 16)
        .zip(v.par_chunks(1 << 16))
        .for_each(|(o, r)| half::slice::HalfFloatSliceExt::convert_from_f32_slice(o, r));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_trip_is_exact_and_slices_keep_rows() {
        // Every bf16 value widens to an f32 that narrows back to itself.
        let vals: Vec<bf16> = (0..1u32 << 16)
            .map(|b| bf16::from_bits(b as u16))
            .filter(|x| !x.is_nan())
            .collect();
        let wide = bf16_to_f32(&vals);
        assert_eq!(f32_to_bf16(&wide), vals);
        let rows = HostRows::BF16(vals.clone());
        let part = rows.view().slice(4..8);
        assert_eq!(part.len(), 4);
        assert_eq!(part.to_f32().as_ref(), &wide[4..8]);
        assert_eq!(part.to_owned(), HostRows::BF16(vals[4..8].to_vec()));
        // Rounding is to nearest even, as the device's conversion.
        assert_eq!(f32_to_bf16(&[1.0 + 1.0 / 256.0])[0], bf16::from_f32(1.0));
        assert_eq!(
            f32_to_bf16(&[1.0 + 3.0 / 256.0])[0],
            bf16::from_f32(1.0 + 4.0 / 256.0)
        );
    }
}

/// `all` (`[rows, cols]`) cut into parts by rows at `row_starts` (checked by the caller: ascending
/// from 0 to the row count); one part is `all` itself, several are copied out on all cores.
pub fn split_rows(all: HostRows, cols: usize, row_starts: &[usize]) -> Vec<HostRows> {
    if row_starts.len() == 2 {
        return vec![all];
    }
    use rayon::prelude::*;
    row_starts
        .par_windows(2)
        .map(|w| all.view().slice(w[0] * cols..w[1] * cols).to_owned())
        .collect()
}
