//! GGUF reader: synthetic files written by a small test-only writer (good files round-trip,
//! bad files give one clear error naming the file), plus checks on the real default model when it
//! is installed (`real_model.rs`). `writer.rs` writes the synthetic files.

mod real_model;
mod writer;

use draftlens_engine::formats::dequant::GgmlType;
use draftlens_engine::formats::gguf::{hf_name, GgufFile, GgufValue, GgufWeights};
use draftlens_engine::formats::WeightSource;
use draftlens_engine::model::config::Arch;
use std::path::Path;
use std::sync::Arc;
use writer::*;

fn err_of<T: std::fmt::Debug>(r: anyhow::Result<T>) -> String {
    format!("{:#}", r.expect_err("expected an error"))
}

fn open_err(path: &Path) -> String {
    let e = err_of(GgufFile::open(path));
    assert!(
        e.contains(&path.display().to_string()),
        "error must name the file: {e}"
    );
    e
}

// ------------------------------------------------------------------------------------------
// Good files

#[test]
fn tiny_llama_round_trips_metadata_and_spec() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_llama().write(dir.path(), "tiny.gguf");
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata().len(), 17);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.get_str("general.name"), Some("tiny"));
    assert_eq!(f.get_u64("llama.context_length"), Some(256));
    assert_eq!(f.get_u64("llama.block_count"), Some(1));
    assert_eq!(f.get_f32("llama.rope.freq_base"), Some(100000.0));
    assert_eq!(f.get_bool("tokenizer.ggml.add_bos_token"), Some(false));
    assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap()[9], "t9");
    assert_eq!(
        f.get_i64_array("tokenizer.ggml.token_type").unwrap()[..2],
        [3, 1]
    );
    // Wrong-type lookups give None, not a panic or a coercion.
    assert_eq!(f.get_str("llama.block_count"), None);
    assert_eq!(f.get_u64("general.name"), None);
    assert_eq!(f.get_f32("llama.block_count"), None);
    assert_eq!(
        f.metadata()["llama.attention.head_count"],
        GgufValue::U32(2)
    );

    let s = f.model_spec().unwrap();
    assert_eq!(s.arch, Arch::Llama);
    assert_eq!(
        (
            s.vocab_size,
            s.hidden_size,
            s.intermediate_size,
            s.num_layers,
            s.num_heads,
            s.num_kv_heads,
            s.head_dim
        ),
        (10, 8, 16, 1, 2, 1, 4)
    );
    assert_eq!(
        (s.rope_theta, s.rms_norm_eps, s.max_position_embeddings),
        (100000.0, 1e-5, 256)
    );
    assert!(s.tie_word_embeddings, "no output.weight means tied");
    assert!(!s.attention_bias && !s.qk_norm);
    assert_eq!(
        (s.bos_token_id, s.eos_token_ids.clone()),
        (Some(1), vec![2])
    );
}

