//! Writing GGUF metadata values, for the golden tests that rewrite a committed GGUF with one
//! change (bad-input tests of the hybrid and MoE GGUF readers).

use draftlens_engine::formats::gguf::GgufValue;

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

pub fn type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

pub fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend(x.to_le_bytes()),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(a) => {
            out.extend(a.first().map_or(4, type_id).to_le_bytes());
            out.extend((a.len() as u64).to_le_bytes());
            a.iter().for_each(|e| put_value(out, e));
        }
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// One tensor to write: its GGUF name, `ne` (innermost first), GGML type id and stored bytes.
pub struct TensorOut {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
}

impl TensorOut {
    /// A copy of a tensor of an open GGUF file, under `name`.
    pub fn copy(
        file: &draftlens_engine::formats::gguf::GgufFile,
        t: &draftlens_engine::formats::gguf::GgufTensor,
        name: &str,
    ) -> TensorOut {
        TensorOut {
            name: name.to_string(),
            ne: t.ne.clone(),
            ty: t.ty.id(),
            data: file.tensor_data(t).to_vec(),
        }
    }
}

/// A GGUF v3 file at `dst`: `meta` (written in its order) and `tensors`, data aligned to `align`.
pub fn write_gguf(
    dst: &std::path::Path,
    meta: &std::collections::BTreeMap<String, GgufValue>,
    tensors: &[TensorOut],
    align: usize,
) {
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut out, k);
        out.extend(type_id(v).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0usize;
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend((t.ne.len() as u32).to_le_bytes());
        t.ne.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(t.ty.to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offset += t.data.len().div_ceil(align) * align;
    }
    out.resize(out.len().div_ceil(align) * align, 0);
    for t in tensors {
        out.extend(&t.data);
        out.resize(out.len().div_ceil(align) * align, 0);
    }
    std::fs::write(dst, out).unwrap();
}
