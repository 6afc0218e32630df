//! The push API (`draftlens push`, client in `crate::push`): resumable uploads of run bundles.
//!
//! An upload is named by what it holds, `<sha256 of the bundle>-<size>`, so a client that lost
//! its connection (or was restarted, the bundle of an unchanged run being byte-identical) finds
//! its upload again and continues at the server's offset:
//!
//! | request | answer |
//! |---|---|
//! | `GET /api/runs/{uid}` | 200 `{"uid", "exists": true}` or 404 `{"exists": false}` |
//! | `POST /api/uploads?sha256=H&size=N` | `{"id", "offset", "size", "max_bytes"}`: created or found; 413 over the size cap |
//! | `POST /api/uploads/{id}/chunk?offset=O` (body: bytes) | `{"offset"}`; 409 `{"offset"}` when O is not the server's offset |
//! | `POST /api/uploads/{id}/finish` | the import summary and `merges`; the part file is checked (size, sha256), imported in one transaction (idempotent by run uid) and deleted |
//!
//! A pushed shard run (its bundle carries `eval`, docs/scale-out.md §9) completes an evaluation
//! once every one of its N shards has a complete run here: the server then merges them into
//! one run with `draftlens merge`'s code (`draftlens_results::merge::merge_received`), in the request
//! that brought the last shard, and says so in `merges` (also `waiting` or `refused`).
//!
//! Part files live in `<db>.uploads/`; a chunk is appended whole (or not at all) and synced
//! before it is acknowledged. Part files untouched for [`PART_MAX_AGE`] are removed when the next
//! upload starts. Writing needs a write token in team mode, like every POST.

use super::*;
use axum::body::Bytes;
use axum::Json;
use serde_json::json;
use std::io::Write;

/// Abandoned part files are removed after this long.
const PART_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Serialises part-file operations (offset check + append) of this process.
static UPLOADS: Mutex<()> = Mutex::new(());

fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(json!({ "error": msg.into() }))).into_response()
}

fn uploads_dir(st: &AppState) -> PathBuf {
    let mut s = st.store.path().as_os_str().to_owned();
    s.push(".uploads");
    PathBuf::from(s)
}

/// `<64 hex>-<decimal size>`; anything else is refused before it touches a path.
fn parse_id(id: &str) -> Option<(String, u64)> {
    let (sha, size) = id.split_once('-')?;
    let ok = sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit());
    let size = size.parse().ok()?;
    ok.then(|| (sha.to_ascii_lowercase(), size))
}

fn part_path(st: &AppState, sha: &str, size: u64) -> PathBuf {
    uploads_dir(st).join(format!("{sha}-{size}.part"))
}

fn too_large(st: &AppState, size: u64) -> Response {
    err(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the upload is {size} bytes ({:.1} MiB), over this server's limit of {} bytes ({} MiB); the server's operator can raise it with `draftlens serve --max-upload-mb`",
            size as f64 / 1048576.0,
            st.max_upload,
            st.max_upload >> 20
        ),
    )
}

pub(super) async fn run_exists(
    State(st): State<Arc<AppState>>,
    AxPath(uid): AxPath<String>,
) -> Response {
    let s = st.clone();
    let u = uid.clone();
    match blocking(&st, move || s.store.run_id_by_uid(&u)).await {
        Ok(Some(_)) => Json(json!({ "uid": uid, "exists": true })).into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "uid": uid, "exists": false })),
        )
            .into_response(),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    }
}

pub(super) async fn upload_start(
    State(st): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = Query::parse(raw.as_deref());
    let (Some(sha), Some(size)) = (q.get("sha256"), q.get("size")) else {
        return err(StatusCode::BAD_REQUEST, "expected ?sha256=HEX&size=BYTES");
    };
    let Some((sha, size)) = parse_id(&format!("{sha}-{size}")) else {
        return err(
            StatusCode::BAD_REQUEST,
            "sha256 must be 64 hex digits and size a byte count",
        );
    };
    if size > st.max_upload as u64 {
        return too_large(&st, size);
    }
    let s = st.clone();
    let r = blocking(&st, move || {
        let dir = uploads_dir(&s);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("{}: cannot create", dir.display()))?;
        let _g = UPLOADS.lock().unwrap_or_else(|e| e.into_inner());
        remove_abandoned(&dir);
        let part = part_path(&s, &sha, size);
        let offset = match std::fs::metadata(&part) {
            Ok(m) => m.len(),
            Err(_) => {
                std::fs::File::create(&part)
                    .with_context(|| format!("{}: cannot create", part.display()))?;
                0
            }
        };
        Ok(json!({ "id": format!("{sha}-{size}"), "offset": offset, "size": size, "max_bytes": s.max_upload }))
    })
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    }
}

