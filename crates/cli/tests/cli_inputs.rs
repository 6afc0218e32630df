//! Bad input through the built binary: a missing model file, truncated and corrupt GGUF files,
//! and an unreadable prompt line. Each must give one clear error that names the file (and the
//! line), a non-zero exit code and no panic; nothing gets stored, and a cache that already holds
//! valid entries stays valid (`draftlens cache verify` passes, no temp files left behind).

mod cli_util;

use cli_util::*;
use std::io::Read;
use std::path::Path;

/// Files under `dir` whose name marks an unfinished write.
fn temp_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap().to_string_lossy().contains(".tmp") {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

/// The first `n` bytes of the default model, as a truncated copy.
fn truncated_copy(dir: &Path, n: usize) -> std::path::PathBuf {
    let mut head = vec![0u8; n];
    std::fs::File::open(model())
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    let p = dir.join(format!("truncated-{n}.gguf"));
    std::fs::write(&p, head).unwrap();
    p
}

#[test]
fn bad_models_and_prompt_lines_give_one_clear_error_and_leave_the_cache_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db) = (tmp.path().join("cache"), tmp.path().join("runs.sqlite"));
    let good = tmp.path().join("good.jsonl");
    write_prompts(&good, &[("hi", None, "Say hello in French.")]);

    // A cache holding valid entries (greedy continuation + taps of one prompt).
    let out = json_out(
        &dl(
            &cache,
            &[
                "--json",
                "extract",
                "--prompts",
                s(&good),
                "--max-new-tokens",
                "6",
                "--layers",
                "1,27",
            ],
        ),
        "extract",
    );
    assert_eq!(out[0]["cached"], false);
    let entries = cache_verifies(&cache);
    assert_eq!(entries, 2);

    // 1. Missing model file: `inspect`, `generate` and `run` name the path.
    let missing = tmp.path().join("no-such-model.gguf");
    for args in [
        vec!["inspect", s(&missing)],
        vec![
            "generate",
            "--target",
            s(&missing),
            "--prompts",
            s(&good),
            "--max-new-tokens",
            "4",
        ],
        vec![
            "run",
            "--target",
            s(&missing),
            "--drafter",
            "builtin:oracle",
            "--prompts",
            s(&good),
            "--db",
            s(&db),
        ],
    ] {
        let o = dl(&cache, &args);
        let line = clean_error(
            &o,
            &format!("{} with a missing model", args[0]),
            &[s(&missing)],
        );
        assert!(line.contains("no such file"), "{line}");
    }

    // 2. Truncated GGUF: inside the header (metadata cut off) and inside the tensor data (the
    //    header promises tensors past the end of the file). Also a file that is not GGUF at all.
    let not_gguf = tmp.path().join("notes.gguf");
    std::fs::write(&not_gguf, b"these are my notes, not a model\n").unwrap();
    for path in [
        truncated_copy(tmp.path(), 24),
        truncated_copy(tmp.path(), 4 << 20),
        not_gguf,
    ] {
        for args in [
            vec!["inspect", s(&path)],
            vec![
                "run",
                "--target",
                s(&path),
                "--drafter",
                "builtin:oracle",
                "--prompts",
                s(&good),
                "--db",
                s(&db),
            ],
        ] {
            let o = dl(&cache, &args);
            clean_error(&o, &format!("{} {}", args[0], path.display()), &[s(&path)]);
        }
    }

    // 3. A bad prompt line: the error names the file and the line (2), for every command that
    //    reads prompts, before the model runs.
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"id\": \"a\", \"prompt\": \"fine\"}\n{\"id\": \"b\", \"messages\": [}\n{\"id\": \"c\", \"prompt\": \"fine too\"}\n",
    )
    .unwrap();
    let at_line = format!("{}:2", bad.display());
    for args in [
        vec!["generate", "--prompts", s(&bad), "--max-new-tokens", "4"],
        vec!["extract", "--prompts", s(&bad), "--max-new-tokens", "4"],
        vec![
            "run",
            "--drafter",
            "builtin:oracle",
            "--prompts",
            s(&bad),
            "--db",
            s(&db),
        ],
    ] {
        let o = dl(&cache, &args);
        clean_error(
            &o,
            &format!("{} with a bad prompt line", args[0]),
            &[&at_line],
        );
    }
    // A line that is valid JSON but breaks the prompt rules (neither `prompt` nor `messages`).
    std::fs::write(
        &bad,
        "{\"id\": \"a\", \"prompt\": \"fine\"}\n\n{\"id\": \"x\", \"category\": \"none\"}\n",
    )
    .unwrap();
    let o = dl(
        &cache,
        &["generate", "--prompts", s(&bad), "--max-new-tokens", "4"],
    );
    clean_error(
        &o,
        "generate with a prompt lacking text",
        &[&format!("{}:3", bad.display())],
    );

    // Nothing was stored, and the cache is exactly as valid as before.
    if db.exists() {
        assert!(runs(&db).is_empty(), "a failed command stored a run");
    }
    assert_eq!(cache_verifies(&cache), entries);
    assert!(
        temp_files(&cache).is_empty(),
        "temp files left: {:?}",
        temp_files(&cache)
    );
    // And it is still used: the same extract is served from it.
    let out = json_out(
        &dl(
            &cache,
            &[
                "--json",
                "extract",
                "--prompts",
                s(&good),
                "--max-new-tokens",
                "6",
                "--layers",
                "1,27",
            ],
        ),
        "extract again",
    );
    assert_eq!(out[0]["cached"], true);
}
