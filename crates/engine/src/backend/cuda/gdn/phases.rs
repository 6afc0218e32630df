//! Per-launch timing of the chunked delta rule for `gdn_bench --breakdown` (docs/gdn-cuda.md,
//! "Where the time goes").

use super::CudaBackend;
use anyhow::Result;

/// Per-launch times of the chunked delta rule, for `gdn_bench`'s per-phase table: while on
/// ([`set_phase_timing`]), [`CudaBackend::gated_delta_rule_with`] synchronises the device before
/// its first launch and after each launch, recording the wall time since the previous mark under
/// the phase's name ("gates", "setup" (uploads, scratch), "prep", "walk", "output", or the fused
/// kernel's "chunk"). Off (the default) it costs one relaxed atomic load per mark.
static PHASE_TIMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static PHASE_TIMES: std::sync::Mutex<Vec<(&'static str, f64)>> = std::sync::Mutex::new(Vec::new());

/// Turns the per-phase timing on or off (benchmarks only: it synchronises after every launch).
pub fn set_phase_timing(on: bool) {
    PHASE_TIMING.store(on, std::sync::atomic::Ordering::Relaxed);
    take_phase_times();
}

/// The (phase, seconds) marks recorded since the last call, in launch order.
pub fn take_phase_times() -> Vec<(&'static str, f64)> {
    std::mem::take(&mut *PHASE_TIMES.lock().unwrap_or_else(|e| e.into_inner()))
}

/// One call's clock for [`set_phase_timing`].
pub(in crate::backend::cuda) struct PhaseClock(Option<std::time::Instant>);

impl PhaseClock {
    pub(in crate::backend::cuda) fn start(be: &CudaBackend) -> Result<Self> {
        if !PHASE_TIMING.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(PhaseClock(None));
        }
        be.synchronize()?;
        Ok(PhaseClock(Some(std::time::Instant::now())))
    }
    /// Records the time since the previous mark under `phase` (device synchronised first).
    pub(in crate::backend::cuda) fn mark(
        &mut self,
        be: &CudaBackend,
        phase: &'static str,
    ) -> Result<()> {
        if let Some(t0) = self.0 {
            be.synchronize()?;
            let now = std::time::Instant::now();
            PHASE_TIMES
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((phase, (now - t0).as_secs_f64()));
            self.0 = Some(now);
        }
        Ok(())
    }
}
