//! What `run` stores to say which evaluation a run is, pinned byte for byte: the run row (every
//! column but the volatile ones), the evaluation identity (its JSON text and its sha256, which
//! `draftlens merge` compares across shards and machines) and the vocabulary stored with the
//! run's tokenizer. A change here changes stored data: shards computed before it no longer merge
//! with shards computed after it.
//!
//! Two runs on the default target (CPU): a checkpoint of the reference series as one shard, and
//! a built-in drafter in train-style mode with non-default evaluation options. Paths are written
//! relative to the repository root and the root itself as `<root>`; the draftlens version as
//! `<version>` (the identity's sha256 is pinned with that placeholder in place of the version).
//! The fixtures' hashes (target, checkpoint, prompt set) are part of the pin: when a fixture is
//! replaced, bless again (see [`PINNED`]) and check that only those hashes moved.

mod cli_util;

use cli_util::*;
use draftlens_results::shard::EvalIdentity;
use rusqlite::types::ValueRef;
use std::path::Path;

/// The columns of `table` for `key = id` as `name = value` lines, without `skip`.
fn row_text(c: &rusqlite::Connection, table: &str, key: &str, id: i64, skip: &[&str]) -> String {
    let mut stmt = c
        .prepare(&format!("SELECT * FROM {table} WHERE {key} = ?1"))
        .unwrap();
    let names: Vec<String> = stmt.column_names().map(|n| n.to_string()).collect();
    stmt.query_row([id], |r| {
        let mut o = String::new();
        for (i, n) in names.iter().enumerate() {
            if skip.contains(&n.as_str()) {
                continue;
            }
            let v = match r.get_ref(i)? {
                ValueRef::Null => "NULL".to_string(),
                ValueRef::Integer(x) => x.to_string(),
                ValueRef::Real(x) => x.to_string(),
                ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                ValueRef::Blob(b) => format!("blob of {} bytes", b.len()),
            };
            o += &format!("{n} = {v}\n");
        }
        Ok(o)
    })
    .unwrap()
}

/// `text` with the repository root written `<root>` and the version `<version>`.
fn portable(text: &str) -> String {
    let version = format!("draftlens {}", env!("CARGO_PKG_VERSION"));
    let mut t = text.replace(&version, "draftlens <version>");
    let canonical = root().canonicalize().unwrap();
    for r in [canonical.as_path(), root().as_path()] {
        t = t.replace(r.to_str().unwrap(), "<root>");
    }
    t
}