#[test]
fn weights_have_hf_names_pytorch_shapes_and_unpermuted_qk() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_llama().write(dir.path(), "tiny.gguf");
    let w = GgufWeights::new(Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    assert_eq!(w.path(), path);
    let infos = w.tensors();
    assert_eq!(infos.len(), 11);
    let q = infos
        .iter()
        .find(|t| t.name == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(
        (
            q.file_name.as_str(),
            q.dtype.as_str(),
            q.shape.clone(),
            q.bytes
        ),
        ("blk.0.attn_q.weight", "F32", vec![8, 8], 256)
    );
    let k = infos
        .iter()
        .find(|t| t.name == "model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    assert_eq!(k.shape, vec![4, 8], "ne [8, 4] is PyTorch [4, 8]");
    assert!(w.contains("model.embed_tokens.weight") && w.contains("model.norm.weight"));
    assert!(!w.contains("lm_head.weight") && !w.contains("token_embd.weight"));

    let embd = w.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(embd.shape, vec![10, 8]);
    assert_eq!(embd.data[9 * 8 + 3], 903.0, "row 9, column 3");

    // q: 2 heads of hd 4. HF row i of a head = GGUF row 2i, HF row i + 2 = GGUF row 2i + 1.
    let row_ids = |t: &draftlens_engine::formats::HostTensor| -> Vec<usize> {
        t.data
            .chunks(t.shape[1])
            .map(|r| (r[0] / 100.0) as usize)
            .collect()
    };
    let q = w.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.shape, vec![8, 8]);
    assert_eq!(row_ids(&q), [0, 2, 1, 3, 4, 6, 5, 7]);
    // Each row keeps its columns (a pure row reorder).
    assert_eq!(
        q.data[8..16],
        [200.0, 201.0, 202.0, 203.0, 204.0, 205.0, 206.0, 207.0]
    );
    // k uses Hkv = 1 head of 4 rows.
    assert_eq!(
        row_ids(&w.tensor("model.layers.0.self_attn.k_proj.weight").unwrap()),
        [0, 2, 1, 3]
    );
    // v and o are never permuted.
    assert_eq!(
        row_ids(&w.tensor("model.layers.0.self_attn.v_proj.weight").unwrap()),
        [0, 1, 2, 3]
    );
    // The raw file view keeps GGUF order.
    assert_eq!(
        row_ids(&w.file().dequantize("blk.0.attn_q.weight").unwrap()),
        [0, 1, 2, 3, 4, 5, 6, 7]
    );

    // Quantised tensor through the same path: row r, element j = (j - 16 + r) * 0.5.
    let down = w.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(down.shape, vec![8, 32]);
    assert_eq!(down.data[0], -8.0);
    assert_eq!(down.data[7 * 32 + 31], (31.0 - 16.0 + 7.0) * 0.5);

    let e = err_of(w.tensor("model.layers.5.mlp.up_proj.weight"));
    assert!(
        e.contains("no tensor model.layers.5.mlp.up_proj.weight") && e.contains("tiny.gguf"),
        "{e}"
    );
}

#[test]
fn qwen2_is_not_permuted_and_maps_biases() {
    let dir = tempfile::tempdir().unwrap();
    let rc = |k: usize| ((k / 8) * 100 + k % 8) as f32;
    let path = Writer::new()
        .str("general.architecture", "qwen2")
        .u32("qwen2.block_count", 1)
        .u32("qwen2.embedding_length", 8)
        .u32("qwen2.feed_forward_length", 16)
        .u32("qwen2.attention.head_count", 2)
        .u32("qwen2.attention.head_count_kv", 2)
        .f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
        .u32("qwen2.vocab_size", 10)
        .u32("tokenizer.ggml.eos_token_id", 7)
        .u32("tokenizer.ggml.eot_token_id", 8)
        .f32_tensor("token_embd.weight", &[8, 10], rc)
        .f32_tensor("output.weight", &[8, 10], rc)
        .f32_tensor("blk.0.attn_q.weight", &[8, 8], rc)
        .f32_tensor("blk.0.attn_q.bias", &[8], |k| k as f32)
        .write(dir.path(), "q2.gguf");
    let f = Arc::new(GgufFile::open(&path).unwrap());
    let s = f.model_spec().unwrap();
    assert_eq!(s.arch, Arch::Qwen2);
    assert!(s.attention_bias && !s.tie_word_embeddings);
    assert_eq!(
        (s.vocab_size, s.head_dim, s.rope_theta, s.bos_token_id),
        (10, 4, 10000.0, None)
    );
    assert_eq!(s.eos_token_ids, vec![7, 8]);
    let w = GgufWeights::new(f).unwrap();
    let q = w.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    let ids: Vec<f32> = q.data.chunks(8).map(|r| r[0]).collect();
    assert_eq!(ids, [0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0]);
    let b = w.tensor("model.layers.0.self_attn.q_proj.bias").unwrap();
    assert_eq!((b.shape.clone(), b.data[5]), (vec![8], 5.0));
    assert!(w.contains("lm_head.weight"));
}

#[test]
fn version_2_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama();
    w.version = 2;
    let f = GgufFile::open(&w.write(dir.path(), "v2.gguf")).unwrap();
    assert_eq!((f.version(), f.tensors().len()), (2, 11));
}

