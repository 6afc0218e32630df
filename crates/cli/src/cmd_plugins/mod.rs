//! `draftlens plugins list | info | check | new`, and the `--plugin` options that `run` and
//! `rescore` share ([`PluginArgs`]). `render.rs` holds the text output of scoring that `run` and
//! `rescore` print too.

mod render;

pub use render::{render_outcomes, render_stored, warn_stored};

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use draftlens_plugin_host::check::{check_plugin, CheckError};
use draftlens_plugin_host::text::clean;
use draftlens_plugin_host::{
    discover, scaffold, FailureKind, Limits, LoadedPlugin, Param, PluginFailure, PreparedPlugin,
    Runtime, RuntimeConfig,
};
use draftlens_results::text::printable;
use serde::Serialize;

use crate::common::Global;

#[derive(Subcommand, Debug)]
pub enum PluginsCmd {
    /// List the plugins (the built-in ones, then those in the plugin folders) and what they
    /// measure.
    List {
        #[command(flatten)]
        dirs: DirArgs,
        #[command(flatten)]
        sandbox: SandboxArgs,
    },
    /// Show one plugin: metrics, parameters, contract version, imports, sha256.
    Info {
        /// Plugin name (looked up in the plugin folders) or path to a .wasm file.
        plugin: String,
        #[command(flatten)]
        dirs: DirArgs,
        #[command(flatten)]
        sandbox: SandboxArgs,
    },
    /// Load a .wasm under the strict sandbox and run it on synthetic records, one-shot and
    /// streamed in chunks (the results must agree).
    Check {
        /// The plugin file.
        file: PathBuf,
        /// Parameter NAME=VALUE (repeatable), typed by the plugin's declared parameters.
        #[arg(long = "param")]
        params: Vec<String>,
        #[command(flatten)]
        sandbox: SandboxArgs,
    },
    /// Scaffold a plugin crate (SDK, a working example metric and its test).
    New {
        /// Plugin name: lower-case letters, digits and '-' (e.g. my-metric).
        name: String,
        /// Folder to create the crate in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Depend on the plugin SDK at this path (written as given) [default: a copy of this
        /// draftlens' SDK in NAME/vendor/, by a relative path]. Rust only.
        #[arg(long)]
        sdk: Option<PathBuf>,
        /// The plugin's language: rust (a crate on the Rust SDK) or python (plain Python on the
        /// Python SDK, built with componentize-py).
        #[arg(long, value_enum, default_value = "rust")]
        lang: Lang,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    Rust,
    Python,
}

#[derive(Args, Clone, Debug, Default)]
pub struct DirArgs {
    /// Plugin folder (repeatable) [default: $DRAFTLENS_PLUGIN_PATH, else
    /// ~/.local/share/draftlens/plugins]. The built-in plugins need none.
    #[arg(long = "plugin-dir")]
    pub plugin_dirs: Vec<PathBuf>,
}

impl DirArgs {
    pub fn dirs(&self) -> Vec<PathBuf> {
        if self.plugin_dirs.is_empty() {
            discover::default_plugin_dirs()
        } else {
            self.plugin_dirs.clone()
        }
    }
}

/// Sandbox limits for plugins.
#[derive(Args, Clone, Debug)]
pub struct SandboxArgs {
    /// Wall-clock limit per plugin job, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub plugin_time_limit: f64,
    /// Deterministic fuel budget per plugin job (wasmtime fuel units; none by default).
    #[arg(long)]
    pub plugin_fuel: Option<u64>,
    /// Memory cap per plugin job (sum of its linear memories), MiB.
    #[arg(long, default_value_t = 256)]
    pub plugin_memory_mib: usize,
    /// Precompiled-plugin cache folder [default: $DRAFTLENS_PLUGIN_CACHE or ~/.cache/draftlens/plugins].
    #[arg(long)]
    pub plugin_cache: Option<PathBuf>,
    /// Compile plugins every time instead of using the precompiled cache.
    #[arg(long)]
    pub no_plugin_cache: bool,
}

impl Default for SandboxArgs {
    fn default() -> Self {
        SandboxArgs {
            plugin_time_limit: 60.0,
            plugin_fuel: None,
            plugin_memory_mib: 256,
            plugin_cache: None,
            no_plugin_cache: false,
        }
    }
}

impl SandboxArgs {
    pub fn runtime(&self) -> Result<Runtime> {
        if !(self.plugin_time_limit > 0.0 && self.plugin_time_limit.is_finite()) {
            bail!(
                "--plugin-time-limit must be a positive number of seconds, got {}",
                self.plugin_time_limit
            );
        }
        if self.plugin_memory_mib == 0 {
            bail!("--plugin-memory-mib must be at least 1");
        }
        let limits = Limits {
            time_limit: Some(Duration::from_secs_f64(self.plugin_time_limit)),
            fuel: self.plugin_fuel,
            memory_bytes: self.plugin_memory_mib << 20,
            ..Limits::default()
        };
        let cache_dir = if self.no_plugin_cache {
            None
        } else {
            self.plugin_cache
                .clone()
                .or_else(draftlens_plugin_host::default_cache_dir)
        };
        Runtime::new(RuntimeConfig {
            limits,
            cache_dir,
            cache_key_file: None,
        })
    }
}

/// The `--plugin` options of `run` and `rescore`.
#[derive(Args, Clone, Debug, Default)]
pub struct PluginArgs {
    /// Metric plugin: a built-in's name, a name from the plugin folders or a .wasm path
    /// (repeatable).
    #[arg(long = "plugin")]
    pub plugins: Vec<String>,
    /// Plugin parameter PLUGIN:NAME=VALUE, PLUGIN being the plugin's name or file stem, or
    /// NAME=VALUE when one --plugin is given (repeatable), e.g. --param ddtree:budgets=4,8,16.
    #[arg(long = "param", visible_alias = "plugin-param")]
    pub params: Vec<String>,
    #[command(flatten)]
    pub dirs: DirArgs,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

impl PluginArgs {
    /// Resolve plugin names (built-ins first, then the plugin folders) and load each plugin
    /// once; parse the parameters against each plugin's declared parameter kinds and have the
    /// plugin check their values (`begin`), so that a bad value fails here, before any model
    /// runs. A plugin that cannot be loaded is still returned: scoring reports its failure and
    /// goes on with the others. Two plugins with the same name are refused (their metrics would
    /// overwrite each other).
    pub fn prepare(&self, runtime: &Runtime) -> Result<Vec<PreparedPlugin>> {
        let dirs = self.dirs.dirs();
        let mut out: Vec<PreparedPlugin> = Vec::new();
        for name in &self.plugins {
            let req = discover::resolve(name, &dirs)?;
            let p = PreparedPlugin::load(runtime, req);
            if let Ok(l) = &p.plugin {
                if let Some(first) = out.iter().find(|q| {
                    q.plugin
                        .as_ref()
                        .is_ok_and(|m| m.metadata.name == l.metadata.name)
                }) {
                    bail!(
                        "--plugin {} and --plugin {} are both the plugin {}: their metrics would overwrite each other",
                        clean(&first.request.path.display().to_string(), 1024),
                        clean(&l.path.display().to_string(), 1024),
                        l.metadata.name
                    );
                }
            }
            out.push(p);
        }
        for spec in &self.params {
            let bad = || {
                format!(
                    "--param {spec}: expected PLUGIN:NAME=VALUE (or NAME=VALUE with one --plugin)"
                )
            };
            // Split at the first '=' so that a value may contain ':'.
            let (key, value) = spec.split_once('=').with_context(bad)?;
            let (plugin, pname) = match key.split_once(':') {
                Some((plugin, pname)) => (Some(plugin), pname),
                None if out.len() == 1 => (None, key),
                None if out.is_empty() => bail!("--param {spec}: no --plugin is given"),
                None => bail!(
                    "--param {spec}: several --plugin are given, so name the plugin: PLUGIN:{key}={value}"
                ),
            };
            if pname.is_empty() {
                bail!("{}", bad());
            }
            let norm = |s: &str| s.replace('_', "-");
            let idx = match plugin {
                None => 0,
                Some(plugin) => out
                    .iter()
                    .position(|p| {
                        p.request
                            .builtin
                            .as_deref()
                            .is_some_and(|b| norm(b) == norm(plugin))
                            || p.request
                                .path
                                .file_stem()
                                .is_some_and(|s| norm(&s.to_string_lossy()) == norm(plugin))
                            || p.plugin.as_ref().is_ok_and(|l| l.metadata.name == plugin)
                    })
                    .with_context(|| format!("--param {spec}: no --plugin named {plugin}"))?,
            };
            let Ok(p) = &out[idx].plugin else { continue };
            let ps = p
                .metadata
                .params
                .iter()
                .find(|s| s.name == pname)
                .with_context(|| {
                    let known: Vec<&str> =
                        p.metadata.params.iter().map(|s| s.name.as_str()).collect();
                    format!(
                        "--param {spec}: plugin {} has no parameter {pname} (it has: {})",
                        p.metadata.name,
                        if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        }
                    )
                })?;
            let value = ps
                .default
                .parse_like(value)
                .map_err(|e| anyhow::anyhow!("--param {spec}: {e}"))?;
            let params = &mut out[idx].request.params;
            params.retain(|q| q.name != pname);
            params.push(Param {
                name: pname.to_string(),
                value,
            });
        }
        // The plugin's own check of the values (ranges, lists, names it knows).
        for p in &out {
            if let Ok(l) = &p.plugin {
                if p.request.params.is_empty() {
                    continue;
                }
                if let Err(f) = runtime.check_params(l, &p.request.params) {
                    if f.kind == FailureKind::InvalidParams {
                        bail!("--param for plugin {}: {}", l.metadata.name, f.message);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The resolved requests (parameters parsed and checked), without the loaded plugins (what
    /// the unit tests below inspect).
    #[cfg(test)]
    pub fn requests(&self, runtime: &Runtime) -> Result<Vec<draftlens_plugin_host::PluginRequest>> {
        Ok(self
            .prepare(runtime)?
            .into_iter()
            .map(|p| p.request)
            .collect())
    }
}

pub fn run(g: &Global, cmd: PluginsCmd) -> Result<()> {
    match cmd {
        PluginsCmd::List { dirs, sandbox } => list(g, &dirs, &sandbox),
        PluginsCmd::Info {
            plugin,
            dirs,
            sandbox,
        } => info(g, &plugin, &dirs, &sandbox),
        PluginsCmd::Check {
            file,
            params,
            sandbox,
        } => check(g, &file, &params, &sandbox),
        PluginsCmd::New {
            name,
            dir,
            sdk,
            lang: Lang::Rust,
        } => new(g, &name, &dir, sdk),
        PluginsCmd::New {
            name,
            dir,
            sdk,
            lang: Lang::Python,
        } => new_python(g, &name, &dir, sdk),
    }
}

#[derive(Serialize)]
struct ListEntry {
    path: PathBuf,
    builtin: bool,
    name: Option<String>,
    version: Option<String>,
    sha256: Option<String>,
    metrics: Vec<String>,
    failure: Option<PluginFailure>,
}

fn list(g: &Global, dirs: &DirArgs, sandbox: &SandboxArgs) -> Result<()> {
    let dirs = dirs.dirs();
    let requests = discover::list_plugins(&dirs)?;
    let runtime = sandbox.runtime()?;
    let entries: Vec<ListEntry> = requests
        .into_iter()
        .map(|req| {
            let builtin = req.builtin.is_some();
            match runtime.load_request(&req) {
                Ok(p) => ListEntry {
                    path: req.path,
                    builtin,
                    name: Some(p.metadata.name.clone()),
                    version: Some(p.metadata.version.clone()),
                    sha256: Some(p.sha256.clone()),
                    metrics: p.metadata.metrics.iter().map(|m| m.name.clone()).collect(),
                    failure: None,
                },
                Err(f) => ListEntry {
                    path: req.path,
                    builtin,
                    name: None,
                    version: None,
                    sha256: None,
                    metrics: vec![],
                    failure: Some(f),
                },
            }
        })
        .collect();
    g.emit(&entries, || {
        // The host cleaned what plugins said when it loaded them; the terminal gets the same
        // rule again (names, versions and messages are the plugins' text).
        let mut s = String::new();
        for e in &entries {
            let path = clean(&e.path.display().to_string(), 1024);
            match (&e.name, &e.failure) {
                (Some(n), _) => {
                    s += &format!(
                        "{:<18} {:<8} {}\n{:<27} {}\n",
                        printable(n),
                        printable(e.version.as_deref().unwrap_or("")),
                        path,
                        "",
                        printable(&e.metrics.join(", "))
                    )
                }
                (None, Some(f)) => {
                    s += &format!(
                        "{:<18} {:<8} {}\n{:<27} {}\n",
                        "(unusable)",
                        "",
                        path,
                        "",
                        printable(&f.message)
                    )
                }
                _ => {}
            }
        }
        if !entries.iter().any(|e| !e.builtin) {
            let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            s += &format!(
                "(no plugin files in {}; pass --plugin-dir or set DRAFTLENS_PLUGIN_PATH)\n",
                if searched.is_empty() {
                    "no plugin folder".to_string()
                } else {
                    searched.join(", ")
                }
            );
        }
        s
    })
}

#[derive(Serialize)]
struct Info<'a> {
    path: &'a std::path::Path,
    sha256: &'a str,
    size: u64,
    contract: String,
    imports: &'a [String],
    exports: &'a [String],
    from_cache: bool,
    load_ms: f64,
    metadata: &'a draftlens_plugin_host::Metadata,
}

fn info_of(p: &LoadedPlugin) -> Info<'_> {
    Info {
        path: &p.path,
        sha256: &p.sha256,
        size: p.size,
        contract: format!("draftlens:metric@{}", p.contract),
        imports: &p.imports,
        exports: &p.exports,
        from_cache: p.from_cache,
        load_ms: p.load_time.as_secs_f64() * 1e3,
        metadata: &p.metadata,
    }
}

/// `plugins info`'s text. Everything but the host's own words is the plugin's text: printed
/// through [`printable`] (no escape sequences or bidi controls), although the host already
/// cleaned it when it loaded the plugin.
fn render_info(i: &Info<'_>) -> String {
    let m = i.metadata;
    let mut s = format!(
        "{} {} — {}\n",
        printable(&m.name),
        printable(&m.version),
        printable(&m.description)
    );
    s += &format!(
        "  file      {} ({} bytes, sha256 {})\n",
        clean(&i.path.display().to_string(), 1024),
        i.size,
        i.sha256
    );
    s += &format!("  contract  {}\n", i.contract);
    s += &format!(
        "  imports   {}\n",
        if i.imports.is_empty() {
            "none".into()
        } else {
            printable(&i.imports.join(", ")).into_owned()
        }
    );
    let inp = &m.inputs;
    s += &format!(
        "  reads     {}, {}, {}\n",
        match inp.candidates {
            0 => "all stored candidates".to_string(),
            1 => "the top-1 candidate".to_string(),
            n => format!("the top-{n} candidates"),
        },
        if inp.draft_logprobs {
            "draft log-probs"
        } else {
            "no draft log-probs"
        },
        if inp.target_topk {
            "the target's top-K"
        } else {
            "not the target's top-K"
        }
    );
    s += &format!(
        "  loaded    {:.1} ms ({})\n",
        i.load_ms,
        if i.from_cache {
            "precompiled cache"
        } else {
            "compiled"
        }
    );
    s += "  metrics\n";
    for x in &m.metrics {
        s += &format!(
            "    {:<24} [{}] {} — {}\n",
            printable(&x.name),
            printable(&x.unit),
            if x.higher_is_better { "↑" } else { "↓" },
            printable(&x.description)
        );
    }
    if !m.params.is_empty() {
        s += "  parameters\n";
        for p in &m.params {
            s += &format!(
                "    {:<24} = {:<16} {}\n",
                printable(&p.name),
                printable(&p.default.to_string()),
                printable(&p.description)
            );
        }
    }
    s
}

fn info(g: &Global, plugin: &str, dirs: &DirArgs, sandbox: &SandboxArgs) -> Result<()> {
    let req = discover::resolve(plugin, &dirs.dirs())?;
    let runtime = sandbox.runtime()?;
    let p = runtime.load_request(&req)?;
    let i = info_of(&p);
    g.emit(&i, || render_info(&i))
}

#[derive(Serialize)]
struct CheckOutput<'a> {
    info: Info<'a>,
    #[serde(flatten)]
    report: &'a draftlens_plugin_host::check::CheckReport,
}

fn check(
    g: &Global,
    file: &std::path::Path,
    params: &[String],
    sandbox: &SandboxArgs,
) -> Result<()> {
    let runtime = sandbox.runtime()?;
    // Same parsing (and checking) as `--param` of run/rescore, with this file as the only plugin.
    let args = PluginArgs {
        plugins: vec![file.display().to_string()],
        params: params.to_vec(),
        ..PluginArgs::default()
    };
    let prepared = args.prepare(&runtime)?.remove(0);
    let p = prepared.plugin?;
    let report = check_plugin(&runtime, &p, &prepared.request.params).map_err(|e| match e {
        CheckError::Failed(f) => anyhow::Error::from(f),
        CheckError::Contract(m) => anyhow::anyhow!(m),
    })?;
    let out = CheckOutput {
        info: info_of(&p),
        report: &report,
    };
    g.emit(&out, || {
        let mut s = render_info(&out.info);
        s += &format!(
            "  check     ok: {} synthetic blocks one-shot, then streamed in {} chunks with per-prompt and \
             per-category groups; results agree, and each of the {} groups scored alone in a fresh instance \
             gives the same values (independent accumulators)\n",
            report.blocks, report.streamed_chunks, report.groups_checked
        );
        s += &render_outcomes(std::slice::from_ref(&report.outcome));
        for l in &report.outcome.logs {
            let times = if l.repeats > 0 { format!(" (×{})", l.repeats + 1) } else { String::new() };
            s += &format!("  log {:?}: {}{times}\n", l.level, l.message);
        }
        s
    })
}

fn new_python(g: &Global, name: &str, dir: &std::path::Path, sdk: Option<PathBuf>) -> Result<()> {
    if sdk.is_some() {
        bail!("--sdk is for Rust plugins; a Python plugin gets draftlens_metric.py in its folder");
    }
    let created = scaffold::new_python_plugin(name, dir)?;
    #[derive(Serialize)]
    struct Created {
        path: PathBuf,
    }
    g.emit(&Created { path: created.clone() }, || {
        format!(
            "created {}\n  pip install componentize-py==0.25.1   # once\n  cd {} && ./build.sh\n  draftlens plugins check {}/{name}.wasm\n",
            created.display(),
            created.display(),
            created.display()
        )
    })
}

fn new(g: &Global, name: &str, dir: &std::path::Path, sdk: Option<PathBuf>) -> Result<()> {
    let created = scaffold::new_plugin(name, dir, sdk.as_deref())?;
    // The lock file pins the SDK's dependencies; without cargo (or offline with an empty cache)
    // the crate is still usable, and the first build writes it.
    let lock = scaffold::write_lock_file(&created);
    if let Err(e) = &lock {
        eprintln!("warning: no Cargo.lock written: {e:#}");
    }
    #[derive(Serialize)]
    struct Created {
        path: PathBuf,
        lock_file: bool,
    }
    g.emit(
        &Created {
            path: created.clone(),
            lock_file: lock.is_ok(),
        },
        || {
            format!(
                "created {}\n  cd {} && cargo test && ./build.sh\n  draftlens plugins check <the .wasm build.sh prints>\n",
                created.display(),
                created.display()
            )
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_options_are_checked() {
        let bad = SandboxArgs {
            plugin_time_limit: 0.0,
            no_plugin_cache: true,
            ..SandboxArgs::default()
        };
        assert!(bad
            .runtime()
            .err()
            .unwrap()
            .to_string()
            .contains("--plugin-time-limit"));
        let bad = SandboxArgs {
            plugin_memory_mib: 0,
            no_plugin_cache: true,
            ..SandboxArgs::default()
        };
        assert!(bad
            .runtime()
            .err()
            .unwrap()
            .to_string()
            .contains("--plugin-memory-mib"));
        let ok = SandboxArgs {
            no_plugin_cache: true,
            ..SandboxArgs::default()
        };
        assert_eq!(ok.runtime().unwrap().limits().memory_bytes, 256 << 20);
    }

    /// A parameter value the plugin itself refuses fails while preparing (before `run` loads a
    /// model), naming the plugin and the value; a good one passes.
    #[test]
    fn parameter_values_are_checked_by_the_plugin_before_any_work() {
        let sandbox = SandboxArgs {
            no_plugin_cache: true,
            ..SandboxArgs::default()
        };
        let rt = sandbox.runtime().unwrap();
        let args = |params: &[&str]| PluginArgs {
            plugins: vec!["ddtree".into(), "topk".into()],
            params: params.iter().map(|s| s.to_string()).collect(),
            dirs: DirArgs::default(),
            sandbox: sandbox.clone(),
        };
        let e = args(&["ddtree:budgets=4,0"])
            .prepare(&rt)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--param for plugin ddtree")
                && e.contains("\"0\" is not a positive integer"),
            "{e}"
        );
        let p = args(&["ddtree:budgets=4,8", "topk:ks=1,2"])
            .prepare(&rt)
            .unwrap();
        assert_eq!(p.len(), 2);
        assert!(p
            .iter()
            .all(|p| p.plugin.as_ref().is_ok_and(|l| l.builtin.is_some())));
        assert_eq!(p[0].request.params.len(), 1);
    }

    #[test]
    fn plugin_options_name_their_problem() {
        let dir =
            std::env::temp_dir().join(format!("draftlens-cmd-plugins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Not wasm: resolved by name, then refused at scoring time (not here), so a bad
        // parameter for it is skipped while the others still get theirs.
        std::fs::write(dir.join("junk.wasm"), b"not wasm").unwrap();
        let sandbox = SandboxArgs {
            no_plugin_cache: true,
            ..SandboxArgs::default()
        };
        let rt = sandbox.runtime().unwrap();
        let args = |plugins: &[&str], params: &[&str]| PluginArgs {
            plugins: plugins.iter().map(|s| s.to_string()).collect(),
            params: params.iter().map(|s| s.to_string()).collect(),
            dirs: DirArgs {
                plugin_dirs: vec![dir.clone()],
            },
            sandbox: sandbox.clone(),
        };
        let reqs = args(&["junk"], &["junk:x=1"]).requests(&rt).unwrap();
        assert_eq!(reqs.len(), 1);
        assert!(reqs[0].params.is_empty());
        // With one plugin the PLUGIN: prefix is optional, and a value may contain ':'.
        let reqs = args(&["junk"], &["x=a:b"]).requests(&rt).unwrap();
        assert_eq!(reqs.len(), 1);
        let e = args(&["nope"], &[]).requests(&rt).unwrap_err().to_string();
        assert!(e.contains("plugin nope not found"), "{e}");
        for bad in ["junk-x", "junk:=1"] {
            let e = args(&["junk"], &[bad])
                .requests(&rt)
                .unwrap_err()
                .to_string();
            assert!(e.contains("expected PLUGIN:NAME=VALUE"), "{bad}: {e}");
        }
        let e = args(&["junk", "junk"], &["x=1"])
            .requests(&rt)
            .unwrap_err()
            .to_string();
        assert!(e.contains("several --plugin are given"), "{e}");
        let e = args(&[], &["x=1"]).requests(&rt).unwrap_err().to_string();
        assert!(e.contains("no --plugin is given"), "{e}");
        let e = args(&["junk"], &["other:x=1"])
            .requests(&rt)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no --plugin named other"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
