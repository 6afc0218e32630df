//! Hugging Face weights: `model.safetensors`, or shards listed in `model.safetensors.index.json`
//! (`weight_map`: tensor name → shard file). Every shard is memory-mapped and its header parsed
//! and validated by the `safetensors` crate at open (offsets contiguous, sizes matching shapes,
//! data covering the file exactly); tensors are converted to f32 when asked for.

use super::{HostTensor, TensorInfo, WeightSource};
use crate::backend::raw::{RawDtype, RawPart};
use anyhow::{bail, Context, Result};
use half::{bf16, f16};
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, Metadata, SafeTensorError};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
}

struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range relative to the shard's data section.
    begin: usize,
    end: usize,
}

/// Tensors of a Hugging Face model folder, by their stored (Hugging Face) names.
pub struct SafetensorsWeights {
    dir: PathBuf,
    shards: Vec<Shard>,
    entries: BTreeMap<String, Entry>,
}

impl SafetensorsWeights {
    /// Open a model folder (or a single `.safetensors` file).
    pub fn open(dir: &Path) -> Result<SafetensorsWeights> {
        let d = dir.display();
        if !dir.exists() {
            bail!("{d}: no such file or directory");
        }
        let mut w = SafetensorsWeights {
            dir: dir.to_path_buf(),
            shards: Vec::new(),
            entries: BTreeMap::new(),
        };
        if dir.is_file() {
            w.add_shard(dir)?;
            return Ok(w);
        }
        let index = dir.join(INDEX_FILE);
        let single = dir.join(SINGLE_FILE);
        if index.is_file() {
            let map = read_index(&index)?;
            // Open each shard once, in a stable order.
            let mut files: Vec<&str> = map.values().map(String::as_str).collect();
            files.sort_unstable();
            files.dedup();
            let mut shard_of: HashMap<&str, usize> = HashMap::new();
            for f in files {
                let path = dir.join(f);
                if !path.is_file() {
                    bail!(
                        "{}: weight_map names shard {f:?}, which does not exist ({})",
                        index.display(),
                        path.display()
                    );
                }
                shard_of.insert(f, w.add_shard(&path)?);
            }
            for (name, f) in &map {
                match w.entries.get(name) {
                    Some(e) if e.shard == shard_of[f.as_str()] => {}
                    _ => bail!("{}: weight_map puts tensor {name} in {f:?}, but that shard does not contain it", index.display()),
                }
            }
        } else if single.is_file() {
            w.add_shard(&single)?;
        } else {
            bail!("{d}: no {SINGLE_FILE} or {INDEX_FILE} in this folder");
        }
        Ok(w)
    }

    /// Map one file, validate its header and register its tensors. Returns the shard index.
    fn add_shard(&mut self, path: &Path) -> Result<usize> {
        let p = path.display();
        let file = std::fs::File::open(path).with_context(|| format!("{p}: cannot open"))?;
        let len = file
            .metadata()
            .with_context(|| format!("{p}: cannot stat"))?
            .len();
        if len < 8 {
            bail!("{p}: truncated safetensors file ({len} bytes; the header length alone takes 8)");
        }
        // SAFETY: read-only map; as with every mmap loader we rely on the file not being
        // truncated while open.
        let mmap =
            unsafe { Mmap::map(&file) }.with_context(|| format!("{p}: cannot memory-map"))?;
        let header_len = u64::from_le_bytes(mmap[..8].try_into().expect("8 bytes"));
        if header_len > len - 8 {
            bail!("{p}: truncated safetensors file: header length {header_len} runs past the end of the file ({len} bytes)");
        }
        let (n, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|e| explain(path, &mmap, e))?;
        let shard = self.shards.len();
        for (name, info) in metadata_tensors(&metadata) {
            let (begin, end) = info.data_offsets;
            let entry = Entry {
                shard,
                dtype: info.dtype,
                shape: info.shape.clone(),
                begin,
                end,
            };
            if let Some(prev) = self.entries.insert(name.clone(), entry) {
                bail!(
                    "{p}: tensor {name} also appears in {}",
                    self.shards[prev.shard].path.display()
                );
            }
        }
        self.shards.push(Shard {
            path: path.to_path_buf(),
            mmap,
            data_start: 8 + n,
        });
        Ok(shard)
    }
}

