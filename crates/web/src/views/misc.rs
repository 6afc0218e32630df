//! Small pages: 404, errors, import form, share result, auth.

use super::{page, Ctx};
use maud::{html, Markup};

pub fn not_found(ctx: &Ctx, what: &str) -> Markup {
    page(
        ctx,
        "Not found",
        html! {
            div class="panel empty" {
                div class="big404" { "404" }
                p { strong { (what) } }
                p { a class="btn" href="/" { "Back to the run list" } }
            }
        },
    )
}

pub fn error(ctx: &Ctx, title: &str, message: &str) -> Markup {
    page(
        ctx,
        title,
        html! {
            h1 { (title) }
            div class="err" { (message) }
            p { a class="btn" href="/" { "Back to the run list" } }
        },
    )
}

pub fn unauthorized(ctx: &Ctx, write: bool) -> Markup {
    page(
        ctx,
        "Token needed",
        html! {
            div class="panel" style="max-width:560px; margin:40px auto" {
                h1 { (if write { "A write token is needed" } else { "This team server needs a token" }) }
                p class="sub" {
                    "Ask the owner for a token (" code { "draftlens tokens create NAME --scope read" } "), then open any page with "
                    code { "?token=…" } " once; the browser remembers it. Scripts can send " code { "Authorization: Bearer …" } "."
                }
                form method="get" action="/" {
                    input type="password" name="token" placeholder="token" style="width:100%; margin-bottom:8px";
                    button class="btn primary" type="submit" { "Continue" }
                }
            }
        },
    )
}

pub fn import_form(ctx: &Ctx, max_mb: usize, message: Option<Result<String, String>>) -> Markup {
    page(
        ctx,
        "Import",
        html! {
            div class="head" { div class="grow" {
                h1 { "Import a report or bundle" }
                div class="sub" { "Upload a draftlens report (.html) or bundle (.json) from a teammate. Importing the same file twice changes nothing; a broken file imports nothing." }
            } }
            @match &message {
                Some(Ok(m)) => { div class="ok" { (m) } }
                Some(Err(e)) => { div class="err" { (e) } }
                None => {}
            }
            div class="panel" style="max-width:640px" {
                @if ctx.can_write {
                    form method="post" action="/import" enctype="multipart/form-data" {
                        p { input type="file" name="file" accept=".html,.htm,.json" required; }
                        button class="btn primary" type="submit" { "Import" }
                        span class="hint" { " at most " (max_mb) " MiB" }
                    }
                } @else {
                    p class="sub" { "Importing needs a write token." }
                }
                p class="hint" { "From a terminal: " code { "draftlens import report.html --db runs.sqlite" } }
            }
        },
    )
}

pub fn shared(ctx: &Ctx, url: &str, state: &str) -> Markup {
    page(
        ctx,
        "Shared view",
        html! {
            div class="panel" style="max-width:640px; margin:30px auto" {
                h1 { "Link saved" }
                p class="sub" { "Anyone who can reach this server can open this view with the link (on a team server, the link itself grants read access to this one view)." }
                p { input type="text" readonly value=(url) style="width:100%; font-family:var(--mono)"; }
                p { a class="btn primary" href=(url) { "Open the shared view" } " " a class="btn" href=(state) { "Back" } }
            }
        },
    )
}
