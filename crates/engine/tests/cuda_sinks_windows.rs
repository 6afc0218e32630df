//! gpt-oss's attention extras on CUDA (sink logits, sliding windows: `AttnExtras`) against the
//! CPU reference, in every kernel that runs them: the packed prefill (`attention_varlen_ext`), a
//! verify-style causal block over a cache (`attention_ext`), and the batched decode step
//! (`attention_decode_ext`, split-KV chunks and windows that start mid-chunk). Plus known answers
//! that need no reference: a sink of −1e30 and a window longer than every sequence give plain
//! attention's bits, a window of 1 gives each row its own v, and a decode row's result does not
//! depend on its batch-mates. And the fused-QKV decode step (`attention_decode_qkv_ext`: q and k
//! rotated in place, the attention reading the projection's columns) against the split
//! composition it replaces, bit for bit. Skipped without a GPU.

mod cuda_util;

use cuda_util::{bits, gpu};
use draftlens_engine::backend::compose::attention_decode_qkv_ext_unfused;
use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::cuda::{CudaBackend, CudaTensor};
use draftlens_engine::backend::{
    AttnExtras, AttnMask, AttnShape, Backend, KvSlot, RopeFreqs, RopeStyle, SeqStarts,
};
use draftlens_engine::parity::{diff, OpTolerance};
use draftlens_engine::util::host_random_bf16;

/// gpt-oss-20b's attention: 64 query heads over 8 KV heads of 64.
const SHAPE: AttnShape = AttnShape {
    heads: 64,
    kv_heads: 8,
    head_dim: 64,
};
/// The attention tolerance of the other CUDA attention tests (parity.rs, docs/cuda.md).
const ATTN_TOL: OpTolerance = OpTolerance {
    max_rel_l2: 1e-2,
    min_cosine: 0.99995,
};
/// None, one key, gpt-oss's 128, and windows that end mid-tile and mid-chunk.
const WINDOWS: [Option<usize>; 5] = [None, Some(1), Some(8), Some(100), Some(128)];

/// Sink logits of gpt-oss's magnitude (a few units), one per query head.
fn sinks() -> Vec<f32> {
    host_random_bf16(SHAPE.heads, 7, 3.0)
}

fn assert_close(what: &str, want: &[f32], got: &[f32]) {
    let d = diff(want, got);
    assert!(ATTN_TOL.accepts(&d), "{what}: {d:?} outside {ATTN_TOL:?}");
}

/// q, k, v of `t` rows on a backend.
fn qkv<B: Backend>(be: &B, t: usize, seed: u64) -> (B::Tensor, B::Tensor, B::Tensor) {
    let (qd, kvd) = (
        SHAPE.heads * SHAPE.head_dim,
        SHAPE.kv_heads * SHAPE.head_dim,
    );
    let up = |n, s, scale, c| {
        be.from_host(&host_random_bf16(t * n, seed + s, scale), t, c)
            .unwrap()
    };
    (
        up(qd, 1, 1.5, qd),
        up(kvd, 2, 1.5, kvd),
        up(kvd, 3, 1.0, kvd),
    )
}

fn extras<'a>(window: Option<usize>, sinks: Option<&'a [f32]>) -> AttnExtras<'a> {
    AttnExtras { window, sinks }
}

