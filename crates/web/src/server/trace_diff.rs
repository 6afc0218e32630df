//! `/runs/{id}/trace-diff?diff=D&prompt=I`: the drill-down of a trace run's diff against its
//! reference drafter (`draftlens trace diff`, docs/traces.md §6): the summary, then the first
//! rounds that differ by prompt then round, prompt `I` opened. Without `diff`, the run's newest.

use super::*;

pub(super) async fn trace_diff_page(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    AxPath(id): AxPath<String>,
    uri: Uri,
    RawQuery(raw): RawQuery,
) -> Response {
    let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::Runs);
    let s = st.clone();
    let r = blocking(&st, move || {
        let q = Query::parse(raw.as_deref());
        let Ok(id) = id.parse::<i64>() else {
            return Ok(Out::NotFound("There is no such run.".into()));
        };
        let Some(detail) = s.store.run(id)? else {
            return Ok(Out::NotFound(format!("There is no run {id}.")));
        };
        let diff = match q.get("diff").map(str::parse::<i64>) {
            None => None,
            Some(Ok(d)) => Some(d),
            Some(Err(_)) => return Ok(Out::Bad("diff= takes a diff id (a number).".into())),
        };
        let selected = match q.get("prompt").map(str::parse::<u32>) {
            None => None,
            Some(Ok(p)) => Some(p),
            Some(Err(_)) => return Ok(Out::Bad("prompt= takes a prompt index (a number).".into())),
        };
        let Some(drill) = compare::trace_diff::drill_down(&s.store, &detail.run, diff)? else {
            return Ok(Out::NotFound(match diff {
                Some(d) => format!("Run {id} has no trace diff {d}."),
                None => format!(
                    "Run {id} has no trace diff: `draftlens trace diff {id} --drafter CKPT` makes one for a trace run."
                ),
            }));
        };
        let vocab = match &detail.run.tokenizer_sha256 {
            Some(sha) => s.vocab_for(sha)?,
            None => None,
        };
        let v = views::trace_diff::DrillView {
            run: &detail.run,
            drill: &drill,
            selected,
            vocab: vocab.as_deref().map(|v| v.as_slice()),
        };
        Ok(Out::Page(html(views::trace_diff::render(&ctx, &v))))
    })
    .await;
    respond(&st, r).await
}
