//! The raw weight path (backend/raw.rs, `Backend::matrix_raw` / `matrix_stacked_raw`,
//! `WeightSource::raw`): bit-identical to the f32 path the loader used before, for F32, F16 and
//! BF16 tensors, stacked parts (also of mixed dtypes) and dequantised GGUF parts; and a whole
//! model loaded through it equals one built from `WeightSource::tensor` matrices.

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::raw::{stacked_to_f32, RawDtype, RawPart, CONVERT_CHUNK};
use draftlens_engine::backend::Backend;
use draftlens_engine::formats::safetensors::SafetensorsWeights;
use draftlens_engine::formats::WeightSource;
use draftlens_engine::model::transformer::Mixer;
use draftlens_engine::model::{Capture, TargetFiles, TargetModel};
use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

mod f32_only;
use f32_only::F32Only;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Pseudo-random f32 bit patterns (`draftlens_engine::util::DetRng`), with the special values every conversion must
/// carry: ±0, ±inf, NaNs with payloads, f16/bf16 subnormals, values halfway between two bf16.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut r = draftlens_engine::util::DetRng::new(seed);
    let special = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(0x7fc0_0001),
        f32::from_bits(0xff81_2345),
        f32::from_bits(0x0000_0001),
        6.0e-8,
        f32::from_bits(0x3f80_8000), // halfway: rounds to even
        f32::from_bits(0x3f81_8000),
        65504.0,
        1.0e-40,
    ];
    (0..n)
        .map(|i| {
            if i < special.len() {
                return special[i];
            }
            let s = r.next_u64();
            // Mostly ordinary magnitudes, every 7th an arbitrary bit pattern.
            if i % 7 == 0 {
                f32::from_bits(s as u32)
            } else {
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) as f32
            }
        })
        .collect()
}

fn bytes_of(dtype: Dtype, v: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::F16 => v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        Dtype::BF16 => v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        d => panic!("{d:?}"),
    }
}

