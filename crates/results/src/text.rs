//! The one rule for text that comes from outside: plugins (names, versions, descriptions,
//! messages, log lines), imported reports and bundles, runs pushed to a team server, and
//! whatever a stored run holds when a terminal shows it.
//!
//! Such text is cleaned on the way in (before the store keeps it) and again on the way to a
//! terminal (`runs ls`, `runs show`, `plugins list`, `plugins info`): an escape sequence could
//! otherwise clear the screen or forge a line such as "plugin accept-length failed", and a
//! bidirectional override (U+202E) or isolate (U+2066) could make a terminal or a page show a
//! name or version other than the stored one. Control characters (C0, DEL, C1: ESC, newlines
//! and tabs included, so one field is one line) become a space; the bidi controls (U+200E,
//! U+200F, U+202A–U+202E, U+2066–U+2069) become U+FFFD, so that something visibly stood there.

use std::borrow::Cow;

/// Whether `c` may reach a terminal or page as it is: not a C0/C1 control character or DEL, and
/// not one of the bidirectional marks, embeddings, overrides and isolates.
pub fn is_printable(c: char) -> bool {
    !(c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
}

/// What a character that is not printable becomes: a space for a control character, U+FFFD for
/// a bidi control.
fn replacement(c: char) -> char {
    if c.is_control() {
        ' '
    } else {
        '\u{fffd}'
    }
}

/// `s` with every unprintable character replaced (see the module doc); borrowed when there is
/// nothing to replace, which is almost always.
pub fn printable(s: &str) -> Cow<'_, str> {
    if s.chars().all(is_printable) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(
            s.chars()
                .map(|c| if is_printable(c) { c } else { replacement(c) })
                .collect(),
        )
    }
}

/// Replaces the unprintable characters of `s` in place (for cleaning stored fields).
pub fn clean_in_place(s: &mut String) {
    if let Cow::Owned(c) = printable(s) {
        *s = c;
    }
}

/// `s` cut to at most `max_bytes` (at a char boundary, with a note saying how much was cut),
/// with every unprintable character replaced (see the module doc).
pub fn clean(s: &str, max_bytes: usize) -> String {
    // Fast path (log lines are mostly plain ASCII): printable ASCII is copied as it is.
    let head = &s.as_bytes()[..s.len().min(max_bytes)];
    if head.iter().all(|b| (0x20..0x7f).contains(b)) {
        let mut out = String::from(&s[..head.len()]);
        if head.len() < s.len() {
            out.push_str(&format!(" …[{} more bytes cut]", s.len() - head.len()));
        }
        return out;
    }
    let mut out = String::with_capacity(s.len().min(max_bytes) + 32);
    let mut cut_at = None;
    for (i, c) in s.char_indices() {
        if out.len() + c.len_utf8() > max_bytes {
            cut_at = Some(i);
            break;
        }
        out.push(if is_printable(c) { c } else { replacement(c) });
    }
    if let Some(i) = cut_at {
        out.push_str(&format!(" …[{} more bytes cut]", s.len() - i));
    }
    out
}

/// The first `max_chars` characters of `s`, cleaned: for quoting an offending value in an error.
pub fn preview(s: &str, max_chars: usize) -> String {
    let head: String = s.chars().take(max_chars).collect();
    let mut p = clean(&head, max_chars * 4);
    if head.len() < s.len() {
        p.push_str(&format!("… ({} bytes)", s.len()));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_pass() {
        let s = "ok\x1b[2J\x1b[1;1Hwarning: plugin accept-length failed\r\n\u{202e}x\u{7f}\u{9b}";
        let c = clean(s, 1000);
        assert!(!c.chars().any(|c| c.is_control()), "{c:?}");
        assert!(!c.contains('\u{202e}'));
        assert!(c.starts_with("ok [2J [1;1Hwarning"), "{c:?}");
        assert_eq!(printable(s), c);
    }

    #[test]
    fn every_bidi_control_and_c1_control_is_replaced() {
        for c in [
            '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}', '\u{2067}',
            '\u{2068}', '\u{2069}', '\u{200e}', '\u{200f}',
        ] {
            assert_eq!(
                printable(&format!("1.0{c}")),
                "1.0\u{fffd}",
                "U+{:04X}",
                c as u32
            );
        }
        for c in [
            '\u{0}', '\u{7}', '\u{1b}', '\u{7f}', '\u{80}', '\u{9b}', '\u{9f}',
        ] {
            assert_eq!(printable(&format!("a{c}b")), "a b", "U+{:04X}", c as u32);
        }
        // Everything else passes untouched, without a copy.
        let fine = "naïve — 日本語 ✓ \u{200d}";
        assert!(matches!(printable(fine), Cow::Borrowed(_)));
        let mut s = String::from("v1\u{2066}.0");
        clean_in_place(&mut s);
        assert_eq!(s, "v1\u{fffd}.0");
    }

    #[test]
    fn long_text_is_cut_at_a_char_boundary() {
        let s = "é".repeat(10_000);
        let c = clean(&s, 101);
        assert!(c.starts_with(&"é".repeat(50)));
        assert!(c.ends_with(" …[19900 more bytes cut]"), "{c}");
        assert_eq!(clean("short", 100), "short");
        let p = preview(&"a".repeat(1000), 10);
        assert_eq!(p, "aaaaaaaaaa… (1000 bytes)");
    }
}
