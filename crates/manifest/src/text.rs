//! Untrusted text made printable: the one implementation every crate uses (a command name
//! in an engine error, a file name or schema string in a verification message). One line, no
//! C0/C1 controls, no bidirectional overrides or zero-width characters, bounded length.

use std::fmt::Write;

/// True for characters that must never reach a terminal or a report unescaped: C0/C1 controls,
/// DEL, the Arabic letter mark and the Unicode bidirectional marks, overrides and isolates
/// ("Trojan source" characters), line/paragraph separators, and zero-width/BOM characters.
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061C}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}')
}

/// `s` with unsafe characters escaped as `\u{..}` (`\n`, `\t`, `\r` as such, `\` as `\\`), cut to
/// at most `max` characters (then ending with `…`).
pub fn printable(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n >= max {
            out.push('…');
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        '\\' => out.push_str("\\\\"),
        c if is_unsafe_char(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// A file name (raw bytes) rendered printable: invalid UTF-8 bytes as `\xNN`, unsafe characters
/// escaped as in [`printable`]. Never truncated (names are at most 255 bytes).
pub fn escape_name(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            push_escaped(&mut out, c);
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(printable("a\nb\u{202E}c\\", 100), "a\\nb\\u{202e}c\\\\");
        assert_eq!(printable("abcdef", 3), "abc…");
        assert_eq!(printable("\u{1b}[2J", 10), "\\u{1b}[2J");
        assert_eq!(escape_name(b"ok\xffx\x1b"), "ok\\xffx\\u{1b}");
    }
}