impl SafetensorsWeights {
    /// An integer or boolean tensor (I64, I32, U8, BOOL) as its shape and i64 values: the
    /// vocabulary maps of an EAGLE-3 checkpoint (`d2t`, `t2d`). Errors name the file and tensor.
    pub fn integers(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("{}: no tensor {name}", self.dir.display()))?;
        let shard = &self.shards[e.shard];
        let bytes = &shard.mmap[shard.data_start + e.begin..shard.data_start + e.end];
        let values: Vec<i64> = match e.dtype {
            Dtype::I64 => bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
            Dtype::I32 => bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
                .collect(),
            Dtype::U8 | Dtype::BOOL => bytes.iter().map(|&b| b as i64).collect(),
            other => bail!(
                "{}: tensor {name} has dtype {other:?}; an integer tensor (I64, I32, U8 or BOOL) is expected",
                shard.path.display()
            ),
        };
        Ok((e.shape.clone(), values))
    }
}

fn metadata_tensors(m: &Metadata) -> Vec<(String, &safetensors::tensor::TensorInfo)> {
    m.tensors().into_iter().collect()
}

/// `weight_map` of an index file.
fn read_index(index: &Path) -> Result<BTreeMap<String, String>> {
    let i = index.display();
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let text = std::fs::read_to_string(index).with_context(|| format!("{i}: cannot read"))?;
    let idx: Index = serde_json::from_str(&text)
        .with_context(|| format!("{i}: not a valid index (needs a \"weight_map\" object)"))?;
    for f in idx.weight_map.values() {
        // Shards live next to the index; refuse paths that would escape the folder.
        let fp = Path::new(f);
        if fp.components().count() != 1 || fp.is_absolute() || f == ".." {
            bail!("{i}: weight_map shard name {f:?} must be a plain file name in the same folder");
        }
    }
    Ok(idx.weight_map)
}

/// Turn a `safetensors` validation error into a message that says what is wrong with the file.
fn explain(path: &Path, buf: &[u8], e: SafeTensorError) -> anyhow::Error {
    let p = path.display();
    match e {
        SafeTensorError::MetadataIncompleteBuffer => {
            // Recover the largest end offset from the header for the message.
            let n = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")) as usize;
            let end = serde_json::from_slice::<HashMap<String, serde_json::Value>>(&buf[8..8 + n])
                .ok()
                .and_then(|h| {
                    h.iter()
                        .filter(|(k, _)| k.as_str() != "__metadata__")
                        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
                        .max()
                })
                .unwrap_or(0);
            let have = buf.len() - 8 - n;
            if (end as usize) > have {
                anyhow::anyhow!("{p}: tensor data offsets run past the end of the file (header needs {end} data bytes, file has {have}); the file is truncated")
            } else {
                anyhow::anyhow!("{p}: {} trailing bytes after the last tensor (header covers {end} data bytes, file has {have})", have - end as usize)
            }
        }
        SafeTensorError::InvalidOffset(name) => {
            anyhow::anyhow!("{p}: tensor {name} has data offsets that are not contiguous with the previous tensor")
        }
        other => anyhow::anyhow!("{p}: invalid safetensors header: {other}"),
    }
}

