//! Deny-all WASI 0.2 for plugins that import it (a Rust plugin built for `wasm32-wasip2`, a
//! Python plugin built without `--stub-wasi`): the imports resolve, so such a plugin loads and
//! runs, but it gets nothing from the machine (plugins/README.md, "Sandbox"):
//!
//! * filesystem: no preopened folder, so every path is "not found";
//! * environment: no variables, no arguments, no working directory;
//! * stdio: stdin closed, stdout and stderr discarded;
//! * network: TCP, UDP and name lookup denied (every socket address is refused too);
//! * clocks: the wall clock reads [`WALL_CLOCK`] (the Unix epoch) and the monotonic clock never
//!   advances; sleeping and waiting on a clock return at once (a sleep must not hold the host
//!   thread in a host call, where the epoch deadline cannot interrupt it);
//! * randomness: the same seeded sequence in every job ([`RANDOM_SEED`]), so a plugin's values
//!   never depend on chance.
//!
//! The sandbox's limits are unchanged: WASI calls run inside a job's time, fuel and memory
//! limits, and the host-side resource table a plugin can fill is capped ([`MAX_RESOURCES`]).

use std::time::Duration;

use rand::SeedableRng;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView};

use crate::job::HostState;

/// What the wall clock reads, as time since the Unix epoch: the epoch itself.
pub const WALL_CLOCK: Duration = Duration::ZERO;

/// Seed of `wasi:random/random` (the insecure generator and `insecure-seed` derive from it).
pub const RANDOM_SEED: u64 = 0x6472_6166_746c_656e; // "draftlen"

/// Entries a job may hold in the host's WASI resource table (streams, pollables, ...): WASI
/// resources live in host memory, outside the linear-memory limit, so their number is capped.
pub const MAX_RESOURCES: usize = 4096;

/// Largest `get-random-bytes` request (the host allocates it before copying it into the guest).
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The WASI 0.2 packages the linker provides (all deny-all); a plugin importing any other
/// interface (wasi:http, wasi:keyvalue, ...) is refused at load.
const PACKAGES: &[&str] = &["cli", "clocks", "filesystem", "io", "random", "sockets"];

/// The version of the WASI interfaces wasmtime-wasi 48 implements (imports of any 0.2.x
/// resolve to it by semver).
const LINKED_VERSION: &str = "0.2.12";

/// Whether `import` (e.g. `wasi:cli/environment@0.2.6`) is one of the deny-all interfaces.
pub fn is_provided(import: &str) -> bool {
    let Some(rest) = import.strip_prefix("wasi:") else {
        return false;
    };
    let Some((package, version)) = rest.split_once('/').and_then(|(p, iv)| {
        let (_iface, v) = iv.split_once('@')?;
        Some((p, v))
    }) else {
        return false;
    };
    PACKAGES.contains(&package) && version.starts_with("0.2.")
}

/// The store data WASI needs: a deny-all context and a capped resource table (one per job).
pub(crate) struct WasiState {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl WasiState {
    pub(crate) fn deny_all() -> WasiState {
        let seeded = |salt: u64| rand::rngs::StdRng::seed_from_u64(RANDOM_SEED ^ salt);
        let ctx = WasiCtxBuilder::new()
            // A new builder has no env, args or preopens, stdin closed and stdout/stderr
            // discarded. Sockets are said explicitly, so that a change of defaults cannot
            // open the network.
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .wall_clock(FixedWallClock)
            .monotonic_clock(FrozenMonotonicClock)
            .secure_random(seeded(0))
            .insecure_random(seeded(1))
            .insecure_random_seed(u128::from(RANDOM_SEED))
            .max_random_size(MAX_RANDOM_BYTES)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        WasiState { ctx, table }
    }
}

impl wasmtime_wasi::WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi.ctx,
            table: &mut self.wasi.table,
        }
    }
}

/// The wall clock of [`WALL_CLOCK`].
struct FixedWallClock;

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        WALL_CLOCK
    }
}

/// A monotonic clock that stays at 0.
struct FrozenMonotonicClock;

impl HostMonotonicClock for FrozenMonotonicClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Add the deny-all WASI 0.2 interfaces to `linker`, with the monotonic clock's `subscribe-*`
/// replaced by pollables that are ready at once: wasmtime-wasi's would sleep in real time inside
/// a blocking host call (`poll`, `pollable.block`), which no epoch deadline interrupts.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    linker.allow_shadowing(true);
    let mut clock = linker.instance(&format!("wasi:clocks/monotonic-clock@{LINKED_VERSION}"))?;
    clock.func_wrap(
        "subscribe-duration",
        |mut cx: StoreContextMut<'_, HostState>, (_d,): (u64,)| Ok((ready_now(cx.data_mut())?,)),
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut cx: StoreContextMut<'_, HostState>, (_t,): (u64,)| Ok((ready_now(cx.data_mut())?,)),
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A pollable that is ready at once (wasmtime-wasi's zero-length sleep).
fn ready_now(state: &mut HostState) -> wasmtime::Result<Resource<DynPollable>> {
    let mut view = wasmtime_wasi::clocks::WasiClocksCtxView {
        ctx: state.wasi.ctx.clocks(),
        table: &mut state.wasi.table,
    };
    monotonic_clock::Host::subscribe_duration(&mut view, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_stubbed_wasi_packages_are_provided() {
        for ok in [
            "wasi:cli/environment@0.2.0",
            "wasi:io/streams@0.2.6",
            "wasi:clocks/monotonic-clock@0.2.12",
            "wasi:sockets/tcp@0.2.3",
            "wasi:filesystem/preopens@0.2.6",
            "wasi:random/random@0.2.0",
        ] {
            assert!(is_provided(ok), "{ok}");
        }
        for denied in [
            "wasi:http/outgoing-handler@0.2.0",
            "wasi:cli/environment@0.3.0",
            "wasi:cli/environment",
            "wasi:cli@0.2.0",
            "draftlens:metric/host@0.1.0",
            "test:spy/spy",
        ] {
            assert!(!is_provided(denied), "{denied}");
        }
    }
}
