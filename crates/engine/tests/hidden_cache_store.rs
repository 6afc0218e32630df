//! Hidden-state cache: addressing, round trips, atomic writes, corruption handling, listing and
//! removal.

use draftlens_engine::hidden_cache::{
    CacheKey, CachedData, CachedTensor, HiddenCache, Lookup, RemoveFilter,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

fn key(kind: &str, tokens: &[u32]) -> CacheKey {
    CacheKey {
        kind: kind.into(),
        weights: "w0".into(),
        tokenizer: "t0".into(),
        token_ids: tokens.to_vec(),
        layers: vec![1, 8],
        backend: "cpu".into(),
        dtype: "f32".into(),
        kernel_version: "k1".into(),
        extra: String::new(),
    }
}

/// Tensors of every dtype the cache stores, in name order (the order `get` returns).
fn tensors(seed: f32) -> Vec<CachedTensor> {
    vec![
        CachedTensor {
            name: "argmax".into(),
            shape: vec![3],
            data: CachedData::U32(vec![0, 49151, u32::MAX]),
        },
        CachedTensor {
            name: "layer.1".into(),
            shape: vec![2, 3],
            data: CachedData::F32(vec![seed, -0.0, 1e-30, f32::MAX, -7.25, f32::INFINITY]),
        },
        CachedTensor {
            name: "layer.8.bf16".into(),
            shape: vec![2],
            data: CachedData::BF16(vec![half::bf16::from_f32(seed), half::bf16::from_f32(-3.5)]),
        },
        CachedTensor {
            name: "layer.8.f16".into(),
            shape: vec![1, 2],
            data: CachedData::F16(vec![half::f16::from_f32(0.5), half::f16::from_f32(65504.0)]),
        },
        CachedTensor {
            name: "scalar".into(),
            shape: vec![],
            data: CachedData::F32(vec![seed * 2.0]),
        },
    ]
}

fn open(dir: &Path) -> HiddenCache {
    HiddenCache::open(&dir.join("cache")).unwrap()
}

/// Files under the cache root, recursively, relative names.
fn all_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn digest_is_pinned_and_covers_every_field() {
    let k = key("taps", &[1, 2, 3]);
    // Reference: python3 hashlib.sha256(b"draftlens-cache-key/v1\n" + json.dumps(key,
    // separators=(",", ":")).encode()) with the fields in declaration order.
    assert_eq!(
        k.digest(),
        "72e16e1ed419b39369c773cefb961137d319bebe242f0dbfa963cf3bac218211"
    );

    type Change = Box<dyn Fn(&mut CacheKey)>;
    let variants: Vec<Change> = vec![
        Box::new(|k| k.kind = "greedy".into()),
        Box::new(|k| k.weights = "w1".into()),
        Box::new(|k| k.tokenizer = "t1".into()),
        Box::new(|k| k.token_ids.push(4)),
        Box::new(|k| k.token_ids = vec![1, 3, 2]),
        Box::new(|k| k.layers = vec![8, 1]),
        Box::new(|k| k.backend = "cuda".into()),
        Box::new(|k| k.dtype = "bf16".into()),
        Box::new(|k| k.kernel_version = "k2".into()),
        Box::new(|k| k.extra = "max_new=64".into()),
    ];
    let mut seen = std::collections::HashSet::from([k.digest()]);
    for change in variants {
        let mut k2 = k.clone();
        change(&mut k2);
        assert!(seen.insert(k2.digest()), "{k2:?} collides");
    }
}

#[test]
fn round_trip_and_layout() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let k = key("taps", &[5, 6, 7]);
    assert!(cache.get(&k).unwrap().is_none());

    let path = cache.put(&k, &tensors(1.5)).unwrap();
    let digest = k.digest();
    assert_eq!(
        path,
        cache
            .root()
            .join(&digest[..2])
            .join(format!("{digest}.safetensors"))
    );
    assert_eq!(cache.entry_path(&k), path);
    assert_eq!(cache.get(&k).unwrap().unwrap(), tensors(1.5));
    // Bit-exact: -0.0 keeps its sign.
    if let CachedData::F32(v) = &cache.get(&k).unwrap().unwrap()[1].data {
        assert_eq!(v[1].to_bits(), (-0.0f32).to_bits());
    }

    // The entry is a plain safetensors file that other tools can read, with the key in the metadata.
    let bytes = std::fs::read(&path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let md = meta.metadata().clone().unwrap();
    assert_eq!(md["digest"], digest);
    assert!(md["checksum"].starts_with("sha256:") && md["checksum"].len() == 7 + 64);
    let stored: CacheKey = serde_json::from_str(&md["key"]).unwrap();
    assert_eq!(stored, k);
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("argmax").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::U32);
    assert_eq!(
        t.data(),
        [0u32, 49151, u32::MAX]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<_>>()
    );

    // The entry is streamed to disk tensor by tensor (no copy of it in memory): it is what the
    // safetensors crate's own serialiser gives for the same tensors and metadata: the same header
    // (as JSON: the metadata map's key order is a hash map's), padded the same way, and the same
    // data section (tensor order and offsets).
    let canonical = safetensors::serialize(st.tensors(), Some(md.clone())).unwrap();
    assert_eq!(canonical.len(), bytes.len());
    let header_len = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let (n, cn) = (header_len(&bytes), header_len(&canonical));
    assert_eq!(n, cn, "header length (padding)");
    let json = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(&b[8..8 + n]).unwrap();
    assert_eq!(json(&bytes), json(&canonical));
    assert_eq!(bytes[8 + n..], canonical[8 + n..], "data section");

    // Only the entry is on disk: no temp files left behind.
    assert_eq!(
        all_files(cache.root()),
        [PathBuf::from(&digest[..2]).join(format!("{digest}.safetensors"))]
    );

    // Another key misses.
    assert!(cache.get(&key("taps", &[5, 6])).unwrap().is_none());
}

