//! Where a command's wall time goes: named phases of the main thread, work handed to background
//! threads, and how busy the GPU was in each phase (issue 11's "timeline of one run").
//!
//! The main thread marks what it is doing with [`phase`]; phases nest, and time is charged to the
//! innermost one (exclusive time), so the phases of the main thread add up to the wall time.
//! Background threads (the cache writer, kernel compilation) charge their work with
//! [`background`]: it runs at the same time as the main thread's phases, so it is reported apart
//! and does not add to the wall time. A GPU sampler ([`start_gpu_sampler`], NVML's utilisation on
//! the CUDA backend) is read every [`SAMPLE_PERIOD`] and each reading is charged to the phase that
//! was current when it was taken: "GPU busy 93 % during decode, 0 % during cache reads".
//!
//! NVML's utilisation is "the fraction of the last sample period (1/6 s to 1 s, by product) during
//! which a kernel was running", so phases shorter than a second get a coarse figure; the overall
//! fraction is reliable for a run of tens of seconds.
//!
//! Host memory likewise: with `--timeline` a host sampler ([`start_host_sampler`]) reads the
//! process's resident set every [`SAMPLE_PERIOD`] and each phase keeps the largest reading taken
//! in it, so the table says which phase holds the peak (issue 11: host memory below 2 GB plus the
//! cache being written). A peak shorter than the period can be missed; the kernel's own high-water
//! mark (`VmHWM`, `/usr/bin/time -v`) cannot, but names no phase.

use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the GPU sampler is read.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(50);

#[derive(Default)]
struct Totals {
    seconds: f64,
    count: u64,
    /// Sum of utilisation readings (0..1) and number of readings charged to this phase.
    busy_sum: f64,
    busy_n: u64,
    /// Largest resident-set reading taken in this phase, bytes (0: none).
    rss_peak: u64,
}

struct State {
    start: Instant,
    /// Open phases of the main thread, innermost last, with the instant time was last charged.
    stack: Vec<&'static str>,
    last_switch: Instant,
    phases: Vec<(&'static str, Totals)>,
    background: Vec<(&'static str, Totals)>,
    busy_sum: f64,
    busy_n: u64,
    rss_peak: u64,
    /// Largest reading less the cache entries queued for writing at that moment.
    rss_besides_cache_peak: u64,
}

fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(|| {
        let now = Instant::now();
        Mutex::new(State {
            start: now,
            stack: Vec::new(),
            last_switch: now,
            phases: Vec::new(),
            background: Vec::new(),
            busy_sum: 0.0,
            busy_n: 0,
            rss_peak: 0,
            rss_besides_cache_peak: 0,
        })
    })
}

fn totals<'a>(list: &'a mut Vec<(&'static str, Totals)>, name: &'static str) -> &'a mut Totals {
    let i = match list.iter().position(|(n, _)| *n == name) {
        Some(i) => i,
        None => {
            list.push((name, Totals::default()));
            list.len() - 1
        }
    };
    &mut list[i].1
}

/// Time outside any phase is charged to this name.
pub const OTHER: &str = "other";

impl State {
    /// Charge the time since the last switch to the innermost open phase.
    fn charge(&mut self, now: Instant) {
        let name = self.stack.last().copied().unwrap_or(OTHER);
        let dt = now.duration_since(self.last_switch).as_secs_f64();
        totals(&mut self.phases, name).seconds += dt;
        self.last_switch = now;
    }
}

fn lock() -> std::sync::MutexGuard<'static, State> {
    state().lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks the calling (main) thread as being in phase `name` until the guard drops.
#[must_use = "the phase ends when the guard drops"]
pub struct PhaseGuard {
    name: &'static str,
}

/// Enter phase `name` (main thread only; see [`background`] for other threads).
pub fn phase(name: &'static str) -> PhaseGuard {
    let mut s = lock();
    let now = Instant::now();
    s.charge(now);
    s.stack.push(name);
    totals(&mut s.phases, name).count += 1;
    PhaseGuard { name }
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        let mut s = lock();
        let now = Instant::now();
        s.charge(now);
        // Guards drop in reverse order of creation; a guard moved out of order still removes its
        // own entry.
        if let Some(i) = s.stack.iter().rposition(|n| *n == self.name) {
            s.stack.remove(i);
        }
    }
}

/// Charges the time until the guard drops to background work `name`.
#[must_use = "the work is timed until the guard drops"]
pub struct BackgroundGuard {
    name: &'static str,
    t0: Instant,
}

