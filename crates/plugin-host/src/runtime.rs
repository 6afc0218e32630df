//! The sandbox: one wasmtime `Engine` per limit policy, a strict `Linker` (the `log` import and
//! the deny-all WASI of [`crate::wasi`]),
//! an epoch ticker for wall-clock limits, a memory limiter that caps the sum of a job's linear
//! memories, and a precompiled-artifact cache.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine};

use crate::failure::{FailureKind, PluginFailure};
use crate::job::{HostState, Job};
use crate::score::PluginRequest;
use crate::types::{ContractVersion, Metadata};
use crate::wit;

/// Limits applied to every job (one plugin over one batch, with its groups).
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Wall-clock limit of a job, enforced with epoch interruption; None compiles plugins
    /// without the interruption checks (benchmarks; a runaway plugin then runs forever).
    pub time_limit: Option<Duration>,
    /// Optional deterministic budget (wasmtime fuel units, ≈ 10 G units/s on this class of
    /// machine). Changes the compiled code, hence the engine and the cache key.
    pub fuel: Option<u64>,
    /// Cap on the sum of all linear memories of a job's instance, in bytes.
    pub memory_bytes: usize,
    /// Log lines kept per job; further lines are counted and dropped.
    pub max_log_lines: usize,
    /// Bytes kept per log line (longer lines are cut at a char boundary).
    pub max_log_line_bytes: usize,
    /// Metric values one call may return.
    pub max_values: usize,
    /// Entries in one series.
    pub max_series_len: usize,
    /// Output budget of one plugin over one run, shared by all its groups (the whole run, every
    /// prompt, every category): values plus series entries.
    pub max_output_entries: usize,
    /// The same budget in bytes, counted as stored: a value costs its name, its metric's unit
    /// and description (every row keeps a copy) and 16 bytes, a series entry 16.
    pub max_output_bytes: usize,
    /// Largest plugin file accepted (checked before it is read).
    pub max_file_bytes: u64,
    /// Reading and compiling a plugin must end within the time limit, but never within less
    /// than this: a limit meant for one job must not refuse an ordinary plugin, whose compile
    /// takes about a second per MiB of code on a loaded 2-core machine (a precompiled artifact
    /// loads in well under a millisecond). No bound without a time limit.
    pub min_compile_time: Duration,
}

impl Limits {
    /// How long reading and compiling a plugin may take (see [`Limits::min_compile_time`]).
    pub fn compile_time_limit(&self) -> Option<Duration> {
        self.time_limit.map(|t| t.max(self.min_compile_time))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            time_limit: Some(Duration::from_secs(60)),
            fuel: None,
            memory_bytes: 256 << 20,
            max_log_lines: 1000,
            max_log_line_bytes: 4096,
            max_values: 4096,
            max_series_len: 1 << 20,
            max_output_entries: 2 << 20,
            max_output_bytes: 32 << 20,
            max_file_bytes: 256 << 20,
            min_compile_time: Duration::from_secs(10),
        }
    }
}

/// Runtime settings.
#[derive(Clone, Debug, Default)]
pub struct RuntimeConfig {
    pub limits: Limits,
    /// Where precompiled artifacts (`.cwasm`) are kept; None = compile every time.
    pub cache_dir: Option<PathBuf>,
    /// The key file for the artifacts' tags; None = [`cache_key_file`].
    pub cache_key_file: Option<PathBuf>,
}

impl RuntimeConfig {
    /// Defaults with the cache in `$DRAFTLENS_PLUGIN_CACHE`, else `$XDG_CACHE_HOME/draftlens/plugins`,
    /// else `$HOME/.cache/draftlens/plugins` (no cache when none of them is set).
    pub fn with_default_cache() -> Self {
        RuntimeConfig {
            limits: Limits::default(),
            cache_dir: default_cache_dir(),
            cache_key_file: None,
        }
    }
}

/// The default cache folder (see [`RuntimeConfig::with_default_cache`]).
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DRAFTLENS_PLUGIN_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("draftlens").join("plugins"));
    }
    std::env::var_os("HOME").map(|h| {
        PathBuf::from(h)
            .join(".cache")
            .join("draftlens")
            .join("plugins")
    })
}

/// Epoch tick: the granularity of wall-clock limits.
const TICK: Duration = Duration::from_millis(5);

