//! The byte-level rules of the credential flow, apart from the gateway so that they can be
//! fuzzed without a runtime (docs/fuzzing.md): which request paths a credentialed host may
//! receive, and how a secret echoed back by the upstream is found and masked.
//!
//! Both sides of the rule matter. A credential is added when the request's path starts with
//! one of its `paths`; that match means something only if the upstream reads the path the
//! same way the gateway does, so a path whose meaning depends on the upstream's normalisation
//! (an encoded `/`, `\`, `.`, `;`, `%`, a control or non-ASCII byte, a dot segment, path
//! parameters) is refused outright ([`unambiguous_path`]). A request body that holds an HTTP
//! request line is refused ([`SmuggleScanner`]): an upstream (or a front proxy's pooled
//! connection behind it) that leaves a body unread parses it as the next request, and the
//! gateway's next, credentialed request as that one's body. On the way back, the secret and
//! its bare token (the value without its `Bearer`-style scheme) are looked for in the
//! response, case-insensitively: in header names and values (also split across consecutive
//! headers, [`Needles::header_spans`]) and in the body, across chunk boundaries
//! ([`BodyMasker`]), where each copy is overwritten at the same length so the body's framing
//! is unchanged. Only **whole** copies are looked for: removing a header that holds a piece
//! of the secret would tell a sandbox that reflects its own guesses through the upstream
//! (a request id, a CORS header) which guess was a piece of it, an oracle that recovers the
//! secret piece by piece.

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
}

impl Needles {
    /// The needles of the secrets `values` (header values as sent).
    pub fn new<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Needles {
        let mut whole: Vec<Vec<u8>> = Vec::new();
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
            for n in [v, bare] {
                if !n.is_empty() && !whole.contains(&n) {
                    whole.push(n);
                }
            }
        }
        // A needle that holds another needs no search of its own: every copy of it holds a
        // copy of the other, which is masked (or its header removed) anyway. Usually that
        // leaves the bare token alone: one pass over a body instead of two.
        let all = whole.clone();
        whole.retain(|n| {
            !all.iter()
                .any(|m| m.len() < n.len() && find(n, m, 0).is_some())
        });
        whole.sort_by_key(|n| std::cmp::Reverse(n.len()));
        Needles { whole }
    }

    /// Longest needle (0 when there is none).
    pub fn max_len(&self) -> usize {
        self.whole.first().map_or(0, Vec::len)
    }

    /// Whether `hay` holds a whole copy of a needle, case-insensitively.
    pub fn in_header(&self, hay: &[u8]) -> bool {
        self.whole.iter().any(|n| find(hay, n, 0).is_some())
    }

    /// `text` with every copy of a needle masked (for messages built from what an upstream
    /// sent: a refusal's reason).
    pub fn redact(&self, text: &str) -> String {
        let mut b = text.as_bytes().to_vec();
        if self.mask(&mut b) == 0 {
            return text.to_owned();
        }
        // Needles are ASCII, so only ASCII bytes were replaced: still UTF-8.
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
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
        let off = memchr::memchr2(first, first.to_ascii_uppercase(), rest)?;
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

/// Finds an HTTP request line at the start of any line of a request body that arrives in
/// chunks, before the line is passed on: the current line is held back until its end (or
/// until it is longer than [`SmuggleScanner::MAX_LINE`], which no server takes as a request
/// line). A request line is `METHOD SP TARGET SP HTTP/d…`, any case, after optional leading
/// blanks.
#[derive(Debug, Default)]
pub struct SmuggleScanner {
    line: Vec<u8>,
    /// The current line is too long to be a request line: pass it on without holding.
    overlong: bool,
}

/// Why a body was refused.
pub const SMUGGLED: &str = "a request body that holds an HTTP request line is refused for a credentialed host (rule: no request smuggled in a body)";

impl SmuggleScanner {
    /// Longest line held back.
    pub const MAX_LINE: usize = 64 << 10;

    /// Takes the next chunk; returns the bytes that may be passed on now, or the refusal.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, &'static str> {
        let mut out = Vec::with_capacity(chunk.len() + self.line.len());
        for &b in chunk {
            if self.overlong {
                out.push(b);
                if b == b'\n' {
                    self.overlong = false;
                }
                continue;
            }
            self.line.push(b);
            if b == b'\n' {
                if is_request_line(&self.line) {
                    return Err(SMUGGLED);
                }
                out.append(&mut self.line);
            } else if self.line.len() > Self::MAX_LINE {
                out.append(&mut self.line);
                self.overlong = true;
            }
        }
        Ok(out)
    }

    /// The end of the body: the last line, unless it is a request line.
    pub fn finish(&mut self) -> Result<Vec<u8>, &'static str> {
        if !self.overlong && is_request_line(&self.line) {
            return Err(SMUGGLED);
        }
        Ok(std::mem::take(&mut self.line))
    }

    /// Bytes held back.
    pub fn held(&self) -> usize {
        self.line.len()
    }
}

