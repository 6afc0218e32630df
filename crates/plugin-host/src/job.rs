//! One job = one plugin instance in its own fresh `Store`, with its budgets. A trapped instance is
//! poisoned (wasmtime refuses to re-enter it), so a job ends at its first failure and the store
//! is dropped; nothing leaks into the next job.

use std::path::Path;
use std::time::Instant;

use wasmtime::component::{ComponentExportIndex, Instance, ResourceAny, TypedFunc};
use wasmtime::{ResourceLimiter, Store, Trap, UpdateDeadline};

use crate::failure::{FailureKind, PluginFailure};
use crate::runtime::{Limits, LoadedPlugin, Runtime};
use crate::types::{LogLevel, LogLine, Metadata, Param};
use crate::wit::{self, BatchRef};

/// Caps the *sum* of a store's linear memories (`StoreLimits` caps each memory on its own) and
/// remembers a refused growth, so the guest's following abort is reported as "memory limit".
pub(crate) struct MemoryLimiter {
    max_total: usize,
    total: usize,
    /// (total the guest asked for, in bytes) of the first refused growth.
    pub(crate) denied: Option<usize>,
    /// The growth approved last, taken back if wasmtime then fails to perform it.
    last_approved: usize,
}

impl MemoryLimiter {
    pub(crate) fn new(max_total: usize) -> Self {
        MemoryLimiter {
            max_total,
            total: 0,
            denied: None,
            last_approved: 0,
        }
    }

    /// Bytes currently counted against the cap.
    #[cfg(test)]
    pub(crate) fn total(&self) -> usize {
        self.total
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Memories only grow, so the sum of deltas is the sum of sizes.
        let wanted = self.total + desired.saturating_sub(current);
        if wanted > self.max_total {
            self.denied.get_or_insert(wanted);
            return Ok(false);
        }
        self.last_approved = wanted - self.total;
        self.total = wanted;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        // Approved, but the memory did not grow (e.g. the host could not map it): the memory
        // keeps its size, so the growth must not count against the cap.
        self.total -= std::mem::take(&mut self.last_approved);
        tracing::debug!("a plugin memory growth approved by the limiter failed: {error:#}");
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }

    fn instances(&self) -> usize {
        64
    }
    fn tables(&self) -> usize {
        64
    }
    fn memories(&self) -> usize {
        16
    }
}

/// What a plugin logged, bounded.
#[derive(Default)]
pub(crate) struct LogSink {
    max_lines: usize,
    max_line_bytes: usize,
    pub(crate) lines: Vec<LogLine>,
    pub(crate) dropped: u64,
    /// The last line starting with "panic: " (kept even when the line limit was reached).
    pub(crate) panic: Option<String>,
}

impl LogSink {
    fn push(&mut self, level: LogLevel, raw: String) {
        if level == LogLevel::Error && raw.starts_with("panic: ") {
            // Rust's panic message is "panicked at FILE:LINE:COL:\nMESSAGE": one line.
            self.panic = Some(crate::text::clean(&raw, crate::text::MAX_MESSAGE_BYTES));
        }
        // Full, and plainly not a repeat of the last line (first bytes differ): count it without
        // cleaning it, so a flood costs the host little (at worst a repeat counts as dropped).
        if self.lines.len() >= self.max_lines {
            let n = 64.min(raw.len());
            let differs = self.lines.last().is_none_or(|l| {
                l.level != level || l.message.as_bytes().get(..n) != Some(&raw.as_bytes()[..n])
            });
            if differs {
                self.dropped += 1;
                return;
            }
        }
        // Capped and without control characters before anything shows or stores it.
        let message = crate::text::clean(&raw, self.max_line_bytes);
        drop(raw);
        if let Some(last) = self
            .lines
            .last_mut()
            .filter(|l| l.level == level && l.message == message)
        {
            last.repeats += 1;
        } else if self.lines.len() < self.max_lines {
            self.lines.push(LogLine {
                level,
                message,
                repeats: 0,
            });
        } else {
            self.dropped += 1;
        }
    }
}

/// The store's data.
pub struct HostState {
    pub(crate) limiter: MemoryLimiter,
    pub(crate) log: LogSink,
    /// The deny-all WASI context and its capped resource table.
    pub(crate) wasi: crate::wasi::WasiState,
}

impl wit::draftlens::metric::host::Host for HostState {
    fn log(&mut self, level: wit::Level, message: String) {
        let level = match level {
            wit::Level::Debug => LogLevel::Debug,
            wit::Level::Info => LogLevel::Info,
            wit::Level::Warn => LogLevel::Warn,
            wit::Level::Error => LogLevel::Error,
        };
        self.log.push(level, message);
    }
}

