//! Denials handed out while the run goes on ([`LiveDenials`], `RunOptions::live_denials`):
//! each distinct refusal once, as the report lists it, the moment it is recorded, for a caller
//! that shows them live (`agentjail serve`'s `denial` events). The native tier hands out the
//! syscalls the seccomp listener refuses and the egress gateway's refusals; the denials known
//! only at the end (limits, output) are in the report alone. The report is unchanged and stays
//! the authority: it counts every refusal, and lists what these leave out.

use std::collections::HashSet;
use std::sync::Mutex;

use agentjail_manifest::report::{Denial, DenialKind, bounded_detail};
pub use agentjail_manifest::results::MAX_LIVE_DENIALS;

/// Where a run's denials go as they are recorded: the first of each distinct kind and detail
/// (the detail bounded as the report bounds it), at most [`MAX_LIVE_DENIALS`] per run. The
/// supervisor's loop (syscalls) and the egress gateway's thread (network) both offer theirs;
/// the hand-outs are one at a time, so a sink that writes frames never interleaves two.
pub struct LiveDenials {
    inner: Mutex<Inner>,
}

struct Inner {
    seen: HashSet<(DenialKind, String)>,
    to: Box<dyn FnMut(&Denial) + Send>,
}

impl std::fmt::Debug for LiveDenials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveDenials").finish_non_exhaustive()
    }
}

impl LiveDenials {
    /// Hands each new denial to `to` (on the thread that recorded it). `to` must not block
    /// for long: the supervisor's loop waits for it.
    pub fn new(to: impl FnMut(&Denial) + Send + 'static) -> LiveDenials {
        LiveDenials {
            inner: Mutex::new(Inner {
                seen: HashSet::new(),
                to: Box::new(to),
            }),
        }
    }

    /// A refusal was recorded: handed out unless the same one was, or [`MAX_LIVE_DENIALS`]
    /// were.
    pub fn offer(&self, kind: DenialKind, detail: &str) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.seen.len() >= MAX_LIVE_DENIALS {
            return;
        }
        let detail = bounded_detail(detail.to_owned());
        if g.seen.contains(&(kind, detail.clone())) {
            return;
        }
        g.seen.insert((kind, detail.clone()));
        (g.to)(&Denial {
            kind,
            detail,
            count: 1,
        });
    }
}

/// A path naming the Unix socket `path` that fits `sockaddr_un` however deep its folder is:
/// `/proc/self/fd/N/<name>` through the folder opened here (keep the returned file open until
/// the bind or the connect is done). A data directory's job folders can be nested past the
/// 107 bytes a socket path may take.
pub fn short_socket_path(
    path: &std::path::Path,
) -> std::io::Result<(std::fs::File, std::path::PathBuf)> {
    use std::os::fd::AsRawFd;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a socket path needs a folder and a name",
        ));
    };
    let d = std::fs::File::open(dir)?;
    let short = std::path::Path::new("/proc/self/fd")
        .join(d.as_raw_fd().to_string())
        .join(name);
    Ok((d, short))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn each_distinct_denial_goes_out_once_within_the_bound() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        let live = LiveDenials::new(move |d| sink.lock().unwrap().push(d.clone()));
        live.offer(DenialKind::Syscall, "ptrace");
        live.offer(DenialKind::Syscall, "ptrace");
        // The same detail of another kind is another denial.
        live.offer(DenialKind::Network, "ptrace");
        // Bounded as the report bounds it: the same once cut.
        let long = "x".repeat(agentjail_manifest::report::MAX_DETAIL + 10);
        live.offer(DenialKind::Network, &long);
        live.offer(DenialKind::Network, &format!("{long}y"));
        for i in 0..200 {
            live.offer(
                DenialKind::Network,
                &format!("GET h{i}.test:80: not allowed"),
            );
        }
        let got = got.lock().unwrap();
        assert_eq!(got.len(), MAX_LIVE_DENIALS);
        assert_eq!(
            (got[0].kind, got[0].detail.as_str()),
            (DenialKind::Syscall, "ptrace")
        );
        assert_eq!(got[1].kind, DenialKind::Network);
        assert!(got[2].detail.len() <= agentjail_manifest::report::MAX_DETAIL + '…'.len_utf8());
        assert!(got[3].detail.starts_with("GET h0.test"));
        assert!(got.iter().all(|d| d.count == 1));
    }
}
