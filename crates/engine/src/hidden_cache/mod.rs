//! Content-addressed cache of target outputs (hidden-state taps, greedy continuations, ...).
//!
//! Length (~830 lines, over the ~800 guideline): addressing, the entry file format and the
//! on-disk store are one rule (what invalidates an entry) and stay together; the shared-cache
//! publication rules are in `shared.rs`, the background writes in `writer.rs`.
//!
//! An entry is addressed by the sha256 of everything that determines its content ([`CacheKey`]):
//! weights, tokenizer, token ids, layer set, backend, dtype and kernel version. Change any of them and
//! the address changes, so a stale entry is never returned: it is simply not found.
//!
//! Layout: `<root>/<first 2 hex of the digest>/<digest>.safetensors`. Each entry is a safetensors
//! file whose `__metadata__` holds
//!
//! | key | value |
//! |---|---|
//! | `draftlens.cache` | format version, `"1"` |
//! | `key` | the [`CacheKey`] as JSON (checked on read: a file at the wrong address is corrupt) |
//! | `digest` | the digest, i.e. the file name |
//! | `checksum` | `sha256:<hex>` over the tensors (see [`tensors_checksum`]) |
//! | `created` | unix seconds |
//!
//! Durability and sharing: the cache may live on a network filesystem (NFS, Lustre, GPFS) that
//! many jobs on many machines write at once (docs/scale-out.md, "Shared cache"). An entry is
//! written to a temp file in its own directory whose name is unique across machines
//! ([`unique_temp_name`]: host, pid, a per-process counter and 64 random bits), fsynced, and
//! published with `link(2)`, which fails instead of replacing when the entry already exists: a
//! published entry is never overwritten, so a reader never reads a file that changes under it.
//! Where hard links are not supported the publish falls back to `rename(2)` (atomic too; the last
//! of two identical writers wins). Readers therefore see a complete entry or none; a killed
//! writer leaves at most a temp file, whose name starts with a dot and never matches an entry,
//! removed by `cache rm` / `cache gc` once stale ([`STALE_TEMP_AGE`]). No lock files are used.
//! Two jobs computing the same key both compute it (the content is a function of the key); the
//! first publish wins and the other's temp file is deleted.
//!
//! Least-recently-used eviction (`cache gc --max-size`, [`HiddenCache::gc`]) orders entries by
//! their modification time, which records the last use: a hit whose entry was last touched more
//! than [`TOUCH_INTERVAL`] ago sets it to now (one metadata write per entry per hour at most, not
//! one per read; `atime` is not used because most mounts are `noatime` or `relatime`).
//!
//! Corruption policy: [`HiddenCache::get`] verifies the checksum and the key of every entry it
//! reads. A corrupt entry is logged as a warning naming the file and the problem, deleted, and
//! reported as a miss so the caller recomputes it. [`HiddenCache::lookup`] returns the same
//! information to callers that want to show it.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub mod shared;
pub mod writer;

use shared::{is_not_found, publish, read_entry, same_file, touch_if_old};
pub use shared::{parse_size, GcReport, PutOutcome};

/// Format version stored in every entry; bump it when the layout or checksum changes.
const FORMAT_VERSION: &str = "1";
/// Domain-separation prefix of key digests; changing it invalidates every entry.
const KEY_DOMAIN: &str = "draftlens-cache-key/v1\n";
const ENTRY_EXT: &str = "safetensors";
/// A temp file not modified for this long belongs to a dead writer: writing one entry takes
/// seconds, and the file's mtime moves while it is written.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(15 * 60);
/// A hit refreshes its entry's modification time (the LRU clock) when it is older than this.
pub const TOUCH_INTERVAL: Duration = Duration::from_secs(60 * 60);
/// Attempts of one publish whose shard directory vanished under it (a concurrent `gc` removed it
/// while empty) before giving up.
const PUBLISH_ATTEMPTS: u32 = 5;