impl wit::draftlens::metric::types::Host for HostState {}

/// A live plugin instance in a fresh store.
pub struct Job<'r> {
    path: &'r Path,
    limits: &'r Limits,
    store: Store<HostState>,
    instance: Instance,
    bindings: wit::MetricPlugin,
    evaluate_idx: ComponentExportIndex,
    accumulate_idx: ComponentExportIndex,
    /// End of the job's wall-clock budget (None: no limit).
    deadline: Option<Instant>,
}

/// `evaluate(params, batch)` with the batch lowered from borrowed columns.
type EvaluateFn<'a> =
    TypedFunc<(&'a [wit::Param], BatchRef<'a>), (Result<Vec<wit::MetricValue>, wit::PluginError>,)>;
/// `[method]accumulator.accumulate(self, batch)` with the batch lowered from borrowed columns.
type AccumulateFn<'a> = TypedFunc<(ResourceAny, BatchRef<'a>), (Result<(), wit::PluginError>,)>;

impl<'r> Job<'r> {
    /// Instantiate `plugin` in a fresh store with the runtime's limits. The wall-clock limit
    /// runs from here for the whole job.
    pub fn new(runtime: &'r Runtime, plugin: &'r LoadedPlugin) -> Result<Job<'r>, PluginFailure> {
        let limits = runtime.limits();
        let path = plugin.path.as_path();
        let state = HostState {
            limiter: MemoryLimiter::new(limits.memory_bytes),
            log: LogSink {
                max_lines: limits.max_log_lines,
                max_line_bytes: limits.max_log_line_bytes,
                ..Default::default()
            },
            wasi: crate::wasi::WasiState::deny_all(),
        };
        let mut store = Store::new(&runtime.engine, state);
        store.limiter(|s| &mut s.limiter);
        if let Some(fuel) = limits.fuel {
            store.set_fuel(fuel).map_err(|e| {
                PluginFailure::new(
                    FailureKind::Trap,
                    path,
                    format!("cannot set the fuel budget: {e}"),
                )
            })?;
        }
        let deadline = limits.time_limit.map(|t| Instant::now() + t);
        if let Some(deadline) = deadline {
            // Every tick asks the real clock: counting ticks would stretch the limit by however
            // late a starved ticker thread wakes (15-24 % under load); this way a job overshoots
            // by at most about one tick plus the time to be scheduled again.
            store.epoch_deadline_callback(move |_| {
                Ok(if Instant::now() >= deadline {
                    UpdateDeadline::Interrupt
                } else {
                    UpdateDeadline::Continue(1)
                })
            });
            store.set_epoch_deadline(1);
        }

        let component = plugin.pre.instance_pre().component();
        let iface = component.get_export_index(None, wit::evaluator());
        let lookup = |name: &str| -> Result<ComponentExportIndex, PluginFailure> {
            iface
                .as_ref()
                .and_then(|i| component.get_export_index(Some(i), name))
                .ok_or_else(|| {
                    PluginFailure::new(
                        FailureKind::IncompatibleContract,
                        path,
                        format!("exports no function {name} in {}", wit::evaluator()),
                    )
                })
        };
        let evaluate_idx = lookup("evaluate")?;
        let accumulate_idx = lookup("[method]accumulator.accumulate")?;

