//! The GGUF header parser (docs/models.md §3.2): every count and length read from the file is
//! checked against the bytes that remain before anything is allocated, and every tensor's data
//! range against the file size; errors name the file, the byte offset and what was being read.

use super::{GgmlType, GgufTensor, GgufValue};
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// `"GGUF"` read as a little-endian u32.
const GGUF_MAGIC: u32 = 0x4655_4747;
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal in the format; deeper nesting than this is treated as corruption.
const MAX_ARRAY_DEPTH: usize = 4;

pub(super) struct Parsed {
    pub(super) version: u32,
    pub(super) metadata: BTreeMap<String, GgufValue>,
    pub(super) tensors: Vec<GgufTensor>,
    pub(super) alignment: u64,
    pub(super) data_offset: u64,
}

/// A bounds-checked little-endian reader over the mapped file. Errors carry the file path, the
/// byte offset and what was being read.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Invalid UTF-8 in string values seen so far (replaced, reported once).
    lossy_strings: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            bail!(
                "{}: truncated: {} needs {n} bytes at offset {} but only {} remain (file is {} bytes)",
                self.path.display(),
                what(),
                self.pos,
                self.remaining(),
                self.buf.len()
            );
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returned N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length or count that must fit in what remains given `min_each` bytes per item.
    fn count(&mut self, min_each: usize, what: &dyn Fn() -> String) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let need = n.checked_mul(min_each as u64);
        match need {
            Some(need) if need <= self.remaining() as u64 => Ok(n as usize),
            _ => bail!(
                "{}: {} at offset {at} claims {n} items of at least {min_each} bytes, but only {} bytes remain (corrupt or truncated file)",
                self.path.display(),
                what(),
                self.remaining()
            ),
        }
    }

    /// GGUF string: u64 length + bytes. Names and keys must be UTF-8.
    fn string_bytes(&mut self, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let n = self.count(1, &|| format!("length of {}", what()))?;
        self.take(n, what)
    }

    fn name(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let at = self.pos;
        let b = self.string_bytes(what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => bail!(
                "{}: {} at offset {at} is not valid UTF-8",
                self.path.display(),
                what()
            ),
        }
    }

    fn value(&mut self, ty: u32, depth: usize, key: &str) -> Result<GgufValue> {
        let what = || format!("value of metadata key {key:?}");
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(&what)?[0]),
            1 => GgufValue::I8(self.array::<1>(&what)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => GgufValue::Bool(self.array::<1>(&what)?[0] != 0),
            8 => {
                let b = self.string_bytes(&what)?;
                // Token strings of some converted vocabularies are not valid UTF-8; keep them
                // readable rather than refusing the whole model.
                match std::str::from_utf8(b) {
                    Ok(s) => GgufValue::String(s.to_string()),
                    Err(_) => {
                        self.lossy_strings += 1;
                        GgufValue::String(String::from_utf8_lossy(b).into_owned())
                    }
                }
            }
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    bail!(
                        "{}: metadata key {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH}",
                        self.path.display()
                    );
                }
                let at = self.pos;
                let elem = self.u32(&|| format!("array element type of metadata key {key:?}"))?;
                let min = min_value_size(elem).with_context(|| {
                    format!("{}: metadata key {key:?}: unknown array element type {elem} at offset {at}", self.path.display())
                })?;
                let n = self.count(min, &|| format!("array length of metadata key {key:?}"))?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, depth + 1, key)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            other => bail!(
                "{}: metadata key {key:?} has unknown value type {other}",
                self.path.display()
            ),
        })
    }
}

/// Smallest encoding of a value of GGUF type `ty` (used to bound counts before allocating).
fn min_value_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8,  // u64 length
        9 => 12, // u32 element type + u64 count
        _ => return None,
    })
}

pub(super) fn parse(path: &Path, buf: &[u8]) -> Result<Parsed> {
    let p = path.display();
    let mut r = Reader {
        buf,
        pos: 0,
        path,
        lossy_strings: 0,
    };
    let magic = r.u32(&|| "magic".into())?;
    if magic != GGUF_MAGIC {
        bail!(
            "{p}: not a GGUF file (magic bytes {:02x?}, expected \"GGUF\" = 47 47 55 46)",
            &magic.to_le_bytes()
        );
    }
    let version = r.u32(&|| "version".into())?;
    match version {
        2 | 3 => {}
        1 => bail!("{p}: GGUF version 1 is not supported (only v2 and v3; v1 used 32-bit lengths): re-convert the model with a current llama.cpp"),
        v if v.swap_bytes() <= 3 => bail!("{p}: big-endian GGUF files are not supported (version field reads {v:#x})"),
        v => bail!("{p}: unsupported GGUF version {v} (supported: 2, 3)"),
    }
    // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes;
    // a key/value pair at least 8 (key length) + 4 (type) + 1.
    let n_tensors = r.count(24, &|| "tensor count".into())?;
    let n_kv = r.count(13, &|| "metadata key/value count".into())?;

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = r.name(&|| format!("metadata key #{i}"))?;
        let ty = r.u32(&|| format!("value type of metadata key {key:?}"))?;
        let value = r.value(ty, 0, &key)?;
        if metadata.insert(key.clone(), value).is_some() {
            bail!("{p}: duplicate metadata key {key:?}");
        }
    }
    if r.lossy_strings > 0 {
        tracing::warn!(
            "{p}: {} metadata strings were not valid UTF-8 and were read lossily",
            r.lossy_strings
        );
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() => a,
            _ => bail!("{p}: general.alignment must be a power of two, found {v:?}"),
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut rel_offsets = Vec::with_capacity(n_tensors);
    let mut seen = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = r.name(&|| format!("name of tensor #{i}"))?;
        let what = |s: &str| format!("{s} of tensor {name}");
        let n_dims = r.u32(&|| what("n_dims"))?;
        if n_dims > MAX_DIMS {
            bail!("{p}: tensor {name} has {n_dims} dimensions (ggml allows at most {MAX_DIMS})");
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(r.u64(&|| what("dimensions"))?);
        }
        let type_id = r.u32(&|| what("type"))?;
        let rel = r.u64(&|| what("data offset"))?;
        let ty = GgmlType::from_id(type_id)
            .with_context(|| format!("{p}: tensor {name} has unknown ggml type id {type_id}"))?;
        let n_elems = ne
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .with_context(|| {
                format!("{p}: tensor {name}: element count of shape {ne:?} overflows")
            })?;
        let row = ne.first().copied().unwrap_or(1);
        if row % ty.block_size() as u64 != 0 {
            bail!(
                "{p}: tensor {name}: row length {row} is not a multiple of the {ty} block size {}",
                ty.block_size()
            );
        }
        let n_bytes = ty
            .bytes_for(n_elems)
            .with_context(|| format!("{p}: tensor {name}: byte size of shape {ne:?} overflows"))?;
        if seen.insert(name.clone(), i).is_some() {
            bail!("{p}: duplicate tensor name {name}");
        }
        rel_offsets.push(rel);
        tensors.push(GgufTensor {
            name,
            ty,
            ne,
            offset: 0,
            n_bytes,
        });
    }

    let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for (t, rel) in tensors.iter_mut().zip(rel_offsets) {
        let end = data_offset
            .checked_add(rel)
            .and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => t.offset = data_offset + rel,
            _ => bail!(
                "{p}: tensor {} data (offset {rel} + {} bytes after the data section at byte {data_offset}) runs past the end of the file ({file_len} bytes); the file is truncated or corrupt",
                t.name,
                t.n_bytes
            ),
        }
    }
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