/// Everything that determines a cached entry's content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheKey {
    /// What the entry holds: `"taps"`, `"greedy"`, ...
    pub kind: String,
    /// Hash of the target weights (e.g. sha256 of the weight files).
    pub weights: String,
    /// Fingerprint of the tokenizer and chat template.
    pub tokenizer: String,
    /// The token ids the target was run over.
    pub token_ids: Vec<u32>,
    /// Captured layers (hidden-state indices), in the caller's order.
    pub layers: Vec<usize>,
    /// `"cpu"`, `"cuda"`, ...
    pub backend: String,
    /// Compute dtype, e.g. `"f32"`, `"bf16"`.
    pub dtype: String,
    /// Version of the kernel and model code that produced the entry, so a numerics fix invalidates it.
    pub kernel_version: String,
    /// Anything else that matters to this kind (e.g. max new tokens for `greedy`); free-form.
    pub extra: String,
}

impl CacheKey {
    /// sha256 (lowercase hex) of the key's canonical JSON. The JSON of a struct is canonical: fields
    /// come out in declaration order, so the digest is stable across runs and machines.
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(self).expect("serialising a CacheKey to JSON cannot fail");
        let mut h = Sha256::new();
        h.update(KEY_DOMAIN.as_bytes());
        h.update(&json);
        hex::encode(h.finalize())
    }

    /// One-line human summary for `cache ls`.
    pub fn summary(&self) -> String {
        format!(
            "{} backend={} dtype={} layers={:?} tokens={} weights={} tokenizer={} kernels={}{}",
            self.kind,
            self.backend,
            self.dtype,
            self.layers,
            self.token_ids.len(),
            short(&self.weights),
            short(&self.tokenizer),
            self.kernel_version,
            if self.extra.is_empty() {
                String::new()
            } else {
                format!(" extra={}", self.extra)
            }
        )
    }
}

fn short(s: &str) -> &str {
    s.get(..12).unwrap_or(s)
}

/// Element data of a cached tensor, stored little-endian with the matching safetensors dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum CachedData {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    BF16(Vec<half::bf16>),
    U32(Vec<u32>),
}

impl CachedData {
    pub fn len(&self) -> usize {
        match self {
            CachedData::F32(v) => v.len(),
            CachedData::F16(v) => v.len(),
            CachedData::BF16(v) => v.len(),
            CachedData::U32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn dtype(&self) -> safetensors::Dtype {
        match self {
            CachedData::F32(_) => safetensors::Dtype::F32,
            CachedData::F16(_) => safetensors::Dtype::F16,
            CachedData::BF16(_) => safetensors::Dtype::BF16,
            CachedData::U32(_) => safetensors::Dtype::U32,
        }
    }

    /// The values as little-endian bytes: borrowed on a little-endian machine (no copy of
    /// gigabytes of hidden states while an entry is written), converted otherwise.
    fn le_bytes(&self) -> Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            return Cow::Borrowed(match self {
                CachedData::F32(v) => bytemuck::cast_slice(v),
                CachedData::F16(v) => bytemuck::cast_slice(v),
                CachedData::BF16(v) => bytemuck::cast_slice(v),
                CachedData::U32(v) => bytemuck::cast_slice(v),
            });
        }
        Cow::Owned(match self {
            CachedData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            CachedData::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            CachedData::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            CachedData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        })
    }

    fn from_le_bytes(
        dtype: safetensors::Dtype,
        b: &[u8],
    ) -> std::result::Result<CachedData, String> {
        use safetensors::Dtype;
        let w4 = || b.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
        let w2 = || b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
        Ok(match dtype {
            Dtype::F32 => CachedData::F32(w4().map(f32::from_le_bytes).collect()),
            Dtype::U32 => CachedData::U32(w4().map(u32::from_le_bytes).collect()),
            Dtype::F16 => CachedData::F16(w2().map(half::f16::from_bits).collect()),
            Dtype::BF16 => CachedData::BF16(w2().map(half::bf16::from_bits).collect()),
            other => return Err(format!("dtype {other:?} is not one the cache writes")),
        })
    }
}

/// One named tensor of an entry (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct CachedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: CachedData,
}

