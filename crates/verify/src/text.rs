//! Rendering untrusted names and schema-provided strings safely: one line, no control or
//! bidirectional-override characters, bounded length. The character rules are
//! `agentjail_manifest::text` (the one implementation, shared with the engine); JSON Pointers
//! are rendered here.

pub use agentjail_manifest::text::{escape_name, is_unsafe_char, printable};

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