#[test]
fn custom_alignment_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama().u32("general.alignment", 64);
    w.alignment = 64;
    let f = GgufFile::open(&w.write(dir.path(), "a64.gguf")).unwrap();
    assert_eq!((f.alignment(), f.data_offset() % 64), (64, 0));
    let t = f.dequantize("token_embd.weight").unwrap();
    assert_eq!(t.data[8 * 4 + 1], 401.0);
}

#[test]
fn large_tensor_parallel_unpermute_matches_the_formula() {
    // 512 x 512 F32 crosses the parallel threshold; 8 heads of hd 64.
    let dir = tempfile::tempdir().unwrap();
    let path = Writer::new()
        .str("general.architecture", "llama")
        .u32("llama.attention.head_count", 8)
        .u32("llama.attention.head_count_kv", 8)
        .f32_tensor("blk.0.attn_q.weight", &[512, 512], |k| {
            ((k / 512) * 1000 + k % 512) as f32
        })
        .write(dir.path(), "big.gguf");
    let w = GgufWeights::new(Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let q = w.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    for (r, row) in q.data.chunks(512).enumerate() {
        let (head, i) = (r / 64, r % 64);
        let want = head * 64 + if i < 32 { 2 * i } else { 2 * (i - 32) + 1 };
        assert_eq!(row[0], (want * 1000) as f32, "HF row {r}");
        assert_eq!(row[511], (want * 1000 + 511) as f32, "HF row {r}");
    }
}

// ------------------------------------------------------------------------------------------
// Bad files: one clear error naming the file, never a panic

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_err(&dir.path().join("nope.gguf"));
    assert!(e.contains("cannot open"), "{e}");
}

#[test]
fn empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty.gguf");
    std::fs::write(&p, b"").unwrap();
    assert!(open_err(&p).contains("empty file"));
}

#[test]
fn bad_magic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("magic.gguf");
    let mut b = tiny_llama().bytes();
    b[..4].copy_from_slice(b"GGML");
    std::fs::write(&p, b).unwrap();
    let e = open_err(&p);
    assert!(e.contains("not a GGUF file"), "{e}");
}

#[test]
fn unsupported_versions() {
    let dir = tempfile::tempdir().unwrap();
    for (v, want) in [
        (1u32, "GGUF version 1 is not supported"),
        (4, "unsupported GGUF version 4"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut w = tiny_llama();
        w.version = v;
        let e = open_err(&w.write(dir.path(), "v.gguf"));
        assert!(e.contains(want), "version {v}: {e}");
    }
}

#[test]
fn every_truncation_is_a_clear_error() {
    // Cut a valid file at every length: the header, each metadata value, each tensor info and
    // the data section must all be bounds-checked.
    let dir = tempfile::tempdir().unwrap();
    let full = tiny_llama().bytes();
    let p = dir.path().join("cut.gguf");
    for len in 1..full.len() {
        // A fresh file each time: truncating and rewriting one file makes ext4 flush it to disk
        // on close (auto_da_alloc), which turns this loop into thousands of synchronous writes.
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, &full[..len]).unwrap();
        let e = open_err(&p);
        assert!(
            e.contains("truncated") || e.contains("past the end") || e.contains("remain"),
            "cut at {len}: {e}"
        );
    }
    std::fs::write(&p, &full).unwrap();
    GgufFile::open(&p).unwrap();
}

/// Header with `n_tensors`, `n_kv`, followed by `rest`.
fn header(n_tensors: u64, n_kv: u64, rest: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b.extend(rest);
    b
}