        let instance = match plugin.pre.instance_pre().instantiate(&mut store) {
            Ok(i) => i,
            Err(e) => return Err(classify(&store, path, limits, "instantiation", e)),
        };
        let bindings = match wit::MetricPlugin::new(&mut store, &instance) {
            Ok(b) => b,
            Err(e) => return Err(classify(&store, path, limits, "instantiation", e)),
        };
        Ok(Job {
            path,
            limits,
            store,
            instance,
            bindings,
            evaluate_idx,
            accumulate_idx,
            deadline,
        })
    }

    /// Re-arm the epoch deadline before a call (the callback set in [`Job::new`] then checks
    /// the job's deadline at every tick).
    fn arm(&mut self, during: &str) -> Result<(), PluginFailure> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(PluginFailure::new(
                FailureKind::Timeout,
                self.path,
                format!(
                    "exceeded its time limit of {:?} before {during}",
                    self.limits.time_limit.unwrap_or_default()
                ),
            ));
        }
        self.store.set_epoch_deadline(1);
        Ok(())
    }

    fn fail(&self, during: &str, e: wasmtime::Error) -> PluginFailure {
        classify(&self.store, self.path, self.limits, during, e)
    }

    fn plugin_error(&self, during: &str, e: wit::PluginError) -> PluginFailure {
        use crate::text::{clean, MAX_MESSAGE_BYTES};
        let e = match e {
            wit::PluginError::InvalidParams(m) => {
                wit::PluginError::InvalidParams(clean(&m, MAX_MESSAGE_BYTES))
            }
            wit::PluginError::InvalidBatch(m) => {
                wit::PluginError::InvalidBatch(clean(&m, MAX_MESSAGE_BYTES))
            }
            wit::PluginError::Internal(m) => {
                wit::PluginError::Internal(clean(&m, MAX_MESSAGE_BYTES))
            }
        };
        let (kind, msg) = match e {
            wit::PluginError::InvalidParams(m) => (
                FailureKind::InvalidParams,
                format!("rejected its parameters: {m}"),
            ),
            wit::PluginError::InvalidBatch(m) => (
                FailureKind::PluginError,
                format!("rejected the batch in {during}: {m}"),
            ),
            wit::PluginError::Internal(m) => (
                FailureKind::PluginError,
                format!("reported an internal error in {during}: {m}"),
            ),
        };
        PluginFailure::new(kind, self.path, msg)
    }

    /// `describe()`.
    pub fn describe(&mut self) -> Result<Metadata, PluginFailure> {
        self.arm("describe")?;
        let r = self
            .bindings
            .draftlens_metric_evaluator()
            .call_describe(&mut self.store);
        r.map(Metadata::from).map_err(|e| self.fail("describe", e))
    }

    /// One-shot `evaluate(params, batch)`.
    pub fn evaluate(
        &mut self,
        params: &[Param],
        batch: BatchRef<'_>,
    ) -> Result<Vec<wit::MetricValue>, PluginFailure> {
        self.arm("evaluate")?;
        let params = wit_params(params);
        let f: EvaluateFn<'_> = match self
            .instance
            .get_typed_func(&mut self.store, self.evaluate_idx)
        {
            Ok(f) => f,
            Err(e) => return Err(self.fail("evaluate (type check)", e)),
        };
        match f.call(&mut self.store, (&params, batch)) {
            Ok((Ok(v),)) => Ok(v),
            Ok((Err(e),)) => Err(self.plugin_error("evaluate", e)),
            Err(e) => Err(self.fail("evaluate", e)),
        }
    }

    /// `begin(params)`: a new accumulator.
    pub fn begin(&mut self, params: &[Param]) -> Result<ResourceAny, PluginFailure> {
        self.arm("begin")?;
        let params = wit_params(params);
        let r = self
            .bindings
            .draftlens_metric_evaluator()
            .call_begin(&mut self.store, &params);
        match r {
            Ok(Ok(acc)) => Ok(acc),
            Ok(Err(e)) => Err(self.plugin_error("begin", e)),
            Err(e) => Err(self.fail("begin", e)),
        }
    }

    /// `accumulator.accumulate(batch)`.
    pub fn accumulate(
        &mut self,
        acc: ResourceAny,
        batch: BatchRef<'_>,
    ) -> Result<(), PluginFailure> {
        self.arm("accumulate")?;
        let f: AccumulateFn<'_> = match self
            .instance
            .get_typed_func(&mut self.store, self.accumulate_idx)
        {
            Ok(f) => f,
            Err(e) => return Err(self.fail("accumulate (type check)", e)),
        };
        match f.call(&mut self.store, (acc, batch)) {
            Ok((Ok(()),)) => Ok(()),
            Ok((Err(e),)) => Err(self.plugin_error("accumulate", e)),
            Err(e) => Err(self.fail("accumulate", e)),
        }
    }

    /// `accumulator.finish()`, then drop the accumulator.
    pub fn finish(&mut self, acc: ResourceAny) -> Result<Vec<wit::MetricValue>, PluginFailure> {
        self.arm("finish")?;
        let r = self
            .bindings
            .draftlens_metric_evaluator()
            .accumulator()
            .call_finish(&mut self.store, acc);
        let out = match r {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(self.plugin_error("finish", e)),
            Err(e) => return Err(self.fail("finish", e)),
        };
        self.arm("dropping the accumulator")?;
        acc.resource_drop(&mut self.store)
            .map_err(|e| self.fail("dropping the accumulator", e))?;
        Ok(out)
    }

    /// What the plugin logged so far (bounded), and how many lines were dropped.
    pub fn logs(&self) -> (&[LogLine], u64) {
        (&self.store.data().log.lines, self.store.data().log.dropped)
    }

    /// Fuel consumed so far (None without a fuel budget). Deterministic for a given plugin,
    /// parameters and records, which is what makes fuel budgets reproducible.
    pub fn fuel_used(&self) -> Option<u64> {
        let budget = self.limits.fuel?;
        self.store.get_fuel().ok().map(|left| budget - left)
    }

    /// Take the log lines (for the outcome of the job).
    pub fn take_logs(&mut self) -> (Vec<LogLine>, u64) {
        let log = &mut self.store.data_mut().log;
        (std::mem::take(&mut log.lines), log.dropped)
    }
}

