//! Hugging Face safetensors folders: single file, sharded with an index, dtype conversion, and
//! bad input (each a clear error naming the file, never a panic).

use draftlens_engine::formats::safetensors::SafetensorsWeights;
use draftlens_engine::formats::WeightSource;
use half::{bf16, f16};
use std::path::{Path, PathBuf};

/// One tensor to write: name, safetensors dtype string, shape, raw little-endian bytes.
struct T(&'static str, &'static str, Vec<usize>, Vec<u8>);

/// Serialise tensors in order, with contiguous data offsets (the format's rule).
fn st_bytes(tensors: &[T]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut off = 0usize;
    for T(name, dtype, shape, data) in tensors {
        header.insert(
            (*name).into(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + data.len()]}),
        );
        off += data.len();
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    // Pad the header to 8 bytes with spaces, as the reference writer does.
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend(h);
    for t in tensors {
        b.extend(&t.3);
    }
    b
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn f16s(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect()
}
fn bf16s(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn err_of<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn single_file_all_float_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let vals = [1.0f32, -2.5, 0.125, 3.0, 1024.0, -0.0];
    write(
        dir.path(),
        "model.safetensors",
        &st_bytes(&[
            T("model.embed_tokens.weight", "F32", vec![2, 3], f32s(&vals)),
            T("model.norm.weight", "F16", vec![6], f16s(&vals)),
            T("lm_head.weight", "BF16", vec![3, 2], bf16s(&vals)),
        ]),
    );
    let w = SafetensorsWeights::open(dir.path()).unwrap();
    assert_eq!(w.path(), dir.path());
    assert!(w.contains("model.norm.weight") && !w.contains("__metadata__"));
    let infos = w.tensors();
    assert_eq!(infos.len(), 3);
    let lm = infos.iter().find(|t| t.name == "lm_head.weight").unwrap();
    assert_eq!(
        (
            lm.dtype.as_str(),
            lm.shape.clone(),
            lm.bytes,
            lm.file_name.as_str()
        ),
        ("BF16", vec![3, 2], 12, "lm_head.weight")
    );
    for name in [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
    ] {
        let t = w.tensor(name).unwrap();
        // All chosen values are exact in f16 and bf16.
        assert_eq!(t.data, vals, "{name}");
    }
    assert_eq!(
        w.tensor("model.embed_tokens.weight").unwrap().shape,
        vec![2, 3]
    );
    let e = err_of(w.tensor("model.layers.0.mlp.up_proj.weight"));
    assert!(
        e.contains("no tensor model.layers.0.mlp.up_proj.weight"),
        "{e}"
    );
}

#[test]
fn bf16_and_f16_rounding_known_answers() {
    // bf16 0x3F81 = 1.0078125; f16 0x3C01 = 1.0009765625 (1 + 2^-10).
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "model.safetensors",
        &st_bytes(&[
            T("a", "BF16", vec![1], vec![0x81, 0x3F]),
            T("b", "F16", vec![1], vec![0x01, 0x3C]),
        ]),
    );
    let w = SafetensorsWeights::open(dir.path()).unwrap();
    assert_eq!(w.tensor("a").unwrap().data, [1.0078125]);
    assert_eq!(w.tensor("b").unwrap().data, [1.0 + 1.0 / 1024.0]);
}

#[test]
fn large_tensor_parallel_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let n = 300_000;
    let vals: Vec<f32> = (0..n).map(|i| (i % 4096) as f32 - 2048.0).collect();
    write(
        dir.path(),
        "model.safetensors",
        &st_bytes(&[T("big", "BF16", vec![n / 1000, 1000], bf16s(&vals))]),
    );
    let w = SafetensorsWeights::open(dir.path()).unwrap();
    // bf16 keeps 8 significant bits: compare with the bf16-rounded inputs, element by element.
    let want: Vec<f32> = vals.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
    assert_eq!(w.tensor("big").unwrap().data, want);
    assert_eq!(
        want[4095], 2048.0,
        "2047 rounds to 2048 in bf16 (step 8 above 1024)"
    );
}

#[test]
fn sharded_folder_with_index() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "model-00001-of-00002.safetensors",
        &st_bytes(&[T("x", "F32", vec![2], f32s(&[1.0, 2.0]))]),
    );
    write(
        dir.path(),
        "model-00002-of-00002.safetensors",
        &st_bytes(&[
            T("y", "F32", vec![1], f32s(&[3.0])),
            T("z", "F16", vec![1], f16s(&[4.0])),
        ]),
    );
    write(
        dir.path(),
        "model.safetensors.index.json",
        br#"{"metadata": {"total_size": 14}, "weight_map": {"x": "model-00001-of-00002.safetensors",
            "y": "model-00002-of-00002.safetensors", "z": "model-00002-of-00002.safetensors"}}"#,
    );
    let w = SafetensorsWeights::open(dir.path()).unwrap();
    assert_eq!(w.tensors().len(), 3);
    assert_eq!(w.tensor("x").unwrap().data, [1.0, 2.0]);
    assert_eq!(w.tensor("y").unwrap().data, [3.0]);
    assert_eq!(w.tensor("z").unwrap().data, [4.0]);
}