#[test]
fn counts_and_lengths_past_the_end_are_rejected_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("overrun.gguf");
    let kv_with = |ty: u32, value: &[u8]| {
        let mut b = gstr("k");
        b.extend(ty.to_le_bytes());
        b.extend(value);
        b.extend([0u8; 64]); // some slack so the failure is the count, not the end of file
        b
    };
    let huge_array = |elem: u32, n: u64| {
        let mut v = elem.to_le_bytes().to_vec();
        v.extend(n.to_le_bytes());
        v
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (header(0, u64::MAX, &[0; 64]), "metadata key/value count"),
        (header(1 << 40, 0, &[0; 64]), "tensor count"),
        // Key length far past the end.
        (
            header(0, 1, &[&(1u64 << 50).to_le_bytes()[..], &[0; 64]].concat()),
            "length of metadata key #0",
        ),
        // String value with a huge length.
        (
            header(0, 1, &kv_with(8, &(u64::MAX - 3).to_le_bytes())),
            "value of metadata key \"k\"",
        ),
        // Array of u64 whose byte size overflows u64.
        (
            header(0, 1, &kv_with(9, &huge_array(10, u64::MAX / 2))),
            "array length of metadata key \"k\"",
        ),
        // Array of strings: each needs at least 8 bytes.
        (
            header(0, 1, &kv_with(9, &huge_array(8, 1_000_000))),
            "array length of metadata key \"k\"",
        ),
    ];
    for (bytes, want) in cases {
        std::fs::write(&p, &bytes).unwrap();
        let e = open_err(&p);
        assert!(e.contains(want), "want {want:?} in: {e}");
    }
    // Unknown value types are named too.
    std::fs::write(&p, header(0, 1, &kv_with(13, &[]))).unwrap();
    assert!(open_err(&p).contains("unknown value type 13"));
    std::fs::write(&p, header(0, 1, &kv_with(9, &huge_array(77, 1)))).unwrap();
    assert!(open_err(&p).contains("unknown array element type 77"));
}

#[test]
fn duplicate_keys_and_bad_alignment() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_err(
        &tiny_llama()
            .str("general.name", "again")
            .write(dir.path(), "dup.gguf"),
    );
    assert!(e.contains("duplicate metadata key \"general.name\""), "{e}");
    let e = open_err(
        &tiny_llama()
            .u32("general.alignment", 48)
            .write(dir.path(), "align.gguf"),
    );
    assert!(
        e.contains("general.alignment must be a power of two"),
        "{e}"
    );
}

#[test]
fn tensor_data_past_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama();
    w.tensors[3].offset = Some(1 << 20);
    let e = open_err(&w.write(dir.path(), "off.gguf"));
    assert!(
        e.contains("tensor blk.0.attn_q.weight data") && e.contains("past the end"),
        "{e}"
    );
    // An offset so large that offset + size overflows u64.
    let mut w = tiny_llama();
    w.tensors[0].offset = Some(u64::MAX - 4);
    let e = open_err(&w.write(dir.path(), "off2.gguf"));
    assert!(e.contains("tensor token_embd.weight data"), "{e}");
}

#[test]
fn bad_tensor_infos() {
    let dir = tempfile::tempdir().unwrap();
    // Row length 48 is not a multiple of the Q8_0 block (32).
    let w = tiny_llama().tensor(
        "blk.0.bad.weight",
        &[48, 2],
        GgmlType::Q8_0,
        vec![0; 3 * 34],
    );
    let e = open_err(&w.write(dir.path(), "rows.gguf"));
    assert!(
        e.contains(
            "tensor blk.0.bad.weight: row length 48 is not a multiple of the Q8_0 block size 32"
        ),
        "{e}"
    );
    // Unknown ggml type id.
    let mut w = tiny_llama();
    w.tensors[1].ty = 99;
    let e = open_err(&w.write(dir.path(), "type.gguf"));
    assert!(
        e.contains("tensor output_norm.weight has unknown ggml type id 99"),
        "{e}"
    );
    // Too many dimensions.
    let w = tiny_llama().f32_tensor("five.weight", &[1, 1, 1, 1, 2], |_| 0.0);
    let e = open_err(&w.write(dir.path(), "dims.gguf"));
    assert!(e.contains("tensor five.weight has 5 dimensions"), "{e}");
    // Duplicate tensor names.
    let w = tiny_llama().f32_tensor("output_norm.weight", &[8], |_| 0.0);
    let e = open_err(&w.write(dir.path(), "dupt.gguf"));
    assert!(
        e.contains("duplicate tensor name output_norm.weight"),
        "{e}"
    );
}