/// A safetensors file of `(name, dtype, rows, cols)` tensors with [`values`].
fn write_file(path: &Path, specs: &[(&str, Dtype, usize, usize)]) {
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, (_, d, r, c))| bytes_of(*d, &values(r * c, 7 + i as u64)))
        .collect();
    let views: Vec<(String, TensorView)> = specs
        .iter()
        .zip(&data)
        .map(|((n, d, r, c), b)| (n.to_string(), TensorView::new(*d, vec![*r, *c], b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The matrix's values as bit patterns (every row, through `embed`).
fn bits<B: Backend>(be: &B, m: &B::Matrix) -> Vec<u32> {
    let (out, _) = be.matrix_dims(m);
    let ids: Vec<u32> = (0..out as u32).collect();
    be.to_host(&be.embed(m, &ids).unwrap())
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

const SPECS: &[(&str, Dtype, usize, usize)] = &[
    ("a.f32", Dtype::F32, 37, 64),
    ("b.f16", Dtype::F16, 19, 64),
    ("c.bf16", Dtype::BF16, 23, 64),
    // More than one conversion chunk (2^20 elements) of f16.
    ("big.f16", Dtype::F16, 1100, 1024),
];

#[test]
fn raw_matrices_equal_the_f32_path_bit_for_bit_on_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("w.safetensors");
    write_file(&file, SPECS);
    const { assert!(1100 * 1024 > CONVERT_CHUNK) };
    let w = SafetensorsWeights::open(&file).unwrap();
    let be = CpuBackend::new();
    for (name, dtype, rows, cols) in SPECS {
        let raw = w.raw(name).unwrap().expect("F32/F16/BF16 are raw");
        assert_eq!((raw.rows, raw.cols), (*rows, *cols));
        assert_eq!(
            raw.dtype,
            match dtype {
                Dtype::F32 => RawDtype::F32,
                Dtype::F16 => RawDtype::F16,
                _ => RawDtype::BF16,
            }
        );
        let t = w.tensor(name).unwrap();
        let old = be.matrix(&t.data, *rows, *cols).unwrap();
        let new = be.matrix_raw(raw).unwrap();
        assert_eq!(bits(&be, &new), bits(&be, &old), "{name}");
    }
    // Stacked parts of mixed dtypes: the rows of each, in order.
    let parts: Vec<RawPart> = ["a.f32", "b.f16", "c.bf16"]
        .iter()
        .map(|n| w.raw(n).unwrap().unwrap())
        .collect();
    let mut data = Vec::new();
    for n in ["a.f32", "b.f16", "c.bf16"] {
        data.extend(w.tensor(n).unwrap().data);
    }
    let old = be.matrix(&data, 37 + 19 + 23, 64).unwrap();
    let new = be.matrix_stacked_raw(&parts).unwrap();
    assert_eq!(be.matrix_dims(&new), (79, 64));
    assert_eq!(bits(&be, &new), bits(&be, &old));
    // An f32 host part (a dequantised GGUF tensor) next to a stored one.
    let host = w.tensor("b.f16").unwrap().data;
    let mixed = [RawPart::from_f32(&host, 19, 64), parts[2]];
    let want: Vec<f32> = host
        .iter()
        .chain(&w.tensor("c.bf16").unwrap().data)
        .copied()
        .collect();
    assert_eq!(
        stacked_to_f32(&mixed, 64)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn raw_parts_with_wrong_sizes_or_widths_are_clean_errors() {
    let be = CpuBackend::new();
    let bytes = vec![0u8; 10];
    let short = RawPart {
        dtype: RawDtype::BF16,
        rows: 2,
        cols: 3,
        bytes: &bytes,
        mapped: false,
    };
    let e = be.matrix_raw(short).err().unwrap().to_string();
    assert!(
        e.contains("BF16 weight [2, 3] needs 12 bytes, got 10"),
        "{e}"
    );
    let ok = RawPart {
        dtype: RawDtype::F16,
        rows: 1,
        cols: 5,
        bytes: &bytes,
        mapped: false,
    };
    let other = RawPart {
        dtype: RawDtype::F16,
        rows: 5,
        cols: 1,
        bytes: &bytes,
        mapped: false,
    };
    let e = be
        .matrix_stacked_raw(&[ok, other])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("a part has 1 columns, the others 5"), "{e}");
}

/// Hidden states and top-8 of a model on the CPU, for comparing loads.
fn run_model(be: &CpuBackend, m: &TargetModel<CpuBackend>) -> (Vec<u32>, Vec<u32>) {
    let ids = [1u32, 5, 9, 200, 17, 3];
    let out = m
        .forward(be, &ids, &mut m.new_cache(), &Capture::none())
        .unwrap();
    let h = be.to_host(&out.last_hidden).unwrap();
    let top = m.logits_topk(be, &out.last_hidden, 8).unwrap();
    (h.iter().map(|x| x.to_bits()).collect(), top.ids)
}

#[test]
fn a_model_loaded_raw_equals_the_model_loaded_from_f32_tensors() {
    let be = CpuBackend::new();
    // The hybrids' gated attention: q_proj's per-head query and gate rows go up as row views of
    // the stored bytes (`load_gated_qkv`); the f32 path splits them on the host.
    for name in ["qwen3", "qwen2", "qwen3_5", "qwen3_next"] {
        let files = TargetFiles::open(&root().join("tests/fixtures/golden").join(name)).unwrap();
        let raw = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
        let f32s = TargetModel::load(&be, &files.spec, &F32Only(files.weights.as_ref())).unwrap();
        assert_eq!(bits(&be, &raw.embed_tokens), bits(&be, &f32s.embed_tokens));
        let mut attention = 0;
        for (a, b) in raw.layers.iter().zip(&f32s.layers) {
            assert_eq!(
                bits(&be, &a.mlp.dense().unwrap().gate_up_proj),
                bits(&be, &b.mlp.dense().unwrap().gate_up_proj),
                "{name}: fused gate|up"
            );
            let (Mixer::Attention(qa), Mixer::Attention(qb)) = (&a.mixer, &b.mixer) else {
                continue;
            };
            attention += 1;
            assert_eq!(
                bits(&be, &qa.qkv_proj),
                bits(&be, &qb.qkv_proj),
                "{name}: fused qkv"
            );
            match (&qa.gate_proj, &qb.gate_proj) {
                (Some(ga), Some(gb)) => assert_eq!(bits(&be, ga), bits(&be, gb), "{name}: gate"),
                (None, None) => assert!(!files.spec.arch.is_hybrid(), "{name}: no gate"),
                _ => panic!("{name}: one load has an output gate, the other not"),
            }
        }
        assert!(attention > 0, "{name}: no attention layer compared");
        assert_eq!(run_model(&be, &raw), run_model(&be, &f32s), "{name}");
    }
}
