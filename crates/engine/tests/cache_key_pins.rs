//! The session's cache keys, pinned byte for byte for every backend and Gated DeltaNet profile:
//! a change to how a key is built (crates/engine/src/session/keys.rs, `Backend::gdn_cache_tag`)
//! must not change one, or every cache on disk silently goes cold. The pins were computed by the
//! code before the backend supplied its GDN tag (when the session asked `name() == "cuda"` and
//! called the CUDA GDN module itself): the CPU ones by running it, the CUDA ones by building
//! today's keys the way it built them (CUDA's name, dtype and `engine_cache_tag`) on the CPU
//! session's keys.
//!
//! Targets: the random Qwen3.5 golden as GGUF (hybrid, carries a tokenizer) and the random Qwen3
//! golden (dense) given that tokenizer. CUDA: without a usable GPU the full-key test prints
//! "SKIP: CUDA unavailable: <reason>" and returns (CI has no GPU); the engine kernel's tag is
//! checked without one.

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::{Backend, GdnProfile};
use draftlens_engine::hidden_cache::HiddenCache;
use draftlens_engine::session::{Session, SessionOptions};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn hybrid() -> PathBuf {
    root().join("tests/fixtures/golden/qwen3_5/model.gguf")
}

fn open<B: Backend>(be: B, target: &Path, cache: &Path, gdn_profile: GdnProfile) -> Session<B> {
    let opts = SessionOptions {
        gdn_profile,
        ..Default::default()
    };
    Session::load(be, target, HiddenCache::open(cache).unwrap(), opts).unwrap()
}

/// The dense golden (config + weights, no tokenizer) in `dir`, with the hybrid GGUF's tokenizer
/// (both have 512 token ids).
fn dense(dir: &Path) -> PathBuf {
    let target = dir.join("dense");
    std::fs::create_dir_all(&target).unwrap();
    let golden = root().join("tests/fixtures/golden/qwen3");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(golden.join(f), target.join(f)).unwrap();
    }
    let s = open(
        CpuBackend::new(),
        &hybrid(),
        &dir.join("tok"),
        GdnProfile::Reference,
    );
    s.files
        .tokenizer()
        .unwrap()
        .inner()
        .save(target.join("tokenizer.json"), false)
        .unwrap();
    target
}

/// `(kernel_version, digest)` of a target-pass key and of a continuation key.
fn two_keys<B: Backend>(s: &Session<B>) -> Vec<(String, String)> {
    [
        ("taps", vec![1, 4], "topk=8"),
        ("greedy", vec![], "max_new=16;eos=[2]"),
    ]
    .into_iter()
    .map(|(kind, layers, extra)| {
        let k = s
            .derived_key(kind, &[1, 2, 3, 40, 511], layers, extra.into())
            .unwrap();
        (k.kernel_version.clone(), k.digest())
    })
    .collect()
}

/// [`two_keys`] under the reference profile, then under the engine profile, as sessions of
/// `target` on backends from `be` build them. A session switched to the other profile after
/// loading ([`Session::set_gdn_profile`], what `parity` does) builds the same keys as one loaded
/// with it.
fn keys<B: Backend>(be: impl Fn() -> B, target: &Path, cache: &Path) -> Vec<(String, String)> {
    let mut out = two_keys(&open(be(), target, cache, GdnProfile::Reference));
    out.extend(two_keys(&open(be(), target, cache, GdnProfile::Engine)));
    let mut switched = open(be(), target, cache, GdnProfile::Engine);
    switched.set_gdn_profile(GdnProfile::Reference);
    assert_eq!(two_keys(&switched), out[..2], "switched to reference");
    switched.set_gdn_profile(GdnProfile::Engine);
    assert_eq!(two_keys(&switched), out[2..], "switched back to engine");
    out
}

