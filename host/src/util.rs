//! Small helpers shared across modules.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// sha256 of a file's bytes, lowercase hex. Streams the file so large weights do not need RAM.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("{}: read failed", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// sha256 of bytes, lowercase hex.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Deterministic pseudo-random f32 values in [-1, 1) (xorshift64*): test inputs and benchmark
/// token ids that every backend and every run sees identically.
pub fn host_random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let v = s.wrapping_mul(0x2545f4914f6cdd1d);
            ((v >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
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
