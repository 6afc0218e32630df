//! Test support: a minimal HTTP/1.1 client over tokio (keep-alive, Content-Length and chunked
//! bodies), a WebDriver client on top of it for headless Chromium, and a helper that serves a
//! store on a free loopback port. Only loopback addresses are ever contacted.
#![allow(dead_code)]

use anyhow::{anyhow, bail, Context, Result};
use draftlens_results::store::Store;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One keep-alive connection.
pub struct Conn {
    addr: SocketAddr,
    io: BufReader<TcpStream>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Result<Conn> {
        let s = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect {addr}"))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            addr,
            io: BufReader::new(s),
        })
    }

    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Resp> {
        // A `Host` among `headers` replaces the default (DNS-rebinding tests).
        let mut req = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req.push_str(&format!("Host: {}\r\n", self.addr));
        }
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let s = self.io.get_mut();
        s.write_all(req.as_bytes()).await?;
        s.write_all(body).await?;
        s.flush().await?;
        let mut line = String::new();
        self.io.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .ok_or_else(|| anyhow!("bad status line {line:?}"))?
            .parse()?;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            self.io.read_line(&mut h).await?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        let mut body = Vec::new();
        if let Some(len) = get("content-length") {
            let n: usize = len.parse()?;
            body.resize(n, 0);
            self.io.read_exact(&mut body).await?;
        } else if get("transfer-encoding")
            .map(|t| t.contains("chunked"))
            .unwrap_or(false)
        {
            loop {
                let mut l = String::new();
                self.io.read_line(&mut l).await?;
                let n = usize::from_str_radix(l.trim().split(';').next().unwrap_or("0"), 16)?;
                let mut chunk = vec![0; n + 2];
                self.io.read_exact(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else if status != 204 && status != 304 {
            self.io.read_to_end(&mut body).await?;
        }
        Ok(Resp {
            status,
            headers,
            body,
        })
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> Result<Resp> {
    Conn::open(addr).await?.send("GET", path, &[], &[]).await
}

pub async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<Resp> {
    Conn::open(addr)
        .await?
        .send("GET", path, headers, &[])
        .await
}

pub async fn post_form(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    form: &str,
) -> Result<Resp> {
    let mut h = vec![("Content-Type", "application/x-www-form-urlencoded")];
    h.extend_from_slice(headers);
    Conn::open(addr)
        .await?
        .send("POST", path, &h, form.as_bytes())
        .await
}

/// multipart/form-data upload of one file field named "file".
pub async fn post_file(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    filename: &str,
    content: &[u8],
) -> Result<Resp> {
    let boundary = "----draftlensTestBoundary7MA4YWxkTrZu0gW";
    let mut body = Vec::new();
    body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let ct = format!("multipart/form-data; boundary={boundary}");
    let mut h = vec![("Content-Type", ct.as_str())];
    h.extend_from_slice(headers);
    Conn::open(addr).await?.send("POST", path, &h, &body).await
}

/// Serves `db` on a free loopback port; the server lives as long as the runtime.
pub async fn serve(db: &Path, team: bool, max_upload: usize) -> Result<SocketAddr> {
    let store = Store::open(db)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = draftlens_web::app(store, team, max_upload);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

// ---------------------------------------------------------------------------------------------
// WebDriver (W3C) over the client above, for Debian's chromium + chromium-driver.
// ---------------------------------------------------------------------------------------------

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Why the browser tests cannot run here, if they cannot.
pub fn browser_missing() -> Option<String> {
    for p in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(p).exists() {
            return Some(format!(
                "{p} is not installed (apt-get install -y chromium chromium-driver)"
            ));
        }
    }
    None
}

pub struct Browser {
    driver: tokio::process::Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

impl Browser {
    pub async fn start(width: u32, height: u32) -> Result<Browser> {
        let port = free_port()?;
        let driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start chromedriver")?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let profile = tempfile::tempdir()?;
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--disable-background-networking", "--disable-component-update", "--disable-sync",
                         "--no-first-run", "--disable-quic", "--hide-scrollbars",
                         format!("--window-size={width},{height}"),
                         format!("--user-data-dir={}", profile.path().display())]
            }
        }}});
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let session = loop {
            match Conn::open(addr).await {
                Ok(mut c) => {
                    let r = c
                        .send(
                            "POST",
                            "/session",
                            &[("Content-Type", "application/json")],
                            caps.to_string().as_bytes(),
                        )
                        .await?;
                    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
                    let id = v["value"]["sessionId"]
                        .as_str()
                        .ok_or_else(|| anyhow!("no WebDriver session: {}", r.text()))?;
                    break id.to_string();
                }
                Err(_) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await
                }
                Err(e) => return Err(e.context("chromedriver did not come up")),
            }
        };
        Ok(Browser {
            driver,
            addr,
            session,
            _profile: profile,
        })
    }

    async fn cmd(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value> {
        let p = format!("/session/{}{}", self.session, path);
        let b = body.map(|b| b.to_string()).unwrap_or_default();
        let r = Conn::open(self.addr)
            .await?
            .send(
                method,
                &p,
                &[("Content-Type", "application/json")],
                b.as_bytes(),
            )
            .await?;
        let v: serde_json::Value = serde_json::from_slice(&r.body)
            .with_context(|| format!("WebDriver {path}: {}", r.text()))?;
        if r.status != 200 {
            bail!(
                "WebDriver {method} {path} failed ({}): {}",
                r.status,
                v["value"]["message"]
            );
        }
        Ok(v["value"].clone())
    }

    pub async fn goto(&self, url: &str) -> Result<()> {
        self.cmd("POST", "/url", Some(serde_json::json!({"url": url})))
            .await?;
        Ok(())
    }

    pub async fn url(&self) -> Result<String> {
        Ok(self
            .cmd("GET", "/url", None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Runs a script (the body of a function) and returns its value.
    pub async fn js(&self, script: &str) -> Result<serde_json::Value> {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(serde_json::json!({"script": script, "args": []})),
        )
        .await
    }

    pub async fn find(&self, css: &str) -> Result<String> {
        let v = self
            .cmd(
                "POST",
                "/element",
                Some(serde_json::json!({"using": "css selector", "value": css})),
            )
            .await?;
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(|x| x.as_str())
            .map(String::from)
            .ok_or_else(|| anyhow!("no element {css}"))
    }

    pub async fn click(&self, css: &str) -> Result<()> {
        let id = self.find(css).await?;
        // Centre it first, as a person would scroll: sticky bars cover the edges.
        self.cmd("POST", "/execute/sync", Some(serde_json::json!({"script": "document.querySelector(arguments[0]).scrollIntoView({block: 'center'})", "args": [css]})))
            .await?;
        self.cmd(
            "POST",
            &format!("/element/{id}/click"),
            Some(serde_json::json!({})),
        )
        .await?;
        Ok(())
    }

    /// Types `text` into the element (for a file input: the path of the file to upload).
    pub async fn send_keys(&self, css: &str, text: &str) -> Result<()> {
        let id = self.find(css).await?;
        self.cmd(
            "POST",
            &format!("/element/{id}/value"),
            Some(serde_json::json!({"text": text})),
        )
        .await?;
        Ok(())
    }

    /// The visible text of the page.
    pub async fn text(&self) -> Result<String> {
        Ok(self
            .js("return document.body.innerText")
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Waits until `script` returns true (polls for up to 10 s).
    pub async fn wait_for(&self, script: &str) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if self.js(script).await?.as_bool() == Some(true) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!("timed out waiting for: {script}");
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    pub async fn set_size(&self, width: u32, height: u32) -> Result<()> {
        self.cmd(
            "POST",
            "/window/rect",
            Some(serde_json::json!({"width": width, "height": height})),
        )
        .await?;
        Ok(())
    }

    /// PNG of the viewport.
    pub async fn screenshot(&self) -> Result<Vec<u8>> {
        use base64::Engine;
        let v = self.cmd("GET", "/screenshot", None).await?;
        Ok(base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap_or_default())?)
    }

    /// Screenshot of the whole page (window grown to the document height, at most `max_h`).
    pub async fn full_screenshot(&self, width: u32, max_h: u32, to: &Path) -> Result<()> {
        self.js("window.scrollTo(0, 0); return 0").await?;
        let h = self
            .js("return Math.ceil(document.documentElement.scrollHeight)")
            .await?
            .as_u64()
            .unwrap_or(1000) as u32;
        self.set_size(width, h.clamp(600, max_h) + 90).await?;
        // Let charts re-layout after the resize.
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        self.js("window.scrollTo(0, 0); return 0").await?;
        let png = self.screenshot().await?;
        if let Some(d) = to.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(to, png).with_context(|| format!("{}: cannot write", to.display()))?;
        Ok(())
    }

    pub async fn quit(mut self) -> Result<()> {
        let _ = self.cmd("DELETE", "", None).await;
        let _ = self.driver.kill().await;
        Ok(())
    }
}

pub fn screenshots_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join("docs")
        .join("screenshots")
}

// ---------------------------------------------------------------------------------------------
// Hostile fixtures
// ---------------------------------------------------------------------------------------------

/// Markup that would run script if any of it reached the page unescaped.
pub const EVIL: &str = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=1\">";

/// A complete run whose name, prompt text, token pieces, metric text and plugin failure all
/// carry `EVIL`. Returns its id.
pub fn hostile_run(store: &Store) -> Result<i64> {
    use draftlens_records::RecordBatch;
    use draftlens_results::store::{MetricRow, MetricScope, NewRun, RunPrompt, RunStatus};
    let tok = "evil-tokenizer";
    let pieces: Vec<String> = (0..64)
        .map(|i| {
            if i % 7 == 0 {
                format!("{EVIL}{i}")
            } else {
                format!(" t{i}")
            }
        })
        .collect();
    store.put_vocab(tok, "evil", &pieces)?;
    let id = store.create_run(&NewRun {
        name: format!("evil run {EVIL}"),
        config: serde_json::json!({"note": EVIL, "</script>": "x"}),
        target_arch: format!("arch{EVIL}"),
        drafter_series: format!("series{EVIL}"),
        drafter_step: Some(5),
        prompt_set_name: format!("set{EVIL}"),
        prompt_set_sha256: "evilset".into(),
        backend: "cpu".into(),
        block_size: 4,
        top_k: 2,
        tokenizer_sha256: Some(tok.into()),
        ..Default::default()
    })?;
    let ids: Vec<u32> = (0..30).map(|i| (i * 7) % 64).collect();
    store.add_prompt(
        id,
        &RunPrompt {
            index: 0,
            id: format!("p{EVIL}"),
            sha256: "evil-prompt-sha".into(),
            category: Some(format!("cat{EVIL}")),
            prompt_len: 10,
            token_ids: ids.clone(),
            text: format!("prompt text {EVIL}"),
        },
    )?;
    let mut b = RecordBatch::new(4, 2);
    for a in 10..30u32 {
        b.prompt_index.push(0);
        b.anchor.push(a);
        b.region.push(0);
        for k in 1..=3u32 {
            let pos = a + k;
            let valid = pos < 30;
            let t = if valid { ids[pos as usize] } else { 0 };
            b.target.push(t);
            b.valid.push(valid as u8);
            b.loss_mask.push(1);
            let top1 = if (a + k) % 3 == 0 { 0 } else { t };
            b.draft_ids.extend([top1, 7]);
            b.draft_logprobs.extend([-0.3, -1.9]);
        }
    }
    store.add_records(id, &b)?;
    let mut m = MetricRow::scalar("evil-plugin", "score", MetricScope::Run, 1.5, 1, true);
    m.description = EVIL.into();
    m.unit = EVIL.into();
    store.add_metrics(id, &[m])?;
    store.add_plugin_failure(id, "evil-plugin", "trap", EVIL)?;
    store.finish_run(id, RunStatus::Complete, None, &serde_json::json!({}))?;
    Ok(id)
}