/// Engine + strict linker + ticker. Cheap to share by reference; jobs create their own stores.
pub struct Runtime {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) config: RuntimeConfig,
    /// Hex digest of the engine's precompilation compatibility hash (part of the cache key).
    compat: String,
    /// Key of the tags that precompiled artifacts carry (None: the cache is not used).
    cache_key: Option<[u8; 32]>,
    stop: Arc<AtomicBool>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> anyhow::Result<Runtime> {
        let mut cfg = Config::new();
        cfg.wasm_component_model(true);
        cfg.epoch_interruption(config.limits.time_limit.is_some());
        cfg.consume_fuel(config.limits.fuel.is_some());
        // Native stack for wasm frames; Rust guests keep most of their stack in linear memory.
        cfg.max_wasm_stack(512 << 10);
        let engine =
            Engine::new(&cfg).map_err(|e| anyhow::anyhow!("creating the wasm engine: {e}"))?;

        let mut linker = Linker::<HostState>::new(&engine);
        // The only capability: draftlens:metric/host.log (plus the type-only `types` interface).
        wit::MetricPlugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| anyhow::anyhow!("linking the plugin host interface: {e}"))?;
        // WASI for plugins whose toolchain imports it, with nothing behind it.
        crate::wasi::add_to_linker(&mut linker)
            .map_err(|e| anyhow::anyhow!("linking the deny-all WASI: {e}"))?;

        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let compat = format!("{:016x}", h.finish());

        // Ticker: advances the epoch so that deadlines fire; exits with the runtime (weak handle).
        let stop = Arc::new(AtomicBool::new(false));
        let weak = engine.weak();
        let stop2 = stop.clone();
        if config.limits.time_limit.is_some() {
            std::thread::Builder::new()
                .name("plugin-epoch".into())
                .spawn(move || loop {
                    std::thread::sleep(TICK);
                    if stop2.load(Ordering::Relaxed) {
                        break;
                    }
                    match weak.upgrade() {
                        Some(e) => e.increment_epoch(),
                        None => break,
                    }
                })
                .map_err(|e| anyhow::anyhow!("starting the epoch ticker thread: {e}"))?;
        }

        let key_file = config.cache_key_file.clone().or_else(cache_key_file);
        let cache_key = match (&config.cache_dir, key_file) {
            (Some(_), Some(f)) => match cache_key(&f) {
                Ok(k) => Some(k),
                Err(e) => {
                    tracing::warn!(
                        "{}: cannot read or create the plugin cache key ({e}); plugins are compiled every time",
                        f.display()
                    );
                    None
                }
            },
            _ => None,
        };

        Ok(Runtime {
            engine,
            linker,
            config,
            compat,
            cache_key,
            stop,
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.config.limits
    }

    /// Load a plugin file: check its header and size, read it, check it is a component, compile
    /// it (or load the verified precompiled artifact), check the contract version and the
    /// imports, prepare instantiation and ask the plugin to `describe` itself (once: the time
    /// limit applies to that call). Every problem is a classified [`PluginFailure`].
    pub fn load(&self, path: &Path) -> Result<LoadedPlugin, PluginFailure> {
        let started = Instant::now();
        let bytes = read_plugin_file(path, self.config.limits.max_file_bytes)?;
        self.load_bytes(path, &bytes, started)
    }

    /// Load an embedded built-in plugin (its path is `builtin:NAME`).
    pub fn load_builtin(
        &self,
        b: &crate::builtins::Builtin,
    ) -> Result<LoadedPlugin, PluginFailure> {
        self.load_bytes(&b.path(), b.wasm, Instant::now())
    }

    /// Load what a request names: the embedded built-in when it is one, else its file.
    pub fn load_request(&self, req: &PluginRequest) -> Result<LoadedPlugin, PluginFailure> {
        match &req.builtin {
            Some(name) => match crate::builtins::find(name) {
                Some(b) => self.load_builtin(b),
                None => Err(PluginFailure::new(
                    FailureKind::Io,
                    &req.path,
                    format!("no built-in plugin named {name}"),
                )),
            },
            None => self.load(&req.path),
        }
    }

    fn load_bytes(
        &self,
        path: &Path,
        bytes: &[u8],
        started: Instant,
    ) -> Result<LoadedPlugin, PluginFailure> {
        let fail = |kind, msg: String| PluginFailure::new(kind, path, msg);
        check_header(bytes).map_err(|(kind, msg)| fail(kind, msg))?;
        let sha256 = hex::encode(Sha256::digest(bytes));

        let (component, from_cache) = self.compile(path, bytes, &sha256, started)?;
        let compile_time = started.elapsed();

        let ty = component.component_type();
        let imports: Vec<String> = ty
            .imports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        let exports: Vec<String> = ty
            .exports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        let contract =
            check_contract(&exports).map_err(|m| fail(FailureKind::IncompatibleContract, m))?;
        check_imports(&imports).map_err(|m| fail(FailureKind::CapabilityDenied, m))?;

        let mismatch = |e: wasmtime::Error| {
            fail(
                FailureKind::IncompatibleContract,
                format!(
                    "does not match the draftlens:metric@{} contract: {e:#}",
                    ContractVersion::HOST
                ),
            )
        };
        let pre = self.linker.instantiate_pre(&component).map_err(mismatch)?;
        let pre = wit::MetricPluginPre::new(pre).map_err(mismatch)?;

        let mut plugin = LoadedPlugin {
            path: path.to_path_buf(),
            builtin: crate::builtins::by_sha256(&sha256),
            sha256,
            size: bytes.len() as u64,
            pre,
            metadata: Metadata::default(),
            contract,
            imports,
            exports,
            from_cache,
            compile_time,
            load_time: Duration::ZERO,
        };
        let mut job = Job::new(self, &plugin)?;
        let mut meta = job.describe()?;
        crate::validate::metadata(&meta)
            .map_err(|m| fail(FailureKind::BadOutput, format!("describe() {m}")))?;
        crate::validate::clean_metadata(&mut meta);
        plugin.metadata = meta;
        plugin.load_time = started.elapsed();
        Ok(plugin)
    }

    /// Compile `bytes`, going through the `.cwasm` cache when one is configured. Compiling is
    /// bounded by the time limit, counted from `started` (see [`Runtime::bounded_compile`]).
    fn compile(
        &self,
        path: &Path,
        bytes: &[u8],
        sha256: &str,
        started: Instant,
    ) -> Result<(Component, bool), PluginFailure> {
        let invalid = |e: wasmtime::Error| {
            PluginFailure::new(
                FailureKind::NotComponent,
                path,
                format!("not a valid WebAssembly component: {e:#}"),
            )
        };
        let (Some(dir), Some(key)) = (&self.config.cache_dir, &self.cache_key) else {
            let component =
                self.bounded_compile(path, bytes, started, |e, b| Component::new(e, b))?;
            return Ok((component.map_err(invalid)?, false));
        };
        let cached = self.cache_path(dir, sha256);
        // Read into memory rather than `deserialize_file` (mmap): a cache file truncated or
        // rewritten in place by another process must not pull code out from under us (SIGBUS).
        if let Ok(file) = std::fs::read(&cached) {
            match verify_artifact(key, &self.compat, sha256, &file) {
                Some(artifact) => {
                    // SAFETY: the artifact carries a tag made with this host's private key over
                    // (engine compatibility hash, sha256 of the .wasm, artifact): this runtime
                    // (or another on this account) wrote exactly these bytes from this source.
                    // wasmtime still checks the header and engine settings.
                    match unsafe { Component::deserialize(&self.engine, artifact) } {
                        Ok(c) => return Ok((c, true)),
                        Err(e) => tracing::warn!(
                            "{}: ignoring unusable precompiled plugin ({e}); recompiling",
                            cached.display()
                        ),
                    }
                }
                // Never deserialized: a damaged or foreign artifact is machine code we did not
                // write (a shared cache folder would make this an attack).
                None => tracing::warn!(
                    "{}: the precompiled plugin does not carry this host's tag (damaged or not written \
                     here); recompiling",
                    cached.display()
                ),
            }
        }
        let serialized = self
            .bounded_compile(path, bytes, started, |engine, b| {
                engine.precompile_component(b)
            })?
            .map_err(invalid)?;
        // SAFETY: produced just above by this engine.
        let component =
            unsafe { Component::deserialize(&self.engine, &serialized) }.map_err(invalid)?;
        let tag = artifact_tag(key, &self.compat, sha256, &serialized);
        if let Err(e) = write_atomically(&cached, &[&serialized, &tag]) {
            // The cache is an optimisation: say so and go on.
            tracing::warn!(
                "{}: cannot write the precompiled plugin: {e}",
                cached.display()
            );
        }
        Ok((component, false))
    }

    /// Runs `compile(engine, bytes)` (Cranelift: about a second per MiB of code on a 2-core
    /// machine, and hundreds of MiB of host memory for a large plugin) within what is left of
    /// [`Limits::compile_time_limit`] since `started`, so that a huge plugin cannot hold a
    /// command for minutes before its first call is timed. Wasmtime cannot stop a compilation:
    /// past the limit the compiling thread is abandoned (it finishes in the background, its
    /// result is dropped) and the plugin fails with `timeout`. Without a time limit, compiles in
    /// this thread.
    fn bounded_compile<T: Send + 'static>(
        &self,
        path: &Path,
        bytes: &[u8],
        started: Instant,
        compile: fn(&Engine, &[u8]) -> T,
    ) -> Result<T, PluginFailure> {
        let Some(limit) = self.config.limits.compile_time_limit() else {
            return Ok(compile(&self.engine, bytes));
        };
        let (engine, owned) = (self.engine.clone(), bytes.to_vec());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("plugin-compile".into())
            .spawn(move || {
                // The receiver is gone when the load gave up: nothing to do with the result.
                let _ = tx.send(compile(&engine, &owned));
            })
            .map_err(|e| {
                PluginFailure::new(
                    FailureKind::Io,
                    path,
                    format!("cannot start a thread to compile the plugin: {e}"),
                )
            })?;
        let left = limit.saturating_sub(started.elapsed());
        rx.recv_timeout(left).map_err(|e| match e {
            std::sync::mpsc::RecvTimeoutError::Disconnected => PluginFailure::new(
                FailureKind::NotComponent,
                path,
                "could not be compiled: the compiler stopped without a result",
            ),
            std::sync::mpsc::RecvTimeoutError::Timeout => PluginFailure::new(
                FailureKind::Timeout,
                path,
                format!(
                    "was not compiled within {limit:?} ({} MiB of WebAssembly): compiling a plugin counts against \
                     its time limit (at least {:?}), so a plugin this large needs a longer --plugin-time-limit \
                     (its compilation was abandoned)",
                    bytes.len().div_ceil(1 << 20),
                    self.config.limits.min_compile_time
                ),
            ),
        })
    }

    /// `<cache>/<sha256 of the .wasm>-<engine compatibility hash>.cwasm`.
    pub fn cache_path(&self, dir: &Path, sha256: &str) -> PathBuf {
        dir.join(format!("{sha256}-{}.cwasm", self.compat))
    }
}