/// Time work `name` done on a thread other than the main one.
pub fn background(name: &'static str) -> BackgroundGuard {
    BackgroundGuard {
        name,
        t0: Instant::now(),
    }
}

impl Drop for BackgroundGuard {
    fn drop(&mut self) {
        let dt = self.t0.elapsed().as_secs_f64();
        let mut s = lock();
        let t = totals(&mut s.background, self.name);
        t.seconds += dt;
        t.count += 1;
    }
}

/// Record one GPU utilisation reading (0..1), charged to the current phase.
pub fn record_gpu_busy(fraction: f64) {
    let mut s = lock();
    let name = s.stack.last().copied().unwrap_or(OTHER);
    let t = totals(&mut s.phases, name);
    t.busy_sum += fraction;
    t.busy_n += 1;
    s.busy_sum += fraction;
    s.busy_n += 1;
}

/// Bytes of cache entries queued for writing (announced by the cache writer), process-wide.
static QUEUED_CACHE_BYTES: AtomicI64 = AtomicI64::new(0);

/// The cache writer's queue grew (`delta` > 0) or shrank by `delta` announced bytes. Host memory
/// is reported with and without them: issue 11 bounds the host's memory "besides the cache being
/// written", whose entries wait in memory until a writer thread stores them.
pub fn queued_cache_bytes(delta: i64) {
    QUEUED_CACHE_BYTES.fetch_add(delta, Ordering::SeqCst);
}

/// Record one reading of the process's resident set (bytes), charged to the current phase.
pub fn record_host_rss(bytes: u64) {
    let queued = QUEUED_CACHE_BYTES.load(Ordering::SeqCst).max(0) as u64;
    let mut s = lock();
    let name = s.stack.last().copied().unwrap_or(OTHER);
    let t = totals(&mut s.phases, name);
    t.rss_peak = t.rss_peak.max(bytes);
    s.rss_peak = s.rss_peak.max(bytes);
    s.rss_besides_cache_peak = s.rss_besides_cache_peak.max(bytes.saturating_sub(queued));
}

/// The process's resident set now, bytes (`/proc/self/statm`; `None` where there is none).
pub fn host_rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system; no pointers involved.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (page > 0).then(|| pages * page as u64)
}

static HOST_SAMPLING: AtomicBool = AtomicBool::new(false);

/// Starts a thread that records [`host_rss`] every [`SAMPLE_PERIOD`] for the rest of the process
/// (nothing where it cannot be read). Only the first call starts one.
pub fn start_host_sampler() {
    let Some(now) = host_rss() else { return };
    if HOST_SAMPLING.swap(true, Ordering::SeqCst) {
        return;
    }
    // The first reading now, so that even a command shorter than a period has one.
    record_host_rss(now);
    let spawned = std::thread::Builder::new()
        .name("host-sampler".into())
        .spawn(|| loop {
            if let Some(b) = host_rss() {
                record_host_rss(b);
            }
            std::thread::sleep(SAMPLE_PERIOD);
        });
    if spawned.is_err() {
        HOST_SAMPLING.store(false, Ordering::SeqCst);
    }
}

static SAMPLING: AtomicBool = AtomicBool::new(false);

/// Starts a thread that calls `read` (a utilisation reading in 0..1, `None` when unavailable)
/// every [`SAMPLE_PERIOD`] for the rest of the process. Only the first call starts one.
pub fn start_gpu_sampler(mut read: impl FnMut() -> Option<f64> + Send + 'static) {
    if SAMPLING.swap(true, Ordering::SeqCst) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("gpu-sampler".into())
        .spawn(move || loop {
            if let Some(f) = read() {
                record_gpu_busy(f);
            }
            std::thread::sleep(SAMPLE_PERIOD);
        });
    if spawned.is_err() {
        SAMPLING.store(false, Ordering::SeqCst);
    }
}

/// One line of a [`Report`].
#[derive(Clone, Debug, Serialize)]
pub struct PhaseReport {
    pub name: String,
    pub seconds: f64,
    /// Share of the wall time (main-thread phases add up to 1).
    pub share: f64,
    /// Times the phase was entered (or background work items).
    pub count: u64,
    /// Mean GPU utilisation while in this phase, when a sampler ran and took readings in it.
    pub gpu_busy: Option<f64>,
    /// Largest host resident set sampled in this phase, bytes (with the host sampler).
    pub host_rss_peak_bytes: Option<u64>,
}

