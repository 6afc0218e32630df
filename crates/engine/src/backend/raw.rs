//! Weights as stored: dtype + little-endian bytes, borrowed from the checkpoint's memory map.
//!
//! [`super::Backend::matrix_raw`] and [`super::Backend::matrix_stacked_raw`] take these so a
//! backend can build a weight matrix without the host ever holding an f32 copy of the model: the
//! CUDA backend streams the bytes through pinned staging buffers and converts on the GPU
//! (`backend/cuda/upload.rs`); the default converts to f32 here, [`CONVERT_CHUNK`] elements at a
//! time, and calls [`super::Backend::matrix`] (the CPU reference keeps f32 weights anyway).
//!
//! Conversions are the `half` crate's, the same ones `formats/safetensors.rs` has always used,
//! so the default path is bit-identical to loading through `WeightSource::tensor`.

use anyhow::{bail, ensure, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// Storage dtypes a backend takes as is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawDtype {
    F32,
    F16,
    BF16,
}

impl RawDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            RawDtype::F32 => 4,
            RawDtype::F16 | RawDtype::BF16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RawDtype::F32 => "F32",
            RawDtype::F16 => "F16",
            RawDtype::BF16 => "BF16",
        }
    }
}

/// One stored tensor `[rows, cols]` (row-major), its bytes borrowed from the file's mmap.
#[derive(Clone, Copy, Debug)]
pub struct RawPart<'a> {
    pub dtype: RawDtype,
    pub rows: usize,
    pub cols: usize,
    /// `rows · cols · dtype.size()` little-endian bytes.
    pub bytes: &'a [u8],
    /// Whether `bytes` view a read-only file mapping, whose pages an upload may drop from this
    /// process once it has copied them ([`release_mapped_pages`]); never for host memory, where
    /// dropping pages would zero them.
    pub mapped: bool,
}

impl<'a> RawPart<'a> {
    /// A part over f32 values already on the host (a dequantised GGUF tensor).
    pub fn from_f32(data: &'a [f32], rows: usize, cols: usize) -> RawPart<'a> {
        // SAFETY: any f32 is 4 initialised bytes; u8 has no alignment requirement. The bytes
        // are the host's native order, which `f32_le` reads back as little-endian: every
        // platform draftlens builds for is little-endian (see the compile_error below).
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data))
        };
        RawPart {
            dtype: RawDtype::F32,
            rows,
            cols,
            bytes,
            mapped: false,
        }
    }

    /// A part over bf16 values already on the host (a drafter context's taps).
    pub fn from_bf16(data: &'a [half::bf16], rows: usize, cols: usize) -> RawPart<'a> {
        // SAFETY: any bf16 is 2 initialised bytes; u8 has no alignment requirement (byte order
        // as in `from_f32`).
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data))
        };
        RawPart {
            dtype: RawDtype::BF16,
            rows,
            cols,
            bytes,
            mapped: false,
        }
    }

    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `r0 .. r0 + n` of this part (a row-major slice of its bytes).
    pub fn row_range(&self, r0: usize, n: usize) -> RawPart<'a> {
        let row = self.cols * self.dtype.size();
        RawPart {
            rows: n,
            bytes: &self.bytes[r0 * row..(r0 + n) * row],
            ..*self
        }
    }

    /// The byte count must match the shape.
    pub fn check(&self) -> Result<()> {
        let want = self.len() * self.dtype.size();
        ensure!(
            self.bytes.len() == want,
            "{} weight [{}, {}] needs {want} bytes, got {}",
            self.dtype.name(),
            self.rows,
            self.cols,
            self.bytes.len()
        );
        Ok(())
    }
}

/// Drops this process's pages of `bytes`, a range of a read-only file mapping that has been
/// copied (the whole pages inside it; the page cache keeps them, and a later read faults them
/// back in with the same content). A large tensor's upload calls it chunk by chunk, so its
/// resident pages never add up to the tensor: the 27B's 2.5 GB embedding alone used to raise the
/// host's peak RSS by its size while it was copied. The loader's per-tensor
/// `WeightSource::release` covers what this leaves (the partial pages at the ends).
///
/// # Safety
/// `bytes` must lie in a file mapping (`MAP_SHARED` or `MAP_PRIVATE`) that nothing has written
/// to: for anonymous or written private memory, dropping pages replaces the content with zeros.
pub unsafe fn release_mapped_pages(bytes: &[u8]) {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let start = (bytes.as_ptr() as usize).next_multiple_of(page);
        let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
        if end > start {
            // SAFETY: [start, end) is whole pages inside `bytes`, of a clean file mapping (the
            // caller's contract); MADV_DONTNEED only unmaps this process's copies of them.
            let _ = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
            };
        }
    }
    #[cfg(not(unix))]
    let _ = bytes;
}

