//! The hidden-state cache shared by many processes at once (docs/scale-out.md, "Shared cache"),
//! tested with real processes: this test binary re-runs itself as writers and readers (the
//! ignored `child` test, driven by environment variables).
//!
//! - Writers of the same entries and of different entries run while readers read: every entry a
//!   reader sees is complete and equal to what was written (never corrupt), each shared entry is
//!   published exactly once, and no writer leaves a temp file.
//! - A writer SIGKILLed in the middle of writing a 32 MiB entry leaves only a hidden temp file
//!   that no reader or listing takes for an entry, and that `gc` removes once stale.
//! - `gc` keeps the budget and evicts least recently used entries first; a hit refreshes an
//!   entry's clock only when it is older than the touch interval.
//!
//! `eight_writers_throughput` (ignored; run by hand) is the measurement in docs/scale-out.md.

use draftlens_engine::hidden_cache::{
    CacheKey, CachedData, CachedTensor, HiddenCache, Lookup, TOUCH_INTERVAL,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

const CHILD: &str = "DRAFTLENS_CACHE_CHILD";

fn key(n: u64) -> CacheKey {
    CacheKey {
        kind: "taps".into(),
        weights: "shared-cache-test".into(),
        tokenizer: "t".into(),
        token_ids: vec![n as u32],
        layers: vec![1, 2],
        backend: "cpu".into(),
        dtype: "f32".into(),
        kernel_version: "k".into(),
        extra: String::new(),
    }
}

/// The content of entry `n`: a function of `n`, so any reader can check what it got.
fn tensors(n: u64, floats: usize) -> Vec<CachedTensor> {
    vec![CachedTensor {
        name: "h".into(),
        shape: vec![floats],
        data: CachedData::F32(
            (0..floats as u64)
                .map(|i| ((n * 1_000_003 + i) % 65_521) as f32)
                .collect(),
        ),
    }]
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"))
}

/// Comma-separated keys and `a..b` ranges.
fn parse_keys(s: &str) -> Vec<u64> {
    s.split(',')
        .flat_map(|part| match part.split_once("..") {
            Some((a, b)) => (a.parse().unwrap()..b.parse().unwrap()).collect::<Vec<u64>>(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}

/// The helper process: does nothing unless a test spawned it with `DRAFTLENS_CACHE_CHILD`.
/// Prints one `STATS {json}` line.
#[test]
#[ignore = "helper process of the shared-cache tests"]
fn child() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let cache = HiddenCache::open(Path::new(&env("DL_ROOT"))).unwrap();
    let keys = parse_keys(&env("DL_KEYS"));
    let floats: usize = env("DL_FLOATS").parse().unwrap();
    let t = Instant::now();
    let mut stats = serde_json::json!({});
    match mode.as_str() {
        "write" => {
            let (mut published, mut present, mut retries, mut bytes) = (0u64, 0u64, 0u64, 0u64);
            for &n in &keys {
                let o = cache.put_outcome(&key(n), &tensors(n, floats)).unwrap();
                if o.published {
                    published += 1;
                    bytes += std::fs::metadata(&o.path).unwrap().len();
                } else {
                    present += 1;
                }
                retries += o.retries as u64;
            }
            stats = serde_json::json!({ "published": published, "present": present,
                "retries": retries, "bytes": bytes });
        }
        "read" => {
            // Until the stop file exists: every hit must be exactly the written content.
            let stop = PathBuf::from(env("DL_STOP"));
            let (mut hits, mut misses) = (0u64, 0u64);
            while !stop.exists() {
                for &n in &keys {
                    match cache.lookup(&key(n)).unwrap() {
                        Lookup::Hit(t) => {
                            assert_eq!(t, tensors(n, floats), "entry {n} read back different");
                            hits += 1;
                        }
                        Lookup::Miss => misses += 1,
                        Lookup::Corrupt { path, problem } => {
                            panic!(
                                "{}: a reader saw a corrupt entry: {problem}",
                                path.display()
                            )
                        }
                    }
                }
            }
            stats = serde_json::json!({ "hits": hits, "misses": misses });
        }
        "slow" => loop {
            // Killed by the test while writing.
            for &n in &keys {
                cache.put(&key(n), &tensors(n, floats)).unwrap();
            }
        },
        other => panic!("unknown child mode {other}"),
    }
    stats["seconds"] = t.elapsed().as_secs_f64().into();
    println!("STATS {stats}");
}

fn spawn(root: &Path, mode: &str, keys: &str, floats: usize, stop: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, mode)
        .env("DL_ROOT", root)
        .env("DL_KEYS", keys)
        .env("DL_FLOATS", floats.to_string())
        .env("DL_STOP", stop)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a child and returns its STATS; panics with its output if it failed.
fn stats(c: Child, what: &str) -> serde_json::Value {
    let o = c.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{what} failed: {:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let line = out
        .lines()
        .find_map(|l| l.split_once("STATS ").map(|x| x.1))
        .unwrap_or_else(|| panic!("{what}: no STATS line in\n{out}"));
    serde_json::from_str(line).unwrap()
}

/// Every file in the shard directories: (entries, hidden temp files).
fn files(root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut entries, mut temps) = (Vec::new(), Vec::new());
    for d in std::fs::read_dir(root).unwrap().flatten() {
        if d.file_name().len() != 2 || !d.path().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(d.path()).unwrap().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                assert!(name.contains(".tmp."), "unexpected hidden file {name}");
                temps.push(f.path());
            } else {
                assert!(name.ends_with(".safetensors"), "unexpected file {name}");
                entries.push(f.path());
            }
        }
    }
    (entries, temps)
}

fn set_mtime(p: &Path, t: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

#[test]
fn concurrent_writers_readers_and_a_killed_writer_leave_only_valid_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("cache");
    let stop = tmp.path().join("stop");
    std::fs::create_dir_all(&root).unwrap();
    let floats = 64 << 10; // 256 KiB per entry
    let shared = "0..24";

    // The slow writer first: 32 MiB entries, killed once its first temp file exists.
    let slow = spawn(&root, "slow", "5000..5004", 8 << 20, &stop);
    let slow_pid = slow.id();
    let readers: Vec<Child> = (0..3)
        .map(|_| spawn(&root, "read", "0..24,1000,2000", floats, &stop))
        .collect();
    let same: Vec<Child> = (0..4)
        .map(|_| spawn(&root, "write", shared, floats, &stop))
        .collect();
    let distinct: Vec<Child> = (1..=4)
        .map(|w| {
            spawn(
                &root,
                "write",
                &format!("{}..{}", w * 1000, w * 1000 + 12),
                floats,
                &stop,
            )
        })
        .collect();

    let marker = format!(".{slow_pid}.");
    let t = Instant::now();
    let mut slow = slow;
    loop {
        let (_, temps) = files(&root);
        if temps.iter().any(|p| p.to_string_lossy().contains(&marker)) {
            slow.kill().unwrap(); // SIGKILL
            slow.wait().unwrap();
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the slow writer never started writing"
        );
        std::thread::sleep(Duration::from_millis(2));
    }

    let same: Vec<_> = same
        .into_iter()
        .enumerate()
        .map(|(i, c)| stats(c, &format!("writer {i} of the shared keys")))
        .collect();
    for (i, c) in distinct.into_iter().enumerate() {
        let s = stats(c, &format!("writer {i} of its own keys"));
        assert_eq!(s["published"], 12, "{s}");
    }
    std::fs::write(&stop, "").unwrap();
    let reads: Vec<_> = readers
        .into_iter()
        .enumerate()
        .map(|(i, c)| stats(c, &format!("reader {i}")))
        .collect();

    // Each shared entry was published exactly once: later writers found it (link never
    // replaces), so no reader could have read a file replaced under it.
    let published: u64 = same.iter().map(|s| s["published"].as_u64().unwrap()).sum();
    let present: u64 = same.iter().map(|s| s["present"].as_u64().unwrap()).sum();
    assert_eq!(published, 24, "{same:?}");
    assert_eq!(present, 3 * 24, "{same:?}");
    let hits: u64 = reads.iter().map(|s| s["hits"].as_u64().unwrap()).sum();
    assert!(hits > 0, "the readers never saw an entry: {reads:?}");

    // Every entry verifies and reads back equal; the killed writer's keys are absent or valid.
    let cache = HiddenCache::open(&root).unwrap();
    for (path, r) in cache.verify().unwrap() {
        assert!(r.is_ok(), "{}: {r:?}", path.display());
    }
    for n in (0..24).chain((1..=4).flat_map(|w| w * 1000..w * 1000 + 12)) {
        assert_eq!(
            cache.get(&key(n)).unwrap(),
            Some(tensors(n, floats)),
            "entry {n}"
        );
    }
    let listed = cache.list().unwrap();
    let slow_entries = listed
        .iter()
        .filter(|l| l.key.as_ref().is_some_and(|k| k.token_ids[0] >= 5000))
        .count();
    assert_eq!(listed.len(), 24 + 4 * 12 + slow_entries);
    assert!(listed.iter().all(|l| l.problem.is_none()));

    // Debris: only the killed writer's temp file, hidden from readers and listings.
    let (entries, temps) = files(&root);
    assert_eq!(entries.len(), listed.len());
    assert!(!temps.is_empty(), "the killed writer's temp file vanished");
    for t in &temps {
        assert!(
            t.to_string_lossy().contains(&marker),
            "a writer that exited normally left {}",
            t.display()
        );
    }
    // Not stale yet: gc leaves it (its writer might be alive on another machine).
    assert_eq!(cache.gc(u64::MAX).unwrap().temp_files, 0);
    let old = SystemTime::now()
        - draftlens_engine::hidden_cache::STALE_TEMP_AGE
        - Duration::from_secs(60);
    for t in &temps {
        set_mtime(t, old);
    }
    let r = cache.gc(u64::MAX).unwrap();
    assert_eq!((r.temp_files, r.evicted), (temps.len(), 0), "{r:?}");
    assert!(files(&root).1.is_empty());
}

#[test]
fn gc_keeps_the_budget_and_evicts_least_recently_used_first() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = HiddenCache::open(tmp.path()).unwrap();
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    let paths: Vec<PathBuf> = (0..6u64)
        .map(|n| {
            let p = cache.put(&key(n), &tensors(n, 1000)).unwrap();
            // Entry 0 was used longest ago, entry 5 most recently.
            set_mtime(&p, now - hour * (10 - n as u32));
            p
        })
        .collect();
    let size = |p: &PathBuf| std::fs::metadata(p).unwrap().len();
    let mtime = |p: &PathBuf| std::fs::metadata(p).unwrap().modified().unwrap();

    // A hit on an entry last used 10 h ago moves it to the front of the LRU order ...
    assert!(cache.get(&key(0)).unwrap().is_some());
    assert!(mtime(&paths[0]) > now - Duration::from_secs(60));
    // ... one used within the touch interval is not written at all.
    let recent = now - TOUCH_INTERVAL / 2;
    set_mtime(&paths[5], recent);
    assert!(cache.get(&key(5)).unwrap().is_some());
    assert_eq!(mtime(&paths[5]), recent);

    // Budget for three entries: 1, 2 and 3 (the least recently used) go.
    let budget = size(&paths[0]) + size(&paths[4]) + size(&paths[5]);
    let r = cache.gc(budget).unwrap();
    assert_eq!(
        (r.entries_before, r.evicted, r.entries_after),
        (6, 3, 3),
        "{r:?}"
    );
    assert!(r.bytes_after <= budget);
    for n in 0..6u64 {
        let kept = cache.get(&key(n)).unwrap().is_some();
        assert_eq!(kept, [0, 4, 5].contains(&n), "entry {n}");
    }
    // Within budget: nothing to do.
    assert_eq!(cache.gc(budget).unwrap().evicted, 0);
    let r = cache.gc(0).unwrap();
    assert_eq!((r.evicted, r.bytes_after), (3, 0));
    assert!(cache.list().unwrap().is_empty());
}

