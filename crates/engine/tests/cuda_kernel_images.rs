//! The kernel images that ship with the binary (docs/cuda.md, "Kernel images that ship") on a
//! GPU: on an sm_90 device every module loads from its shipped CUBIN and every kernel resolves,
//! and each image is compared with what this machine's NVRTC compiles from the same source
//! (equal: the device runs exactly what it would have compiled itself). Skipped without a GPU
//! and on other architectures; the images' freshness and integrity are checked in CI by the unit
//! test `shipped_kernel_images_are_current_and_whole`.

mod cuda_util;

use draftlens_engine::backend::cuda::shipped_images_against_nvrtc;

#[test]
fn shipped_images_load_and_match_this_machines_nvrtc() {
    let Some(be) = cuda_util::gpu() else { return };
    if be.arch() != "sm_90" {
        println!("SKIP: no kernel images ship for {}", be.arch());
        return;
    }
    // Loads every module (the shipped image when current; DRAFTLENS_KERNEL_IMAGES=nvrtc compiles)
    // and resolves the kernels the report lists.
    let report = be
        .kernel_report()
        .expect("every module loads and its kernels resolve");
    assert!(report.len() > 30, "{report:?}");
    println!(
        "modules loaded in {:.3} s (image wait and module load)",
        be.kernel_compile_secs()
    );
    let mut unequal = Vec::new();
    for (name, equal) in shipped_images_against_nvrtc("sm_90").unwrap() {
        let equal = equal.unwrap_or_else(|| panic!("{name}: no current image ships for sm_90"));
        println!(
            "{name}: shipped CUBIN {} this machine's NVRTC",
            if equal { "==" } else { "!=" }
        );
        if !equal {
            unequal.push(name);
        }
    }
    println!("images unlike this machine's NVRTC: {unequal:?}");
}
