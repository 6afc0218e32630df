//! The timeline's accounting (its own test binary: the timeline is process-wide state, and the
//! library's other tests enter phases from many threads at once).

use draftlens::timeline::{background, phase, record_gpu_busy, report};
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
    let sum: f64 = r.phases.iter().map(|p| p.seconds).sum();
    assert!(
        (sum - r.wall_seconds).abs() < 1e-6,
        "{sum} vs {}",
        r.wall_seconds
    );
    let bgr = r.background.iter().find(|p| p.name == "t-bg").unwrap();
    assert!(bgr.seconds >= 0.020 && bgr.count == 1);
    assert!(r.render().contains("t-inner"));
}