/// One entry as `cache ls` shows it. Entries whose header cannot be read are listed too (with
/// `key: None` and the `problem`), so that they can be seen and removed.
#[derive(Clone, Debug, Serialize)]
pub struct CacheListing {
    pub path: PathBuf,
    pub digest: String,
    pub size_bytes: u64,
    /// Unix seconds from the entry's metadata (the file's mtime if the header is unreadable).
    pub created_unix: Option<u64>,
    pub key: Option<CacheKey>,
    pub problem: Option<String>,
}

impl CacheListing {
    pub fn kind(&self) -> Option<&str> {
        self.key.as_ref().map(|k| k.kind.as_str())
    }

    pub fn summary(&self) -> String {
        match (&self.key, &self.problem) {
            (Some(k), _) => k.summary(),
            (None, Some(p)) => format!("unreadable: {p}"),
            (None, None) => "unreadable".into(),
        }
    }
}

/// Which entries [`HiddenCache::remove`] deletes. Every call also deletes stale temp files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoveFilter {
    /// Every entry.
    All,
    /// Entries whose digest starts with this lowercase hex prefix.
    KeyPrefix(String),
    /// Entries of this kind (`"taps"`, ...). Entries with an unreadable header have no kind and are
    /// not matched; use `Corrupt` for them.
    Kind(String),
    /// Entries that fail verification.
    Corrupt,
    /// No entries: only stale temp files.
    StaleTemps,
}

/// What [`HiddenCache::remove`] deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RemoveReport {
    pub entries: usize,
    pub bytes: u64,
    pub temp_files: usize,
}

/// Result of [`HiddenCache::lookup`].
#[derive(Debug)]
pub enum Lookup {
    Hit(Vec<CachedTensor>),
    Miss,
    /// The entry existed but was corrupt; it has been deleted.
    Corrupt {
        path: PathBuf,
        problem: String,
    },
}

/// The cache rooted at one directory.
#[derive(Clone, Debug)]
pub struct HiddenCache {
    root: PathBuf,
}

impl HiddenCache {
    /// The default root: `$DRAFTLENS_CACHE`, else `$XDG_CACHE_HOME/draftlens`, else
    /// `$HOME/.cache/draftlens`.
    pub fn default_root() -> Result<PathBuf> {
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        if let Some(p) = env("DRAFTLENS_CACHE") {
            return Ok(p);
        }
        if let Some(p) = env("XDG_CACHE_HOME") {
            return Ok(p.join("draftlens"));
        }
        if let Some(p) = env("HOME") {
            return Ok(p.join(".cache").join("draftlens"));
        }
        bail!("no cache directory: set DRAFTLENS_CACHE (or HOME)")
    }

