//! The byte-level rules of the credential flow, apart from the gateway so that they can be
//! fuzzed without a runtime (docs/fuzzing.md): which request paths a credentialed host may
//! receive, and how a secret echoed back by the upstream is found and masked.
//!
//! Both sides of the rule matter. A credential is added when the request's path starts with
//! one of its `paths`; that match means something only if the upstream reads the path the
//! same way the gateway does, so a path whose meaning depends on the upstream's normalisation
//! (an encoded `/`, `\`, `.`, `;`, `%`, a control or non-ASCII byte, a dot segment, path
//! parameters) is refused outright ([`unambiguous_path`]). On the way back, the secret and
//! its bare token (the value without its `Bearer`-style scheme) are looked for in the
//! response, case-insensitively: in header names and values (also split across headers,
//! [`Needles::header_spans`]) and in the body, across chunk boundaries ([`BodyMasker`]), where
//! each copy is overwritten at the same length so the body's framing is unchanged.

/// Why a path would be read differently by some upstream than by the gateway's prefix match;
/// `Ok` when no server normalises it into another path. The reason names the rule.
pub fn unambiguous_path(path: &str) -> Result<(), &'static str> {
    let b = path.as_bytes();
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        match c {
            b'%' => {
                let hex = |j: usize| b.get(j).copied().filter(u8::is_ascii_hexdigit);
                let (Some(h), Some(l)) = (hex(i + 1), hex(i + 2)) else {
                    return Err(
                        "a `%` not followed by two hex digits (`%u…` escapes, a stray `%`)",
                    );
                };
                let v = (nibble(h) << 4) | nibble(l);
                match v {
                    b'/' => return Err("an encoded `/` (%2F)"),
                    b'\\' => return Err("an encoded `\\` (%5C)"),
                    b'.' => return Err("an encoded `.` (%2E)"),
                    b';' => return Err("an encoded `;` (%3B)"),
                    b'%' => return Err("an encoded `%` (%25, double encoding)"),
                    0..=0x1f | 0x7f => {
                        return Err("an encoded control character (NUL, %00–%1F, %7F)");
                    }
                    0x80..=0xff => {
                        return Err("an encoded non-ASCII byte (overlong or other UTF-8)");
                    }
                    _ => {}
                }
                i += 3;
            }
            b'\\' => return Err("a `\\`"),
            b';' => return Err("a `;` (path parameters: `..;` is `..` to Tomcat and Spring)"),
            0..=0x20 | 0x7f..=0xff => return Err("a space, control or non-ASCII character"),
            _ => i += 1,
        }
    }
    if path.split('/').any(|seg| seg == "." || seg == "..") {
        return Err("a dot segment (`.` or `..`)");
    }
    Ok(())
}

fn nibble(h: u8) -> u8 {
    match h {
        b'0'..=b'9' => h - b'0',
        b'a'..=b'f' => h - b'a' + 10,
        _ => h.wrapping_sub(b'A').wrapping_add(10),
    }
}

/// Copies of one credential that must not reach the sandbox, lower-cased: the whole value
/// and its bare token (`Bearer abc` → `abc`).
#[derive(Debug, Clone)]
pub struct Needles {
    /// Longest first; never empty strings.
    whole: Vec<Vec<u8>>,
    /// The shortest needle: every run of this many of its bytes is a piece to look for in
    /// headers (a copy split across headers has a piece at least this long in one of them,
    /// unless it was cut into pieces shorter than [`Needles::PIECE`]).
    token: Vec<u8>,
}

impl Needles {
    /// Shortest piece of the bare token looked for in a single header.
    pub const PIECE: usize = 8;