/// Everything pinned of run `id`: its row as created (not what finishing it writes), its
/// evaluation, and the identity's sha256 with the version placeholder (the stored sha256 is
/// checked to be the sha256 of the stored identity).
fn pinned_run(db: &Path, id: i64) -> String {
    let c = rusqlite::Connection::open(db).unwrap();
    let volatile = ["id", "uid", "created_at", "finished_at", "timings_json"];
    let finished = ["status", "error", "num_prompts", "num_blocks"];
    let run = row_text(
        &c,
        "run",
        "id",
        id,
        &[&volatile[..], &finished[..]].concat(),
    );
    let eval = row_text(&c, "run_eval", "run_id", id, &["run_id", "identity"]);
    let (sha, json): (String, String) = c
        .query_row(
            "SELECT identity, identity_json FROM run_eval WHERE run_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let mut identity: EvalIdentity = serde_json::from_str(&json).unwrap();
    assert_eq!(
        identity.sha256(),
        sha,
        "the stored sha256 is the identity's"
    );
    identity.code_version = "draftlens <version>".into();
    portable(&format!(
        "{run}--- eval\n{eval}--- identity sha256 at <version>: {}\n",
        identity.sha256()
    ))
}

/// The stored vocabulary: its row, the pieces as their sha256.
fn pinned_vocab(db: &Path) -> String {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row(
        "SELECT tokenizer_sha256, name, size, pieces_json FROM vocab",
        [],
        |r| {
            let pieces: String = r.get(3)?;
            Ok(portable(&format!(
                "tokenizer_sha256 = {}\nname = {}\nsize = {}\npieces sha256 = {}\n",
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                sha256_hex(pieces.as_bytes())
            )))
        },
    )
    .unwrap()
}

use draftlens_results::sha256_hex;

/// Runs `draftlens run ARGS --json` on the default target (paths relative to the root, where
/// the command runs) and returns the stored run's id.
fn run(cache: &Path, db: &Path, args: &[&str]) -> i64 {
    let mut all = vec![
        "--json",
        "run",
        "--target",
        "models/SmolLM2-135M-Instruct.Q4_1.gguf",
        "--prompts",
        "builtin:humaneval",
        "--max-new-tokens",
        "4",
        "--backend",
        "cpu",
        "--db",
        s(db),
    ];
    all.extend(args);
    let out = json_out(&dl(cache, &all), "run");
    out[0]["run_id"].as_i64().unwrap()
}

#[test]
fn stored_identity_of_a_run_is_pinned() {
    model();
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db) = (tmp.path().join("cache"), tmp.path().join("runs.sqlite"));
    let checkpoint = run(
        &cache,
        &db,
        &[
            "--drafter",
            "drafters/smollm2-reference/step-2581",
            "--limit",
            "3",
            "--shard",
            "1/2",
        ],
    );
    let builtin = run(
        &cache,
        &db,
        &[
            "--drafter",
            "builtin:anti-oracle",
            "--block-size",
            "4",
            "--limit",
            "1",
            "--mode",
            "train-style",
            "--mask",
            "inclusive",
            "--stride",
            "2",
            "--top-k",
            "4",
            "--anchor-batch",
            "16",
            "--prompt-anchors",
            "--name",
            "pinned",
        ],
    );
    let got = format!(
        "=== checkpoint\n{}=== builtin\n{}=== vocab\n{}",
        pinned_run(&db, checkpoint),
        pinned_run(&db, builtin),
        pinned_vocab(&db)
    );
    if std::env::var_os("DRAFTLENS_BLESS").is_some() {
        println!("{got}");
    }
    assert_eq!(got, PINNED);
}

