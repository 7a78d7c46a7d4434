//! Rendering untrusted names and schema-provided strings safely: one line, no control or
//! bidirectional-override characters, bounded length.

use std::fmt::Write;

/// True for characters that must never reach a terminal or a report unescaped: C0/C1 controls,
/// DEL, and the Unicode bidirectional overrides/isolates ("Trojan source" characters),
/// line/paragraph separators, and zero-width/BOM characters.
pub(crate) fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}'
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

/// Longest JSON Pointer put into a report; longer ones are cut and end with `…`.
pub const MAX_POINTER_CHARS: usize = 1024;

/// JSON Pointer (RFC 6901) of `segments`, with unsafe characters escaped (see [`printable`]) so
/// that a hostile key cannot smuggle control characters into a report, and bounded in length.
pub fn json_pointer(segments: &[String]) -> String {
    let mut raw = String::new();
    for s in segments {
        raw.push('/');
        raw.push_str(&s.replace('~', "~0").replace('/', "~1"));
    }
    sanitize_pointer(&raw)
}

/// A JSON Pointer produced elsewhere (e.g. by the schema validator), made safe as in
/// [`json_pointer`].
pub fn sanitize_pointer(raw: &str) -> String {
    if raw.chars().any(|c| is_unsafe_char(c) || c == '\\')
        || raw.chars().count() > MAX_POINTER_CHARS
    {
        printable(raw, MAX_POINTER_CHARS)
    } else {
        raw.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(printable("a\nb\u{202E}c\\", 100), "a\\nb\\u{202e}c\\\\");
        assert_eq!(printable("abcdef", 3), "abc…");
        assert_eq!(escape_name(b"ok\xffx\x1b"), "ok\\xffx\\u{1b}");
        assert_eq!(
            json_pointer(&["a/b".into(), "~".into(), "0".into()]),
            "/a~1b/~0/0"
        );
        assert_eq!(json_pointer(&[]), "");
        assert_eq!(json_pointer(&["x\ny".into()]), "/x\\ny");
    }
}