    /// Opens the cache at `root`, creating the directory if needed. Does not require write access
    /// (listing a read-only cache works); [`HiddenCache::put`] reports an unwritable directory.
    pub fn open(root: &Path) -> Result<HiddenCache> {
        fs::create_dir_all(root)
            .with_context(|| format!("{}: cannot create the cache directory", root.display()))?;
        if !root.is_dir() {
            bail!("{}: the cache root is not a directory", root.display());
        }
        Ok(HiddenCache {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the entry of `key` lives (whether or not it exists).
    pub fn entry_path(&self, key: &CacheKey) -> PathBuf {
        self.path_for_digest(&key.digest())
    }

    fn path_for_digest(&self, digest: &str) -> PathBuf {
        self.root
            .join(&digest[..2])
            .join(format!("{digest}.{ENTRY_EXT}"))
    }

    /// The entry's tensors, or `None` on a miss. A corrupt entry is logged (warning naming the
    /// file), deleted, and reported as `None` so the caller recomputes it.
    pub fn get(&self, key: &CacheKey) -> Result<Option<Vec<CachedTensor>>> {
        Ok(match self.lookup(key)? {
            Lookup::Hit(t) => Some(t),
            Lookup::Miss => None,
            Lookup::Corrupt { .. } => None,
        })
    }

    /// Like [`HiddenCache::get`] but says whether a miss was a corrupt entry (already deleted).
    /// Errors are I/O failures other than "not found" (e.g. permission denied). An entry removed
    /// while it is read (a concurrent `gc`; `ESTALE` on NFS) is a miss.
    pub fn lookup(&self, key: &CacheKey) -> Result<Lookup> {
        let digest = key.digest();
        let path = self.path_for_digest(&digest);
        // Twice at most: a corrupt file that was replaced between our read and our delete is
        // read again instead of deleted.
        for _ in 0..2 {
            let (bytes, meta) = match read_entry(&path) {
                Ok(Some(x)) => x,
                Ok(None) => return Ok(Lookup::Miss),
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("{}: cannot read cache entry", path.display()))
                }
            };
            match decode_entry(&bytes, Some((&digest, key))) {
                Ok((_, tensors)) => {
                    touch_if_old(&path, &meta);
                    return Ok(Lookup::Hit(tensors));
                }
                Err(problem) => {
                    if !same_file(&path, &meta) {
                        continue;
                    }
                    tracing::warn!(
                        "{}: corrupt cache entry ({problem}); deleting it, it will be recomputed",
                        path.display()
                    );
                    match fs::remove_file(&path) {
                        Ok(()) => {}
                        // A concurrent reader may have deleted it first.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(e).with_context(|| {
                                format!(
                                    "{}: corrupt cache entry ({problem}) and cannot delete it",
                                    path.display()
                                )
                            })
                        }
                    }
                    return Ok(Lookup::Corrupt { path, problem });
                }
            }
        }
        Ok(Lookup::Miss)
    }

    /// Stores `tensors` under `key` atomically and returns the entry's path. If a valid entry for
    /// the key already exists nothing is written (the content is a function of the key); a corrupt
    /// one is replaced.
    pub fn put(&self, key: &CacheKey, tensors: &[CachedTensor]) -> Result<PathBuf> {
        self.put_outcome(key, tensors).map(|o| o.path)
    }

    /// [`HiddenCache::put`], saying what happened (for measurements of concurrent writers).
    pub fn put_outcome(&self, key: &CacheKey, tensors: &[CachedTensor]) -> Result<PutOutcome> {
        let digest = key.digest();
        let path = self.path_for_digest(&digest);
        let present = |retries| PutOutcome {
            path: path.clone(),
            published: false,
            retries,
        };
        if let Ok(Some((existing, meta))) = read_entry(&path) {
            match decode_entry(&existing, Some((&digest, key))) {
                Ok(_) => {
                    touch_if_old(&path, &meta);
                    return Ok(present(0));
                }
                Err(problem) => {
                    tracing::warn!(
                        "{}: corrupt cache entry ({problem}); replacing it",
                        path.display()
                    );
                    if same_file(&path, &meta) {
                        let _ = fs::remove_file(&path);
                    }
                }
            }
        }

        let entry = EntryWriter::new(&digest, key, tensors)
            .with_context(|| format!("{}: cannot encode entry", path.display()))?;
        let dir = path.parent().expect("entry paths have a shard directory");
        let mut retries = 0;
        loop {
            match publish(dir, &path, &digest, |tmp| entry.write(tmp)) {
                Ok(published) => {
                    return Ok(PutOutcome {
                        path,
                        published,
                        retries,
                    })
                }
                // The shard directory was removed (an empty one, by a concurrent `gc`) between
                // creating it and linking into it: create it again.
                Err(e) if is_not_found(&e) && retries + 1 < PUBLISH_ATTEMPTS => retries += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Every entry, sorted by path. Reads only the headers.
    pub fn list(&self) -> Result<Vec<CacheListing>> {
        let mut out = Vec::new();
        for (path, digest) in self.entry_files()? {
            let meta =
                fs::metadata(&path).with_context(|| format!("{}: cannot stat", path.display()))?;
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs());
            let (key, created, problem) = match read_header_metadata(&path) {
                Ok(md) => match parse_key(&md) {
                    Ok(k) => (
                        Some(k),
                        md.get("created").and_then(|c| c.parse().ok()).or(mtime),
                        None,
                    ),
                    Err(p) => (None, mtime, Some(p)),
                },
                Err(p) => (None, mtime, Some(p)),
            };
            out.push(CacheListing {
                path,
                digest,
                size_bytes: meta.len(),
                created_unix: created,
                key,
                problem,
            });
        }
        Ok(out)
    }

    /// Fully verifies every entry (header, key, checksum); reads every byte.
    pub fn verify(&self) -> Result<Vec<(PathBuf, std::result::Result<(), String>)>> {
        let mut out = Vec::new();
        for (path, digest) in self.entry_files()? {
            let result = verify_file(&path, &digest);
            out.push((path, result));
        }
        Ok(out)
    }

    /// Deletes the entries `which` selects, plus stale temp files.
    pub fn remove(&self, which: RemoveFilter) -> Result<RemoveReport> {
        if let RemoveFilter::KeyPrefix(p) = &which {
            if p.is_empty()
                || !p
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                bail!("cache key prefix {p:?}: expected lowercase hex digits");
            }
        }
        let mut report = RemoveReport::default();
        for (path, digest) in self.entry_files()? {
            let selected = match &which {
                RemoveFilter::All => true,
                RemoveFilter::KeyPrefix(p) => digest.starts_with(p.as_str()),
                RemoveFilter::Kind(kind) => read_header_metadata(&path)
                    .ok()
                    .and_then(|md| parse_key(&md).ok())
                    .is_some_and(|k| &k.kind == kind),
                RemoveFilter::Corrupt => verify_file(&path, &digest).is_err(),
                RemoveFilter::StaleTemps => false,
            };
            if selected {
                let size = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                match fs::remove_file(&path) {
                    Ok(()) => {
                        report.entries += 1;
                        report.bytes += size;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("{}: cannot delete cache entry", path.display())
                        })
                    }
                }
            }
        }
        report.temp_files = self.remove_stale_temps()?;
        // Drop shard directories left empty (fails harmlessly on non-empty ones).
        for dir in self.shard_dirs()? {
            let _ = fs::remove_dir(&dir);
        }
        Ok(report)
    }

    /// The two-hex-digit shard directories under the root.
    pub(crate) fn shard_dirs(&self) -> Result<Vec<PathBuf>> {
        let mut dirs = Vec::new();
        for e in read_dir(&self.root)? {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.len() == 2
                && is_hex(&name)
                && e.file_type().map(|t| t.is_dir()).unwrap_or(false)
            {
                dirs.push(e.path());
            }
        }
        dirs.sort();
        Ok(dirs)
    }

    /// `(path, digest)` of every file named like an entry. Temp files start with a dot and never
    /// match.
    pub(crate) fn entry_files(&self) -> Result<Vec<(PathBuf, String)>> {
        let mut out = Vec::new();
        for dir in self.shard_dirs()? {
            for e in read_dir(&dir)? {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(digest) = name.strip_suffix(&format!(".{ENTRY_EXT}")) {
                    if digest.len() == 64
                        && is_hex(digest)
                        && e.file_type().map(|t| t.is_file()).unwrap_or(false)
                    {
                        out.push((e.path(), digest.to_string()));
                    }
                }
            }
        }
        out.sort();
        Ok(out)
    }

    pub(crate) fn temp_files(&self) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for dir in self.shard_dirs()? {
            for e in read_dir(&dir)? {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') && name.contains(".tmp.") {
                    out.push(e.path());
                }
            }
        }
        Ok(out)
    }
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    fs::read_dir(dir)
        .with_context(|| format!("{}: cannot list cache directory", dir.display()))?
        .map(|e| e.with_context(|| format!("{}: cannot list cache directory", dir.display())))
        .collect()
}

