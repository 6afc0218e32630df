//! Measurement helpers of the CUDA benchmarks (crates/engine/examples/cuda_bench.rs): device-synchronised
//! median timing, the measured cuBLAS GEMM rate and the copy bandwidth, the ceilings every
//! benchmark figure is divided by. The benchmarks themselves run the product's code
//! (`TargetModel`, `DFlashDrafter`), never a copy of it.

use super::CudaBackend;
use crate::backend::Backend;
use anyhow::Result;
use std::time::Instant;

// ---------------------------------------------------------------------------------------------
// Timing helpers

/// Median of `reps` timed runs of `f` (after `warmup` untimed runs), in seconds, with the device
/// synchronised around every run.
pub fn time_median(
    be: &CudaBackend,
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    be.synchronize()?;
    let mut ts = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        be.synchronize()?;
        ts.push(t0.elapsed().as_secs_f64());
    }
    ts.sort_by(|a, b| a.total_cmp(b));
    Ok(ts[ts.len() / 2])
}

/// Measured bf16 GEMM rate (TFLOP/s) of cuBLAS for `[m, k] × [n, k]ᵀ` on random data.
pub fn gemm_tflops(be: &CudaBackend, m: usize, n: usize, k: usize) -> Result<f64> {
    let x = be.random_tensor(m, k, 1.0, 0.0, 11)?;
    let w = be.random_matrix(n, k, 1.0, 12)?;
    let t = time_median(be, 3, 10, || be.matmul(&x, &w).map(|_| ()))?;
    Ok(2.0 * (m * n * k) as f64 / t / 1e12)
}

/// Device-to-device copy bandwidth (bytes read + written per second).
pub fn copy_bandwidth(be: &CudaBackend, bytes: usize) -> Result<f64> {
    let t = be.random_tensor(bytes / 2 / 4096, 4096, 1.0, 0.0, 13)?;
    let secs = time_median(be, 2, 10, || be.clone_tensor(&t).map(|_| ()))?;
    Ok(2.0 * (t.rows() * t.cols() * 2) as f64 / secs)
}

/// SM clock and board power sampled by NVML every 2 ms while a benchmark ran: the H200 is
/// power-limited, so a long compute-bound run does not keep the clock of a short burst.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ClockStats {
    pub samples: usize,
    pub sm_mhz_mean: f64,
    pub sm_mhz_max_rated: f64,
    pub power_w_mean: f64,
    pub power_w_limit: f64,
}

impl std::fmt::Display for ClockStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SM clock {:.0} of {:.0} MHz, {:.0} of {:.0} W ({} samples)",
            self.sm_mhz_mean,
            self.sm_mhz_max_rated,
            self.power_w_mean,
            self.power_w_limit,
            self.samples
        )
    }
}

/// Runs `f` while a thread samples the SM clock and power of device `ordinal` (no samples when
/// NVML is missing).
pub fn with_clock_samples<T>(ordinal: usize, f: impl FnOnce() -> T) -> (T, ClockStats) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Ok(nvml) = super::nvml::Nvml::for_ordinal(ordinal) else {
        return (f(), ClockStats::default());
    };
    let stop = &AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(move || {
            let mut st = ClockStats::default();
            while !stop.load(Ordering::Relaxed) {
                if let (Some((c, m)), Some((p, l))) = (nvml.sm_clock_mhz(), nvml.power_w()) {
                    st.samples += 1;
                    st.sm_mhz_mean += f64::from(c);
                    st.power_w_mean += p;
                    st.sm_mhz_max_rated = f64::from(m);
                    st.power_w_limit = l;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            if st.samples > 0 {
                st.sm_mhz_mean /= st.samples as f64;
                st.power_w_mean /= st.samples as f64;
            }
            st
        });
        let out = f();
        stop.store(true, Ordering::Relaxed);
        (out, sampler.join().unwrap_or_default())
    })
}