    /// The needles of the secrets `values` (header values as sent).
    pub fn new<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Needles {
        let mut whole: Vec<Vec<u8>> = Vec::new();
        let mut token: Vec<u8> = Vec::new();
        for v in values {
            let v = v.trim_ascii().to_ascii_lowercase();
            if v.is_empty() {
                continue;
            }
            // `scheme SP token`: a scheme is a token of its own (RFC 9110 section 11.1).
            let bare = match v.iter().position(|&c| c == b' ') {
                Some(at) if at > 0 => v.get(at + 1..).unwrap_or_default().trim_ascii().to_vec(),
                _ => v.clone(),
            };
            for n in [v, bare.clone()] {
                if !n.is_empty() && !whole.contains(&n) {
                    whole.push(n);
                }
            }
            if token.is_empty() || (!bare.is_empty() && bare.len() < token.len()) {
                token = bare;
            }
        }
        whole.sort_by_key(|n| std::cmp::Reverse(n.len()));
        Needles { whole, token }
    }

    /// Longest needle (0 when there is none).
    pub fn max_len(&self) -> usize {
        self.whole.first().map_or(0, Vec::len)
    }

    /// Whether `hay` holds a whole copy of a needle, or a piece of the bare token at least
    /// [`Needles::PIECE`] bytes long, case-insensitively.
    pub fn in_header(&self, hay: &[u8]) -> bool {
        if self.whole.iter().any(|n| find(hay, n, 0).is_some()) {
            return true;
        }
        let w = Needles::PIECE.min(self.token.len());
        w > 0
            && self
                .token
                .windows(w)
                .any(|piece| find(hay, piece, 0).is_some())
    }

    /// The indexes of the values in `values` that together hold a whole needle when read
    /// one after the other (a copy split across several headers).
    pub fn header_spans(&self, values: &[&[u8]]) -> Vec<usize> {
        let mut joined = Vec::new();
        let mut owner = Vec::new();
        for (i, v) in values.iter().enumerate() {
            joined.extend_from_slice(v);
            owner.extend(std::iter::repeat_n(i, v.len()));
        }
        let mut hit: Vec<usize> = Vec::new();
        for n in &self.whole {
            let mut from = 0;
            while let Some(at) = find(&joined, n, from) {
                for o in owner.get(at..at + n.len()).unwrap_or_default() {
                    if !hit.contains(o) {
                        hit.push(*o);
                    }
                }
                from = at + 1;
            }
        }
        hit.sort_unstable();
        hit
    }

    /// Overwrites every copy of a needle in `buf` with `*` (same length), case-insensitively,
    /// longest needles first. Returns how many copies were masked.
    pub fn mask(&self, buf: &mut [u8]) -> u64 {
        let mut n = 0;
        for needle in &self.whole {
            let mut from = 0;
            while let Some(at) = find(buf, needle, from) {
                if let Some(s) = buf.get_mut(at..at + needle.len()) {
                    s.fill(b'*');
                }
                n += 1;
                from = at + needle.len();
            }
        }
        n
    }
}