fn wit_params(params: &[Param]) -> Vec<wit::Param> {
    params
        .iter()
        .map(|p| wit::Param {
            name: p.name.clone(),
            value: (&p.value).into(),
        })
        .collect()
}

/// Turn a wasmtime error from a call into a classified failure.
fn classify(
    store: &Store<HostState>,
    path: &Path,
    limits: &Limits,
    during: &str,
    err: wasmtime::Error,
) -> PluginFailure {
    let st = store.data();
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let trap = err.downcast_ref::<Trap>().copied();
    let (kind, msg) = match trap {
        Some(Trap::Interrupt) => (
            FailureKind::Timeout,
            format!(
                "exceeded its time limit of {:?} in {during} and was interrupted",
                limits.time_limit.unwrap_or_default()
            ),
        ),
        Some(Trap::OutOfFuel) => (
            FailureKind::FuelExhausted,
            format!("used up its fuel budget of {} units in {during}", limits.fuel.unwrap_or(0)),
        ),
        // A panic (the SDK's hook logged it) — possibly provoked by a refused allocation.
        Some(Trap::UnreachableCodeReached) if st.log.panic.is_some() => {
            // Already one line, capped and cleaned by the log sink.
            let m = st.log.panic.as_deref().unwrap_or_default();
            let m = m.trim_start_matches("panic: ");
            let note = match st.limiter.denied {
                Some(b) => format!(" (after the memory limit refused growth to {:.0} MiB)", mib(b)),
                None => String::new(),
            };
            (FailureKind::Panic, format!("panicked in {during}: {m}{note}"))
        }
        // Rust aborts (`unreachable`) when an allocation fails; the limiter saw the refusal.
        _ if st.limiter.denied.is_some() => (
            FailureKind::MemoryLimit,
            format!(
                "exceeded its memory limit in {during}: tried to grow its linear memory to {:.0} MiB, \
                 limit {:.0} MiB",
                mib(st.limiter.denied.unwrap_or(0)),
                mib(limits.memory_bytes)
            ),
        ),
        Some(Trap::StackOverflow) => (
            FailureKind::StackOverflow,
            format!("exhausted the wasm call stack in {during} (runaway recursion?)"),
        ),
        Some(Trap::MemoryOutOfBounds) => (
            FailureKind::Trap,
            format!(
                "trapped in {during}: out of bounds memory access (Rust plugins keep their stack in linear \
                 memory, so runaway recursion ends like this)"
            ),
        ),
        Some(t) => (FailureKind::Trap, format!("trapped in {during}: {t}")),
        // wasi:cli/exit (e.g. Rust's `std::process::exit`, Python's `sys.exit`).
        None if err.downcast_ref::<wasmtime_wasi::I32Exit>().is_some() => (
            FailureKind::Trap,
            format!(
                "called exit({}) in {during} (a plugin reports problems by returning an error)",
                err.downcast_ref::<wasmtime_wasi::I32Exit>().map_or(0, |e| e.0)
            ),
        ),
        // Not a trap: lifting the plugin's return value failed (bad pointers, invalid UTF-8,
        // ...), or the plugin misused a resource handle (a Python runtime torn down half-way
        // by an uncaught SystemExit drops handles it no longer owns). One line: the cause, never
        // the wasm backtrace wasmtime wraps it in (1.4 KB, issue 39).
        None => (
            FailureKind::BadOutput,
            format!(
                "failed in {during} without a trap: {} (a malformed return value or resource handle, or a \
                 runtime that stopped half-way, e.g. after an uncaught sys.exit())",
                err.root_cause()
            ),
        ),
    };
    PluginFailure::new(kind, path, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_that_fails_after_approval_is_not_counted() {
        let mut l = MemoryLimiter::new(10 << 20);
        assert!(l.memory_growing(0, 4 << 20, None).unwrap());
        assert!(l.memory_growing(4 << 20, 8 << 20, None).unwrap());
        assert_eq!(l.total(), 8 << 20);
        // wasmtime approved 4 MiB more but could not map it: the memory is still 4 MiB.
        l.memory_grow_failed(wasmtime::Error::msg("mmap failed"))
            .unwrap();
        assert_eq!(l.total(), 4 << 20);
        // So a growth to 10 MiB still fits, and one past the cap is refused and remembered.
        assert!(l.memory_growing(4 << 20, 10 << 20, None).unwrap());
        assert!(!l.memory_growing(10 << 20, 11 << 20, None).unwrap());
        assert_eq!(l.denied, Some(11 << 20));
        assert_eq!(l.total(), 10 << 20);
    }
}