/// Removes part files not written for [`PART_MAX_AGE`] (their client gave up).
fn remove_abandoned(dir: &std::path::Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > PART_MAX_AGE);
        if old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

pub(super) async fn upload_chunk(
    State(st): State<Arc<AppState>>,
    AxPath(id): AxPath<String>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    let Some((sha, size)) = parse_id(&id) else {
        return err(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not an upload id"),
        );
    };
    let Some(offset) = Query::parse(raw.as_deref())
        .get("offset")
        .and_then(|o| o.parse::<u64>().ok())
    else {
        return err(StatusCode::BAD_REQUEST, "expected ?offset=BYTES");
    };
    if size > st.max_upload as u64 {
        return too_large(&st, size);
    }
    let s = st.clone();
    let r = blocking(&st, move || {
        let part = part_path(&s, &sha, size);
        let _g = UPLOADS.lock().unwrap_or_else(|e| e.into_inner());
        let have = match std::fs::metadata(&part) {
            Ok(m) => m.len(),
            Err(_) => return Ok(err(StatusCode::NOT_FOUND, format!("no upload {sha}-{size}: start it first"))),
        };
        if offset != have {
            return Ok((
                StatusCode::CONFLICT,
                Json(json!({ "error": format!("the upload is at byte {have}, not {offset}"), "offset": have })),
            )
                .into_response());
        }
        if have + body.len() as u64 > size {
            return Ok(err(
                StatusCode::BAD_REQUEST,
                format!("the chunk ends at byte {}, past the declared size {size}", have + body.len() as u64),
            ));
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&part)
            .with_context(|| format!("{}: cannot open", part.display()))?;
        f.write_all(&body)
            .and_then(|()| f.sync_data())
            .with_context(|| format!("{}: cannot write", part.display()))?;
        Ok(Json(json!({ "offset": have + body.len() as u64 })).into_response())
    })
    .await;
    r.unwrap_or_else(|e| err(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))
}

pub(super) async fn upload_finish(
    State(st): State<Arc<AppState>>,
    AxPath(id): AxPath<String>,
) -> Response {
    let Some((sha, size)) = parse_id(&id) else {
        return err(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not an upload id"),
        );
    };
    let s = st.clone();
    let r = blocking(&st, move || {
        let part = part_path(&s, &sha, size);
        let bytes = {
            let _g = UPLOADS.lock().unwrap_or_else(|e| e.into_inner());
            match std::fs::read(&part) {
                Ok(b) => b,
                Err(_) => {
                    return Ok(err(
                        StatusCode::NOT_FOUND,
                        format!("no upload {sha}-{size} (finished already, or never started)"),
                    ))
                }
            }
        };
        if bytes.len() as u64 != size {
            return Ok(err(
                StatusCode::CONFLICT,
                format!("the upload has {} of its {size} bytes", bytes.len()),
            ));
        }
        let got = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        if got != sha {
            // Not what the client meant to send: start over.
            let _ = std::fs::remove_file(&part);
            return Ok(err(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("the uploaded bytes hash to {got}, not {sha}; the upload was discarded"),
            ));
        }
        let name = format!("push-{}.json", &sha[..12]);
        let result = import_bytes(&s.store, &name, &name, &bytes, s.max_upload);
        let _ = std::fs::remove_file(&part);
        Ok(match result {
            Ok(summary) => {
                // The run is stored whatever the merge does: a merge error is reported, not
                // a failed push.
                let merges = draftlens_results::merge::merge_received(&s.store, "this server", &summary.imported, s.scorer.as_deref())
                    .unwrap_or_else(|e| {
                        vec![draftlens_results::merge::SetOutcome {
                            identity: String::new(),
                            shards: 0,
                            state: "refused",
                            run_uid: None,
                            message: format!("merging the received shards failed: {e:#}"),
                        }]
                    });
                for m in &merges {
                    eprintln!("draftlens: {name}: {}", m.message);
                }
                Json(json!({
                    "imported": summary.imported, "skipped": summary.skipped, "bundle_sha256": summary.bundle_sha256,
                    "merges": merges,
                }))
                .into_response()
            }
            Err(e) => err(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")),
        })
    })
    .await;
    st.invalidate();
    r.unwrap_or_else(|e| err(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_ids_are_checked_before_they_name_a_file() {
        let sha = "ab".repeat(32);
        assert_eq!(parse_id(&format!("{sha}-12")), Some((sha.clone(), 12)));
        for bad in [
            "../../etc-1".to_string(),
            format!("{sha}-"),
            format!("{sha}-x"),
            format!("{}-1", &sha[..63]),
            format!("{}/..-1", &sha[..61]),
        ] {
            assert_eq!(parse_id(&bad), None, "{bad}");
        }
    }
}