/// The first index at or after `from` where `needle` (lower-case) occurs in `hay`, compared
/// ASCII case-insensitively.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let first = *needle.first()?;
    let last_start = hay.len().checked_sub(needle.len())?;
    let mut i = from;
    while i <= last_start {
        let rest = hay.get(i..=last_start)?;
        let off = rest.iter().position(|c| c.to_ascii_lowercase() == first)?;
        i += off;
        if hay
            .get(i..i + needle.len())
            .is_some_and(|w| w.eq_ignore_ascii_case(needle))
        {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Masks the needles in a body that arrives in chunks: a copy split across chunks is found
/// because the last `max_len - 1` bytes of what came are held back until the next chunk (or
/// the end). What comes out is exactly as long as what went in.
#[derive(Debug)]
pub struct BodyMasker {
    needles: Needles,
    held: Vec<u8>,
    masked: u64,
}

impl BodyMasker {
    /// A masker for `needles`.
    pub fn new(needles: Needles) -> BodyMasker {
        BodyMasker {
            needles,
            held: Vec::new(),
            masked: 0,
        }
    }

    /// Takes the next chunk; returns the bytes that may be passed on now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let keep = self.needles.max_len().saturating_sub(1);
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(chunk);
        self.masked += self.needles.mask(&mut buf);
        let cut = buf.len().saturating_sub(keep);
        self.held = buf.split_off(cut);
        buf
    }

    /// The end of the body: what was held back.
    pub fn finish(&mut self) -> Vec<u8> {
        self.masked += self.needles.mask(&mut self.held);
        std::mem::take(&mut self.held)
    }

    /// Copies masked so far.
    pub fn masked(&self) -> u64 {
        self.masked
    }

    /// Bytes held back, waiting for the next chunk or the end.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_servers_read_differently_are_refused() {
        for (p, rule) in [
            ("/v1/../admin", "dot segment"),
            ("/v1/./x", "dot segment"),
            ("/v1/..", "dot segment"),
            ("/v1/..%2Fadmin", "encoded `/`"),
            ("/v1/%2e%2e%2fadmin", "encoded `.`"),
            ("/v1/%2E%2E%2Fadmin", "encoded `.`"),
            ("/v1/..%2F..%2Fadmin", "encoded `/`"),
            ("/v1/..;/admin", "`;`"),
            ("/v1/x/..;/..;/admin", "`;`"),
            ("/v1/%252e%252e/admin", "%25"),
            ("/v1/%c0%ae%c0%ae/admin", "non-ASCII"),
            ("/v1/%u002e%u002e/admin", "two hex digits"),
            ("/v1/..%00/admin", "control"),
            ("/v1/..%3Badmin", "`;`"),
            ("/v1/\u{ff0e}\u{ff0e}/admin", "non-ASCII"),
            ("/v1/%ef%bc%8e%ef%bc%8e/admin", "non-ASCII"),
            ("/v1\\..\\admin", "`\\`"),
            ("/v1/%5c../admin", "`\\`"),
            ("/v1/%", "two hex digits"),
            ("/v1/%2", "two hex digits"),
            ("/v1/%+1", "two hex digits"),
            ("/v1/a b", "space"),
        ] {
            let e = unambiguous_path(p).expect_err(p);
            assert!(e.contains(rule), "{p}: {e}");
        }
        for p in [
            "/v1/x",
            "/v1/..x",
            "/v1/x..",
            "/v1/.well-known",
            "/",
            "/v1/a%20b",
            "/v1/%41",
            "/v1//x",
        ] {
            assert_eq!(unambiguous_path(p), Ok(()), "{p}");
        }
    }

    fn needles() -> Needles {
        Needles::new([b"Bearer sk-Secret-0123456789".as_slice()])
    }

    #[test]
    fn needles_are_the_value_and_its_bare_token_any_case() {
        let n = needles();
        assert_eq!(n.max_len(), "bearer sk-secret-0123456789".len());
        assert!(n.in_header(b"you sent bearer SK-SECRET-0123456789"));
        assert!(n.in_header(b"sk-secret-0123456789"));
        // A piece of the token (a copy cut in two).
        assert!(n.in_header(b"x=Secret-01"));
        assert!(!n.in_header(b"text/html; charset=utf-8"));
        let spans = n.header_spans(&[b"ok", b"Bearer sk-Se", b"cret-0123", b"456789", b"ok"]);
        assert_eq!(spans, vec![1, 2, 3]);
        assert!(n.header_spans(&[b"ok", b"fine"]).is_empty());
    }

    #[test]
    fn bodies_are_masked_at_the_same_length_across_chunks() {
        let body = b"{\"authorization\": \"Bearer sk-secret-0123456789\", \"b\": \"SK-SECRET-0123456789\"}";
        for split in 1..body.len() {
            let mut m = BodyMasker::new(needles());
            let mut out = Vec::new();
            for c in body.chunks(split) {
                out.extend(m.push(c));
            }
            out.extend(m.finish());
            assert_eq!(out.len(), body.len(), "split {split}");
            let text = String::from_utf8(out).unwrap().to_ascii_lowercase();
            assert!(
                !text.contains("sk-secret-0123456789"),
                "split {split}: {text}"
            );
            assert!(text.contains("\"b\": \"****"), "split {split}: {text}");
            assert_eq!(m.masked(), 2, "split {split}");
        }
    }
}