impl WeightSource for SafetensorsWeights {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.entries
            .iter()
            .map(|(name, e)| TensorInfo {
                name: name.clone(),
                file_name: name.clone(),
                dtype: format!("{:?}", e.dtype),
                shape: e.shape.clone(),
                bytes: (e.end - e.begin) as u64,
            })
            .collect()
    }

    fn raw(&self, name: &str) -> Result<Option<RawPart<'_>>> {
        // 2-D tensors only (1-D ones are read as values, 3-D ones through `raw_flat`).
        if self.entries.get(name).is_some_and(|e| e.shape.len() != 2) {
            return Ok(None);
        }
        Ok(self.raw_flat(name)?.map(|(_, part)| part))
    }

    fn raw_flat(&self, name: &str) -> Result<Option<(Vec<usize>, RawPart<'_>)>> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("{}: no tensor {name}", self.dir.display()))?;
        let dtype = match e.dtype {
            Dtype::F32 => RawDtype::F32,
            Dtype::F16 => RawDtype::F16,
            Dtype::BF16 => RawDtype::BF16,
            _ => return Ok(None),
        };
        let Some((&cols, leading)) = e.shape.split_last() else {
            return Ok(None);
        };
        if leading.is_empty() {
            return Ok(None);
        }
        let rows = leading.iter().product();
        let shard = &self.shards[e.shard];
        let (begin, len) = (shard.data_start + e.begin, e.end - e.begin);
        // Start reading the whole tensor from disk now (readahead), so the copy that follows
        // finds most pages resident. A hint only: failure changes nothing.
        #[cfg(unix)]
        let _ = shard
            .mmap
            .advise_range(memmap2::Advice::WillNeed, begin, len);
        let part = RawPart {
            dtype,
            rows,
            cols,
            bytes: &shard.mmap[begin..begin + len],
            mapped: true,
        };
        Ok(Some((e.shape.clone(), part)))
    }

    fn release(&self, name: &str) {
        #[cfg(unix)]
        if let Some(e) = self.entries.get(name) {
            let shard = &self.shards[e.shard];
            // SAFETY: the map is a read-only view of the file; MADV_DONTNEED only drops this
            // process's pages of the range (the page cache keeps them), and a later access
            // faults them back in with the same content. No borrow of the range outlives the
            // upload that preceded this call.
            let _ = unsafe {
                shard.mmap.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    shard.data_start + e.begin,
                    e.end - e.begin,
                )
            };
        }
        #[cfg(not(unix))]
        let _ = name;
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("{}: no tensor {name}", self.dir.display()))?;
        let shard = &self.shards[e.shard];
        let bytes = &shard.mmap[shard.data_start + e.begin..shard.data_start + e.end];
        let n: usize = e.shape.iter().product();
        let mut data = vec![0f32; n];
        // Elements per parallel task; small tensors stay on this thread.
        const CHUNK: usize = 1 << 16;
        match e.dtype {
            Dtype::F32 => convert(bytes, &mut data, 4, CHUNK, |b| {
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }),
            Dtype::F16 => convert(bytes, &mut data, 2, CHUNK, |b| {
                f16::from_le_bytes([b[0], b[1]]).to_f32()
            }),
            Dtype::BF16 => convert(bytes, &mut data, 2, CHUNK, |b| {
                bf16::from_le_bytes([b[0], b[1]]).to_f32()
            }),
            other => bail!(
                "{}: tensor {name} has dtype {other:?}; only F32, F16 and BF16 are supported",
                shard.path.display()
            ),
        }
        Ok(HostTensor {
            shape: e.shape.clone(),
            data,
        })
    }
}

/// Convert little-endian elements of `size` bytes to f32, in parallel for large tensors.
fn convert(
    src: &[u8],
    dst: &mut [f32],
    size: usize,
    chunk: usize,
    f: impl Fn(&[u8]) -> f32 + Sync,
) {
    let body = |(s, d): (&[u8], &mut [f32])| {
        for (y, b) in d.iter_mut().zip(s.chunks_exact(size)) {
            *y = f(b);
        }
    };
    if dst.len() >= 2 * chunk {
        src.par_chunks(chunk * size)
            .zip(dst.par_chunks_mut(chunk))
            .for_each(body);
    } else {
        body((src, dst));
    }
}
