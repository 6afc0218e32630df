//! A GGUF file read back and written again with edits: the converter mistakes and bad inputs of
//! the tests are made on purpose in copies of llama.cpp's own output.

#[allow(dead_code)]
#[path = "../formats_gguf/writer.rs"]
mod writer;

use draftlens_engine::formats::gguf::{GgufFile, GgufValue};
use std::path::{Path, PathBuf};
use writer::{Tensor, Writer};

pub struct Copy {
    kv: Vec<(String, GgufValue)>,
    tensors: Vec<Tensor>,
}

/// GGUF value type id and payload (docs/models.md §3.2).
fn encode(v: &GgufValue) -> (u32, Vec<u8>) {
    match v {
        GgufValue::U8(x) => (0, vec![*x]),
        GgufValue::I8(x) => (1, x.to_le_bytes().to_vec()),
        GgufValue::U16(x) => (2, x.to_le_bytes().to_vec()),
        GgufValue::I16(x) => (3, x.to_le_bytes().to_vec()),
        GgufValue::U32(x) => (4, x.to_le_bytes().to_vec()),
        GgufValue::I32(x) => (5, x.to_le_bytes().to_vec()),
        GgufValue::F32(x) => (6, x.to_le_bytes().to_vec()),
        GgufValue::Bool(x) => (7, vec![*x as u8]),
        GgufValue::String(s) => (8, writer::gstr(s)),
        GgufValue::Array(a) => {
            let elem = a.first().map(|x| encode(x).0).unwrap_or(4);
            let mut b = elem.to_le_bytes().to_vec();
            b.extend((a.len() as u64).to_le_bytes());
            for x in a {
                b.extend(encode(x).1);
            }
            (9, b)
        }
        GgufValue::U64(x) => (10, x.to_le_bytes().to_vec()),
        GgufValue::I64(x) => (11, x.to_le_bytes().to_vec()),
        GgufValue::F64(x) => (12, x.to_le_bytes().to_vec()),
    }
}

impl Copy {
    pub fn open(path: &Path) -> Copy {
        let f = GgufFile::open(path).unwrap();
        Copy {
            kv: f
                .metadata()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            tensors: f
                .tensors()
                .iter()
                .map(|t| Tensor {
                    name: t.name.clone(),
                    ne: t.ne.clone(),
                    ty: t.ty.id(),
                    data: f.tensor_data(t).to_vec(),
                    offset: None,
                })
                .collect(),
        }
    }

    pub fn set(mut self, key: &str, v: GgufValue) -> Self {
        match self.kv.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = v,
            None => self.kv.push((key.into(), v)),
        }
        self
    }

    pub fn remove(mut self, key: &str) -> Self {
        self.kv.retain(|(k, _)| k != key);
        self
    }

    pub fn drop_tensor(mut self, name: &str) -> Self {
        let n = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        assert_eq!(self.tensors.len(), n - 1, "{name}");
        self
    }

    pub fn rename(mut self, from: &str, to: &str) -> Self {
        self.tensor(from).name = to.into();
        self
    }

    fn tensor(&mut self, name: &str) -> &mut Tensor {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap()
    }

    /// Swap the stored bytes of two tensors of the same shape and type.
    pub fn swap_data(mut self, a: &str, b: &str) -> Self {
        let x = std::mem::take(&mut self.tensor(a).data);
        let y = std::mem::replace(&mut self.tensor(b).data, x);
        self.tensor(a).data = y;
        self
    }

    /// Swap rows 2i and 2i + 1 of a 2-D tensor: what leaving out llama.cpp's q/k permutation
    /// does to the first two rows of every head's pairs.
    pub fn swap_rows_pairwise(mut self, name: &str) -> Self {
        let t = self.tensor(name);
        let rows = t.ne[1] as usize;
        let row = t.data.len() / rows;
        for r in (0..rows).step_by(2) {
            let (lo, hi) = t.data[r * row..(r + 2) * row].split_at_mut(row);
            lo.swap_with_slice(hi);
        }
        self
    }

    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let mut w = Writer::new();
        for (k, v) in &self.kv {
            let (ty, bytes) = encode(v);
            w = w.raw(k, ty, bytes);
        }
        w.tensors = self.tensors.clone();
        w.write(dir, name)
    }
}
