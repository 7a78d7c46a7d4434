//! What a run produces and the parts of it both tiers share: the caller's options
//! ([`RunOptions`], [`Sink`]), the [`Outcome`] and its [`Cleanup`], the command's output
//! [`Stream`]s, and the one classification of how a run ended ([`classify`]) into the report's
//! status. `supervisor` (native tier) and `gvisor` both build on this module; neither imports
//! the other's internals.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use agentjail_manifest::report::{DenialKind, RunReport, Status, StreamReport};

use crate::cgroup::Cgroup;

/// Bound on what passes through of the command's stdout and of its stderr.
pub const STREAM_LIMIT: u64 = 1024 * 1024;

/// Where a stream of the command goes.
#[derive(Debug, Clone, Copy)]
pub enum Sink {
    /// Written through to our own stdout, up to [`STREAM_LIMIT`].
    Stdout,
    /// Written through to our own stderr, up to [`STREAM_LIMIT`].
    Stderr,
    /// Kept in memory, up to [`STREAM_LIMIT`].
    Capture,
    /// Like `Stdout`, with control characters shown escaped ([`crate::term`]): for a terminal.
    StdoutInert,
    /// Like `Stderr`, with control characters shown escaped ([`crate::term`]): for a terminal.
    StderrInert,
}

/// Options of one run that are not part of the manifest (they concern the caller's side).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Run even when a protection cannot be applied; the report lists what was not.
    pub allow_degraded: bool,
    pub stdout: Sink,
    pub stderr: Sink,
    /// Name servers the egress gateway asks; empty means the host's resolver configuration
    /// (/etc/hosts, /etc/resolv.conf).
    pub egress_dns: Vec<std::net::SocketAddr>,
    /// The read end of a pipe whose write end only the caller (the service) holds: when it
    /// hangs up (the caller died), the sandbox is killed and the run ends as a setup error.
    pub lifeline: Option<std::sync::Arc<OwnedFd>>,
    /// With a lifeline: the lease the caller holds on the run (a fleet executor's), which the
    /// caller renews over the lifeline; when its end passes, the sandbox is killed
    /// ([`crate::lifeline`]).
    pub lease: Option<crate::lifeline::LeaseStart>,
    /// The checkpoint to restore into /work (manifest `workspace.restore`), read once and
    /// checked by the caller against its digest and bounds before the run.
    pub workspace_restore: Option<std::sync::Arc<Vec<u8>>>,
    /// Where each new denial goes as it is recorded, while the run goes on (the native tier's
    /// refused syscalls and egress refusals; [`crate::live`]). The report is the same with or
    /// without it.
    pub live_denials: Option<std::sync::Arc<crate::live::LiveDenials>>,
    /// The command's stdin instead of `/dev/null` (native tier): a live session's control
    /// socket, over which its resident interpreter receives cells and answers them.
    pub stdin: Option<std::sync::Arc<OwnedFd>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            allow_degraded: false,
            stdout: Sink::Stdout,
            stderr: Sink::Stderr,
            egress_dns: Vec::new(),
            lifeline: None,
            lease: None,
            workspace_restore: None,
            live_denials: None,
            stdin: None,
        }
    }
}

/// The result of a run, before its output is verified.
#[derive(Debug)]
pub struct Outcome {
    /// Status is final except that `ok` still depends on output verification.
    pub report: RunReport,
    /// The sandbox's /output, readable after every process of the sandbox is gone.
    pub output_dir: Option<OwnedFd>,
    /// The sandbox's /work, when the manifest collects the workspace; read like `output_dir`.
    pub work_dir: Option<OwnedFd>,
    /// /output reached its size limit: files in it may be truncated.
    pub output_full: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Reaps the sandbox's init and removes the run's cgroup when dropped. Every process of
    /// the command is already dead when `run` returns; only the init's own exit (the kernel
    /// tearing the namespaces down) may still be in progress, and the caller can verify and
    /// report meanwhile. Keep it until the report is written.
    pub cleanup: Cleanup,
}

/// See [`Outcome::cleanup`].
#[derive(Debug, Default)]
pub struct Cleanup {
    pub(crate) init: Option<OwnedFd>,
    /// The init reported the command's end after reaping every process of it: the cgroups
    /// are empty, and the init has nothing left to do but exit.
    pub(crate) init_finished: bool,
    pub(crate) cgroup: Option<Cgroup>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        match self.init.take() {
            Some(pidfd) if self.init_finished => {
                // The cgroups are empty already (the init is outside them): remove them first,
                // then reap the init. Always reap it: an init left to whoever adopts it would
                // stay a zombie under a parent that does not reap adopted children (a
                // container's pid 1, a server). Its exit (the kernel tearing the namespaces
                // down) costs ~0.4 ms more per run than not waiting (docs/performance.md).
                drop(self.cgroup.take());
                let _ = rustix::process::waitid(
                    rustix::process::WaitId::PidFd(pidfd.as_fd()),
                    rustix::process::WaitIdOptions::EXITED,
                );
            }
            // Killed or failed: its pid namespace may still hold processes of the command,
            // which leave the cgroups only as the namespace dies.
            Some(pidfd) => kill_and_reap(&pidfd),
            None => {}
        }
        crate::timing::mark("cleanup: init reaped");
        drop(self.cgroup.take());
    }
}

