//! Loading streams the weights: once a tensor is uploaded its file pages leave the process
//! (`WeightSource::release`; the page cache keeps them), so a loaded target's weight file does not
//! stay resident beside the copy the backend holds. Measured on this process's own mapping of the
//! file (the `Rss` of its entries in /proc/self/smaps), for every source the loader reads: GGUF
//! (dense, hybrid, MoE with stacked experts served per expert) and safetensors. Linux only (skips
//! elsewhere). One test function, so that no other test maps the same files meanwhile.

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::model::{TargetFiles, TargetModel};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Resident bytes of this process's mappings of `file`, `None` without /proc/self/smaps.
fn mapped_rss(file: &Path) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let want = file.canonicalize().ok()?;
    let (mut ours, mut kb) = (false, 0u64);
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // A mapping's header: range perms offset dev inode [path].
            let path = fields.nth(4);
            ours = path.is_some_and(|p| Path::new(p) == want);
        } else if ours && first == "Rss:" {
            kb += fields.next()?.parse::<u64>().ok()?;
        }
    }
    Some(kb * 1024)
}

#[test]
fn a_loaded_targets_weight_file_does_not_stay_resident() {
    let golden = root().join("tests/fixtures/golden");
    let cases: Vec<(PathBuf, PathBuf)> = [
        "moe_gguf/qwen3_moe-bf16.gguf",
        "moe_gguf/qwen3_moe-q8_0.gguf",
        "moe_gguf/qwen3_5_moe-bf16.gguf",
        "qwen3_5/model.gguf",
        "qwen3_moe",
        "qwen3_5_moe",
    ]
    .iter()
    .map(|rel| {
        let p = golden.join(rel);
        let file = if p.is_dir() {
            p.join("model.safetensors")
        } else {
            p.clone()
        };
        (p, file)
    })
    .chain([(
        root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )])
    .collect();
    let be = CpuBackend::new();
    for (model, file) in cases {
        let size = std::fs::metadata(&file).unwrap().len();
        let files = TargetFiles::open(&model).unwrap();
        // Every tensor read (and its pages faulted in), as a loader without releases would leave
        // them; then each released.
        let names: Vec<String> = files
            .weights
            .tensors()
            .into_iter()
            .map(|t| t.name)
            .collect();
        for n in &names {
            files.weights.tensor(n).unwrap();
        }
        let Some(read) = mapped_rss(&file) else {
            eprintln!("no /proc/self/smaps: skipped");
            return;
        };
        for n in &names {
            files.weights.release(n);
        }
        let released = mapped_rss(&file).unwrap();
        // What may stay: the header (metadata and tensor index, read at open; for a GGUF the
        // tokenizer) and tensors the target never loads (a Qwen3.5 checkpoint's vision tower and
        // MTP head, not in the listing).
        eprintln!(
            "{}: {size} bytes, {read} resident after reading every tensor, {released} after releasing them",
            model.display()
        );
        assert!(
            read >= size / 2,
            "{}: reading faults the tensors in",
            model.display()
        );
        assert!(
            released <= size / 8 + (64 << 10),
            "{}: {released} of {size} bytes still resident after every release",
            model.display()
        );
        // And the loader itself releases what it uploads through `load_stacked_matrix` (every
        // 2-D weight); norms and biases, read as f32 vectors, keep their few pages. Checked on
        // the one file whose tensors are of a real model's size (the fixtures' are kilobytes,
        // where those pages are most of the file).
        if size < 16 << 20 {
            continue;
        }
        drop(files);
        let files = TargetFiles::open(&model).unwrap();
        let _model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
        let loaded = mapped_rss(&file).unwrap();
        assert!(
            loaded <= size / 8 + (64 << 10),
            "{}: {loaded} of {size} bytes resident after TargetModel::load",
            model.display()
        );
    }
}
