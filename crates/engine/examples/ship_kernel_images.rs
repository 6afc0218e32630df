//! Compiles every kernel module to a CUBIN for the architectures that ship and writes them to
//! `crates/engine/src/backend/cuda/kernel_images/` (docs/cuda.md, "Kernel images that ship").
//! Run it through `tools/ship_kernel_images.sh`, which fetches the pinned NVRTC wheel:
//!   LD_LIBRARY_PATH=<nvrtc>/nvidia/cu13/lib cargo run --release -p draftlens-engine \
//!     --example ship_kernel_images -- <nvrtc version> [arch ...]
use draftlens_engine::backend::cuda::ship_kernel_images;
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((nvrtc, archs)) = args.split_first() else {
        anyhow::bail!("usage: ship_kernel_images <nvrtc version> [arch ...] (default sm_90)");
    };
    let archs = if archs.is_empty() {
        vec!["sm_90".to_string()]
    } else {
        archs.to_vec()
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/cuda/kernel_images");
    for arch in &archs {
        let t0 = std::time::Instant::now();
        let sizes = ship_kernel_images(arch, nvrtc, &dir)?;
        for (name, cubin, gz) in &sizes {
            println!("{arch} {name}: CUBIN {cubin} bytes, gzip {gz}");
        }
        let (cubin, gz) = sizes
            .iter()
            .fold((0, 0), |(c, g), (_, a, b)| (c + a, g + b));
        println!(
            "{arch}: {} modules, {cubin} bytes of CUBIN, {gz} shipped, {:.1} s, in {}",
            sizes.len(),
            t0.elapsed().as_secs_f64(),
            dir.display()
        );
    }
    Ok(())
}