/// The timeline of the process so far.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub wall_seconds: f64,
    /// Main-thread phases, in the order they were first entered.
    pub phases: Vec<PhaseReport>,
    /// Work on other threads, overlapping the phases.
    pub background: Vec<PhaseReport>,
    /// Mean GPU utilisation over the whole command (`None` without a sampler).
    pub gpu_busy: Option<f64>,
    /// Largest host resident set sampled over the whole command, bytes.
    pub host_rss_peak_bytes: Option<u64>,
    /// Largest sample less the cache entries queued for writing when it was taken, bytes.
    pub host_rss_besides_cache_peak_bytes: Option<u64>,
}

/// The timeline so far (the current phase is charged up to now; with the host sampler running,
/// a last host reading is taken first).
pub fn report() -> Report {
    if HOST_SAMPLING.load(Ordering::SeqCst) {
        if let Some(b) = host_rss() {
            record_host_rss(b);
        }
    }
    let mut s = lock();
    let now = Instant::now();
    s.charge(now);
    let wall = now.duration_since(s.start).as_secs_f64();
    let line = |(name, t): &(&'static str, Totals)| PhaseReport {
        name: name.to_string(),
        seconds: t.seconds,
        share: if wall > 0.0 { t.seconds / wall } else { 0.0 },
        count: t.count,
        gpu_busy: (t.busy_n > 0).then(|| t.busy_sum / t.busy_n as f64),
        host_rss_peak_bytes: (t.rss_peak > 0).then_some(t.rss_peak),
    };
    Report {
        wall_seconds: wall,
        phases: s
            .phases
            .iter()
            .filter(|(_, t)| t.seconds > 0.0)
            .map(line)
            .collect(),
        background: s.background.iter().map(line).collect(),
        gpu_busy: (s.busy_n > 0).then(|| s.busy_sum / s.busy_n as f64),
        host_rss_peak_bytes: (s.rss_peak > 0).then_some(s.rss_peak),
        host_rss_besides_cache_peak_bytes: (s.rss_peak > 0).then_some(s.rss_besides_cache_peak),
    }
}

impl Report {
    /// A table for the terminal.
    pub fn render(&self) -> String {
        let mut out = format!("timeline: {:.2} s wall", self.wall_seconds);
        if let Some(b) = self.gpu_busy {
            out += &format!(", GPU busy {:.0} %", b * 100.0);
        }
        if let Some(b) = self.host_rss_peak_bytes {
            out += &format!(", host RSS peak {:.2} GB (sampled)", b as f64 / 1e9);
        }
        if let Some(b) = self.host_rss_besides_cache_peak_bytes {
            out += &format!(", {:.2} GB besides queued cache writes", b as f64 / 1e9);
        }
        out += "\n  phase                   seconds   share  count  GPU busy  host RSS peak\n";
        let gb = |b: Option<u64>| {
            b.map(|b| format!("{:.2} GB", b as f64 / 1e9))
                .unwrap_or_else(|| "-".into())
        };
        let row = |p: &PhaseReport, share: bool| {
            format!(
                "  {:<22} {:>8.2} {:>7} {:>6}  {:>8}  {:>8}\n",
                p.name,
                p.seconds,
                if share {
                    format!("{:.1}%", p.share * 100.0)
                } else {
                    "-".into()
                },
                p.count,
                p.gpu_busy
                    .map(|b| format!("{:.0} %", b * 100.0))
                    .unwrap_or_else(|| "-".into()),
                gb(p.host_rss_peak_bytes)
            )
        };
        for p in &self.phases {
            out += &row(p, true);
        }
        if !self.background.is_empty() {
            out += "  in the background (overlaps the phases above):\n";
            for p in &self.background {
                out += &row(p, false);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_besides_the_cache_queue_subtracts_what_is_queued_when_sampled() {
        // Readings far above any real process's, so that other tests' readings cannot be the
        // peaks asserted on (the timeline is process-wide).
        let big: u64 = 1 << 44;
        queued_cache_bytes((big - 7) as i64);
        record_host_rss(big);
        queued_cache_bytes(-((big - 7) as i64));
        let r = report();
        assert_eq!(r.host_rss_peak_bytes, Some(big));
        let besides = r.host_rss_besides_cache_peak_bytes.unwrap();
        assert!(besides < big / 2, "queued bytes not subtracted: {besides}");
        // With nothing queued a reading counts whole.
        record_host_rss(big / 2 + 1);
        assert_eq!(
            report().host_rss_besides_cache_peak_bytes,
            Some(big / 2 + 1)
        );
        assert!(report().render().contains("besides queued cache writes"));
    }
}