/// Blessed from the binary before `RunIdentity` (issue 37), plus the `drafter_family` column of
/// schema v6 (session 21; identities unchanged): rerun with DRAFTLENS_BLESS=1 and
/// `--nocapture` to print what a run stores now.
const PINNED: &str = r#"=== checkpoint
name = smollm2-reference/step-2581 · humaneval · deployment · shard 1/2
mode = deployment
config_json = {"backend":"cpu","drafter":"drafters/smollm2-reference/step-2581","eval":{"anchor_batch":256,"anchors":"every","ctx_inclusive":false,"labels":"target","prompt_anchors":false,"top_k":8},"gdn_profile":null,"max_new_tokens":4,"mode":"deployment","prompts":"builtin:humaneval","shard":"1/2","target":{"arch":"llama","format":"gguf","path":"models/SmolLM2-135M-Instruct.Q4_1.gguf","weights_sha256":"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}}
target_path = models/SmolLM2-135M-Instruct.Q4_1.gguf
target_sha256 = b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
target_arch = llama
drafter_path = drafters/smollm2-reference/step-2581
drafter_sha256 = f40658fe9d5a865c16818490b57638f0d553de8efedbdc8fa676bd88f4389cc4
drafter_series = smollm2-reference
drafter_step = 2581
prompt_set_name = humaneval
prompt_set_sha256 = 4bfd352a07e97311b71085530f796f40c36c0e5a35859e0477cf7e24ea9320b2
backend = cpu
dtype = f32
block_size = 16
top_k = 8
labels = NULL
mask_rule = NULL
tokenizer_sha256 = 5d32b5b4bf631207053a154101b2c857fa646ddb6c4f5cb5b27ff17b88579a1e
origin = local
drafter_family = dflash
--- eval
identity_json = {"backend":"cpu","block_size":16,"code_version":"draftlens <version>","drafter_config_sha256":"d1ff1f087b5dad3ea3979ebfa5a9c0f2437b5a56bbccde4e90afe4986322a31c","drafter_kind":"checkpoint","drafter_sha256":"f40658fe9d5a865c16818490b57638f0d553de8efedbdc8fa676bd88f4389cc4","dtype":"f32","eval":{"anchor_batch":256,"anchors":"every","ctx_inclusive":false,"labels":"target","prompt_anchors":false,"top_k":8},"gdn_profile":null,"max_new_tokens":4,"mode":"deployment","prompt_set_sha256":"4bfd352a07e97311b71085530f796f40c36c0e5a35859e0477cf7e24ea9320b2","prompts":3,"target_arch":"llama","target_sha256":"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53","tokenizer":"5d32b5b4bf631207053a154101b2c857fa646ddb6c4f5cb5b27ff17b88579a1e"}
shard_index = 1
shard_count = 2
set_prompts = 3
run_prompts = 1
merged_from_json = NULL
--- identity sha256 at <version>: 676e0adef9e817ef135c43233a7eccfb117c497c8da37a408a4a7eba99808958
=== builtin
name = pinned
mode = train-style
config_json = {"backend":"cpu","drafter":"builtin:anti-oracle","eval":{"anchor_batch":16,"anchors":{"stride":2},"ctx_inclusive":true,"labels":"target","prompt_anchors":true,"top_k":4},"gdn_profile":null,"max_new_tokens":4,"mode":"train-style","prompts":"builtin:humaneval","target":{"arch":"llama","format":"gguf","path":"models/SmolLM2-135M-Instruct.Q4_1.gguf","weights_sha256":"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}}
target_path = models/SmolLM2-135M-Instruct.Q4_1.gguf
target_sha256 = b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
target_arch = llama
drafter_path = builtin:anti-oracle
drafter_sha256 = 
drafter_series = anti-oracle
drafter_step = NULL
prompt_set_name = humaneval
prompt_set_sha256 = 4bfd352a07e97311b71085530f796f40c36c0e5a35859e0477cf7e24ea9320b2
backend = cpu
dtype = f32
block_size = 4
top_k = 4
labels = target
mask_rule = inclusive
tokenizer_sha256 = 5d32b5b4bf631207053a154101b2c857fa646ddb6c4f5cb5b27ff17b88579a1e
origin = local
drafter_family = builtin:anti-oracle
--- eval
identity_json = {"backend":"cpu","block_size":4,"code_version":"draftlens <version>","drafter_config_sha256":"","drafter_kind":"builtin:anti-oracle","drafter_sha256":"","dtype":"f32","eval":{"anchor_batch":16,"anchors":{"stride":2},"ctx_inclusive":true,"labels":"target","prompt_anchors":true,"top_k":4},"gdn_profile":null,"max_new_tokens":4,"mode":"train-style","prompt_set_sha256":"4bfd352a07e97311b71085530f796f40c36c0e5a35859e0477cf7e24ea9320b2","prompts":1,"target_arch":"llama","target_sha256":"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53","tokenizer":"5d32b5b4bf631207053a154101b2c857fa646ddb6c4f5cb5b27ff17b88579a1e"}
shard_index = NULL
shard_count = NULL
set_prompts = 1
run_prompts = 1
merged_from_json = NULL
--- identity sha256 at <version>: 2ae4850629cb1ed86838e7da5aeb33f10701fb71fc4fc4e30107ad11406a3532
=== vocab
tokenizer_sha256 = 5d32b5b4bf631207053a154101b2c857fa646ddb6c4f5cb5b27ff17b88579a1e
name = models/SmolLM2-135M-Instruct.Q4_1.gguf
size = 49152
pieces sha256 = 2fe0fc4b5a5dd045a6f124b54307df44b702c89f7a126001f5be7e00a4de4448
"#;
