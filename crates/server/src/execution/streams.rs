//! What a run's record shows of the command's stdout and stderr (docs/api.md, "Output in
//! results").
//!
//! The runner's stdout and stderr are the sandboxed command's and nothing else (it says
//! nothing of its own there: `agentjail run --lifeline`), drained into the job folder's
//! `stdout.log` and `stderr.log` ([`super::runner`]), which hold exactly the bytes the
//! report's `stdout.sha256` / `stderr.sha256` digest and the receipt signs. When a run ends,
//! [`record`] makes each stream's [`StreamView`]: within the task's budget
//! ([`agentjail_config::Task::stdout_limit`]), the head and the tail of the log as text
//! (invalid UTF-8 replaced, control characters shown escaped by the engine's terminal filter,
//! every value of the task's `env` and every gateway-held credential redacted), with the byte
//! counts and the digest. It is stored with the record, so every replica and worker of a fleet
//! serves it, and every front door shows it marked as untrusted data.
//!
//! Lives here: reading the logs, cutting, filtering and redacting. Not here: how a front door
//! frames the text for its callers.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use agentjail_config::Task;
use agentjail_manifest::report::StreamReport;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Replaces a secret found in a stream's text.
pub const REDACTED: &str = "[redacted]";
/// Task env values shorter than this are not redacted (they would blot out ordinary text such
/// as line numbers); docs/server.md says not to put such short secrets in a task's env.
pub const MIN_REDACTED_LEN: usize = 4;

/// What a run's record shows of one of the command's streams. Data the sandboxed code wrote:
/// never instructions, whatever it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamView {
    /// The beginning of the stream as text (all of it when `omitted_bytes` is 0): invalid
    /// UTF-8 replaced by U+FFFD, control characters shown escaped (`\x1b`), each value of the
    /// task's `env` and each gateway-held credential replaced by `[redacted]`.
    pub head: String,
    /// The end of the stream, likewise, when its middle is not shown (`omitted_bytes` > 0);
    /// otherwise empty.
    pub tail: String,
    /// Bytes of the retained stream between `head` and `tail` that are not shown (the task's
    /// `stdout_bytes` / `stderr_bytes` budget, half for each end).
    pub omitted_bytes: u64,
    /// Bytes the command wrote to the stream.
    pub bytes: u64,
    /// True when the command wrote more than the service retains (the first 1 MiB); the rest
    /// was dropped unread.
    pub truncated: bool,
    /// `sha256:<hex>` of the retained bytes, exactly as written: what the run's receipt signs
    /// for this stream (`agentjail receipt verify --stdout FILE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Always true: this is untrusted data written by the code.
    pub untrusted: bool,
}

/// The two views, as stored with a run (JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Streams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamView>,
}

/// The secrets a task's stream text must not show: its `env` values (exact) and the values of
/// the credentials its gateway holds (their whole header value and bare token, any case).
pub struct Secrets {
    env: Vec<String>,
    credentials: agentjail_egress::credential::Needles,
}

impl Secrets {
    pub fn of(task: &Task) -> Secrets {
        let mut env: Vec<String> = task
            .env
            .values()
            .filter(|v| v.len() >= MIN_REDACTED_LEN)
            .cloned()
            .collect();
        env.sort_by_key(|v| std::cmp::Reverse(v.len()));
        // Read as the runner's gateway reads them (its environment is the service's for
        // `env:NAME`); a secret that cannot be read here made the run fail anyway.
        let values: Vec<String> = match &task.network {
            agentjail_manifest::Network::Allow(p) => p
                .credentials
                .iter()
                .filter_map(|c| agentjail_egress::read_secret(&c.value_from).ok())
                .collect(),
            _ => Vec::new(),
        };
        let credentials =
            agentjail_egress::credential::Needles::new(values.iter().map(|v| v.as_bytes()));
        Secrets { env, credentials }
    }

    /// Secrets given as they are (tests, the MCP door's older callers).
    pub fn from_values(env: &[&str]) -> Secrets {
        Secrets {
            env: env
                .iter()
                .filter(|v| v.len() >= MIN_REDACTED_LEN)
                .map(|v| v.to_string())
                .collect(),
            credentials: agentjail_egress::credential::Needles::new(std::iter::empty()),
        }
    }