#[test]
fn second_put_of_same_key_is_a_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let k = key("taps", &[1]);
    let p1 = cache.put(&k, &tensors(1.0)).unwrap();
    let before = std::fs::read(&p1).unwrap();
    // Different data under the same key: the content is a function of the key, so the existing
    // entry stands.
    let p2 = cache.put(&k, &tensors(2.0)).unwrap();
    assert_eq!(p1, p2);
    assert_eq!(std::fs::read(&p2).unwrap(), before);
    assert_eq!(cache.get(&k).unwrap().unwrap(), tensors(1.0));
}

#[test]
fn bad_tensors_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let k = key("taps", &[1]);
    let bad_shape = [CachedTensor {
        name: "x".into(),
        shape: vec![2, 2],
        data: CachedData::F32(vec![1.0; 3]),
    }];
    let msg = format!("{:#}", cache.put(&k, &bad_shape).unwrap_err());
    assert!(
        msg.contains("shape [2, 2] has 4 elements but the data has 3"),
        "{msg}"
    );
    let t = CachedTensor {
        name: "x".into(),
        shape: vec![1],
        data: CachedData::U32(vec![1]),
    };
    let msg = format!("{:#}", cache.put(&k, &[t.clone(), t]).unwrap_err());
    assert!(msg.contains("given twice"), "{msg}");
    assert!(all_files(cache.root()).is_empty());
}

fn flip_byte(path: &Path, from_end: usize) {
    let mut b = std::fs::read(path).unwrap();
    let i = b.len() - from_end;
    b[i] ^= 0x40;
    std::fs::write(path, b).unwrap();
}

