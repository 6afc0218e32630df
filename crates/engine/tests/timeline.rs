//! The timeline's accounting (its own test binary: the timeline is process-wide state, and the
//! library's other tests enter phases from many threads at once).

use draftlens_engine::timeline::{
    background, host_rss, phase, record_gpu_busy, record_host_rss, report,
};
use std::time::Duration;

#[test]
fn nested_phases_charge_exclusive_time_and_add_up_to_the_wall() {
    {
        let _outer = phase("t-outer");
        std::thread::sleep(Duration::from_millis(30));
        {
            let _inner = phase("t-inner");
            std::thread::sleep(Duration::from_millis(40));
            record_gpu_busy(1.0);
            record_gpu_busy(0.5);
            record_host_rss(3_000_000_000);
            record_host_rss(2_000_000_000);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let bg = std::thread::spawn(|| {
        let _b = background("t-bg");
        std::thread::sleep(Duration::from_millis(20));
    });
    bg.join().unwrap();
    let r = report();
    let get = |n: &str| r.phases.iter().find(|p| p.name == n).cloned().unwrap();
    let (outer, inner) = (get("t-outer"), get("t-inner"));
    assert!(inner.seconds >= 0.040 && inner.seconds < 0.5, "{inner:?}");
    // The outer phase holds only its own 40 ms, not the inner phase's.
    assert!(
        outer.seconds >= 0.040 && outer.seconds < inner.seconds + 0.03,
        "{outer:?}"
    );
    assert_eq!((outer.count, inner.count), (1, 1));
    assert_eq!(inner.gpu_busy, Some(0.75));
    assert_eq!(outer.gpu_busy, None);
    // A phase keeps its largest host-memory reading; one without readings shows none.
    assert_eq!(inner.host_rss_peak_bytes, Some(3_000_000_000));
    assert_eq!(outer.host_rss_peak_bytes, None);
    assert_eq!(r.host_rss_peak_bytes, Some(3_000_000_000));
    let sum: f64 = r.phases.iter().map(|p| p.seconds).sum();
    assert!(
        (sum - r.wall_seconds).abs() < 1e-6,
        "{sum} vs {}",
        r.wall_seconds
    );
    let bgr = r.background.iter().find(|p| p.name == "t-bg").unwrap();
    assert!(bgr.seconds >= 0.020 && bgr.count == 1);
    let table = r.render();
    assert!(table.contains("t-inner"), "{table}");
    assert!(table.contains("host RSS peak 3.00 GB"), "{table}");
}

/// The host reading is the process's resident set: it grows by at least what the process
/// touches (64 MiB here), and is far below the machine's memory.
#[test]
fn host_rss_sees_memory_the_process_touches() {
    let Some(before) = host_rss() else {
        println!("SKIP: no /proc/self/statm");
        return;
    };
    let block = vec![1u8; 64 << 20];
    let after = host_rss().unwrap();
    assert!(
        after >= before + (60 << 20),
        "resident set {before} → {after} bytes after touching 64 MiB"
    );
    assert!(after < 1 << 40);
    drop(std::hint::black_box(block));
}