#[cfg(target_endian = "big")]
compile_error!("draftlens reads little-endian weight files by reinterpreting bytes; big-endian hosts are not supported");

/// Elements converted per parallel task: 1 Mi elements = 4 MiB of f32, so the conversion never
/// holds more than (threads × 4 MiB) beyond the destination.
pub const CONVERT_CHUNK: usize = 1 << 20;

/// Convert `src` (elements of `dtype`, little-endian) into `dst`, chunk by chunk in parallel.
pub fn convert_to_f32(dtype: RawDtype, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let size = dtype.size();
    if src.len() != dst.len() * size {
        bail!(
            "converting {} bytes of {} into {} f32 values",
            src.len(),
            dtype.name(),
            dst.len()
        );
    }
    let body = |(s, d): (&[u8], &mut [f32])| match dtype {
        RawDtype::F32 => {
            for (y, b) in d.iter_mut().zip(s.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        RawDtype::F16 => {
            for (y, b) in d.iter_mut().zip(s.chunks_exact(2)) {
                *y = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        RawDtype::BF16 => {
            for (y, b) in d.iter_mut().zip(s.chunks_exact(2)) {
                *y = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
    };
    src.par_chunks(CONVERT_CHUNK * size)
        .zip(dst.par_chunks_mut(CONVERT_CHUNK))
        .for_each(body);
    Ok(())
}

/// Row-stacked parts `[Σ rows_i, cols]` as f32: the reference every backend's raw upload must
/// reproduce after its own rounding (the default of `Backend::matrix_stacked_raw`).
pub fn stacked_to_f32(parts: &[RawPart<'_>], cols: usize) -> Result<Vec<f32>> {
    let rows: usize = parts.iter().map(|p| p.rows).sum();
    let mut data = vec![0f32; rows * cols];
    let mut off = 0;
    for p in parts {
        p.check()?;
        ensure!(
            p.cols == cols,
            "stacked weight: a part has {} columns, the others {cols}",
            p.cols
        );
        convert_to_f32(p.dtype, p.bytes, &mut data[off..off + p.len()])?;
        off += p.len();
    }
    Ok(data)
}

/// The output row of the transposed matrix that column `o` of a stored `[inp, out]` part becomes:
/// `o` itself, or with `interleaved` rows (gpt-oss's gate_up, whose columns alternate gate and up)
/// the even columns first, then the odd ones: gate rows then up rows. The one rule the host
/// transpose ([`transposed`]) and the CUDA kernel (`kernels/convert.cu`, `transpose_bf16_rows`)
/// both follow.
pub fn transposed_row(o: usize, out: usize, interleaved: bool) -> usize {
    match interleaved {
        true if o.is_multiple_of(2) => o / 2,
        true => out / 2 + o / 2,
        false => o,
    }
}

/// A part stored transposed must have its bytes, and with `interleaved` rows an even number of
/// them (gate and up rows pair up).
pub fn check_transposable(stored: &RawPart<'_>, interleaved: bool) -> Result<()> {
    stored.check()?;
    ensure!(
        !interleaved || stored.cols.is_multiple_of(2),
        "interleaved rows need an even row count, got {}",
        stored.cols
    );
    Ok(())
}

/// The bytes of the `[out, inp]` matrix a part stored transposed (`stored.rows` = inp,
/// `stored.cols` = out; gpt-oss's expert stacks, which transformers multiplies as `x @ W`)
/// holds, its rows placed by [`transposed_row`]; values kept in their dtype. Row tiles in
/// parallel: for a tile's rows the source columns lie within a cache line or two of each input
/// row, which is read once per tile. The default of `Backend::matrix_raw_transposed`.
pub fn transposed(stored: RawPart<'_>, interleaved: bool) -> Result<Vec<u8>> {
    check_transposable(&stored, interleaved)?;
    const TILE: usize = 32;
    let (inp, out, size) = (stored.rows, stored.cols, stored.dtype.size());
    // The stored column each output row comes from (the inverse of `transposed_row`).
    let mut source_col = vec![0usize; out];
    for o in 0..out {
        source_col[transposed_row(o, out, interleaved)] = o;
    }
    let mut w = vec![0u8; stored.bytes.len()];
    if w.is_empty() {
        return Ok(w);
    }
    w.par_chunks_mut(TILE * inp * size)
        .enumerate()
        .for_each(|(tile, rows)| {
            let cols: Vec<usize> = (0..rows.len() / (inp * size))
                .map(|t| source_col[tile * TILE + t] * size)
                .collect();
            for (i, src_row) in stored.bytes.chunks_exact(out * size).enumerate() {
                for (t, &c) in cols.iter().enumerate() {
                    let at = (t * inp + i) * size;
                    rows[at..at + size].copy_from_slice(&src_row[c..c + size]);
                }
            }
        });
    Ok(w)
}

/// [`transposed`]'s bytes handed to `upload` as the `[out, inp]` part they make: the host
/// transpose path of `Backend::matrix_raw_transposed`, shared by its default and by a backend
/// that takes it for parts its own transpose does not cover.
pub fn with_host_transposed<M>(
    stored: RawPart<'_>,
    interleaved: bool,
    upload: impl FnOnce(RawPart<'_>) -> Result<M>,
) -> Result<M> {
    let bytes = transposed(stored, interleaved)?;
    upload(RawPart {
        dtype: stored.dtype,
        rows: stored.cols,
        cols: stored.rows,
        bytes: &bytes,
        mapped: false,
    })
}

#[cfg(test)]
mod tests {
    /// This process's resident pages of file mappings (kB), or None off Linux.
    fn rss_file_kb() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("RssFile:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Dropping a copied range's pages frees this process's resident memory for it, and the
    /// bytes read back unchanged (faulted in again from the file).
    #[test]
    fn released_mapped_pages_leave_the_process_and_keep_their_content() {
        use std::io::Write;
        const N: usize = 64 << 20;
        let content: Vec<u8> = (0..N)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&content).unwrap();
        // SAFETY: a private temporary file nothing writes while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert!(map[..] == content[..], "mapping reads the file");
        let Some(before) = rss_file_kb() else { return };
        // SAFETY: `map` is a clean read-only file mapping.
        unsafe { super::release_mapped_pages(&map[..]) };
        let after = rss_file_kb().unwrap();
        assert!(
            before >= after + (48 << 10),
            "RssFile {before} kB → {after} kB: the 64 MiB range was not dropped"
        );
        assert!(map[..] == content[..], "content after the release");
        // An unaligned sub-range drops only whole pages inside it: its neighbours stay intact.
        // SAFETY: as above.
        unsafe { super::release_mapped_pages(&map[1000..N - 1000]) };
        assert!(map[..] == content[..], "content after an unaligned release");
    }

    /// `transposed` refuses a part whose bytes do not match its shape, and interleaved rows of
    /// an odd count (gate and up rows must pair), each with one error saying which; an empty
    /// part is an empty matrix.
    #[test]
    fn transposed_refuses_inconsistent_parts() {
        use super::{transposed, RawDtype, RawPart};
        let bytes = [0u8; 2 * 3 * 4];
        let part = |rows, cols, bytes| RawPart {
            dtype: RawDtype::BF16,
            rows,
            cols,
            bytes,
            mapped: false,
        };
        let e = transposed(part(3, 5, &bytes), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("BF16 weight [3, 5] needs 30 bytes, got 24"),
            "{e}"
        );
        let odd = [0u8; 2 * 4 * 3];
        let e = transposed(part(4, 3, &odd), true).unwrap_err().to_string();
        assert!(
            e.contains("interleaved rows need an even row count, got 3"),
            "{e}"
        );
        assert!(transposed(part(4, 3, &odd), false).is_ok());
        assert!(transposed(part(0, 6, &[]), true).unwrap().is_empty());
    }
}