#[test]
fn packed_prefill_and_verify_blocks_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let cpu = CpuBackend::new();
    // Sequences of 1, 9, 200 and 300 tokens: shorter and longer than every window.
    let starts = SeqStarts::new(vec![0, 1, 10, 210, 510]).unwrap();
    let t = 510;
    let s = sinks();
    let (cq, ck, cv) = qkv(&cpu, t, 100);
    let (gq, gk, gv) = qkv(&gpu, t, 100);
    let plain = bits(
        &gpu,
        &gpu.attention_varlen(&gq, &gk, &gv, SHAPE, &starts).unwrap(),
    );
    for window in WINDOWS {
        for sink in [None, Some(s.as_slice())] {
            let x = extras(window, sink);
            let want = cpu
                .attention_varlen_ext(&cq, &ck, &cv, SHAPE, &starts, x)
                .unwrap();
            let got = gpu
                .attention_varlen_ext(&gq, &gk, &gv, SHAPE, &starts, x)
                .unwrap();
            let what = format!(
                "packed prefill, window {window:?}, sinks {}",
                sink.is_some()
            );
            assert_close(
                &what,
                &cpu.to_host(&want).unwrap(),
                &gpu.to_host(&got).unwrap(),
            );
        }
    }
    // Known answers: a sink of −1e30 weighs nothing and a window of every key hides nothing, so
    // both give plain attention's bits; a window of one key gives each row its own v (weight 1).
    let none = vec![-1e30f32; SHAPE.heads];
    for x in [extras(None, Some(&none)), extras(Some(300), None)] {
        let o = gpu
            .attention_varlen_ext(&gq, &gk, &gv, SHAPE, &starts, x)
            .unwrap();
        assert_eq!(bits(&gpu, &o), plain, "{x:?} is plain attention");
    }
    let o = gpu
        .attention_varlen_ext(&gq, &gk, &gv, SHAPE, &starts, extras(Some(1), None))
        .unwrap();
    let (o, v) = (gpu.to_host(&o).unwrap(), gpu.to_host(&gv).unwrap());
    let (qd, kvd, hd) = (
        SHAPE.heads * SHAPE.head_dim,
        SHAPE.kv_heads * SHAPE.head_dim,
        SHAPE.head_dim,
    );
    let group = SHAPE.heads / SHAPE.kv_heads;
    for r in [0, 5, 300, 509] {
        for h in 0..SHAPE.heads {
            let kv = h / group;
            assert_eq!(
                o[r * qd + h * hd..r * qd + (h + 1) * hd],
                v[r * kvd + kv * hd..r * kvd + (kv + 1) * hd],
                "window 1: row {r} head {h} is not its own v"
            );
        }
    }

    // A verify block: 16 queries at positions 300..316 over the 316 keys of one sequence.
    let (tq, tk) = (16, 316);
    let (cq, _, _) = qkv(&cpu, tq, 200);
    let (gq, _, _) = qkv(&gpu, tq, 200);
    let (_, ck, cv) = qkv(&cpu, tk, 300);
    let (_, gk, gv) = qkv(&gpu, tk, 300);
    let mask = AttnMask::Causal { q_start: 300 };
    for window in WINDOWS {
        for sink in [None, Some(s.as_slice())] {
            let x = extras(window, sink);
            let want = cpu.attention_ext(&cq, &ck, &cv, SHAPE, &mask, x).unwrap();
            let got = gpu.attention_ext(&gq, &gk, &gv, SHAPE, &mask, x).unwrap();
            let what = format!("verify block, window {window:?}, sinks {}", sink.is_some());
            assert_close(
                &what,
                &cpu.to_host(&want).unwrap(),
                &gpu.to_host(&got).unwrap(),
            );
        }
    }
}

/// Cache lengths: empty, within one 32-key chunk, at chunk and tile edges, past the window, and
/// long enough (> 4 096) for 64-key chunks, where a window starts mid-chunk.
const LENS: [usize; 10] = [0, 1, 31, 32, 33, 127, 129, 300, 4096, 5000];

/// One decode step of `LENS.len()` sequences (or of the sequences `only` picks), their caches
/// filled with the same random keys on every call: the output and the caches after the append.
fn decode_step<B: Backend>(
    be: &B,
    only: Option<usize>,
    x: AttnExtras<'_>,
) -> (B::Tensor, Vec<(B::Tensor, B::Tensor)>) {
    let all = filled_caches(be);
    let mut caches: Vec<(Option<B::Tensor>, Option<B::Tensor>)> = match only {
        Some(r) => all.into_iter().skip(r).take(1).collect(),
        None => all,
    };
    let (q, k, v) = qkv(be, LENS.len(), 500);
    let pick = |t: &B::Tensor| match only {
        Some(r) => be.slice_rows(t, r, r + 1).unwrap(),
        None => be.slice_rows(t, 0, LENS.len()).unwrap(),
    };
    let (q, k, v) = (pick(&q), pick(&k), pick(&v));
    let mut slots: Vec<KvSlot<'_, B::Tensor>> =
        caches.iter_mut().map(|(k, v)| KvSlot { k, v }).collect();
    let out = be
        .attention_decode_ext(&q, &k, &v, SHAPE, &mut slots, x)
        .unwrap();
    let caches = caches
        .into_iter()
        .map(|(k, v)| (k.unwrap(), v.unwrap()))
        .collect();
    (out, caches)
}

fn rows(gpu: &CudaBackend, t: &CudaTensor, r: usize) -> Vec<u16> {
    bits(gpu, &gpu.slice_rows(t, r, r + 1).unwrap())
}

#[test]
fn batched_decode_matches_the_cpu_and_each_row_alone() {
    let Some(gpu) = gpu() else { return };
    let cpu = CpuBackend::new();
    let s = sinks();
    let (plain, _) = decode_step(&gpu, None, AttnExtras::NONE);
    let plain = bits(&gpu, &plain);
    for window in WINDOWS {
        for sink in [None, Some(s.as_slice())] {
            let x = extras(window, sink);
            let what = format!("decode, window {window:?}, sinks {}", sink.is_some());
            let (want, want_caches) = decode_step(&cpu, None, x);
            let (got, got_caches) = decode_step(&gpu, None, x);
            assert_close(
                &what,
                &cpu.to_host(&want).unwrap(),
                &gpu.to_host(&got).unwrap(),
            );
            for (r, ((wk, wv), (gk, gv))) in want_caches.iter().zip(&got_caches).enumerate() {
                assert_eq!(
                    cpu.to_host(wk).unwrap(),
                    gpu.to_host(gk).unwrap(),
                    "{what}: k cache {r}"
                );
                assert_eq!(
                    cpu.to_host(wv).unwrap(),
                    gpu.to_host(gv).unwrap(),
                    "{what}: v cache {r}"
                );
            }
            // Batch invariance: each sequence's step alone gives its row of the batch, bit for bit.
            for r in 0..LENS.len() {
                let (alone, _) = decode_step(&gpu, Some(r), x);
                assert_eq!(
                    bits(&gpu, &alone),
                    rows(&gpu, &got, r),
                    "{what}: sequence {r} (cache of {}) alone vs in the batch",
                    LENS[r]
                );
            }
        }
    }
    // Known answers, as for the prefill: no weight in the sink, no key outside the window.
    let none = vec![-1e30f32; SHAPE.heads];
    for x in [extras(None, Some(&none)), extras(Some(5001), None)] {
        let (o, _) = decode_step(&gpu, None, x);
        assert_eq!(bits(&gpu, &o), plain, "{x:?} is plain attention");
    }
}