/// One output stream of the command (a pipe), passed through to its sink within
/// [`STREAM_LIMIT`]. Shared by both tiers.
pub(crate) struct Stream {
    pub(crate) fd: Option<OwnedFd>,
    sink: Sink,
    report: StreamReport,
    /// The digest of every byte passed to the sink (before a terminal filter).
    digest: sha2::Sha256,
    pub(crate) captured: Vec<u8>,
    inert: Option<crate::term::Inert>,
    /// Our own stream's reader is gone (EPIPE): nothing more is relayed.
    reader_gone: bool,
}

impl Stream {
    /// Wraps the read end of a pipe, made non-blocking so that draining it never hangs on a
    /// writer that is still alive somewhere.
    pub(crate) fn new(fd: Option<OwnedFd>, sink: Sink) -> Stream {
        if let Some(f) = &fd {
            let _ = rustix::io::ioctl_fionbio(f, true);
        }
        Stream {
            fd,
            sink,
            report: StreamReport::default(),
            digest: sha2::Digest::new(),
            captured: Vec::new(),
            inert: matches!(sink, Sink::StdoutInert | Sink::StderrInert)
                .then(crate::term::Inert::default),
            reader_gone: false,
        }
    }

    /// Hands bytes of the command's stream to the sink.
    fn deliver(&mut self, bytes: &[u8]) {
        let mut shown = Vec::new();
        let bytes = match &mut self.inert {
            Some(f) => {
                f.feed(bytes, &mut shown);
                shown.as_slice()
            }
            None => bytes,
        };
        let relayed = match self.sink {
            Sink::Stdout | Sink::StdoutInert => write_all(std::io::stdout().as_fd(), bytes),
            Sink::Stderr | Sink::StderrInert => write_all(std::io::stderr().as_fd(), bytes),
            Sink::Capture => {
                self.captured.extend_from_slice(bytes);
                Ok(())
            }
        };
        // The reader of our stream left (`agentjail run -- yes | head -1`): close our end of
        // the command's pipe, so that its next write meets SIGPIPE as it would without us in
        // between, instead of being read and dropped until the timeout.
        if relayed == Err(rustix::io::Errno::PIPE) {
            self.reader_gone = true;
            self.fd = None;
            self.inert = None;
        }
    }

    /// The stream ended: a terminal filter gives out what it held and closes an open line.
    fn end(&mut self) {
        self.fd = None;
        if let Some(mut f) = self.inert.take() {
            let mut tail = Vec::new();
            f.finish(&mut tail);
            if !tail.is_empty() {
                self.deliver(&tail);
            }
        }
    }

    /// Reads what is available now; false when nothing more is (end of stream, or no data).
    pub(crate) fn pump(&mut self) -> bool {
        let Some(fd) = &self.fd else { return false };
        let mut buf = [0u8; 65536];
        match rustix::io::read(fd, &mut buf) {
            Ok(0) => {
                self.end();
                false
            }
            Ok(n) => {
                let room = STREAM_LIMIT.saturating_sub(self.report.bytes) as usize;
                let keep = n.min(room);
                if keep < n {
                    self.report.truncated = true;
                }
                if keep > 0 {
                    sha2::Digest::update(&mut self.digest, &buf[..keep]);
                    self.deliver(&buf[..keep]);
                }
                self.report.bytes += n as u64;
                !self.reader_gone
            }
            Err(rustix::io::Errno::INTR) => true,
            Err(rustix::io::Errno::AGAIN) => false,
            Err(_) => {
                self.end();
                false
            }
        }
    }
}

impl Stream {
    /// The report of the stream so far, with the digest of what passed through.
    pub(crate) fn report(&self) -> StreamReport {
        let digest = sha2::Digest::finalize(self.digest.clone());
        StreamReport {
            sha256: Some(format!("sha256:{}", agentjail_manifest::hex(&digest))),
            ..self.report.clone()
        }
    }
}