fn write_atomically(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    for p in parts {
        f.write_all(p)?;
    }
    drop(f);
    std::fs::rename(&tmp, path)
}

/// Read a plugin file after checking, from its first bytes and its size, that it can be one:
/// a 3 GiB file that is not WebAssembly is refused without being read.
fn read_plugin_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, PluginFailure> {
    use std::io::Read;
    let fail = |kind, msg: String| PluginFailure::new(kind, path, msg);
    let io = |e: std::io::Error| fail(FailureKind::Io, format!("cannot read the file: {e}"));
    let mut f = std::fs::File::open(path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    let mut head = Vec::with_capacity(8);
    (&mut f).take(8).read_to_end(&mut head).map_err(io)?;
    check_header(&head).map_err(|(kind, msg)| fail(kind, msg))?;
    if size > max_bytes {
        return Err(fail(
            FailureKind::Io,
            format!(
                "is {size} bytes, over the {max_bytes}-byte limit for a plugin file (the built-in ones are \
                 well under 1 MiB)"
            ),
        ));
    }
    let mut bytes = head;
    bytes.reserve(size as usize);
    // `take`: a file that grows while we read it cannot push us past the limit.
    f.take(max_bytes - 8).read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
}

/// HMAC-SHA256 (RFC 2104) of `parts` under `key` (at most 64 bytes).
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut k = [0u8; 64];
    k[..key.len()].copy_from_slice(key);
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The tag appended to a precompiled artifact: HMAC over what it may be used for (this engine,
/// this source) and its bytes.
fn artifact_tag(key: &[u8; 32], compat: &str, sha256: &str, artifact: &[u8]) -> [u8; 32] {
    hmac_sha256(
        key,
        &[compat.as_bytes(), b"\n", sha256.as_bytes(), b"\n", artifact],
    )
}

/// The artifact in a cache file (artifact ‖ tag) when its tag is right, else None.
fn verify_artifact<'a>(
    key: &[u8; 32],
    compat: &str,
    sha256: &str,
    file: &'a [u8],
) -> Option<&'a [u8]> {
    let split = file.len().checked_sub(32)?;
    let (artifact, tag) = file.split_at(split);
    let want = artifact_tag(key, compat, sha256, artifact);
    // Constant time: the comparison must not tell how much of a forged tag was right.
    let diff = want.iter().zip(tag).fold(0u8, |d, (a, b)| d | (a ^ b));
    (diff == 0).then_some(artifact)
}

