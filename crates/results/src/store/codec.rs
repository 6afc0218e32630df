//! Little-endian BLOB encoding of record columns and token ids (fixed byte order so a database or
//! a bundle written on one machine reads the same on any other). A u8 record column is its bytes.

use anyhow::{bail, Result};
use draftlens_records::{ColumnData, ColumnRef, Element};

pub fn u32s_to_le(v: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

pub fn f32s_to_le(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Decodes a u32 LE blob; `what` names the column for the error.
pub fn le_to_u32s(b: &[u8], what: &str) -> Result<Vec<u32>> {
    if b.len() % 4 != 0 {
        bail!(
            "{what}: blob of {} bytes is not a whole number of u32 values",
            b.len()
        );
    }
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

pub fn le_to_f32s(b: &[u8], what: &str) -> Result<Vec<f32>> {
    if b.len() % 4 != 0 {
        bail!(
            "{what}: blob of {} bytes is not a whole number of f32 values",
            b.len()
        );
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The bytes of a record column: what `record_chunk` stores and a bundle carries in base64.
pub fn column_to_le(c: ColumnRef<'_>) -> Vec<u8> {
    match c {
        ColumnRef::U8(v) => v.to_vec(),
        ColumnRef::U32(v) => u32s_to_le(v),
        ColumnRef::F32(v) => f32s_to_le(v),
    }
}

/// A record column of `element` from its bytes; `what` names the column for the error.
pub fn le_to_column(element: Element, b: &[u8], what: &str) -> Result<ColumnData> {
    Ok(match element {
        Element::U8 => ColumnData::U8(b.to_vec()),
        Element::U32 => ColumnData::U32(le_to_u32s(b, what)?),
        Element::F32 => ColumnData::F32(le_to_f32s(b, what)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_order_is_little_endian() {
        assert_eq!(u32s_to_le(&[0x0102_0304]), vec![4, 3, 2, 1]);
        assert_eq!(f32s_to_le(&[1.0]), vec![0, 0, 0x80, 0x3f]);
        assert_eq!(
            le_to_u32s(&[4, 3, 2, 1, 1, 0, 0, 0], "t").unwrap(),
            vec![0x0102_0304, 1]
        );
        assert!(le_to_u32s(&[1, 2, 3], "t")
            .unwrap_err()
            .to_string()
            .contains("t: blob of 3 bytes"));
        assert_eq!(
            le_to_f32s(&f32s_to_le(&[-2.5, f32::INFINITY]), "t").unwrap(),
            vec![-2.5, f32::INFINITY]
        );
        let bytes = column_to_le(ColumnRef::U32(&[0x0102_0304]));
        assert_eq!(bytes, vec![4, 3, 2, 1]);
        assert_eq!(column_to_le(ColumnRef::U8(&[0, 1, 1])), vec![0, 1, 1]);
        assert_eq!(
            le_to_column(Element::U32, &bytes, "t").unwrap(),
            ColumnData::U32(vec![0x0102_0304])
        );
        assert_eq!(
            le_to_column(Element::U8, &bytes, "t").unwrap(),
            ColumnData::U8(bytes.clone())
        );
        assert!(le_to_column(Element::F32, &bytes[..3], "t")
            .unwrap_err()
            .to_string()
            .contains("t: blob of 3 bytes is not a whole number of f32 values"));
    }
}