fn write_all(fd: BorrowedFd<'_>, mut b: &[u8]) -> rustix::io::Result<()> {
    while !b.is_empty() {
        match rustix::io::write(fd, b) {
            Ok(n) => b = &b[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A kernel refusal (EPERM, EACCES, ENOSPC) on a host that restricts user namespaces for this
/// caller: the message, then the setting and its one-line fix. Under Ubuntu's AppArmor
/// restriction the clone succeeds and the init's first mount fails, so both paths use this.
pub(crate) fn with_userns_hint(msg: String) -> String {
    match crate::userns::userns_hint_for(&msg) {
        Some(h) => format!("{msg}; {h}"),
        None => msg,
    }
}

/// An outcome for a run that could not start: `setup_error` with a one-line reason.
pub(crate) fn fail(mut r: RunReport, msg: String) -> Outcome {
    let msg = with_userns_hint(msg);
    r.status = Status::SetupError;
    r.error = Some(msg);
    Outcome {
        report: r,
        output_dir: None,
        work_dir: None,
        output_full: false,
        stdout: Vec::new(),
        stderr: Vec::new(),
        cleanup: Cleanup::default(),
    }
}

/// Ends a sandbox whose set-up went wrong (its init is pid 1: the whole namespace goes).
pub(crate) fn kill_and_reap(pidfd: &OwnedFd) {
    let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
    let _ = rustix::process::waitid(
        rustix::process::WaitId::PidFd(pidfd.as_fd()),
        rustix::process::WaitIdOptions::EXITED,
    );
}

/// How the command ended, as a tier learned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
}

/// What a tier knows once its run is over, for [`classify`].
#[derive(Debug)]
pub(crate) struct Ending<'a> {
    /// The wall-clock deadline passed and every process was killed.
    pub(crate) timed_out: bool,
    /// The run could not be set up, or the command not executed: the report's error.
    pub(crate) failure: Option<String>,
    /// How the command ended, when the tier learned it.
    pub(crate) ended: Option<Ended>,
    /// The kernel's OOM killer killed a process of the run (known on the native tier only).
    pub(crate) oom_killed: bool,
    /// The report's error when nothing says how the command ended.
    pub(crate) unknown_end: &'a str,
}

/// The one classification of a run's end into the report's status, shared by both tiers. In
/// order: a timeout (whatever else happened); a set-up failure; no known end; an exit (0 is
/// `ok`; non-zero is `memory_limit` when the OOM killer struck, else `exit_nonzero`); a signal
/// (SIGKILL with an OOM kill is `memory_limit`, else `signaled`).
pub(crate) fn classify(r: &mut RunReport, limits: &agentjail_manifest::Limits, e: Ending<'_>) {
    if e.timed_out {
        r.status = Status::Timeout;
        r.signal = Some(libc::SIGKILL);
        r.deny(
            DenialKind::Limit,
            format!(
                "time: wall-clock limit of {} s reached, every process killed",
                limits.seconds
            ),
        );
        return;
    }
    if let Some(msg) = e.failure {
        r.status = Status::SetupError;
        r.error = Some(msg);
        return;
    }
    match e.ended {
        None => {
            r.status = Status::SetupError;
            r.error = Some(e.unknown_end.to_owned());
        }
        Some(Ended::Exited(code)) => {
            r.exit_code = Some(code);
            r.status = if code == 0 {
                Status::Ok
            } else if e.oom_killed {
                Status::MemoryLimit
            } else {
                Status::ExitNonzero
            };
        }
        Some(Ended::Signaled(sig)) => {
            r.signal = Some(sig);
            r.status = if e.oom_killed && sig == libc::SIGKILL {
                Status::MemoryLimit
            } else {
                Status::Signaled
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(timed_out: bool, failure: Option<&str>, ended: Option<Ended>, oom: bool) -> RunReport {
        let limits = agentjail_manifest::Limits::default();
        let mut r = RunReport::setup_error(limits, String::new());
        r.error = None;
        classify(
            &mut r,
            &limits,
            Ending {
                timed_out,
                failure: failure.map(str::to_owned),
                ended,
                oom_killed: oom,
                unknown_end: "gone",
            },
        );
        r
    }

    #[test]
    fn each_end_gets_its_status() {
        use Ended::*;
        // (timed out, set-up failure, end, OOM kill) → status.
        type Case<'a> = (bool, Option<&'a str>, Option<Ended>, bool, Status);
        let cases: &[Case<'_>] = &[
            (true, Some("x"), Some(Exited(0)), true, Status::Timeout),
            (false, Some("x"), Some(Exited(0)), false, Status::SetupError),
            (false, None, None, false, Status::SetupError),
            (false, None, Some(Exited(0)), true, Status::Ok),
            (false, None, Some(Exited(3)), false, Status::ExitNonzero),
            (false, None, Some(Exited(3)), true, Status::MemoryLimit),
            (false, None, Some(Signaled(9)), true, Status::MemoryLimit),
            (false, None, Some(Signaled(9)), false, Status::Signaled),
            (false, None, Some(Signaled(15)), true, Status::Signaled),
        ];
        for (t, f, e, oom, want) in cases {
            let r = end(*t, *f, *e, *oom);
            assert_eq!(r.status, *want, "{t} {f:?} {e:?} {oom}");
        }
        let r = end(true, None, None, false);
        assert_eq!(r.signal, Some(libc::SIGKILL));
        assert!(r.denials[0].detail.contains("wall-clock limit"), "{r:?}");
        assert_eq!(end(false, None, None, false).error.as_deref(), Some("gone"));
        let r = end(false, None, Some(Exited(3)), false);
        assert_eq!((r.exit_code, r.signal), (Some(3), None));
        let r = end(false, None, Some(Signaled(15)), false);
        assert_eq!((r.exit_code, r.signal), (None, Some(15)));
    }
}