#[test]
fn corrupted_entry_is_detected_by_verify_and_get() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let good = key("taps", &[1]);
    let bad = key("taps", &[2]);
    cache.put(&good, &tensors(1.0)).unwrap();
    let path = cache.put(&bad, &tensors(1.0)).unwrap();
    flip_byte(&path, 3); // inside the data section: the file still parses

    let report = cache.verify().unwrap();
    assert_eq!(report.len(), 2);
    for (p, r) in &report {
        if p == &path {
            let e = r.as_ref().unwrap_err();
            assert!(e.contains("checksum mismatch"), "{e}");
        } else {
            assert!(r.is_ok(), "{p:?}: {r:?}");
        }
    }

    match cache.lookup(&bad).unwrap() {
        Lookup::Corrupt { path: p, problem } => {
            assert_eq!(p, path);
            assert!(problem.contains("checksum mismatch"), "{problem}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Policy: the corrupt entry was deleted; the next read is a plain miss, then a put recomputes.
    assert!(!path.exists());
    assert!(cache.get(&bad).unwrap().is_none());
    cache.put(&bad, &tensors(3.0)).unwrap();
    assert_eq!(cache.get(&bad).unwrap().unwrap(), tensors(3.0));
    assert_eq!(cache.get(&good).unwrap().unwrap(), tensors(1.0));
}

#[test]
fn truncated_entry_is_detected_by_verify_and_get() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let k = key("taps", &[9]);
    let path = cache.put(&k, &tensors(1.0)).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let report = cache.verify().unwrap();
    assert_eq!(report.len(), 1);
    let e = report[0].1.as_ref().unwrap_err();
    assert!(e.contains("not a valid safetensors file"), "{e}");
    // `ls` still shows it (with its problem when the header is cut) so that it can be removed.
    assert_eq!(cache.list().unwrap().len(), 1);

    assert!(cache.get(&k).unwrap().is_none());
    assert!(!path.exists(), "the truncated entry is deleted by get");
}

#[test]
fn corrupt_entry_is_replaced_by_put() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let k = key("taps", &[4]);
    let path = cache.put(&k, &tensors(1.0)).unwrap();
    flip_byte(&path, 1);
    cache.put(&k, &tensors(2.0)).unwrap();
    assert_eq!(cache.get(&k).unwrap().unwrap(), tensors(2.0));
}

#[test]
fn entry_under_the_wrong_name_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let a = key("taps", &[1]);
    let b = key("taps", &[2]);
    let pa = cache.put(&a, &tensors(1.0)).unwrap();
    let pb = cache.entry_path(&b);
    std::fs::create_dir_all(pb.parent().unwrap()).unwrap();
    std::fs::copy(&pa, &pb).unwrap();

    let report = cache.verify().unwrap();
    let (_, r) = report.iter().find(|(p, _)| p == &pb).unwrap();
    assert!(r.as_ref().unwrap_err().contains("file name says"), "{r:?}");
    match cache.lookup(&b).unwrap() {
        Lookup::Corrupt { problem, .. } => assert!(
            problem.contains("does not match the requested key"),
            "{problem}"
        ),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(cache.get(&a).unwrap().unwrap(), tensors(1.0));
}

#[test]
fn leftover_temp_file_is_not_an_entry_and_is_removed_once_stale() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let k = key("taps", &[1, 2]);
    let digest = k.digest();
    // What a writer killed between create and rename leaves: a half-written temp file.
    let shard = cache.root().join(&digest[..2]);
    std::fs::create_dir_all(&shard).unwrap();
    let tmp = shard.join(format!(".{digest}.tmp.424242.0"));
    std::fs::write(&tmp, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"__metad").unwrap();

    assert!(cache.list().unwrap().is_empty());
    assert!(cache.verify().unwrap().is_empty());
    assert!(cache.get(&k).unwrap().is_none());

    // A fresh temp file may belong to a live writer: kept.
    let r = cache.remove(RemoveFilter::StaleTemps).unwrap();
    assert_eq!((r.entries, r.temp_files), (0, 0));
    assert!(tmp.exists());

    // Once it has not been touched for longer than a write can take, it is removed.
    let old =
        SystemTime::now() - draftlens_engine::hidden_cache::STALE_TEMP_AGE - Duration::from_secs(1);
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let r = cache.remove(RemoveFilter::All).unwrap();
    assert_eq!((r.entries, r.temp_files), (0, 1));
    assert!(!tmp.exists());
    assert!(all_files(cache.root()).is_empty());

    // The key is still writable afterwards.
    cache.put(&k, &tensors(1.0)).unwrap();
    assert_eq!(cache.get(&k).unwrap().unwrap(), tensors(1.0));
}

