//! A plugin built for `wasm32-wasip2` (so Rust std imports WASI) that tries what a plugin must
//! not get: files, environment, clocks, randomness and the network. The host's deny-all WASI
//! must let it load and run, and give it nothing (crates/plugin-host/tests/wasi.rs).
//!
//! Mode `probe` reports in `finish` as metric values (counts, 0/1 flags, clock readings, random
//! bytes) and logs what each attempt returned; `sleep` sleeps an hour; `spin` busy-waits for a
//! second on the monotonic clock; `exit` calls `std::process::exit(3)`.

use draftlens_plugin_sdk::{
    export_metric, log, Accumulator, Batch, Inputs, Level, Metadata, Metric, MetricSpec,
    MetricValue, ParamSpec, ParamValue, Params, PluginError,
};
use std::time::{Duration, Instant, SystemTime};

pub struct Probe;

pub struct Acc {
    mode: String,
    path: String,
    port: u16,
    values: Vec<MetricValue>,
}

const METRICS: &[&str] = &[
    "file_read",
    "file_written",
    "dir_listed",
    "env_vars",
    "args",
    "wall_clock_ns",
    "monotonic_advance_ns",
    "random_bytes_0_4",
    "random_bytes_4_8",
    "insecure_seed_lo",
    "tcp_connected",
    "udp_bound",
    "name_resolved",
];

impl Metric for Probe {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "wasi-probe".into(),
            version: "0.0.1".into(),
            description: "tries files, environment, clocks, randomness and sockets".into(),
            metrics: METRICS
                .iter()
                .map(|m| MetricSpec::new(m, "count", "probe result", true))
                .collect(),
            params: vec![
                ParamSpec::new(
                    "mode",
                    "probe | sleep | spin | exit",
                    ParamValue::Text("probe".into()),
                ),
                ParamSpec::new(
                    "path",
                    "a file to read",
                    ParamValue::Text("/etc/passwd".into()),
                ),
                ParamSpec::new("port", "a local TCP port to connect to", ParamValue::Int(9)),
            ],
            inputs: Inputs::TOP1,
        }
    }

    fn begin(params: &Params) -> Result<Acc, PluginError> {
        Ok(Acc {
            mode: params.text("mode")?.to_string(),
            path: params.text("path")?.to_string(),
            port: params.int("port")? as u16,
            values: Vec::new(),
        })
    }
}

/// Log what an attempt returned; 1.0 when it succeeded.
fn attempt<T: std::fmt::Debug, E: std::fmt::Debug>(what: &str, r: Result<T, E>) -> f64 {
    match r {
        Ok(v) => {
            log(Level::Info, &format!("{what}: ok {v:?}"));
            1.0
        }
        Err(e) => {
            log(Level::Info, &format!("{what}: error {e:?}"));
            0.0
        }
    }
}

impl Acc {
    fn probe(&mut self) {
        let mut v = |name: &str, x: f64| self.values.push(MetricValue::new(name, x, 1));
        v("file_read", attempt("read", std::fs::read(&self.path)));
        v(
            "file_written",
            attempt("write", std::fs::write("probe-was-here.txt", b"x")),
        );
        v(
            "dir_listed",
            attempt("read_dir", std::fs::read_dir("/").map(|d| d.count())),
        );
        let vars: Vec<(String, String)> = std::env::vars().collect();
        log(Level::Info, &format!("env: {vars:?}"));
        v("env_vars", vars.len() as f64);
        v("args", std::env::args().count() as f64);
        attempt("current_dir", std::env::current_dir());

        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(-1.0, |d| d.as_nanos() as f64);
        v("wall_clock_ns", wall);
        let t0 = Instant::now();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        std::thread::sleep(Duration::from_millis(20));
        v("monotonic_advance_ns", t0.elapsed().as_nanos() as f64);

        #[cfg(target_os = "wasi")]
        {
            let bytes = wasip2::random::random::get_random_bytes(8);
            log(Level::Info, &format!("random: {bytes:?}"));
            let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
            v("random_bytes_0_4", word(&bytes[..4]));
            v("random_bytes_4_8", word(&bytes[4..8]));
            let (lo, _hi) = wasip2::random::insecure_seed::insecure_seed();
            v("insecure_seed_lo", (lo & 0xffff_ffff) as f64);
        }
        // Print through WASI stdout/stderr: discarded by the host, must not fail the plugin.
        println!("stdout from the probe");
        eprintln!("stderr from the probe");

        use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
        let port = self.port;
        v(
            "tcp_connected",
            attempt(
                "tcp connect",
                TcpStream::connect(("127.0.0.1", port)).map(|_| ()),
            ),
        );
        v(
            "udp_bound",
            attempt("udp bind", UdpSocket::bind("127.0.0.1:0").map(|_| ())),
        );
        v(
            "name_resolved",
            attempt(
                "resolve",
                "localhost:80".to_socket_addrs().map(|a| a.count()),
            ),
        );
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, _batch: &Batch<'_>) -> Result<(), PluginError> {
        match self.mode.as_str() {
            "probe" if self.values.is_empty() => self.probe(),
            "sleep" => {
                std::thread::sleep(Duration::from_secs(3600));
                log(Level::Info, "slept");
            }
            "spin" => {
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs(1) {
                    std::hint::spin_loop();
                }
            }
            "exit" => std::process::exit(3),
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        Ok(self.values)
    }
}

export_metric!(Probe);
