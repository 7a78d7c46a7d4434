//! A run's denials as they happen (issue #33; docs/api.md, "Following a run live"). The runner
//! sends each one on its lifeline as the engine records it (a `DENIAL` frame,
//! [`agentjail_manifest::results`]); [`Writer`] appends it to the job folder's `denials.jsonl`,
//! one JSON line `{"kind": …, "detail": …}` each (the names of the report's denials); a fleet's
//! executor copies the file into the database as it grows, like the logs
//! ([`super::fleet`]); a follower reads its whole lines from where it left off ([`lines`]).
//!
//! Bounded: at most [`MAX_LIVE_DENIALS`] lines (the engine sends no more: the first of each
//! distinct denial), each from a frame of at most [`FRAME_LIMIT`] bytes; a frame over it, or
//! one that is not a denial, is dropped with a warning. The run's report, in its record, stays
//! the account of its denials: it counts every refusal and has those known only at the end.

use std::path::PathBuf;

use agentjail_manifest::report::{Denial, bounded_detail};
pub use agentjail_manifest::results::MAX_LIVE_DENIALS;

/// The file of a run's live denials in its job folder.
pub const NAME: &str = "denials.jsonl";
/// The most a denial's frame may take on the lifeline: a detail is at most
/// `agentjail_manifest::report::MAX_DETAIL` (768) bytes, under 5 KiB as JSON even escaped.
pub const FRAME_LIMIT: u64 = 8 * 1024;
/// The most a run's `denials.jsonl` holds (each line is shorter than its frame's bound).
pub const LOG_LIMIT: u64 = MAX_LIVE_DENIALS as u64 * FRAME_LIMIT;

/// Appends the denials a runner sends to its job folder's `denials.jsonl` (created, 0600,
/// with the folder if need be, at the first one).
pub struct Writer {
    path: PathBuf,
    file: Option<std::fs::File>,
    lines: usize,
    /// The run's followers on this node, told of each line appended.
    news: Option<crate::news::Teller>,
}

impl Writer {
    /// A writer of the log at `path` (nothing is created yet).
    pub fn new(path: PathBuf, news: Option<crate::news::Teller>) -> Writer {
        Writer {
            path,
            file: None,
            lines: 0,
            news,
        }
    }

    /// A `DENIAL` frame's body: appended as one line when it is a denial and there is room.
    pub fn frame(&mut self, body: &[u8]) {
        if self.lines >= MAX_LIVE_DENIALS {
            tracing::warn!(path = %self.path.display(), "a runner sent more live denials than it may; dropped");
            return;
        }
        let Some(line) = line_of(body) else {
            tracing::warn!(path = %self.path.display(), "a runner's denial frame is not a denial; dropped");
            return;
        };
        if let Err(e) = self.append(&line) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot write a run's live denial; dropped");
            return;
        }
        self.lines += 1;
        if let Some(n) = &self.news {
            n.tell();
        }
    }

    fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let file = match &mut self.file {
            Some(f) => f,
            None => {
                if let Some(dir) = self.path.parent() {
                    super::streams::job_folder(dir)?;
                }
                self.file.insert(
                    std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .mode(0o600)
                        .open(&self.path)?,
                )
            }
        };
        // One write of the whole line: a follower reading meanwhile sees it whole or not yet.
        file.write_all(line)
    }
}

/// The line of a frame's body (a denial as JSON): the denial as the report names it, its
/// detail bounded as there, and a newline; None when the body is not a denial.
fn line_of(body: &[u8]) -> Option<Vec<u8>> {
    let d: Denial = serde_json::from_slice(body).ok()?;
    let mut line = serde_json::to_vec(&Denial {
        kind: d.kind,
        detail: bounded_detail(d.detail),
        count: 1,
    })
    .ok()?;
    line.push(b'\n');
    Some(line)
}

/// The whole lines at the start of `bytes` (a denials log read from some offset), each with
/// the offset just past its newline: its denial, or None for a line that is not one (skipped).
/// An incomplete last line is left out, to be read whole later.
pub fn lines(bytes: &[u8]) -> Vec<(Option<Denial>, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(n) = bytes
        .get(at..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
    {
        let line = &bytes[at..at + n];
        at += n + 1;
        out.push((serde_json::from_slice::<Denial>(line).ok(), at));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentjail_manifest::report::DenialKind;

    #[test]
    fn whole_lines_are_read_a_garbage_line_skipped_a_partial_one_left() {
        let log = b"{\"kind\":\"syscall\",\"detail\":\"ptrace\"}\nnot json\n{\"kind\":\"network\",\"detail\":\"GET a.test:80: not allowed\"}\n{\"kind\":\"syscall\",\"det";
        let got = lines(log);
        assert_eq!(got.len(), 3, "{got:?}");
        let first = got[0].0.as_ref().unwrap();
        assert_eq!(
            (first.kind, first.detail.as_str()),
            (DenialKind::Syscall, "ptrace")
        );
        assert_eq!(got[0].1, 37);
        assert!(got[1].0.is_none());
        assert_eq!(got[1].1, 37 + 9);
        assert_eq!(got[2].0.as_ref().unwrap().kind, DenialKind::Network);
        // The partial line is not passed: reading again from the last end gets it once whole.
        let end = got[2].1;
        assert_eq!(&log[end..], b"{\"kind\":\"syscall\",\"det");
        assert!(lines(&log[end..]).is_empty());
        let whole = b"{\"kind\":\"syscall\",\"detail\":\"bpf\"}\n";
        assert_eq!(lines(whole)[0].0.as_ref().unwrap().detail, "bpf");
        assert!(lines(b"").is_empty());
        // An empty line, or a denial of an unknown kind, is not one.
        assert!(
            lines(b"\n{\"kind\":\"magic\",\"detail\":\"x\"}\n")
                .iter()
                .all(|(d, _)| d.is_none())
        );
    }

    #[test]
    fn frames_become_bounded_lines_and_garbage_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job").join(NAME);
        let mut w = Writer::new(path.clone(), None);
        w.frame(b"not a denial");
        assert!(!path.exists(), "nothing is created for garbage");
        let long = "\n".repeat(2000);
        let body =
            serde_json::to_vec(&serde_json::json!({"kind": "network", "detail": long})).unwrap();
        w.frame(&body);
        w.frame(br#"{"kind":"syscall","detail":"ptrace","count":7}"#);
        for i in 0..(MAX_LIVE_DENIALS + 5) {
            w.frame(format!(r#"{{"kind":"syscall","detail":"s{i}"}}"#).as_bytes());
        }
        let text = std::fs::read(&path).unwrap();
        assert!(text.len() as u64 <= LOG_LIMIT);
        let got = lines(&text);
        assert_eq!(got.len(), MAX_LIVE_DENIALS);
        assert!(got.iter().all(|(d, _)| d.is_some()));
        let first = got[0].0.as_ref().unwrap();
        assert!(first.detail.len() <= agentjail_manifest::report::MAX_DETAIL + 3);
        assert!(
            text.split(|&b| b == b'\n')
                .all(|l| l.len() as u64 <= FRAME_LIMIT)
        );
        // One line each, as the report names it (no count).
        assert_eq!(
            got[1]
                .0
                .as_ref()
                .map(|d| (d.kind, d.detail.as_str(), d.count)),
            Some((DenialKind::Syscall, "ptrace", 1))
        );
        assert!(
            String::from_utf8_lossy(&text)
                .contains("{\"kind\":\"syscall\",\"detail\":\"ptrace\"}\n")
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
