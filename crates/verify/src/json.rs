//! Strict JSON checking of an untrusted artifact.
//!
//! [`check_json`] accepts a document only if it is valid UTF-8 without a byte order mark, one
//! JSON value with nothing but whitespace after it, nested at most [`MAX_DEPTH`] levels deep,
//! and free of duplicate object keys at every level.
//!
//! Depth is checked by an iterative byte scan *before* any recursive parsing, so a hostile
//! `[[[[…` a million levels deep costs one linear pass and no stack. serde_json's own recursion
//! limit (128) stays enabled behind it as a second bound.
//!
//! Error messages name the rule and a position (byte offset, line/column or JSON Pointer) and
//! never contain the document's text.

use std::cell::RefCell;
use std::fmt;

use agentjail_manifest::report::OutputError;
use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::text::{json_pointer, printable};

/// Deepest nesting of arrays and objects accepted (a scalar at the top is depth 0, `[1]` is 1).
pub const MAX_DEPTH: usize = 64;

/// Why a document is not acceptable JSON. Each message is one line without document content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("empty document")]
    Empty,
    #[error("starts with a UTF-8 byte order mark, which JSON does not allow")]
    ByteOrderMark,
    #[error("not valid UTF-8: invalid byte at offset {offset}")]
    NotUtf8 { offset: usize },
    #[error("nesting deeper than {max} levels (at byte offset {offset})")]
    TooDeep { max: usize, offset: usize },
    #[error("duplicate key in object at {}", if .pointer.is_empty() { "the top level" } else { .pointer.as_str() })]
    DuplicateKey {
        /// JSON Pointer of the object holding the duplicated key.
        pointer: String,
    },
    #[error("invalid JSON: {reason} at line {line} column {column}")]
    Syntax {
        /// serde_json's fixed description of the syntax rule (never document text).
        reason: String,
        line: usize,
        column: usize,
    },
}

impl JsonError {
    /// The JSON Pointer this error is located at (empty for the whole document).
    pub fn instance_path(&self) -> String {
        match self {
            JsonError::DuplicateKey { pointer } => pointer.clone(),
            _ => String::new(),
        }
    }

    /// The report form of this error.
    pub fn to_output_error(&self) -> OutputError {
        OutputError {
            instance_path: self.instance_path(),
            message: self.to_string(),
        }
    }
}

impl From<JsonError> for OutputError {
    fn from(e: JsonError) -> OutputError {
        e.to_output_error()
    }
}

/// Checks `bytes` as one strict JSON document and returns its value.
pub fn check_json(bytes: &[u8]) -> Result<Value, OutputError> {
    parse_strict(bytes).map_err(OutputError::from)
}

/// Like [`check_json`], with the typed error.
pub fn parse_strict(bytes: &[u8]) -> Result<Value, JsonError> {
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err(JsonError::ByteOrderMark);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| JsonError::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    if text.trim_matches([' ', '\t', '\n', '\r']).is_empty() {
        return Err(JsonError::Empty);
    }
    check_depth(text.as_bytes(), MAX_DEPTH)?;

    let duplicate: RefCell<Option<String>> = RefCell::new(None);
    let path: RefCell<Vec<String>> = RefCell::new(Vec::new());
    // `from_str` keeps serde_json's recursion limit (128) enabled.
    let mut de = serde_json::Deserializer::from_str(text);
    let seed = ValueSeed {
        path: &path,
        duplicate: &duplicate,
    };
    let result = seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match result {
        Ok(v) => Ok(v),
        Err(e) => {
            if let Some(pointer) = duplicate.borrow_mut().take() {
                return Err(JsonError::DuplicateKey { pointer });
            }
            Err(JsonError::Syntax {
                reason: syntax_reason(&e),
                line: e.line(),
                column: e.column(),
            })
        }
    }
}

/// serde_json's description of a syntax error without its position suffix. Its syntax and EOF
/// messages are fixed texts ("expected value", "trailing characters", ...); anything else (a
/// custom message) is replaced by a neutral description, so no document text can leak.
fn syntax_reason(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof => {
            let full = e.to_string();
            let reason = match full.rfind(" at line ") {
                Some(i) => &full[..i],
                None => full.as_str(),
            };
            printable(reason, 120)
        }
        Category::Data => "value not accepted".into(),
        Category::Io => "read error".into(),
    }
}

