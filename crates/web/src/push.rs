//! `draftlens push`: upload runs with their records to a team server (`draftlens serve --team`),
//! one run at a time, resumably (docs/scale-out.md, "Push"; the server side is
//! `server/push.rs`).
//!
//! Per run: if the server already has the run's uid, nothing is sent (pushing twice stores
//! once). Otherwise the run is exported as a one-run bundle (the format `import` reads, records
//! included), whose bytes are a function of the stored run (its `created_at` is the run's own
//! time, not now), and uploaded in chunks to the upload named by the bundle's sha256 and size.
//! After a dropped connection or a server error the client waits and asks the server where
//! the upload stands, then sends the rest: bytes already acknowledged are never sent again,
//! even by a later `push` of the same run. The server checks the whole bundle's sha256 before
//! importing it in one transaction.

use crate::bundle::export_bundle;
use anyhow::{bail, Context, Result};
use draftlens_results::store::{RunStatus, Store};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// How `push` reaches the server.
#[derive(Clone, Debug)]
pub struct PushOptions {
    /// Base URL, e.g. `http://evalbox:8080`.
    pub server: String,
    /// Bearer token (a write token on a team server).
    pub token: Option<String>,
    /// Bytes per chunk request (lowered to the server's limit when that is smaller).
    pub chunk_bytes: usize,
    /// Attempts per run before giving up (each after a transport failure or a 5xx answer).
    pub attempts: u32,
    /// Wait before the first retry; doubled after each, up to 30 s.
    pub retry_delay: Duration,
}

impl PushOptions {
    pub const DEFAULT_CHUNK: usize = 8 << 20;

    pub fn new(server: &str, token: Option<String>) -> PushOptions {
        PushOptions {
            server: server.trim_end_matches('/').to_string(),
            token,
            chunk_bytes: Self::DEFAULT_CHUNK,
            attempts: 8,
            retry_delay: Duration::from_secs(1),
        }
    }
}

/// What happened to one run.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PushedRun {
    pub uid: String,
    pub name: String,
    /// `"uploaded"` or `"already-present"`.
    pub outcome: String,
    /// Size of the bundle (0 when already present).
    pub bundle_bytes: u64,
    /// Bytes this push sent (less than the bundle when it resumed an earlier upload).
    pub sent_bytes: u64,
    /// Failed attempts that were retried.
    pub retries: u32,
    /// The server's offset each retry resumed from.
    pub resumed_at: Vec<u64>,
    /// What the server did with the evaluation of a shard run (merged, waiting for shards,
    /// refused: docs/scale-out.md §9), one line per evaluation.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub server: Vec<String>,
}

/// Why one request did not succeed.
enum Failure {
    /// Worth another attempt: the connection dropped, a timeout, a 5xx.
    Retry(String),
    /// Retrying cannot help: a refused token, the size cap, a bundle the server rejects.
    Fatal(anyhow::Error),
}

struct Client {
    agent: ureq::Agent,
    opts: PushOptions,
}

type Reply = std::result::Result<(u16, serde_json::Value), Failure>;

