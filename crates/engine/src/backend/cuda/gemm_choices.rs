//! GEMM algorithm choices remembered across processes (docs/cuda.md, "GEMM modes and tuning").
//!
//! In [`super::GemmMode::LtTuned`] the first GEMM of each large shape times a dozen cuBLASLt
//! algorithms and keeps the fastest. Timing is noisy, so two processes could keep different
//! algorithms, whose fp32 summation orders differ: the same prompt's hidden states would then
//! differ in their last bits between runs, and every process paid the timing again (seconds for a
//! 27B `run`: docs/benchmarks-cuda.md, "Session 10"). The choice is therefore written to `gemm-choices-v1.json` in the kernel cache folder
//! (`$DRAFTLENS_KERNEL_CACHE`, default `~/.cache/draftlens/kernels`), per machine (GPU, compute
//! capability, driver and cuBLASLt versions: an algorithm is only valid for the library that
//! offered it) and shape, and later processes on that machine reuse it after cuBLASLt has checked
//! it against the shape's descriptors.
//!
//! The file is a cache: a missing, unreadable or malformed file (or entry) is ignored with a
//! warning and rewritten; a failed write costs only the next process's timing.
//!
//! A fresh machine has no file, so its first job timed every shape again (2 s of a cold 8B
//! `extract`, docs/benchmarks-cuda.md). The choices timed on the GPU machines this project
//! measures on ship with the binary ([`SHIPPED`], the same format, copied from those machines'
//! files by `tools/bench/ship_gemm_choices.py`): a machine whose key is one of them (same GPU,
//! driver and cuBLASLt) starts from them, and its own file's entries win where both have a shape.

use anyhow::{anyhow, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// File name inside the kernel cache folder.
pub const FILE_NAME: &str = "gemm-choices-v1.json";

/// The choices that ship with the binary: a [`FILE_NAME`] file of the measured machines.
pub const SHIPPED: &str = include_str!("gemm_choices_shipped.json");

/// What a tuned shape runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// `cublasGemmEx` timed fastest.
    GemmEx,
    /// The backend's own kernel timed fastest (decode GEMMs, `decode_lt.rs`).
    Own,
    /// This cuBLASLt algorithm (`cublasLtMatmulAlgo_t`'s eight words, which cuBLASLt documents as
    /// trivially serialisable for reuse with the same library version).
    Lt([u64; 8]),
}

impl Choice {
    /// `gemm_ex`, or `lt:` and the eight words in hex separated by dots.
    fn encode(&self) -> String {
        match self {
            Choice::GemmEx => "gemm_ex".into(),
            Choice::Own => "own".into(),
            Choice::Lt(words) => {
                let hex: Vec<String> = words.iter().map(|w| format!("{w:x}")).collect();
                format!("lt:{}", hex.join("."))
            }
        }
    }

    fn decode(s: &str) -> Result<Choice> {
        match s {
            "gemm_ex" => return Ok(Choice::GemmEx),
            "own" => return Ok(Choice::Own),
            _ => {}
        }
        let body = s
            .strip_prefix("lt:")
            .ok_or_else(|| anyhow!("neither `gemm_ex`, `own` nor `lt:…`"))?;
        let words: Vec<u64> = body
            .split('.')
            .map(|w| u64::from_str_radix(w, 16).map_err(|e| anyhow!("word `{w}`: {e}")))
            .collect::<Result<_>>()?;
        let words: [u64; 8] = words
            .try_into()
            .map_err(|w: Vec<u64>| anyhow!("{} words, expected 8", w.len()))?;
        Ok(Choice::Lt(words))
    }
}

/// The file's contents: machine → shape key → encoded choice. BTreeMaps keep the file sorted, so
/// rewriting it with the same entries gives the same bytes.
type FileMap = BTreeMap<String, BTreeMap<String, String>>;

#[derive(serde::Serialize, serde::Deserialize)]
struct ChoicesFile {
    version: u32,
    machines: FileMap,
}

/// The remembered choices of one machine, and where they live.
pub struct ChoiceStore {
    /// None: remembering is off (no cache folder).
    path: Option<PathBuf>,
    machine: String,
    choices: Mutex<HashMap<String, Choice>>,
    /// Whether a save already failed (warned once per process).
    save_failed: Mutex<bool>,
}

impl ChoiceStore {
    /// The store for `machine` at `path`, with what ships for it ([`SHIPPED`]) and, over that,
    /// whatever the file already holds for it.
    pub fn open(path: Option<PathBuf>, machine: String) -> ChoiceStore {
        Self::open_with(path, machine, SHIPPED)
    }

