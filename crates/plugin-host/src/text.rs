//! Text that comes from a plugin (its name, messages, log lines, descriptions) is untrusted: it
//! is capped and stripped of control characters here, before any terminal, database or page
//! sees it. An escape sequence could otherwise clear the screen or forge a line such as
//! "plugin accept-length failed"; a 100 MiB message would be printed, stored and served whole.

/// Bytes kept of a failure message (plugin error text, panic message).
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// Whether `c` may reach a terminal: no C0/C1 control characters, no DEL, and none of the
/// bidirectional overrides/isolates that reorder what a terminal or page shows.
fn printable(c: char) -> bool {
    !(c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
}

/// `s` cut to at most `max_bytes` (at a char boundary, with a note saying how much was cut),
/// every control character replaced by a space (newlines and tabs included: one line per
/// message) and every other unprintable character by U+FFFD.
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
        out.push(if printable(c) {
            c
        } else if c.is_control() {
            ' '
        } else {
            '\u{fffd}'
        });
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