    /// The longest secret, in bytes: how far past a cut the text is read (or how much a live
    /// follower holds back) so that a secret across the cut is still seen whole.
    pub fn longest(&self) -> usize {
        self.margin()
    }

    fn margin(&self) -> usize {
        self.env
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .max(self.credentials.max_len())
    }

    fn redact(&self, mut s: String) -> String {
        for v in &self.env {
            if s.contains(v.as_str()) {
                s = s.replace(v.as_str(), REDACTED);
            }
        }
        self.credentials.redact(&s)
    }

    /// Overwrites every copy of a secret in `bytes` with `*`, byte for byte (offsets and length
    /// unchanged); how many copies were masked.
    pub fn mask(&self, bytes: &mut [u8]) -> u64 {
        let mut n = 0;
        for v in &self.env {
            let v = v.as_bytes();
            let mut from = 0;
            while let Some(at) = bytes
                .get(from..)
                .and_then(|rest| rest.windows(v.len()).position(|w| w == v))
            {
                let at = from + at;
                bytes[at..at + v.len()].fill(b'*');
                from = at + v.len();
                n += 1;
            }
        }
        n + self.credentials.mask(bytes)
    }

    /// `s` without a beginning of a secret at its very end (a stream cut mid-secret).
    fn redact_cut_end(&self, mut s: String) -> String {
        for v in &self.env {
            for k in (MIN_REDACTED_LEN..v.len()).rev() {
                if s.ends_with(&v[..k]) && v.is_char_boundary(k) {
                    s.truncate(s.len() - k);
                    s.push_str(REDACTED);
                    return s;
                }
            }
        }
        s
    }
}

/// The file of a stream's log in a job folder (`stdout.log`, `stderr.log`).
pub fn log_name(stdout: bool) -> &'static str {
    if stdout { "stdout.log" } else { "stderr.log" }
}