/// `METHOD SP TARGET SP HTTP/d` at the start of `line` (after blanks), any case.
fn is_request_line(line: &[u8]) -> bool {
    let blank = |c: &u8| matches!(c, b' ' | b'\t' | b'\r');
    let start = line.iter().position(|c| !blank(c)).unwrap_or(line.len());
    let mut words = line
        .get(start..)
        .unwrap_or_default()
        .split(|c| blank(c) || *c == b'\n')
        .filter(|w| !w.is_empty());
    let (Some(method), Some(_target), Some(version)) = (words.next(), words.next(), words.next())
    else {
        return false;
    };
    method
        .iter()
        .all(|c| c.is_ascii_alphabetic() || *c == b'-' || *c == b'_')
        && version.len() >= 6
        && version
            .get(..5)
            .is_some_and(|v| v.eq_ignore_ascii_case(b"http/"))
        && version.get(5).is_some_and(u8::is_ascii_digit)
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
        // The whole value holds the bare token: the token alone is searched for.
        assert_eq!(n.max_len(), "sk-secret-0123456789".len());
        assert!(n.in_header(b"you sent bearer SK-SECRET-0123456789"));
        assert!(n.in_header(b"sk-secret-0123456789"));
        // A piece is not looked for: its removal would tell a guessing sandbox it was right.
        assert!(!n.in_header(b"x=Secret-01"));
        assert!(!n.in_header(b"sk-secret-012345678"));
        assert!(!n.in_header(b"text/html; charset=utf-8"));
        assert_eq!(
            n.redact("refused: gzip-SK-secret-0123456789"),
            "refused: gzip-********************"
        );
        assert_eq!(n.redact("fine"), "fine");
        let spans = n.header_spans(&[b"ok", b"Bearer sk-Se", b"cret-0123", b"456789", b"ok"]);
        assert_eq!(spans, vec![1, 2, 3]);
        assert!(n.header_spans(&[b"ok", b"fine"]).is_empty());
    }

    #[test]
    fn request_lines_in_bodies_are_found_across_chunks() {
        for body in [
            &b"POST /v2/echo HTTP/1.1\r\nHost: app\r\nContent-Length: 99\r\n\r\n"[..],
            b"a=1&b=2\r\n  get /admin/delete-everything http/1.0\r\nX-Ignore: ",
            b"x\nGET /admin HTTP/1.1",
            b"\r\n\r\nPROPFIND * HTTP/2\r\n",
        ] {
            for split in 1..body.len() {
                let mut s = SmuggleScanner::default();
                let mut passed = Vec::new();
                let mut refused = false;
                for c in body.chunks(split) {
                    match s.push(c) {
                        Ok(b) => passed.extend(b),
                        Err(_) => {
                            refused = true;
                            break;
                        }
                    }
                }
                refused = refused || s.finish().is_err();
                assert!(refused, "{split}: {:?}", String::from_utf8_lossy(body));
                // What was passed on before the refusal holds no request line.
                assert!(!passed.windows(5).any(|w| w.eq_ignore_ascii_case(b"http/")));
            }
        }
        for body in [
            &b"{\"note\": \"GET /admin HTTP/1.1\"}"[..],
            b"hello world\nthe HTTP/1.1 spec\n",
            b"a b http/x\n",
            b"",
        ] {
            let mut s = SmuggleScanner::default();
            let mut out = s.push(body).unwrap();
            out.extend(s.finish().unwrap());
            assert_eq!(out, body);
        }
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
