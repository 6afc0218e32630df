//! Web UI benchmark (not a timed test): fills a database with 1,000 list runs and two
//! 1,000-prompt runs with records, serves it on loopback, and measures
//! - server time (the Server-Timing header) and client latency, p50/p99, for the run list and
//!   for the comparison of the two 1,000-prompt runs, one request at a time;
//! - requests/s with 50 concurrent keep-alive clients, bounded in count and time, no errors.
//!
//! cargo run --release -p draftlens-web --example bench [-- DB_PATH]
//! Prints a Markdown report (docs/benchmarks-web.md holds the last one).

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

use anyhow::{bail, Result};
use draftlens_results::store::Store;
use draftlens_web::demo::{fill_demo_db, DemoSpec};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::Conn;

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    draftlens_web::stats::quantile_sorted(v, q)
}

struct Sample {
    server_ms: Vec<f64>,
    client_ms: Vec<f64>,
    bytes: usize,
}

async fn sequential(addr: SocketAddr, path: &str, n: usize) -> Result<Sample> {
    let mut c = Conn::open(addr).await?;
    let mut s = Sample {
        server_ms: vec![],
        client_ms: vec![],
        bytes: 0,
    };
    for _ in 0..n {
        let t = Instant::now();
        let r = c.send("GET", path, &[], &[]).await?;
        s.client_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if r.status != 200 {
            bail!("{path}: status {}", r.status);
        }
        let st = r.header("server-timing").unwrap_or("app;dur=nan");
        s.server_ms.push(
            st.trim_start_matches("app;dur=")
                .parse()
                .unwrap_or(f64::NAN),
        );
        s.bytes = r.body.len();
    }
    Ok(s)
}