/// The file holding this account's key for cache tags: `$DRAFTLENS_PLUGIN_CACHE_KEY`, else
/// `$XDG_CONFIG_HOME/draftlens/plugin-cache.key`, else `~/.config/draftlens/plugin-cache.key`.
/// It lives outside the cache folder on purpose: whoever can write a (shared) cache folder
/// cannot make artifacts this host will run.
pub fn cache_key_file() -> Option<PathBuf> {
    if let Some(f) = std::env::var_os("DRAFTLENS_PLUGIN_CACHE_KEY") {
        return Some(PathBuf::from(f));
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(config.join("draftlens").join("plugin-cache.key"))
}

/// Read the cache key, creating it (32 random bytes, owner-only) on first use.
fn cache_key(file: &Path) -> std::io::Result<[u8; 32]> {
    use std::io::{Read, Write};
    let read = |f: &Path| -> std::io::Result<[u8; 32]> {
        let b = std::fs::read(f)?;
        b.try_into().map_err(|b: Vec<u8>| {
            std::io::Error::other(format!(
                "{}: expected 32 bytes, found {}",
                f.display(),
                b.len()
            ))
        })
    };
    if file.exists() {
        return read(file);
    }
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    match opts.open(file) {
        Ok(mut f) => {
            f.write_all(&key)?;
            Ok(key)
        }
        // Another process created it first: use its key.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(file),
        Err(e) => Err(e),
    }
}

/// WebAssembly files start with `\0asm` and a 4-byte version/layer: 1 for core modules,
/// 0x0001000d for components.
fn check_header(bytes: &[u8]) -> Result<(), (FailureKind, String)> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Err((
            FailureKind::NotWasm,
            format!(
                "not a WebAssembly file (expected the magic bytes 00 61 73 6d, found {})",
                head.join(" ")
            ),
        ));
    }
    match &bytes[4..8] {
        [0x0d, 0x00, 0x01, 0x00] => Ok(()),
        [0x01, 0x00, 0x00, 0x00] => Err((
            FailureKind::NotComponent,
            "a core WebAssembly module, not a component: link the plugin with wasm-component-ld \
             (see plugins/README.md)"
                .into(),
        )),
        v => Err((
            FailureKind::NotComponent,
            format!("unknown WebAssembly version/layer bytes {v:02x?}"),
        )),
    }
}