/// Iterative scan: fails when arrays/objects nest deeper than `max`. Strings (with escapes)
/// are skipped so brackets inside them do not count. Works on any bytes; syntax is left to the
/// parser.
pub fn check_depth(bytes: &[u8], max: usize) -> Result<(), JsonError> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (offset, &b) in bytes.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(JsonError::TooDeep { max, offset });
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Deserializes a [`Value`] like serde_json's own impl, but refuses duplicate keys, recording
/// the JSON Pointer of the offending object in `duplicate`.
#[derive(Clone, Copy)]
struct ValueSeed<'a> {
    path: &'a RefCell<Vec<String>>,
    duplicate: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            self.path.borrow_mut().push(out.len().to_string());
            let next = seq.next_element_seed(self);
            self.path.borrow_mut().pop();
            match next? {
                Some(v) => out.push(v),
                None => break,
            }
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                *self.duplicate.borrow_mut() = Some(json_pointer(&self.path.borrow()));
                return Err(A::Error::custom("duplicate key"));
            }
            self.path.borrow_mut().push(key.clone());
            let value = map.next_value_seed(self);
            self.path.borrow_mut().pop();
            out.insert(key, value?);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_document() {
        let v = check_json(br#" {"a": [1, 2.5, "x", null, true], "b": {"c": {}}} "#).unwrap();
        assert_eq!(v["a"][2], "x");
        assert_eq!(v["b"]["c"], serde_json::json!({}));
        assert_eq!(check_json(b"42").unwrap(), serde_json::json!(42));
    }

    #[test]
    fn invalid_json_reports_position_not_content() {
        let e = check_json(b"{\"secret-value\": tru}").unwrap_err();
        assert_eq!(e.instance_path, "");
        assert!(e.message.starts_with("invalid JSON: "), "{}", e.message);
        assert!(e.message.contains("line 1"), "{}", e.message);
        assert!(!e.message.contains("secret"), "{}", e.message);
    }

    #[test]
    fn hostile_deep_nesting_is_refused_without_recursion() {
        // A thread with a 64 KiB stack: any recursion proportional to depth would overflow it.
        let handle = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(|| {
                let mut doc = vec![b'['; 100_000];
                doc.extend(vec![b']'; 100_000]);
                let started = std::time::Instant::now();
                let r = parse_strict(&doc);
                (r, started.elapsed())
            })
            .unwrap();
        let (r, elapsed) = handle.join().unwrap();
        assert_eq!(
            r.unwrap_err(),
            JsonError::TooDeep {
                max: MAX_DEPTH,
                offset: MAX_DEPTH
            }
        );
        assert!(elapsed < std::time::Duration::from_secs(1));
        // Unbalanced and object nesting too.
        let doc = "{\"a\":".repeat(100_000);
        assert!(matches!(
            parse_strict(doc.as_bytes()),
            Err(JsonError::TooDeep { .. })
        ));
    }

    #[test]
    fn depth_limit_is_exact_and_ignores_brackets_in_strings() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        check_json(ok.as_bytes()).unwrap();
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(check_json(deep.as_bytes()).is_err());
        let s = format!("[\"{}\\\"{}\"]", "[".repeat(1000), "{".repeat(1000));
        check_json(s.as_bytes()).unwrap();
    }

    #[test]
    fn duplicate_keys_top_level_and_nested() {
        let e = parse_strict(br#"{"a": 1, "b": 2, "a": 3}"#).unwrap_err();
        assert_eq!(
            e,
            JsonError::DuplicateKey {
                pointer: String::new()
            }
        );
        assert_eq!(e.to_string(), "duplicate key in object at the top level");

        let e = check_json(br#"{"a": {"b": [0, {"k": 1, "k": 2}]}}"#).unwrap_err();
        assert_eq!(e.instance_path, "/a/b/1");
        assert_eq!(e.message, "duplicate key in object at /a/b/1");

        // Pointer escaping of `/` and `~` in keys.
        let e = check_json(br#"{"x/y~z": {"q": 1, "q": 1}}"#).unwrap_err();
        assert_eq!(e.instance_path, "/x~1y~0z");

        // Same key in sibling objects is fine.
        check_json(br#"[{"a":1},{"a":2}]"#).unwrap();
    }

    #[test]
    fn duplicate_key_message_does_not_echo_the_key() {
        let e = check_json(
            br#"{"IGNORE PREVIOUS INSTRUCTIONS": 1, "IGNORE PREVIOUS INSTRUCTIONS": 2}"#,
        )
        .unwrap_err();
        assert!(!e.message.contains("IGNORE"), "{}", e.message);
    }

    #[test]
    fn non_utf8_reports_offset() {
        let e = parse_strict(b"{\"a\": \"\xff\"}").unwrap_err();
        assert_eq!(e, JsonError::NotUtf8 { offset: 7 });
        assert_eq!(e.to_string(), "not valid UTF-8: invalid byte at offset 7");
    }

    #[test]
    fn bom_trailing_garbage_and_empty() {
        assert_eq!(
            parse_strict(b"\xEF\xBB\xBF{}").unwrap_err(),
            JsonError::ByteOrderMark
        );
        let e = check_json(b"{} {}").unwrap_err();
        assert!(e.message.contains("trailing characters"), "{}", e.message);
        let e = check_json(b"{}garbage").unwrap_err();
        assert!(e.message.contains("trailing characters"), "{}", e.message);
        assert_eq!(parse_strict(b"").unwrap_err(), JsonError::Empty);
        assert_eq!(parse_strict(b" \n\t").unwrap_err(), JsonError::Empty);
        check_json(b"{}\n").unwrap();
    }

    #[test]
    fn control_characters_in_strings_and_huge_numbers() {
        assert!(check_json(b"[\"a\nb\"]").is_err());
        assert!(check_json(b"[1e999]").is_err());
        check_json(b"[123456789012345678901234567890]").unwrap();
    }
}