fn is_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Writes `bytes` to a new file at `path` and fsyncs it.
/// sha256 over the tensors in name order; for each: name, dtype, shape and the little-endian data,
/// each length-prefixed so that no two different tensor lists hash the same byte stream. Defined
/// on the tensors rather than on the file's byte layout, so it does not depend on how the
/// safetensors crate orders the data section.
pub fn tensors_checksum(tensors: &[(&str, safetensors::Dtype, &[usize], &[u8])]) -> String {
    let mut sorted: Vec<_> = tensors.iter().collect();
    sorted.sort_by_key(|t| t.0);
    let mut h = Sha256::new();
    let put = |h: &mut Sha256, b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    for (name, dtype, shape, data) in sorted {
        put(&mut h, name.as_bytes());
        put(&mut h, dtype.to_string().as_bytes());
        h.update((shape.len() as u64).to_le_bytes());
        for &d in shape.iter() {
            h.update((d as u64).to_le_bytes());
        }
        put(&mut h, data);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// An entry ready to be written: its tensors checked and checksummed, their bytes borrowed (on a
/// little-endian machine), so that writing a multi-gigabyte entry does not hold two more copies
/// of it in memory (the bytes and the serialised file).
struct EntryWriter<'a> {
    tensors: &'a [CachedTensor],
    bytes: Vec<Cow<'a, [u8]>>,
    metadata: HashMap<String, String>,
}

impl<'a> EntryWriter<'a> {
    fn new(digest: &str, key: &CacheKey, tensors: &'a [CachedTensor]) -> Result<Self> {
        let mut names = std::collections::HashSet::new();
        for t in tensors {
            if t.name.is_empty() || t.name.starts_with("__") {
                bail!("tensor name {:?} is not allowed", t.name);
            }
            if !names.insert(t.name.as_str()) {
                bail!("tensor {:?} given twice", t.name);
            }
            let elems: usize = t.shape.iter().product();
            if elems != t.data.len() {
                bail!(
                    "tensor {:?}: shape {:?} has {elems} elements but the data has {}",
                    t.name,
                    t.shape,
                    t.data.len()
                );
            }
        }
        let bytes: Vec<Cow<[u8]>> = tensors.iter().map(|t| t.data.le_bytes()).collect();
        let checksum = tensors_checksum(
            &tensors
                .iter()
                .zip(&bytes)
                .map(|(t, b)| (t.name.as_str(), t.data.dtype(), t.shape.as_slice(), &**b))
                .collect::<Vec<_>>(),
        );
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let metadata = HashMap::from([
            ("draftlens.cache".to_string(), FORMAT_VERSION.to_string()),
            ("key".to_string(), serde_json::to_string(key)?),
            ("digest".to_string(), digest.to_string()),
            ("checksum".to_string(), checksum),
            ("created".to_string(), created.to_string()),
        ]);
        Ok(EntryWriter {
            tensors,
            bytes,
            metadata,
        })
    }

    /// Streams the entry into the new file `path` and fsyncs it: the same bytes as
    /// `safetensors::serialize` (tensors by descending dtype, then name; the JSON header padded
    /// with spaces to 8 bytes), which needs the whole file in one buffer. (`serialize_to_file`
    /// streams, but through a temp file of its own naming that `cache gc` would not recognise.)
    fn write(&self, path: &Path) -> Result<()> {
        let mut order: Vec<usize> = (0..self.tensors.len()).collect();
        order.sort_by(|&a, &b| {
            let (ta, tb) = (&self.tensors[a], &self.tensors[b]);
            tb.data
                .dtype()
                .cmp(&ta.data.dtype())
                .then(ta.name.cmp(&tb.name))
        });
        let mut offset = 0;
        let infos = order
            .iter()
            .map(|&i| {
                let t = &self.tensors[i];
                let n = self.bytes[i].len();
                offset += n;
                let info = safetensors::tensor::TensorInfo {
                    dtype: t.data.dtype(),
                    shape: t.shape.clone(),
                    data_offsets: (offset - n, offset),
                };
                (t.name.clone(), info)
            })
            .collect();
        let header = safetensors::tensor::Metadata::new(Some(self.metadata.clone()), infos)?;
        let mut header = serde_json::to_string(&header)?.into_bytes();
        header.resize(header.len().next_multiple_of(8), b' ');
        let io = |e: std::io::Error| {
            anyhow::Error::from(e)
                .context(format!("{}: cannot write cache temp file", path.display()))
        };
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| format!("{}: cannot create cache temp file", path.display()))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        w.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io)?;
        w.write_all(&header).map_err(io)?;
        for &i in &order {
            w.write_all(&self.bytes[i]).map_err(io)?;
        }
        let f = w.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all()
            .with_context(|| format!("{}: cannot fsync cache temp file", path.display()))
    }
}