/// Creates a run's job folder, private (0700), unless it exists (another of its files made it:
/// the logs and the denials are each created at their first byte).
pub fn job_folder(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            // The umask may have taken bits away; a chmod only then (it costs an inode write).
            if std::fs::symlink_metadata(dir)?.permissions().mode() & 0o7777 != 0o700 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Up to `max` bytes of the file at `path` from `offset`; None when there is no such file or
/// it cannot be read.
pub fn read_from(path: &Path, offset: u64, max: u64) -> Option<Vec<u8>> {
    let mut f = std::fs::File::open(path).ok()?;
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut b = Vec::new();
    f.take(max).read_to_end(&mut b).ok()?;
    Some(b)
}

/// Bytes of the sandbox as text made inert for a terminal (the engine's filter), without
/// closing a line left open.
pub fn inert(b: &[u8]) -> String {
    let mut f = agentjail_engine::term::Inert::default();
    let mut out = Vec::new();
    f.feed(b, &mut out);
    f.finish_open(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The views of a finished run's streams, from its job folder's logs and the report's counts
/// and digests; `None` when the command never started (no digest in the report).
pub fn record(dir: &Path, task: &Task, stdout: &StreamReport, stderr: &StreamReport) -> Streams {
    let secrets = Secrets::of(task);
    let one = |name: &str, r: &StreamReport, budget: u64| {
        r.sha256
            .as_ref()
            .map(|_| view(&dir.join(name), r, budget as usize, &secrets))
    };
    Streams {
        stdout: one(log_name(true), stdout, task.stdout_limit()),
        stderr: one(log_name(false), stderr, task.stderr_limit()),
    }
}

/// The views of a run whose runner left no report (it was killed: a cancel, a lost lease),
/// from what its logs hold: counts and digests of the retained bytes (the service's own, not
/// attested by a receipt; `truncated` when a log reached the bound). None when the command
/// wrote nothing at all (no log exists: nothing to show, and no sign it started).
pub fn record_from_logs(dir: &Path, task: &Task) -> Option<Streams> {
    use sha2::Digest;
    let measure = |name: &str| -> Option<StreamReport> {
        let bytes = std::fs::read(dir.join(name)).ok()?;
        Some(StreamReport {
            bytes: bytes.len() as u64,
            truncated: bytes.len() as u64 >= agentjail_engine::STREAM_LIMIT,
            sha256: Some(format!(
                "sha256:{}",
                agentjail_manifest::hex(&sha2::Sha256::digest(&bytes))
            )),
        })
    };
    let (out, err) = (measure(log_name(true)), measure(log_name(false)));
    if out.is_none() && err.is_none() {
        return None;
    }
    let empty = || StreamReport {
        bytes: 0,
        truncated: false,
        sha256: Some(format!(
            "sha256:{}",
            agentjail_manifest::hex(&<sha2::Sha256 as Digest>::digest(b""))
        )),
    };
    Some(record(
        dir,
        task,
        &out.unwrap_or_else(empty),
        &err.unwrap_or_else(empty),
    ))
}

/// One stream's view: the log at `path` (absent: the command wrote nothing), cut to `budget`.
fn view(path: &Path, r: &StreamReport, budget: usize, secrets: &Secrets) -> StreamView {
    let mut v = StreamView {
        head: String::new(),
        tail: String::new(),
        omitted_bytes: 0,
        bytes: r.bytes,
        truncated: r.truncated,
        sha256: r.sha256.clone(),
        untrusted: true,
    };
    let Ok(meta) = std::fs::metadata(path) else {
        return v;
    };
    let len = meta.len() as usize;
    let margin = secrets.margin();
    let read = |from: usize, n: usize| read_from(path, from as u64, n as u64).unwrap_or_default();
    if len <= budget {
        let all = read(0, len);
        v.head = text(&all, secrets, r.truncated);
        return v;
    }
    let half = budget / 2;
    if half == 0 {
        v.omitted_bytes = len as u64;
        return v;
    }
    // Each end is read with a margin, redacted whole, then cut: a secret across the cut is
    // replaced before it could be shown in part.
    let head = read(0, half + margin);
    let head = secrets.redact(String::from_utf8_lossy(&head).into_owned());
    v.head = text(cut_front(&head, half).as_bytes(), secrets, false);
    let start = len.saturating_sub(half + margin);
    let tail = read(start, len - start);
    let tail = secrets.redact(String::from_utf8_lossy(&tail).into_owned());
    v.tail = text(cut_back(&tail, half).as_bytes(), secrets, r.truncated);
    v.omitted_bytes = (len - 2 * half) as u64;
    v
}

/// Bytes of a stream as shown: redacted, made inert for a terminal, redacted again (the filter
/// may escape a control character inside a value, which then no longer matches). `cut_end`:
/// the stream was cut where it ends here, perhaps inside a secret.
fn text(raw: &[u8], secrets: &Secrets, cut_end: bool) -> String {
    let s = secrets.redact(String::from_utf8_lossy(raw).into_owned());
    let s = if cut_end {
        secrets.redact_cut_end(s)
    } else {
        s
    };
    secrets.redact(inert(s.as_bytes()))
}

/// The first `n` bytes of `s`, at a character boundary.
fn cut_front(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The last `n` bytes of `s`, at a character boundary.
fn cut_back(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(bytes: u64, truncated: bool) -> StreamReport {
        StreamReport {
            bytes,
            truncated,
            sha256: Some(format!("sha256:{}", "0".repeat(64))),
        }
    }

    fn log(content: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("stderr.log");
        std::fs::write(&p, content).unwrap();
        (d, p)
    }

    #[test]
    fn a_short_stream_is_shown_whole_inert_and_redacted() {
        let raw = b"token=sk-secret-1234 \x1b]52;c;AAAA\x07 \xe2\x80\xaerev\nok\n";
        let (_d, p) = log(raw);
        let s = Secrets::from_values(&["sk-secret-1234", "ab"]);
        let v = view(&p, &report(raw.len() as u64, false), 4096, &s);
        assert_eq!(v.omitted_bytes, 0);
        assert!(v.tail.is_empty());
        assert!(v.head.contains("token=[redacted]"), "{}", v.head);
        assert!(!v.head.contains("sk-secret"));
        assert!(!v.head.contains('\x1b') && !v.head.contains('\u{202e}'));
        assert!(v.head.contains("\\x1b]52"), "{}", v.head);
        assert!(v.head.ends_with("ok\n"), "{:?}", v.head);
        assert!(v.untrusted);
    }

    #[test]
    fn a_long_stream_shows_head_and_tail_and_no_secret_across_a_cut() {
        let secret = "SECRET-VALUE-0123456789";
        let mut raw = Vec::new();
        // A secret across the head's cut (at 50) and one across the tail's.
        raw.extend_from_slice(&[b'a'; 40]);
        raw.extend_from_slice(secret.as_bytes());
        raw.extend_from_slice(&[b'm'; 1000]);
        raw.extend_from_slice(secret.as_bytes());
        raw.extend_from_slice(&[b'z'; 40]);
        let (_d, p) = log(&raw);
        let s = Secrets::from_values(&[secret]);
        let v = view(&p, &report(raw.len() as u64, false), 100, &s);
        assert_eq!(v.omitted_bytes, raw.len() as u64 - 100);
        for part in [&v.head, &v.tail] {
            assert!(part.len() <= 60, "{part:?}");
            for k in 6..secret.len() {
                assert!(
                    !part.contains(&secret[..k]) && !part.contains(&secret[secret.len() - k..]),
                    "{part:?} shows part of the secret"
                );
            }
        }
        assert!(v.head.starts_with("aaaa") && v.tail.ends_with("zzzz"));
    }

    #[test]
    fn a_stream_cut_inside_a_secret_does_not_show_its_beginning() {
        let raw = b"the key is SECRET-VAL";
        let (_d, p) = log(raw);
        let s = Secrets::from_values(&["SECRET-VALUE-0123456789"]);
        let v = view(&p, &report(5_000_000, true), 4096, &s);
        assert!(!v.head.contains("SECRET-V"), "{}", v.head);
        assert!(v.head.ends_with(REDACTED), "{}", v.head);
        assert!(v.truncated && v.bytes == 5_000_000);
    }

    /// A gateway-held credential echoed into the output (an upstream that reflects headers):
    /// its whole value and its bare token, in any case, are redacted in the view and masked in
    /// a served log.
    #[test]
    fn gateway_credentials_are_redacted_whole_and_bare_in_any_case() {
        let s = Secrets {
            env: Vec::new(),
            credentials: agentjail_egress::credential::Needles::new([
                b"Bearer sk-cred-0123456789".as_slice()
            ]),
        };
        let raw = b"authorization: bearer SK-CRED-0123456789\ntoken=sk-cred-0123456789\n";
        let (_d, p) = log(raw);
        let v = view(&p, &report(raw.len() as u64, false), 4096, &s);
        assert!(!v.head.to_lowercase().contains("sk-cred"), "{}", v.head);
        let mut b = raw.to_vec();
        assert!(s.mask(&mut b) >= 2);
        assert!(
            !String::from_utf8_lossy(&b)
                .to_lowercase()
                .contains("sk-cred")
        );
        assert_eq!(b.len(), raw.len());
    }

    #[test]
    fn masking_keeps_offsets_and_finds_every_copy() {
        let s = Secrets::from_values(&["sk-secret-1234"]);
        let mut b = b"a sk-secret-1234 b sk-secret-1234sk-secret-1234".to_vec();
        let len = b.len();
        assert_eq!(s.mask(&mut b), 3);
        assert_eq!(b.len(), len);
        assert!(!String::from_utf8_lossy(&b).contains("secret"));
        assert!(b.starts_with(b"a ************** b "));
    }

    #[test]
    fn no_log_and_zero_budget() {
        let s = Secrets::from_values(&[]);
        let v = view(Path::new("/nonexistent/x.log"), &report(0, false), 4096, &s);
        assert_eq!((v.head.as_str(), v.omitted_bytes), ("", 0));
        let (_d, p) = log(b"hello");
        let v = view(&p, &report(5, false), 0, &s);
        assert_eq!((v.head.as_str(), v.omitted_bytes), ("", 5));
    }

    #[test]
    fn multibyte_text_is_cut_at_character_boundaries() {
        let raw = "é".repeat(200);
        let (_d, p) = log(raw.as_bytes());
        let s = Secrets::from_values(&[]);
        let v = view(&p, &report(400, false), 101, &s);
        assert!(v.head.chars().all(|c| c == 'é') && !v.head.is_empty());
        assert!(v.tail.chars().all(|c| c == 'é') && !v.tail.is_empty());
    }
}
