//! The sandbox's output made inert for the caller's terminal.
//!
//! What the command writes to stdout/stderr passes through to agentjail's own. When that is a
//! terminal, escape sequences from the sandbox would drive it: set the window title, write the
//! clipboard (OSC 52), move the cursor, clear the screen, or forge agentjail's own last line.
//! [`Inert`] shows every control character but `\n`, `\t` and `\r` escaped instead
//! (`\x1b`, `\x07`; C1 controls and bidi overrides as `\u{9b}`, `\u{202e}`; bytes that are not
//! UTF-8 as `\x9b`), keeps UTF-8 characters split across reads whole, and marks a line of the
//! sandbox that starts with `agentjail` (at the start of the stream or after `\n` or `\r`) as
//! the sandbox's: `[sandbox] agentjail: …`. agentjail's own summary line on a terminal carries an
//! escape sequence (reverse video on `agentjail:`, [`OUR_TAG`]) that filtered output cannot
//! contain, so it cannot be forged. At the end of the stream, a line left open is closed, so
//! that nothing the sandbox wrote shares a line with agentjail's.
//!
//! Output to anything but a terminal is passed byte for byte (no [`Inert`]), and `--raw-output`
//! opts out on a terminal.

/// What starts agentjail's own lines; a sandbox line starting with it (any case) is marked.
const OURS: &[u8] = b"agentjail";
/// The mark put before such a line.
pub const SANDBOX_MARK: &str = "[sandbox] ";
/// How agentjail's own summary line starts on a terminal: `agentjail:` in reverse video. The
/// sandbox's output, filtered, never contains an ESC byte, so it cannot produce this.
pub const OUR_TAG: &str = "\x1b[7magentjail:\x1b[27m";

/// A filter for one stream (see the module's documentation).
#[derive(Debug)]
pub struct Inert {
    /// The start of an incomplete UTF-8 sequence from the previous read (at most 3 bytes).
    pending: Vec<u8>,
    /// Bytes at the start of a line that may still turn out to be `agentjail`.
    held: Vec<u8>,
    at_line_start: bool,
    /// Whether the last byte given out was `\n` (true before anything was).
    line_closed: bool,
}

impl Default for Inert {
    fn default() -> Self {
        Inert {
            pending: Vec::new(),
            held: Vec::new(),
            at_line_start: true,
            line_closed: true,
        }
    }
}

/// Characters shown escaped: the ones `agentjail_manifest::text` never lets through (controls,
/// bidi overrides and isolates, zero-width and line-separator characters), except the `\t`,
/// `\n` and `\r` a stream of lines needs.
fn unsafe_char(c: char) -> bool {
    agentjail_manifest::text::is_unsafe_char(c) && !matches!(c, '\n' | '\t' | '\r')
}

impl Inert {
    /// Filters `input` (one read of the stream), appending what may be shown to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut data = std::mem::take(&mut self.pending);
        data.extend_from_slice(input);
        let mut rest = data.as_slice();
        while !rest.is_empty() {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.text(s, out);
                    rest = &[];
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    // `valid` is UTF-8 (up to `valid_up_to`, by definition).
                    self.text(std::str::from_utf8(valid).unwrap_or_default(), out);
                    match e.error_len() {
                        Some(n) => {
                            let (bad, after) = tail.split_at(n.min(tail.len()));
                            for b in bad {
                                self.escaped(&format!("\\x{b:02x}"), out);
                            }
                            rest = after;
                        }
                        None => {
                            // An incomplete character at the end: wait for the next read.
                            self.pending = tail.to_vec();
                            rest = &[];
                        }
                    }
                }
            }
        }
    }

    /// The end of the stream: what is held is given out, an incomplete character is shown
    /// escaped, and a line left open is closed.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.finish_open(out);
        if !self.line_closed {
            self.emit(b"\n", out);
        }
    }

    /// The end of the text, like [`Inert::finish`] but leaving a line open as it is: for text
    /// shown as a value of its own (a run record's excerpt), not followed by agentjail's line.
    pub fn finish_open(&mut self, out: &mut Vec<u8>) {
        for b in std::mem::take(&mut self.pending) {
            self.escaped(&format!("\\x{b:02x}"), out);
        }
        self.release(out);
    }

    fn text(&mut self, s: &str, out: &mut Vec<u8>) {
        for c in s.chars() {
            match c {
                '\n' | '\r' => {
                    self.release(out);
                    let mut b = [0u8; 4];
                    self.emit(c.encode_utf8(&mut b).as_bytes(), out);
                    self.at_line_start = true;
                }
                c if unsafe_char(c) => {
                    let shown = if (c as u32) < 0x80 {
                        format!("\\x{:02x}", c as u32)
                    } else {
                        format!("\\u{{{:x}}}", c as u32)
                    };
                    self.escaped(&shown, out);
                }
                c => {
                    let mut b = [0u8; 4];
                    let bytes = c.encode_utf8(&mut b).as_bytes();
                    if self.at_line_start {
                        self.held.extend_from_slice(bytes);
                        let n = self.held.len();
                        if n <= OURS.len() && self.held.eq_ignore_ascii_case(&OURS[..n]) {
                            if n == OURS.len() {
                                self.emit(SANDBOX_MARK.as_bytes(), out);
                                self.release(out);
                            }
                        } else {
                            self.release(out);
                        }
                    } else {
                        self.emit(bytes, out);
                    }
                }
            }
        }
    }

    /// Shows an escaped form; it ends any pending match at a line start.
    fn escaped(&mut self, shown: &str, out: &mut Vec<u8>) {
        self.release(out);
        self.emit(shown.as_bytes(), out);
    }

    /// Gives out the bytes held at a line start; the line has started.
    fn release(&mut self, out: &mut Vec<u8>) {
        let held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            self.emit(&held, out);
        }
        self.at_line_start = false;
    }

    fn emit(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(bytes);
        if let Some(&last) = bytes.last() {
            self.line_closed = last == b'\n';
        }
    }
}

