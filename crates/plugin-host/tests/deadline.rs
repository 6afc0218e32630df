//! The wall-clock limit holds under CPU load, and a plugin that loops in `describe` costs one
//! time limit to load.
//!
//! The limit is checked against the real clock at every epoch tick (crates/plugin-host/src/job.rs),
//! so a ticker thread that wakes late under load delays the stop by about one late tick instead
//! of stretching the whole limit (counting ticks overshot by 15-24 % under load).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use draftlens_plugin_host::sdk::testdata::{random, Shape};
use draftlens_plugin_host::{FailureKind, Grouping, Param, ParamValue};

/// The tests of this file time themselves: one at a time, so that one's busy threads do not
/// slow the other's compilation (on a 2-core CI machine that added 4 s to a 3 s limit).
static SERIAL: Mutex<()> = Mutex::new(());

/// Busy threads, 2 per core (at least 4), until dropped.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start() -> Load {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get()) * 2;
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n.max(4))
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = std::hint::black_box(x.wrapping_mul(6364136223846793005) ^ 1);
                        }
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Allowed overshoot: 10 % of the limit plus 100 ms for being scheduled again on a loaded
/// 2-core machine.
fn bound(limit: Duration) -> Duration {
    limit / 10 + Duration::from_millis(100)
}

#[test]
fn the_time_limit_holds_under_cpu_load() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limit = Duration::from_secs(2);
    let rt = common::runtime(limit, 64);
    let plugin = rt.load(&common::guest("hostile")).unwrap();
    let batch = random(5, &Shape::new(8, 4, 3, 5, 30), 0.6, 0.2);
    let looping = [Param {
        name: "mode".into(),
        value: ParamValue::Text("loop".into()),
    }];
    let _load = Load::start();
    std::thread::sleep(Duration::from_millis(200));
    let mut over = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let o = rt.score(&plugin, &looping, &batch, &Grouping::default());
        let took = t.elapsed();
        let f = o.failure.expect("the loop is stopped");
        assert_eq!(f.kind, FailureKind::Timeout, "{f}");
        assert!(took >= limit, "stopped early: {took:?}");
        over.push(took - limit);
    }
    eprintln!("overshoot of a {limit:?} limit under load: {over:?}");
    let worst = over.iter().max().unwrap();
    assert!(
        *worst <= bound(limit),
        "a {limit:?} limit overshot by {worst:?} under load (allowed {:?}): {over:?}",
        bound(limit)
    );
}

#[test]
fn a_plugin_looping_in_describe_costs_one_time_limit_to_load() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limit = Duration::from_secs(3);
    let rt = common::runtime(limit, 64);
    // Built (by cargo, on first use) before the clock starts.
    let guest = common::guest("describe-loop");
    let t = Instant::now();
    let f = rt.load(&guest).unwrap_err();
    let took = t.elapsed();
    assert_eq!(f.kind, FailureKind::Timeout, "{f}");
    assert!(f.message.contains("in describe"), "{f}");
    // Compiling the small component takes a fraction of a second; a second `describe` would
    // add a whole limit.
    assert!(
        took >= limit && took < limit * 2 - Duration::from_millis(200),
        "{took:?}"
    );
}
