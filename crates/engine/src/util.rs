//! Small helpers shared across modules.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// sha256 of a file's bytes, lowercase hex. Streams the file so large weights do not need RAM.
pub fn sha256_file(path: &Path) -> Result<String> {
    let never = std::sync::atomic::AtomicBool::new(false);
    Ok(sha256_file_unless(path, &never)?.expect("a hash nothing stops runs to the end"))
}

/// [`sha256_file`], given up between two reads once `stop` is set (`Ok(None)`): a hash running
/// in the background that nobody will wait for any more (`crate::identity::BackgroundHash`).
pub fn sha256_file_unless(
    path: &Path,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Option<String>> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        let n = f
            .read(&mut buf)
            .with_context(|| format!("{}: read failed", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(Some(hex::encode(h.finalize())))
}

/// sha256 of bytes, lowercase hex (the results crate's rule, which identities also hash with).
pub fn sha256_bytes(bytes: &[u8]) -> String {
    draftlens_results::sha256_hex(bytes)
}

/// The crate's one small deterministic generator (xorshift64*): test inputs, benchmark data and
/// token ids that every backend, run and machine sees identically. Not for anything that needs
/// real randomness (the drafter's anchor sampling uses `rand`).
#[derive(Clone, Debug)]
pub struct DetRng(u64);

impl DetRng {
    pub fn new(seed: u64) -> DetRng {
        DetRng(seed.wrapping_mul(0x9e3779b97f4a7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        s.wrapping_mul(0x2545f4914f6cdd1d)
    }

    /// Uniform in [0, 1), 24 random bits.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1), 24 random bits.
    pub fn signed_unit(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }

    /// An integer in `0..n` (`n > 0`; the modulo bias is irrelevant for test data).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// `n` values of [`DetRng::signed_unit`] from `seed`.
pub fn host_random(n: usize, seed: u64) -> Vec<f32> {
    let mut r = DetRng::new(seed);
    (0..n).map(|_| r.signed_unit()).collect()
}

/// `n` values of [`host_random`] from `seed` times `scale`, rounded to bf16: inputs that a bf16
/// backend and the f32 reference hold exactly alike.
pub fn host_random_bf16(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut v: Vec<f32> = host_random(n, seed)
        .into_iter()
        .map(|x| x * scale)
        .collect();
    round_bf16(&mut v);
    v
}

/// Rounds every value to the nearest bf16 (so that an f32 backend and a bf16 backend start from
/// the same numbers and only their arithmetic differs).
pub fn round_bf16(v: &mut [f32]) {
    for x in v {
        *x = half::bf16::from_f32(*x).to_f32();
    }
}

/// Positions of packed sequences: restarting at 0 at every sequence start (`seq_starts` runs
/// from 0 to the row count, as in `TargetModel::forward_packed`).
pub fn packed_positions(seq_starts: &[usize]) -> Vec<u32> {
    let mut p = Vec::with_capacity(seq_starts.last().copied().unwrap_or(0));
    for w in seq_starts.windows(2) {
        p.extend((0..w[1] - w[0]).map(|i| i as u32));
    }
    p
}

/// One tensor to write: name, dtype, shape and its little-endian bytes.
pub type SafetensorsEntry = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// Writes tensors to a safetensors file atomically: into `<path>.tmp` beside it, then a rename,
/// so an interrupted write never leaves a truncated file under `path`. Errors name the file.
pub fn write_safetensors(path: &Path, tensors: &[SafetensorsEntry]) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                .with_context(|| format!("{}: tensor {name}", path.display()))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    safetensors::serialize_to_file(views, None, &tmp)
        .with_context(|| format!("{}: cannot write", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("{}: cannot move into place", path.display()))
}

/// [`write_safetensors`] of f32 tensors (name, shape, values).
pub fn write_f32_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> Result<()> {
    let entries: Vec<SafetensorsEntry> = tensors
        .iter()
        .map(|(name, shape, values)| {
            let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name.clone(), safetensors::Dtype::F32, shape.clone(), bytes)
        })
        .collect();
    write_safetensors(path, &entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safetensors_round_trip_and_bad_input_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("states.safetensors");
        let a = vec![1.5f32, -2.0, 0.25, 8.0, 0.0, -0.5];
        write_f32_safetensors(&path, &[("h.3".into(), vec![2, 3], a.clone())]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let t = st.tensor("h.3").unwrap();
        assert_eq!(
            (t.dtype(), t.shape()),
            (safetensors::Dtype::F32, &[2usize, 3][..])
        );
        let back: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back, a);
        assert!(!dir.path().join("states.safetensors.tmp").exists());

        // A shape that does not match the values: an error naming file and tensor, and the
        // file already there is untouched.
        let e = write_f32_safetensors(&path, &[("bad".into(), vec![4], vec![1.0; 3])]).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("states.safetensors") && msg.contains("bad"),
            "{msg}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        // A folder that does not exist.
        let e = write_f32_safetensors(&dir.path().join("no/such/x.safetensors"), &[]).unwrap_err();
        assert!(format!("{e:#}").contains("x.safetensors.tmp"), "{e:#}");
    }
}