/// Caches of `LENS` filled with the same random keys on every call.
fn filled_caches<B: Backend>(be: &B) -> Vec<(Option<B::Tensor>, Option<B::Tensor>)> {
    let kvd = SHAPE.kv_heads * SHAPE.head_dim;
    LENS.iter()
        .enumerate()
        .map(|(r, &n)| {
            if n == 0 {
                return (None, None);
            }
            let k = host_random_bf16(n * kvd, 1000 + r as u64, 1.5);
            let v = host_random_bf16(n * kvd, 2000 + r as u64, 1.0);
            (
                Some(be.from_host(&k, n, kvd).unwrap()),
                Some(be.from_host(&v, n, kvd).unwrap()),
            )
        })
        .collect()
}

/// The fused-QKV decode step (`CudaBackend::attention_decode_packed_ext`: one in-place rotation of
/// q and k, the attention reading q, k and v from the projection's columns) gives exactly the bits
/// of the split composition (three column copies, two rotations, `attention_decode_ext`), output
/// and caches, with and without sinks and windows, at YaRN-like frequencies and scale; a fused
/// row of the wrong width is a clean error.
#[test]
fn fused_qkv_decode_step_equals_the_split_composition_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let hd = SHAPE.head_dim;
    let width = (SHAPE.heads + 2 * SHAPE.kv_heads) * hd;
    let freqs = RopeFreqs {
        head_dim: hd,
        rotary_dim: hd,
        style: RopeStyle::RotateHalf,
        inv_freq: (0..hd / 2)
            .map(|i| {
                1.0 / 150_000f32.powf((2 * i) as f32 / hd as f32) * if i > 20 { 0.03 } else { 1.0 }
            })
            .collect(),
        attention_scaling: 1.3466,
    };
    let positions: Vec<u32> = LENS.iter().map(|&n| n as u32).collect();
    let fused = host_random_bf16(LENS.len() * width, 900, 1.5);
    let s = sinks();
    for (window, sink) in [
        (None, None),
        (Some(128), Some(s.as_slice())),
        (Some(8), None),
    ] {
        let x = extras(window, sink);
        let step = |split: bool| {
            let mut caches = filled_caches(&gpu);
            let qkv = gpu.from_host(&fused, LENS.len(), width).unwrap();
            let mut slots: Vec<KvSlot<'_, CudaTensor>> =
                caches.iter_mut().map(|(k, v)| KvSlot { k, v }).collect();
            let out = if split {
                attention_decode_qkv_ext_unfused(
                    &gpu, qkv, SHAPE, &positions, &freqs, &mut slots, x,
                )
            } else {
                gpu.attention_decode_qkv_ext(qkv, SHAPE, &positions, &freqs, &mut slots, x)
            }
            .unwrap();
            let caches: Vec<Vec<u16>> = caches
                .iter()
                .flat_map(|(k, v)| {
                    [
                        bits(&gpu, k.as_ref().unwrap()),
                        bits(&gpu, v.as_ref().unwrap()),
                    ]
                })
                .collect();
            (bits(&gpu, &out), caches)
        };
        let (want, want_caches) = step(true);
        let (got, got_caches) = step(false);
        assert_eq!(
            got,
            want,
            "window {window:?}, sinks {}: output",
            sink.is_some()
        );
        assert_eq!(got_caches, want_caches, "window {window:?}: caches");
    }
    let mut caches = filled_caches(&gpu);
    let mut slots: Vec<KvSlot<'_, CudaTensor>> =
        caches.iter_mut().map(|(k, v)| KvSlot { k, v }).collect();
    let narrow = gpu
        .from_host(&fused[..LENS.len() * (width - hd)], LENS.len(), width - hd)
        .unwrap();
    let Err(err) = gpu.attention_decode_qkv_ext(
        narrow,
        SHAPE,
        &positions,
        &freqs,
        &mut slots,
        AttnExtras::NONE,
    ) else {
        panic!("a fused row {hd} columns short was accepted");
    };
    let err = err.to_string();
    assert!(err.contains("fused QKV rows"), "{err}");
}
