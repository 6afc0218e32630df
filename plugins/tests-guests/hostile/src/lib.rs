//! A metric plugin that misbehaves on request, for the host's sandbox tests. The `mode`
//! parameter picks the misbehaviour; it happens in `accumulate` so that `describe` and `begin`
//! work and the host's per-job isolation is what gets tested.

use draftlens_plugin_sdk::{
    export_metric, log, Accumulator, Batch, Inputs, Level, Metadata, Metric, MetricSpec,
    MetricValue, ParamSpec, ParamValue, Params, PluginError, Series, SeriesKind,
};

pub struct Hostile;

pub struct Acc {
    mode: String,
    blocks: u64,
    /// Accumulators begun in this instance before this one (mode `stateful`).
    begun_before: u64,
    /// Mode `amplify`: series per group and entries per series.
    series: usize,
    len: usize,
}

/// Shared by every accumulator of an instance: what a stateful plugin must not do.
static BEGUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Metric for Hostile {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "hostile".into(),
            version: "0.0.1".into(),
            description: "misbehaves on request".into(),
            metrics: vec![
                MetricSpec::new("blocks", "blocks", "blocks seen", true),
                MetricSpec::new("member_*", "blocks", "a family", true),
            ],
            params: vec![
                ParamSpec::new(
                    "mode",
                    "ok | loop | alloc | panic | recurse | huge-result | undeclared-metric | infinite-value | \
                     series-mismatch | log-flood | plugin-error | amplify | long-member | escape-log | \
                     huge-error | nan-count | count-max | stateful",
                    ParamValue::Text("ok".into()),
                ),
                ParamSpec::new("series", "amplify: series per group", ParamValue::Int(7)),
                ParamSpec::new("len", "amplify: entries per series", ParamValue::Int(1 << 20)),
            ],
            inputs: Inputs::TOP1,
        }
    }

    fn begin(params: &Params) -> Result<Acc, PluginError> {
        Ok(Acc {
            mode: params.text("mode")?.to_string(),
            blocks: 0,
            begun_before: BEGUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            series: params.int("series")? as usize,
            len: params.int("len")? as usize,
        })
    }
}

#[inline(never)]
fn recurse(depth: u64, pad: &mut [u8; 256]) -> u64 {
    if depth == u64::MAX {
        return 0; // never reached: the stack runs out first
    }
    pad[(depth % 256) as usize] = depth as u8;
    let mut local = *pad;
    // The local array keeps every frame on the shadow stack in linear memory.
    recurse(depth + 1, &mut local) + local[3] as u64
}

impl Accumulator for Acc {
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError> {
        self.blocks += batch.num_blocks() as u64;
        match self.mode.as_str() {
            "loop" => {
                let mut x = 0u64;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            "alloc" => {
                // 64 MiB at a time, kept alive, up to 2 GiB.
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                for _ in 0..32 {
                    let mut v = vec![0u8; 64 << 20];
                    v[12345] = 1;
                    hoard.push(std::hint::black_box(v));
                }
                log(Level::Info, &format!("allocated {} chunks", hoard.len()));
            }
            "panic" => {
                let v = std::hint::black_box(vec![1, 2, 3]);
                let i = std::hint::black_box(7);
                log(Level::Info, &format!("{}", v[i]));
            }
            "recurse" => {
                let mut pad = [0u8; 256];
                log(Level::Info, &format!("{}", recurse(0, &mut pad)));
            }
            "log-flood" => {
                let line = "x".repeat(10_000);
                for i in 0..100_000 {
                    log(Level::Debug, &format!("{i} {line}"));
                }
            }
            "plugin-error" => {
                return Err(PluginError::InvalidBatch(
                    "the hostile plugin rejects every batch".into(),
                ))
            }
            "escape-log" => {
                // Clear the screen and forge a host line; then a 10 MiB line.
                log(
                    Level::Warn,
                    "\x1b[2J\x1b[H\rwarning: plugin accept-length failed [timeout]\n\u{202e}forged",
                );
                log(Level::Warn, &"\x1b[31m".repeat(1 << 20));
            }
            "huge-error" => {
                let mut m = String::from("\x1b[2J\x1b[Hplugin accept-length failed\n");
                m.push_str(&"E".repeat(64 << 20));
                return Err(PluginError::Internal(m));
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        let ok = MetricValue::new("blocks", self.blocks as f64, self.blocks);
        Ok(match self.mode.as_str() {
            // 2 Mi entries (32 MiB with the counts): fits a small memory cap, but is twice the
            // host's limit on series length, which must refuse it cleanly.
            "huge-result" => vec![ok.with_series(Series {
                kind: SeriesKind::PerPosition,
                values: vec![0.5; 2 << 20],
                counts: vec![1; 2 << 20],
            })],
            "undeclared-metric" => vec![ok, MetricValue::new("surprise", 1.0, 1)],
            "infinite-value" => vec![MetricValue::new("blocks", f64::INFINITY, 1)],
            // 7 series of 1 Mi entries per group by default: inside every per-call limit, but
            // multiplied by the groups of a run.
            "amplify" => {
                let mut v = vec![ok];
                for i in 0..self.series {
                    v.push(
                        MetricValue::new(&format!("member_{i}"), 0.5, 1).with_series(Series {
                            kind: SeriesKind::PerPosition,
                            values: vec![0.25; self.len],
                            counts: vec![1; self.len],
                        }),
                    );
                }
                v
            }
            "long-member" => {
                let name = format!("member_{}", "x".repeat(60 << 20));
                vec![ok, MetricValue::new(&name, 1.0, 1)]
            }
            "nan-count" => vec![MetricValue::new("blocks", f64::NAN, self.blocks.max(1))],
            "count-max" => vec![MetricValue::new("blocks", 1.0, u64::MAX)],
            "stateful" => vec![MetricValue::new(
                "blocks",
                self.blocks as f64 + self.begun_before as f64,
                self.blocks,
            )],
            "series-mismatch" => vec![ok.with_series(Series {
                kind: SeriesKind::PerPosition,
                values: vec![1.0, 2.0],
                counts: vec![1],
            })],
            _ => vec![ok],
        })
    }
}

export_metric!(Hostile);