/// Find the exported `draftlens:metric/evaluator@X.Y.Z` and check X.Y against the host's 0.1.
fn check_contract(exports: &[String]) -> Result<ContractVersion, String> {
    let prefix = "draftlens:metric/evaluator@";
    let Some(name) = exports.iter().find(|e| e.starts_with(prefix)) else {
        let others = if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        };
        return Err(format!(
            "exports no draftlens:metric/evaluator interface (it exports {others}); is this a draftlens metric plugin?"
        ));
    };
    let v = ContractVersion::parse(&name[prefix.len()..])
        .ok_or_else(|| format!("exports {name}, whose version is not major.minor.patch"))?;
    if !v.compatible_with_host() {
        return Err(format!(
            "built against contract draftlens:metric@{v}, but this draftlens implements draftlens:metric@{}; \
             rebuild the plugin with this version's SDK (plugins/sdk)",
            ContractVersion::HOST
        ));
    }
    Ok(v)
}

/// Strict capability policy: a plugin may import only the contract's own interfaces
/// (`draftlens:metric/host` — the log — and the type-only `draftlens:metric/types`) and the
/// deny-all WASI 0.2 interfaces of [`crate::wasi`].
fn check_imports(imports: &[String]) -> Result<(), String> {
    let allowed = |name: &str| {
        crate::wasi::is_provided(name)
            || ["draftlens:metric/host@", "draftlens:metric/types@"]
                .iter()
                .any(|p| {
                    name.strip_prefix(p)
                        .and_then(ContractVersion::parse)
                        .is_some_and(|v| v.compatible_with_host())
                })
    };
    let denied: Vec<&str> = imports
        .iter()
        .map(String::as_str)
        .filter(|n| !allowed(n))
        .collect();
    if denied.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "imports {}; plugins get no capability but draftlens:metric/host (a bounded log) and a deny-all \
             WASI 0.2 (wasi:cli, clocks, filesystem, io, random, sockets), so they may import nothing else \
             (see plugins/README.md, \"Sandbox\")",
            denied.join(", ")
        ))
    }
}