    fn open_with(path: Option<PathBuf>, machine: String, shipped: &str) -> ChoiceStore {
        let mut choices = match parse(shipped) {
            Ok(file) => decode_machine(Path::new("(shipped)"), &machine, file.get(&machine)),
            Err(e) => {
                tracing::warn!("the shipped GEMM choices: {e}");
                HashMap::new()
            }
        };
        if let Some(p) = &path {
            let (file, warning) = read_file(p);
            if let Some(w) = warning {
                tracing::warn!("{w}; GEMM choices will be timed again and the file rewritten");
            }
            choices.extend(decode_machine(p, &machine, file.get(&machine)));
        }
        ChoiceStore {
            path,
            machine,
            choices: Mutex::new(choices),
            save_failed: Mutex::new(false),
        }
    }

    /// The same machine's store at `path` instead (what the file there holds for it).
    pub fn reopen(&self, path: Option<PathBuf>) -> ChoiceStore {
        ChoiceStore::open(path, self.machine.clone())
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn get(&self, key: &str) -> Option<Choice> {
        self.choices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
    }

    /// Remembers `choice` for `key`, in memory and in the file (merged with what other processes
    /// wrote meanwhile). A failed write is warned about once and otherwise ignored.
    pub fn remember(&self, key: &str, choice: Choice) {
        self.choices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), choice);
        let Some(path) = &self.path else { return };
        if let Err(e) = self.save(path, key, choice) {
            let mut failed = self.save_failed.lock().unwrap_or_else(|e| e.into_inner());
            if !*failed {
                tracing::warn!("{e:#}; GEMM choices are not remembered for the next process");
                *failed = true;
            }
        }
    }

    fn save(&self, path: &Path, key: &str, choice: Choice) -> Result<()> {
        let (mut file, _) = read_file(path);
        file.entry(self.machine.clone())
            .or_default()
            .insert(key.to_string(), choice.encode());
        write_file(path, &file)
    }
}

/// The file's entries, or none and a warning naming the file and the problem.
fn read_file(path: &Path) -> (FileMap, Option<String>) {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (FileMap::new(), None),
        Err(e) => return (FileMap::new(), Some(format!("{}: {e}", path.display()))),
    };
    match parse(&text) {
        Ok(machines) => (machines, None),
        Err(e) => (FileMap::new(), Some(format!("{}: {e}", path.display()))),
    }
}

/// A choices file's entries, or what is wrong with it.
fn parse(text: &str) -> Result<FileMap> {
    match serde_json::from_str::<ChoicesFile>(text) {
        Ok(f) if f.version == 1 => Ok(f.machines),
        Ok(f) => Err(anyhow!("version {}, this build reads version 1", f.version)),
        Err(e) => Err(anyhow!("not a GEMM choices file: {e}")),
    }
}

/// One machine's entries; a malformed entry is skipped with a warning naming it.
fn decode_machine(
    path: &Path,
    machine: &str,
    entries: Option<&BTreeMap<String, String>>,
) -> HashMap<String, Choice> {
    let mut out = HashMap::new();
    for (key, value) in entries.into_iter().flatten() {
        match Choice::decode(value) {
            Ok(c) => {
                out.insert(key.clone(), c);
            }
            Err(e) => tracing::warn!(
                "{}: entry `{key}` of machine `{machine}` skipped: {e:#}",
                path.display()
            ),
        }
    }
    out
}