#[test]
fn missing_folder_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("nope");
    let e = err_of(SafetensorsWeights::open(&gone));
    assert!(
        e.contains(&gone.display().to_string()) && e.contains("no such file"),
        "{e}"
    );
    let e = err_of(SafetensorsWeights::open(dir.path()));
    assert!(
        e.contains("no model.safetensors or model.safetensors.index.json"),
        "{e}"
    );
}

#[test]
fn index_pointing_to_a_missing_shard() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.safetensors",
        &st_bytes(&[T("x", "F32", vec![1], f32s(&[1.0]))]),
    );
    let idx = write(
        dir.path(),
        "model.safetensors.index.json",
        br#"{"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}"#,
    );
    let e = err_of(SafetensorsWeights::open(dir.path()));
    assert!(
        e.contains(&idx.display().to_string())
            && e.contains("\"b.safetensors\", which does not exist"),
        "{e}"
    );
}

#[test]
fn index_naming_a_tensor_its_shard_lacks() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.safetensors",
        &st_bytes(&[T("x", "F32", vec![1], f32s(&[1.0]))]),
    );
    write(
        dir.path(),
        "model.safetensors.index.json",
        br#"{"weight_map": {"x": "a.safetensors", "w": "a.safetensors"}}"#,
    );
    let e = err_of(SafetensorsWeights::open(dir.path()));
    assert!(
        e.contains("puts tensor w in \"a.safetensors\", but that shard does not contain it"),
        "{e}"
    );
}

#[test]
fn bad_index_files() {
    let dir = tempfile::tempdir().unwrap();
    let idx = write(
        dir.path(),
        "model.safetensors.index.json",
        b"{\"weight_map\": 3}",
    );
    let e = err_of(SafetensorsWeights::open(dir.path()));
    assert!(
        e.contains(&idx.display().to_string()) && e.contains("not a valid index"),
        "{e}"
    );
    write(
        dir.path(),
        "model.safetensors.index.json",
        br#"{"weight_map": {"x": "../outside.safetensors"}}"#,
    );
    let e = err_of(SafetensorsWeights::open(dir.path()));
    assert!(e.contains("must be a plain file name"), "{e}");
}

#[test]
fn truncated_files_and_bad_headers() {
    let dir = tempfile::tempdir().unwrap();
    let good = st_bytes(&[T("x", "F32", vec![4], f32s(&[1.0, 2.0, 3.0, 4.0]))]);
    let p = dir.path().join("model.safetensors");
    let open_err = |bytes: &[u8]| {
        let _ = std::fs::remove_file(&p); // fresh file: see formats_gguf.rs every_truncation
        std::fs::write(&p, bytes).unwrap();
        let e = err_of(SafetensorsWeights::open(dir.path()));
        assert!(
            e.contains(&p.display().to_string()),
            "error must name the file: {e}"
        );
        e
    };
    // Every cut is an error, never a panic.
    for len in 0..good.len() {
        open_err(&good[..len]);
    }
    assert!(open_err(&good[..5]).contains("truncated safetensors file (5 bytes"));
    assert!(open_err(&good[..20]).contains("header length"));
    let e = open_err(&good[..good.len() - 1]);
    assert!(
        e.contains(
            "data offsets run past the end of the file (header needs 16 data bytes, file has 15)"
        ),
        "{e}"
    );
    // Header length field far past the end.
    let mut b = good.clone();
    b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(open_err(&b).contains("runs past the end of the file"));
    // Offsets past the end of the data.
    let e = open_err(&st_bytes(&[T("x", "F32", vec![8], f32s(&[1.0; 4]))]));
    assert!(
        e.contains("invalid shape, data type, or offset") || e.contains("past the end"),
        "{e}"
    );
    // Not JSON.
    let mut b = 4u64.to_le_bytes().to_vec();
    b.extend(b"abcd");
    assert!(open_err(&b).contains("invalid JSON in header"));
    // Trailing garbage.
    let mut b = good.clone();
    b.extend([0u8; 3]);
    assert!(open_err(&b).contains("3 trailing bytes"));
}

#[test]
fn unsupported_dtype_names_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "model.safetensors",
        &st_bytes(&[
            T("ids", "I64", vec![2], vec![0; 16]),
            T("ok", "F32", vec![1], f32s(&[5.0])),
        ]),
    );
    let w = SafetensorsWeights::open(dir.path()).unwrap();
    let e = err_of(w.tensor("ids"));
    assert!(
        e.contains(&p.display().to_string()) && e.contains("tensor ids has dtype I64"),
        "{e}"
    );
    assert_eq!(w.tensor("ok").unwrap().data, [5.0]);
}

#[test]
fn single_file_path_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "drafter.safetensors",
        &st_bytes(&[T("fc.weight", "F32", vec![1, 2], f32s(&[7.0, 8.0]))]),
    );
    let w = SafetensorsWeights::open(&p).unwrap();
    assert_eq!(w.path(), p);
    assert_eq!(w.tensor("fc.weight").unwrap().shape, vec![1, 2]);
}