/// A compiled, checked plugin, ready for jobs.
pub struct LoadedPlugin {
    /// The file (`builtin:NAME` for an embedded built-in).
    pub path: PathBuf,
    /// The built-in plugin whose bytes these are (same sha256), if any: only it may use that
    /// built-in's name.
    pub builtin: Option<&'static str>,
    /// sha256 of the `.wasm` file (hex).
    pub sha256: String,
    pub size: u64,
    pub(crate) pre: wit::MetricPluginPre<HostState>,
    pub metadata: Metadata,
    pub contract: ContractVersion,
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    /// Whether the compiled code came from the precompiled cache.
    pub from_cache: bool,
    /// Time to read, compile or deserialize.
    pub compile_time: Duration,
    /// Total load time including `describe`.
    pub load_time: Duration,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("metadata", &self.metadata)
            .field("contract", &self.contract)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiling_is_bounded_by_the_time_limit_but_never_below_the_floor() {
        let with = |t: Option<u64>| Limits {
            time_limit: t.map(Duration::from_secs),
            ..Limits::default()
        };
        assert_eq!(
            with(Some(60)).compile_time_limit(),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            with(Some(1)).compile_time_limit(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(with(None).compile_time_limit(), None);
    }

    #[test]
    fn headers_are_classified() {
        assert_eq!(
            check_header(b"\x7fELF\x02\x01\x01\x00rest").unwrap_err().0,
            FailureKind::NotWasm
        );
        assert_eq!(check_header(b"\0as").unwrap_err().0, FailureKind::NotWasm);
        assert_eq!(
            check_header(b"\0asm\x01\0\0\0").unwrap_err().0,
            FailureKind::NotComponent
        );
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok());
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2: key "Jefe", data "what do ya want for nothing?".
        let tag = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex::encode(tag),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let key = [7u8; 32];
        let mut file = b"artifact".to_vec();
        file.extend(artifact_tag(&key, "c", "s", b"artifact"));
        assert_eq!(
            verify_artifact(&key, "c", "s", &file),
            Some(&b"artifact"[..])
        );
        assert_eq!(verify_artifact(&key, "c", "other-source", &file), None);
        assert_eq!(verify_artifact(&[8u8; 32], "c", "s", &file), None);
        file[2] ^= 1;
        assert_eq!(verify_artifact(&key, "c", "s", &file), None);
        assert_eq!(verify_artifact(&key, "c", "s", b"short"), None);
    }

    #[test]
    fn contract_versions() {
        let ok = |v: &str| check_contract(&[format!("draftlens:metric/evaluator@{v}")]);
        assert!(ok("0.1.0").is_ok());
        assert!(ok("0.1.7").is_ok(), "patch versions are compatible");
        let e = ok("0.2.0").unwrap_err();
        assert!(
            e.contains("built against contract draftlens:metric@0.2.0") && e.contains("@0.1.0"),
            "{e}"
        );
        assert!(ok("1.0.0").is_err());
        let e = check_contract(&["wasi:http/handler@0.2.0".into()]).unwrap_err();
        assert!(e.contains("exports no draftlens:metric/evaluator"), "{e}");
    }

    #[test]
    fn only_the_contract_may_be_imported() {
        assert!(check_imports(&[
            "draftlens:metric/host@0.1.0".into(),
            "draftlens:metric/types@0.1.2".into()
        ])
        .is_ok());
        // The deny-all WASI 0.2 is linked; other WASI packages and versions are not.
        assert!(check_imports(&[
            "draftlens:metric/host@0.1.0".into(),
            "wasi:cli/environment@0.2.0".into(),
            "wasi:io/streams@0.2.6".into(),
        ])
        .is_ok());
        let e = check_imports(&[
            "draftlens:metric/host@0.1.0".into(),
            "wasi:http/outgoing-handler@0.2.0".into(),
            "wasi:cli/environment@0.3.0".into(),
        ])
        .unwrap_err();
        assert!(
            e.starts_with("imports wasi:http/outgoing-handler@0.2.0, wasi:cli/environment@0.3.0;"),
            "{e}"
        );
        assert!(check_imports(&["draftlens:metric/host@0.2.0".into()]).is_err());
    }
}