/// The measurement of docs/scale-out.md: 8 writer processes, half of their entries shared with
/// every other writer, half their own, while 2 readers read. Run by hand:
/// `DL_ENTRIES=64 DL_FLOATS=1048576 cargo test --workspace --release --test hidden_cache_shared -- --ignored eight_writers --nocapture`
/// (`DL_CACHE_ROOT` points it at another filesystem, e.g. an NFS mount).
#[test]
#[ignore = "measurement, run by hand"]
fn eight_writers_throughput() {
    let n: u64 = std::env::var("DL_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let floats: usize = std::env::var("DL_FLOATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20);
    let tmp = match std::env::var("DL_CACHE_ROOT") {
        Ok(dir) => tempfile::tempdir_in(dir).unwrap(),
        Err(_) => tempfile::tempdir().unwrap(),
    };
    let root = tmp.path().join("cache");
    let stop = tmp.path().join("stop");
    std::fs::create_dir_all(&root).unwrap();
    let half = n / 2;
    let t = Instant::now();
    let readers: Vec<Child> = (0..2)
        .map(|_| spawn(&root, "read", &format!("0..{half}"), floats, &stop))
        .collect();
    let writers: Vec<Child> = (0..8u64)
        .map(|w| {
            // Shared keys first, in a writer-specific rotation, then the writer's own.
            let mut keys: Vec<u64> = (0..half).map(|i| (i + w * half / 8) % half).collect();
            keys.extend((0..n - half).map(|i| 100_000 * (w + 1) + i));
            let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            spawn(&root, "write", &keys.join(","), floats, &stop)
        })
        .collect();
    let ws: Vec<_> = writers
        .into_iter()
        .enumerate()
        .map(|(i, c)| stats(c, &format!("writer {i}")))
        .collect();
    let wall = t.elapsed().as_secs_f64();
    std::fs::write(&stop, "").unwrap();
    let rs: Vec<_> = readers
        .into_iter()
        .enumerate()
        .map(|(i, c)| stats(c, &format!("reader {i}")))
        .collect();
    let sum = |v: &[serde_json::Value], k: &str| -> u64 {
        v.iter().map(|s| s[k].as_u64().unwrap()).sum()
    };
    let bytes = sum(&ws, "bytes");
    let published = sum(&ws, "published");
    println!(
        "8 writers x {n} entries of {:.1} MiB ({half} shared by all, {} own each): wall {wall:.2} s, \
         {published} entries published ({:.1} MiB, {:.1} MiB/s, {:.1} entries/s), {} found already \
         published, {} publish retries; 2 readers: {} hits, {} misses, 0 corrupt",
        floats as f64 * 4.0 / 1048576.0,
        n - half,
        bytes as f64 / 1048576.0,
        bytes as f64 / 1048576.0 / wall,
        published as f64 / wall,
        sum(&ws, "present"),
        sum(&ws, "retries"),
        sum(&rs, "hits"),
        sum(&rs, "misses"),
    );
    assert_eq!(published, half + 8 * (n - half));
    let cache = HiddenCache::open(&root).unwrap();
    assert!(cache.verify().unwrap().iter().all(|(_, r)| r.is_ok()));
}