/// Writes the whole file through a temporary file in the same folder and a rename, so a reader
/// never sees half of it.
fn write_file(path: &Path, machines: &FileMap) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{}: no parent folder", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let body = serde_json::to_string_pretty(&ChoicesFile {
        version: 1,
        machines: machines.clone(),
    })?;
    let tmp = dir.join(format!(
        ".{FILE_NAME}.{}.{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::write(&tmp, body).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow!("replacing {}: {e}", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = "NVIDIA H200 sm_90 driver 13000 cublasLt 130000";
    const ALGO: [u64; 8] = [1, 0xdead_beef, u64::MAX, 0, 42, 7, 0x8000_0000_0000_0000, 3];

    #[test]
    fn choices_survive_a_new_process_and_stay_per_machine() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k").join(FILE_NAME);
        let a = ChoiceStore::open(Some(path.clone()), M.into());
        assert_eq!(a.get("16384x4096x4096"), None);
        a.remember("16384x4096x4096", Choice::Lt(ALGO));
        a.remember("16384x12288x4096", Choice::GemmEx);
        // A later process on the same machine sees both, exactly.
        let b = ChoiceStore::open(Some(path.clone()), M.into());
        assert_eq!(b.get("16384x4096x4096"), Some(Choice::Lt(ALGO)));
        assert_eq!(b.get("16384x12288x4096"), Some(Choice::GemmEx));
        // Another machine (say, another cuBLASLt) sees none of them, and its own entry does not
        // replace this machine's.
        let other = ChoiceStore::open(Some(path.clone()), "NVIDIA H100 sm_90".into());
        assert_eq!(other.get("16384x4096x4096"), None);
        other.remember("16384x4096x4096", Choice::GemmEx);
        let c = ChoiceStore::open(Some(path.clone()), M.into());
        assert_eq!(c.get("16384x4096x4096"), Some(Choice::Lt(ALGO)));
        // Two stores open at once: each save merges what the other wrote.
        let (p, q) = (
            ChoiceStore::open(Some(path.clone()), M.into()),
            ChoiceStore::open(Some(path.clone()), M.into()),
        );
        p.remember("2048x1x1", Choice::GemmEx);
        q.remember("4096x1x1", Choice::GemmEx);
        let r = ChoiceStore::open(Some(path), M.into());
        for k in [
            "2048x1x1",
            "4096x1x1",
            "16384x4096x4096",
            "16384x12288x4096",
        ] {
            assert!(r.get(k).is_some(), "{k} lost");
        }
    }

    #[test]
    fn a_bad_file_or_entry_is_ignored_and_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        for bad in [
            "{ not json",
            r#"{"version": 2, "machines": {}}"#,
            r#"{"machines": {}}"#,
        ] {
            std::fs::write(&path, bad).unwrap();
            let (entries, warning) = read_file(&path);
            assert!(entries.is_empty());
            let w = warning.expect("a warning");
            assert!(w.contains(FILE_NAME), "{w}");
            let s = ChoiceStore::open(Some(path.clone()), M.into());
            s.remember("k", Choice::Lt(ALGO));
            assert_eq!(
                ChoiceStore::open(Some(path.clone()), M.into()).get("k"),
                Some(Choice::Lt(ALGO)),
                "after {bad}"
            );
        }
        // Malformed entries are skipped one by one; the good one stays.
        let text = format!(
            r#"{{"version": 1, "machines": {{"{M}": {{"a": "lt:1.2", "b": "cublas", "c": "lt:1.2.3.4.5.6.7.zz", "d": "{}"}}}}}}"#,
            Choice::Lt(ALGO).encode()
        );
        std::fs::write(&path, text).unwrap();
        let s = ChoiceStore::open(Some(path.clone()), M.into());
        assert_eq!(s.get("d"), Some(Choice::Lt(ALGO)));
        for k in ["a", "b", "c"] {
            assert_eq!(s.get(k), None, "{k}");
        }
        assert!(Choice::decode("lt:1.2")
            .unwrap_err()
            .to_string()
            .contains("2 words"));
    }

    #[test]
    fn shipped_choices_start_a_fresh_machine_and_its_own_file_wins() {
        let shipped = format!(
            r#"{{"version": 1, "machines": {{"{M}": {{"a": "gemm_ex", "b": "{}"}}, "other": {{"c": "own"}}}}}}"#,
            Choice::Lt(ALGO).encode()
        );
        // No file: the shipped entries of this machine only.
        let s = ChoiceStore::open_with(None, M.into(), &shipped);
        assert_eq!(s.get("a"), Some(Choice::GemmEx));
        assert_eq!(s.get("b"), Some(Choice::Lt(ALGO)));
        assert_eq!(s.get("c"), None);
        // Another machine gets none of them.
        assert_eq!(
            ChoiceStore::open_with(None, "x".into(), &shipped).get("a"),
            None
        );
        // The machine's own file overrides a shipped entry and adds its own.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let none = r#"{"version": 1, "machines": {}}"#;
        let own = ChoiceStore::open_with(Some(path.clone()), M.into(), none);
        own.remember("a", Choice::Own);
        own.remember("d", Choice::GemmEx);
        let s = ChoiceStore::open_with(Some(path), M.into(), &shipped);
        assert_eq!(s.get("a"), Some(Choice::Own));
        assert_eq!(s.get("b"), Some(Choice::Lt(ALGO)));
        assert_eq!(s.get("d"), Some(Choice::GemmEx));
        // What ships parses (a broken file would only warn, but ship none).
        parse(SHIPPED).expect("gemm_choices_shipped.json is a version-1 choices file");
    }

    #[test]
    fn without_a_folder_choices_last_the_process_and_a_failed_write_is_not_an_error() {
        let s = ChoiceStore::open(None, M.into());
        s.remember("k", Choice::GemmEx);
        assert_eq!(s.get("k"), Some(Choice::GemmEx));
        // A path under a regular file cannot be written: remembered in memory all the same.
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let s = ChoiceStore::open(Some(blocker.join(FILE_NAME)), M.into());
        s.remember("k", Choice::Lt(ALGO));
        assert_eq!(s.get("k"), Some(Choice::Lt(ALGO)));
        assert!(*s.save_failed.lock().unwrap());
    }

    #[test]
    fn the_file_is_sorted_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let s = ChoiceStore::open(Some(path.clone()), M.into());
        s.remember("b", Choice::GemmEx);
        s.remember("a", Choice::Lt(ALGO));
        let first = std::fs::read_to_string(&path).unwrap();
        s.remember("a", Choice::Lt(ALGO));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
        assert!(first.find("\"a\"").unwrap() < first.find("\"b\"").unwrap());
        // No temporary files left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE_NAME)]);
    }
}