impl Client {
    fn new(opts: &PushOptions) -> Result<Client> {
        if !(opts.server.starts_with("http://") || opts.server.starts_with("https://")) {
            bail!(
                "--server {:?}: expected an http:// or https:// URL",
                opts.server
            );
        }
        use ureq::tls::{RootCerts, TlsConfig};
        let agent = ureq::Agent::config_builder()
            .tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::PlatformVerifier)
                    .build(),
            )
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(600)))
            .http_status_as_error(false)
            .user_agent(concat!("draftlens/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Client {
            agent,
            opts: opts.clone(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.opts.server)
    }

    /// One request; the JSON answer with its status, or why there is none.
    fn call(&self, method: &str, path: &str, body: Option<&[u8]>) -> Reply {
        let url = self.url(path);
        let auth = self.opts.token.as_ref().map(|t| format!("Bearer {t}"));
        let resp = if method == "GET" {
            let mut r = self.agent.get(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        } else {
            let mut r = self
                .agent
                .post(&url)
                .header("Content-Type", "application/octet-stream");
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.send(body.unwrap_or(&[]))
        };
        let mut resp = match resp {
            Ok(r) => r,
            Err(e) => return Err(classify(&url, e)),
        };
        let status = resp.status().as_u16();
        let text = match resp.body_mut().read_to_string() {
            Ok(t) => t,
            Err(e) => return Err(classify(&url, e)),
        };
        let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        match status {
            401 | 403 => Err(Failure::Fatal(anyhow::anyhow!(
                "{url}: HTTP {status}: the server refused the token (a team server needs a write token: set DRAFTLENS_TOKEN or pass --token-file)"
            ))),
            408 | 429 | 500..=599 => Err(Failure::Retry(format!("{url}: HTTP {status}"))),
            _ => Ok((status, json)),
        }
    }
}

fn classify(url: &str, e: ureq::Error) -> Failure {
    match e {
        ureq::Error::Io(_)
        | ureq::Error::Timeout(_)
        | ureq::Error::ConnectionFailed
        | ureq::Error::Protocol(_) => Failure::Retry(format!("{url}: {e}")),
        e => Failure::Fatal(anyhow::anyhow!("{url}: {e}")),
    }
}

fn server_error(status: u16, v: &serde_json::Value, what: &str) -> anyhow::Error {
    let msg = v["error"].as_str().unwrap_or("no explanation");
    anyhow::anyhow!("{what}: the server answered HTTP {status}: {msg}")
}

/// Pushes the runs `ids` of `store`; stops at the first run that cannot be pushed (earlier
/// runs stay pushed).
pub fn push_runs(store: &Store, ids: &[i64], opts: &PushOptions) -> Result<Vec<PushedRun>> {
    let client = Client::new(opts)?;
    let mut out = Vec::new();
    for &id in ids {
        let d = store
            .run(id)?
            .with_context(|| format!("{}: no run {id}", store.path().display()))?;
        let run = d.run;
        if run.status == RunStatus::Running {
            bail!(
                "{}: run {} ({}) is still running; push it once it has finished",
                store.path().display(),
                run.id,
                run.name
            );
        }
        let what = format!("run {} ({})", run.uid, run.name);
        out.push(push_one(&client, store, id, &run.uid, &run.name, &what)?);
    }
    Ok(out)
}

/// The bundle of one run, byte-identical for an unchanged stored run.
pub fn run_bundle_bytes(store: &Store, id: i64) -> Result<Vec<u8>> {
    let mut b = export_bundle(store, &[id], true)?;
    let run = &b.runs[0].run;
    b.created_at = run.finished_at.clone().unwrap_or(run.created_at.clone());
    Ok(serde_json::to_vec(&b)?)
}

fn push_one(
    c: &Client,
    store: &Store,
    id: i64,
    uid: &str,
    name: &str,
    what: &str,
) -> Result<PushedRun> {
    let mut pushed = PushedRun {
        uid: uid.to_string(),
        name: name.to_string(),
        outcome: "already-present".into(),
        bundle_bytes: 0,
        sent_bytes: 0,
        retries: 0,
        resumed_at: Vec::new(),
        server: Vec::new(),
    };
    let mut bundle: Option<(Vec<u8>, String)> = None;
    let mut delay = c.opts.retry_delay;
    loop {
        match attempt(c, store, id, uid, what, &mut bundle, &mut pushed) {
            Ok(()) => return Ok(pushed),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Retry(why)) => {
                pushed.retries += 1;
                if pushed.retries >= c.opts.attempts {
                    bail!(
                        "{what}: giving up after {} attempts; last: {why} (push again to resume)",
                        pushed.retries
                    );
                }
                tracing::warn!("{what}: {why}; retrying in {:.1} s", delay.as_secs_f64());
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// One attempt: skip if present, else start or resume the upload, send the rest, finish.
fn attempt(
    c: &Client,
    store: &Store,
    id: i64,
    uid: &str,
    what: &str,
    bundle: &mut Option<(Vec<u8>, String)>,
    pushed: &mut PushedRun,
) -> std::result::Result<(), Failure> {
    let fatal = |e: anyhow::Error| Failure::Fatal(e);
    // Also after a finish whose answer was lost: the server has the run, nothing to resend.
    let (status, v) = c.call("GET", &format!("/api/runs/{uid}"), None)?;
    match status {
        200 if v["exists"] == true => {
            if pushed.sent_bytes > 0 {
                pushed.outcome = "uploaded".into();
            }
            return Ok(());
        }
        404 => {}
        _ => return Err(fatal(server_error(status, &v, what))),
    }
    if bundle.is_none() {
        let bytes = run_bundle_bytes(store, id).map_err(fatal)?;
        let sha = hex::encode(Sha256::digest(&bytes));
        *bundle = Some((bytes, sha));
    }
    let (bytes, sha) = bundle.as_ref().expect("set above");
    let size = bytes.len() as u64;
    pushed.bundle_bytes = size;
    let (status, v) = c.call(
        "POST",
        &format!("/api/uploads?sha256={sha}&size={size}"),
        Some(&[]),
    )?;
    if status != 200 {
        return Err(fatal(server_error(status, &v, what)));
    }
    let upload = v["id"].as_str().unwrap_or_default().to_string();
    let mut offset = v["offset"].as_u64().unwrap_or(0);
    if pushed.retries > 0 {
        pushed.resumed_at.push(offset);
    }
    let chunk = c
        .opts
        .chunk_bytes
        .min(v["max_bytes"].as_u64().unwrap_or(u64::MAX) as usize)
        .max(1);
    while offset < size {
        let end = (offset as usize + chunk).min(bytes.len());
        let (status, v) = c.call(
            "POST",
            &format!("/api/uploads/{upload}/chunk?offset={offset}"),
            Some(&bytes[offset as usize..end]),
        )?;
        match status {
            200 => {
                pushed.sent_bytes += (end - offset as usize) as u64;
                offset = v["offset"].as_u64().unwrap_or(end as u64);
            }
            // Someone else (an earlier attempt whose answer was lost) moved the offset.
            409 if v["offset"].is_u64() => offset = v["offset"].as_u64().unwrap_or(0),
            _ => return Err(fatal(server_error(status, &v, what))),
        }
    }
    let (status, v) = c.call("POST", &format!("/api/uploads/{upload}/finish"), Some(&[]))?;
    match status {
        200 => {
            pushed.outcome = "uploaded".into();
            pushed.server = v["merges"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|m| m["message"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            Ok(())
        }
        // Finished by an earlier attempt whose answer was lost: the next attempt's check of
        // the run settles it.
        404 => Err(Failure::Retry(format!("{what}: upload {upload} is gone"))),
        _ => Err(fatal(server_error(status, &v, what))),
    }
}