#[test]
fn concurrent_writers_of_the_same_key_both_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cache");
    let k = key("taps", &(0..4000).collect::<Vec<u32>>());
    // Big enough that writes overlap.
    let big = vec![CachedTensor {
        name: "layer.1".into(),
        shape: vec![4000, 64],
        data: CachedData::F32((0..4000 * 64).map(|i| i as f32 * 0.5).collect()),
    }];
    let n = 8;
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    // Each writer opens its own handle, as separate processes would.
                    let cache = HiddenCache::open(&root).unwrap();
                    barrier.wait();
                    cache.put(&k, &big)
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
    });
    let cache = HiddenCache::open(&root).unwrap();
    assert_eq!(cache.get(&k).unwrap().unwrap(), big);
    assert_eq!(
        all_files(&root).len(),
        1,
        "one entry, no temp files: {:?}",
        all_files(&root)
    );
    assert!(cache.verify().unwrap().iter().all(|(_, r)| r.is_ok()));
}

#[test]
fn unwritable_cache_dir_gives_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // A regular file where a directory should be: fails even for root, unlike permission bits.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let root = file.join("cache");
    let msg = format!("{:#}", HiddenCache::open(&root).unwrap_err());
    assert!(
        msg.starts_with(&format!(
            "{}: cannot create the cache directory",
            root.display()
        )),
        "{msg}"
    );

    // The root exists but the shard directory cannot be created.
    let cache = open(dir.path());
    let k = key("taps", &[1]);
    let digest = k.digest();
    let shard = cache.root().join(&digest[..2]);
    std::fs::write(&shard, b"in the way").unwrap();
    let msg = format!("{:#}", cache.put(&k, &tensors(1.0)).unwrap_err());
    assert!(
        msg.starts_with(&format!(
            "{}: cannot create cache directory",
            shard.display()
        )),
        "{msg}"
    );
}

#[test]
fn list_and_remove_by_prefix_kind_and_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let taps: Vec<CacheKey> = (0..4).map(|i| key("taps", &[i])).collect();
    let greedy = key("greedy", &[1, 2, 3]);
    for k in taps.iter().chain([&greedy]) {
        cache.put(k, &tensors(1.0)).unwrap();
    }
    // A file named like an entry but holding garbage is listed with its problem.
    let junk = cache
        .root()
        .join("ab")
        .join(format!("ab{}.safetensors", "0".repeat(62)));
    std::fs::create_dir_all(junk.parent().unwrap()).unwrap();
    std::fs::write(&junk, b"garbage").unwrap();

    let list = cache.list().unwrap();
    assert_eq!(list.len(), 6);
    let g = list.iter().find(|l| l.kind() == Some("greedy")).unwrap();
    assert_eq!(g.digest, greedy.digest());
    assert_eq!(g.size_bytes, std::fs::metadata(&g.path).unwrap().len());
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(g.created_unix.unwrap().abs_diff(now) < 600);
    assert!(
        g.summary()
            .starts_with("greedy backend=cpu dtype=f32 layers=[1, 8] tokens=3"),
        "{}",
        g.summary()
    );
    let j = list.iter().find(|l| l.path == junk).unwrap();
    assert!(
        j.key.is_none() && j.summary().starts_with("unreadable: "),
        "{}",
        j.summary()
    );

    let msg = format!(
        "{:#}",
        cache
            .remove(RemoveFilter::KeyPrefix("XYZ".into()))
            .unwrap_err()
    );
    assert!(msg.contains("expected lowercase hex"), "{msg}");

    let r = cache.remove(RemoveFilter::Corrupt).unwrap();
    assert_eq!(r.entries, 1);
    assert!(!junk.exists());

    let r = cache
        .remove(RemoveFilter::KeyPrefix(taps[0].digest()[..10].to_string()))
        .unwrap();
    assert_eq!(r.entries, 1);
    assert!(cache.get(&taps[0]).unwrap().is_none());
    assert!(cache.get(&taps[1]).unwrap().is_some());

    let r = cache.remove(RemoveFilter::Kind("taps".into())).unwrap();
    assert_eq!(r.entries, 3);
    assert!(r.bytes > 0);
    assert_eq!(
        cache
            .list()
            .unwrap()
            .iter()
            .map(|l| l.kind().unwrap())
            .collect::<Vec<_>>(),
        ["greedy"]
    );

    let r = cache.remove(RemoveFilter::All).unwrap();
    assert_eq!(r.entries, 1);
    assert!(
        all_files(cache.root()).is_empty(),
        "{:?}",
        all_files(cache.root())
    );
}