/// Held while a test reads or overrides the process-wide GDN kernel choice (kernel lab).
#[cfg(feature = "cuda")]
static KERNEL_CHOICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn pins(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Dense targets have no GDN: both profiles give the same two keys.
fn dense_pins(version: &str, taps: &str, greedy: &str) -> Vec<(String, String)> {
    pins(&[
        (version, taps),
        (version, greedy),
        (version, taps),
        (version, greedy),
    ])
}

#[test]
fn cpu_keys_are_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    assert_eq!(
        keys(CpuBackend::new, &hybrid(), &cache),
        pins(&[
            (
                "cpu-f32-v9",
                "decd30ebd825dc34cec2bc9b0a0ac7e172b1d00a0be194122698dfcf88a6078b"
            ),
            (
                "cpu-f32-v9",
                "81f999beda784c3445edf1cf399b779bfdc50cde9bffefd2321e38ef500548d6"
            ),
            (
                "cpu-f32-v9-gdn-engine",
                "c539f09652ffde805d3e76b14e18a09a3d38ecd581ff82a2ba1cd14afbd100cb"
            ),
            (
                "cpu-f32-v9-gdn-engine",
                "5e4adc65754c9b64775073f08e895d27fc3f9acba469e7d94af76c69674f0d26"
            ),
        ])
    );
    assert_eq!(
        keys(CpuBackend::new, &dense(tmp.path()), &cache),
        dense_pins(
            "cpu-f32-v9",
            "9fd949949e7e5069422085ef92b360ff0177254fa3155a7ce2f89bc4200c7df2",
            "30ed8c91f9405bdf51896ce4c33a1c1440570d3fb1472544b8cd594893c8549f"
        )
    );
}

/// The CUDA engine profile's tag: the default kernel's (three-phase, walk on the tensor cores).
#[cfg(feature = "cuda")]
#[test]
fn cuda_engine_tag_is_unchanged() {
    let _choice = KERNEL_CHOICE.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        draftlens_engine::backend::cuda::gdn::engine_cache_tag(),
        "-3p-tc"
    );
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_keys_are_unchanged() {
    use draftlens_engine::backend::cuda::CudaBackend;
    if let Err(e) = CudaBackend::new(0) {
        println!("SKIP: {e}");
        return;
    }
    let _choice = KERNEL_CHOICE.lock().unwrap_or_else(|e| e.into_inner());
    let gpu = || CudaBackend::new(0).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    assert_eq!(
        keys(gpu, &hybrid(), &cache),
        pins(&[
            (
                "cuda-bf16-v9",
                "b42700df3744c6bb4710a1c758d397fb933cd2d8958add0a793ec3f2d5f8147f"
            ),
            (
                "cuda-bf16-v9",
                "784ac2317cd98b0ef1c6eb62b0978a309429243c7d8614e77a32f8f1c25b1ce9"
            ),
            (
                "cuda-bf16-v9-gdn-engine-3p-tc",
                "9182a1857da0effb6720bb4c6433e98c91868bfe51e9f51fe1c4a64f62d068cf"
            ),
            (
                "cuda-bf16-v9-gdn-engine-3p-tc",
                "fde63af793101393878871a37b9318366b7b4eb39f90f107dbbb083253980ae3"
            ),
        ])
    );
    assert_eq!(
        keys(gpu, &dense(tmp.path()), &cache),
        dense_pins(
            "cuda-bf16-v9",
            "e8bdef6f58fb4a14aaf320771e28f89484743b12ff941d3713c440ecd1127ca8",
            "88514016b14b4d32ec1e24134b2d6c729f78618d19541ac2696668438a7df88e"
        )
    );
    // The kernel lab's split kernels: the engine tag they always had (none).
    #[cfg(feature = "kernel-lab")]
    {
        use draftlens_engine::backend::cuda::gdn::set_three_phase_override;
        set_three_phase_override(Some(false));
        let split = keys(gpu, &hybrid(), &cache);
        set_three_phase_override(None);
        assert_eq!(
            split[2..],
            pins(&[
                (
                    "cuda-bf16-v9-gdn-engine",
                    "3ffd53b5f95611fd3dc5097b270f43776bd17966e4b973888b41819485fac55e"
                ),
                (
                    "cuda-bf16-v9-gdn-engine",
                    "8aa9dab9480b55867798c4e9034acd64d10f61239beafc983ee5cf7eb1b5d4f4"
                ),
            ])
        );
    }
}