/// Parses and checks a whole entry: safetensors structure, format version, checksum, and when
/// `expect` is given, that the stored key is that key and hashes to that digest.
fn decode_entry(
    bytes: &[u8],
    expect: Option<(&str, &CacheKey)>,
) -> std::result::Result<(CacheKey, Vec<CachedTensor>), String> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid safetensors file: {e}"))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| format!("not a valid safetensors file: {e}"))?;
    let md = header.metadata().clone().unwrap_or_default();
    let key = parse_key(&md)?;
    if let Some((digest, want)) = expect {
        if md.get("digest").map(String::as_str) != Some(digest) || &key != want {
            return Err("stored key does not match the requested key".into());
        }
    }
    let stored = md.get("checksum").ok_or("no checksum in the metadata")?;
    let mut parts = st.tensors();
    parts.sort_by(|a, b| a.0.cmp(&b.0));
    let checksum = tensors_checksum(
        &parts
            .iter()
            .map(|(n, v)| (n.as_str(), v.dtype(), v.shape(), v.data()))
            .collect::<Vec<_>>(),
    );
    if &checksum != stored {
        return Err(format!(
            "checksum mismatch: stored {stored}, data hashes to {checksum}"
        ));
    }
    let tensors = parts
        .into_iter()
        .map(|(name, v)| {
            let data = CachedData::from_le_bytes(v.dtype(), v.data())
                .map_err(|e| format!("tensor {name:?}: {e}"))?;
            Ok(CachedTensor {
                name,
                shape: v.shape().to_vec(),
                data,
            })
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    Ok((key, tensors))
}

fn parse_key(md: &HashMap<String, String>) -> std::result::Result<CacheKey, String> {
    match md.get("draftlens.cache") {
        Some(v) if v == FORMAT_VERSION => {}
        Some(v) => {
            return Err(format!(
                "cache format version {v:?}, this build reads {FORMAT_VERSION:?}"
            ))
        }
        None => {
            return Err(
                "not a draftlens cache entry (no \"draftlens.cache\" in the metadata)".into(),
            )
        }
    }
    let json = md.get("key").ok_or("no key in the metadata")?;
    serde_json::from_str(json).map_err(|e| format!("unreadable key in the metadata: {e}"))
}

/// Full check of the entry file at `path`: structure, checksum, and that its name is the digest of
/// the key stored inside (catches entries copied or renamed by hand).
fn verify_file(path: &Path, digest: &str) -> std::result::Result<(), String> {
    let bytes = fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let (key, _) = decode_entry(&bytes, None)?;
    let actual = key.digest();
    if actual != digest {
        return Err(format!(
            "file name says {digest} but the stored key hashes to {actual}"
        ));
    }
    Ok(())
}

/// Reads only the safetensors header of `path` and returns its `__metadata__`.
fn read_header_metadata(path: &Path) -> std::result::Result<HashMap<String, String>, String> {
    let mut f = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let file_len = f.metadata().map_err(|e| format!("cannot stat: {e}"))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| "shorter than a safetensors header".to_string())?;
    let n = u64::from_le_bytes(n);
    if n > 100 << 20 || 8 + n > file_len {
        return Err(format!(
            "header length {n} runs past the end of the {file_len}-byte file"
        ));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|e| format!("cannot read header: {e}"))?;
    #[derive(Deserialize)]
    struct Header {
        #[serde(rename = "__metadata__")]
        metadata: Option<HashMap<String, String>>,
    }
    let h: Header =
        serde_json::from_slice(&header).map_err(|e| format!("unreadable header: {e}"))?;
    Ok(h.metadata.unwrap_or_default())
}