#[test]
fn unsupported_tensor_type_errors_on_load_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    // Q5_K: 256 elements per 176-byte block. The file opens (so `inspect` can list it) but the
    // tensor cannot be dequantised.
    let mut w = tiny_llama();
    let down = w
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.ffn_down.weight")
        .unwrap();
    *down = Tensor {
        name: down.name.clone(),
        ne: vec![256, 8],
        ty: GgmlType::Q5_K.id(),
        data: vec![0; 8 * 176],
        offset: None,
    };
    let path = w.write(dir.path(), "q5k.gguf");
    let weights = GgufWeights::new(Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let info = weights
        .tensors()
        .into_iter()
        .find(|t| t.file_name == "blk.0.ffn_down.weight")
        .unwrap();
    assert_eq!(
        (info.dtype.as_str(), info.shape.clone(), info.bytes),
        ("Q5_K", vec![8, 256], 8 * 176)
    );
    let e = err_of(weights.tensor("model.layers.0.mlp.down_proj.weight"));
    assert!(
        e.contains("q5k.gguf")
            && e.contains("unsupported tensor type Q5_K in tensor blk.0.ffn_down.weight"),
        "{e}"
    );
    // Other tensors still load.
    weights.tensor("model.layers.0.mlp.up_proj.weight").unwrap();
}

#[test]
fn model_spec_errors_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama();
    w.kv.retain(|(k, _, _)| k != "llama.embedding_length");
    let p = w.write(dir.path(), "nokey.gguf");
    let e = err_of(GgufFile::open(&p).unwrap().model_spec());
    assert!(
        e.contains("nokey.gguf") && e.contains("llama.embedding_length is missing"),
        "{e}"
    );

    let mut w = tiny_llama();
    w.kv[0] = ("general.architecture".into(), 8, gstr("gemma"));
    let e = err_of(
        GgufFile::open(&w.write(dir.path(), "gemma.gguf"))
            .unwrap()
            .model_spec(),
    );
    assert!(e.contains("unsupported architecture \"gemma\""), "{e}");

    let w = tiny_llama().i32("llama.attention.head_count_kv_bad", -1);
    let f = GgufFile::open(&w.write(dir.path(), "neg.gguf")).unwrap();
    assert_eq!(
        f.get_u64("llama.attention.head_count_kv_bad"),
        None,
        "negative is not a u64"
    );

    let mut w = tiny_llama();
    w.kv.retain(|(k, _, _)| k != "llama.rope.dimension_count");
    let w = w.u32("llama.rope.dimension_count", 2);
    let e = err_of(
        GgufFile::open(&w.write(dir.path(), "rope.gguf"))
            .unwrap()
            .model_spec(),
    );
    assert!(e.contains("partial rotary"), "{e}");
}

#[test]
fn hf_name_mapping_covers_every_block_tensor() {
    let pairs = [
        (
            "blk.7.attn_norm.weight",
            "model.layers.7.input_layernorm.weight",
        ),
        (
            "blk.7.attn_q.weight",
            "model.layers.7.self_attn.q_proj.weight",
        ),
        (
            "blk.7.attn_k.weight",
            "model.layers.7.self_attn.k_proj.weight",
        ),
        ("blk.7.attn_v.bias", "model.layers.7.self_attn.v_proj.bias"),
        (
            "blk.7.attn_output.weight",
            "model.layers.7.self_attn.o_proj.weight",
        ),
        (
            "blk.7.attn_q_norm.weight",
            "model.layers.7.self_attn.q_norm.weight",
        ),
        (
            "blk.7.attn_k_norm.weight",
            "model.layers.7.self_attn.k_norm.weight",
        ),
        (
            "blk.7.ffn_norm.weight",
            "model.layers.7.post_attention_layernorm.weight",
        ),
        (
            "blk.7.ffn_gate.weight",
            "model.layers.7.mlp.gate_proj.weight",
        ),
        ("blk.7.ffn_up.weight", "model.layers.7.mlp.up_proj.weight"),
        (
            "blk.7.ffn_down.weight",
            "model.layers.7.mlp.down_proj.weight",
        ),
        ("output_norm.weight", "model.norm.weight"),
    ];
    for (g, h) in pairs {
        assert_eq!(hf_name(g).as_deref(), Some(h), "{g}");
    }
}