/// 50 clients, each on its own keep-alive connection, cycling through `paths` until `total`
/// requests are done or `limit` elapses. Returns (requests, errors, seconds).
async fn concurrent(
    addr: SocketAddr,
    paths: &[String],
    clients: usize,
    total: usize,
    limit: Duration,
) -> Result<(usize, usize, f64)> {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (done, errors, paths) = (done.clone(), errors.clone(), paths.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut c = match Conn::open(addr).await {
                Ok(c) => c,
                Err(_) => {
                    errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
            };
            let mut k = i;
            loop {
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= total || t.elapsed() > limit {
                    break;
                }
                match c.send("GET", &paths[k % paths.len()], &[], &[]).await {
                    Ok(r) if r.status == 200 => {}
                    _ => {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                k += 1;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let secs = t.elapsed().as_secs_f64();
    let n = done.load(std::sync::atomic::Ordering::Relaxed).min(total);
    Ok((n, errors.load(std::sync::atomic::Ordering::Relaxed), secs))
}

fn row(name: &str, s: &mut Sample) -> String {
    format!(
        "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {} KiB |",
        pct(&mut s.server_ms, 0.5),
        pct(&mut s.server_ms, 0.99),
        pct(&mut s.client_ms, 0.5),
        pct(&mut s.client_ms, 0.99),
        s.bytes >> 10
    )
}

fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().join("bench.sqlite"));
    let fresh = !db.exists();
    let store = Store::open(&db)?;
    let t = Instant::now();
    let runs = if fresh {
        fill_demo_db(&store, &DemoSpec::bench())?
    } else {
        bail!(
            "{}: exists; give a new path (the benchmark fills it)",
            db.display()
        );
    };
    let fill_s = t.elapsed().as_secs_f64();
    let (a, b) = (runs.checkpoints[0], runs.checkpoints[1]);
    let blocks = store.run(a)?.map(|d| d.run.num_blocks).unwrap_or(0);
    let size_mb = std::fs::metadata(&db)?.len() as f64 / (1 << 20) as f64;
    drop(store);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let db_path = db.clone();
        let app = draftlens_web::app(Store::open(&db)?, false, 1 << 20);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let list = "/".to_string();
        let list_sorted = "/?sort=m0&dir=desc&page=10".to_string();
        let list_filtered = "/?q=qwen3&backend=cpu&sort=m2".to_string();
        let cmp = format!("/compare?runs={a},{b}");

        // Cold: the first comparison derives per-prompt statistics from the stored records
        // (then cached in the database and in memory).
        let t = Instant::now();
        let mut c = Conn::open(addr).await?;
        let r = c.send("GET", &cmp, &[], &[]).await?;
        if r.status != 200 {
            bail!("compare failed: {}", r.text());
        }
        let cold_ms = t.elapsed().as_secs_f64() * 1e3;

        // The comparison's own cost (what a cache miss pays once statistics are loaded).
        let mut direct = Vec::new();
        {
            let store = Store::open(&db_path)?;
            let mut loaded = std::collections::HashMap::new();
            for id in [a, b] {
                let r = store.run(id)?.expect("exists").run;
                loaded.insert(id, std::sync::Arc::new(draftlens_web::analysis::load_stats(&store, &r)?.expect("records")));
            }
            let stats_of = |r: &draftlens_results::store::RunInfo| Ok(loaded.get(&r.id).cloned());
            for _ in 0..20 {
                let t = Instant::now();
                draftlens_web::compare::compare(&store, &[a, b], &Default::default(), &stats_of)?;
                direct.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }

        let mut s_list = sequential(addr, &list, 300).await?;
        let mut s_sorted = sequential(addr, &list_sorted, 300).await?;
        let mut s_filtered = sequential(addr, &list_filtered, 300).await?;
        let mut s_cmp = sequential(addr, &cmp, 100).await?;
        let (n1, e1, t1) = concurrent(addr, &[list.clone(), list_sorted.clone()], 50, 5000, Duration::from_secs(60)).await?;
        let (n2, e2, t2) = concurrent(addr, &[cmp.clone()], 50, 500, Duration::from_secs(60)).await?;
        let (n3, e3, t3) = concurrent(addr, &[list.clone(), cmp.clone(), list_sorted.clone()], 50, 1500, Duration::from_secs(60)).await?;

        println!("## Web UI benchmark\n");
        println!(
            "Database: 1,000 metric-only runs + two 1,000-prompt runs with records ({} blocks each, B = 16, K = 4); {:.0} MiB, filled in {:.1} s.\n",
            blocks, size_mb, fill_s
        );
        println!("Sequential requests on one keep-alive loopback connection (server = Server-Timing, handler to response; client = full round trip):\n");
        println!("| request | server p50 ms | server p99 ms | client p50 ms | client p99 ms | body |");
        println!("|---|---|---|---|---|---|");
        println!("{}", row("run list, page 1 (50 of 1,003 runs, 4 metric columns)", &mut s_list));
        println!("{}", row("run list, page 10 sorted by a metric", &mut s_sorted));
        println!("{}", row("run list, text + facet filter, metric sort", &mut s_filtered));
        println!("{}", row("comparison of two 1,000-prompt runs (warm)", &mut s_cmp));
        println!("\nFirst (cold) comparison, statistics derived from the records and cached: {cold_ms:.0} ms.");
        println!(
            "Comparison computed from scratch with statistics loaded (a cache miss, e.g. after a plugin re-scores a run; 1,000 bootstrap replicates, 8 metrics, 4 CI-banded curves): p50 {:.1} ms, p99 {:.1} ms.\n",
            pct(&mut direct, 0.5),
            pct(&mut direct, 0.99)
        );
        println!("50 concurrent keep-alive clients on loopback (bounded: stops at the request count or 60 s):\n");
        println!("| mix | requests | errors | seconds | requests/s |");
        println!("|---|---|---|---|---|");
        println!("| run list (pages 1 and 10) | {n1} | {e1} | {t1:.2} | {:.0} |", n1 as f64 / t1);
        println!("| comparison | {n2} | {e2} | {t2:.2} | {:.0} |", n2 as f64 / t2);
        println!("| list + comparison mixed | {n3} | {e3} | {t3:.2} | {:.0} |", n3 as f64 / t3);
        if e1 + e2 + e3 > 0 {
            bail!("{} requests failed", e1 + e2 + e3);
        }
        Ok(())
    })
}