/// A line of agentjail's own, made inert (a detail in it may come from the sandbox) — what
/// follows [`OUR_TAG`] on a terminal.
pub fn inert_line(s: &str) -> String {
    let mut f = Inert {
        at_line_start: false,
        ..Inert::default()
    };
    let mut out = Vec::new();
    f.feed(s.replace(['\n', '\r'], " ").as_bytes(), &mut out);
    f.pending.clear();
    f.release(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]]) -> Vec<u8> {
        let mut f = Inert::default();
        let mut out = Vec::new();
        for c in chunks {
            f.feed(c, &mut out);
        }
        f.finish(&mut out);
        out
    }

    #[test]
    fn controls_are_escaped_and_text_kept() {
        assert_eq!(
            run(&[b"a\x1b]0;T\x07b\tc\r\n"]),
            b"a\\x1b]0;T\\x07b\tc\r\n".to_vec()
        );
        assert_eq!(
            run(&["x\u{9b}y\u{202e}z\u{7f}\n".as_bytes()]),
            b"x\\u{9b}y\\u{202e}z\\x7f\n".to_vec()
        );
        assert_eq!(run(&[b"\x9b\xff\n"]), b"\\x9b\\xff\n".to_vec());
    }

    #[test]
    fn utf8_split_across_reads_is_kept_whole() {
        assert_eq!(run(&[b"\xc3", b"\xa9\n"]), "é\n".as_bytes().to_vec());
        assert_eq!(
            run(&[b"\xe2", b"\x82", b"\xac\n"]),
            "€\n".as_bytes().to_vec()
        );
        // Cut off at the end: shown escaped, and the line closed.
        assert_eq!(run(&[b"a\xe2\x82"]), b"a\\xe2\\x82\n".to_vec());
    }

    #[test]
    fn lines_imitating_ours_are_marked_even_split_across_reads() {
        assert_eq!(
            run(&[b"agentjail: run ended: ok\n"]),
            b"[sandbox] agentjail: run ended: ok\n".to_vec()
        );
        assert_eq!(
            run(&[b"x\rAgent", b"Jail: ok\nagent smith\nagentjai"]),
            b"x\r[sandbox] AgentJail: ok\nagent smith\nagentjai\n".to_vec()
        );
        assert_eq!(run(&[b"say agentjail\n"]), b"say agentjail\n".to_vec());
        assert!(
            !String::from_utf8(run(&[b"\x1b[7magentjail:\x1b[27m ok"]))
                .unwrap()
                .contains(OUR_TAG)
        );
    }

    #[test]
    fn an_open_line_is_closed_at_the_end() {
        assert_eq!(run(&[b"abc"]), b"abc\n".to_vec());
        assert_eq!(run(&[b"abc\r"]), b"abc\r\n".to_vec());
        assert_eq!(run(&[b""]), b"".to_vec());
        assert_eq!(inert_line("a\x1bb\nc"), "a\\x1bb c");
    }
}
