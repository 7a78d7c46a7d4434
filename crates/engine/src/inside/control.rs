//! The control messages between the supervisor, the init and the payload, one type per
//! direction ([`ToInit`], [`ToSupervisor`], [`FromPayload`]), and their framing: JSON in one
//! `SOCK_SEQPACKET` message, with up to [`MAX_FDS`] descriptors attached (`SCM_RIGHTS`).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Supervisor → init, on the control socket, in this order.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ToInit {
    /// The uid/gid maps are written (right after the clone): the init may create files and
    /// start on the parts of the root every host-image run has.
    Maps,
    /// Carries a memfd holding the [`Plan`] (JSON), then, when an input is copied
    /// ([`crate::plan::Op::Copy`]), the sealed memfd of the copies.
    Go {
        allow_degraded: bool,
        /// A descriptor for the command's stdin follows the others (a live session's control
        /// socket, [`crate::outcome::RunOptions::stdin`]); otherwise it reads `/dev/null`.
        stdin: bool,
    },
    /// The run's cgroups, which the init keeps open for the payload (the init itself stays
    /// outside them). `applied` false: none could be made (a degraded run; the rlimits are
    /// the only bound). With v1, carries the `tasks` file of each hierarchy, opened for
    /// writing, through which the payload moves itself in (see `Cgroup::self_join_files`).
    /// With v2, carries the `cgroup.procs` file and then (`into_dir` true) the cgroup's
    /// directory, into which the init clones the payload (`CLONE_INTO_CGROUP`); the payload
    /// writes itself into the file only where the kernel lacks that.
    Cgroups {
        applied: bool,
        name: Option<String>,
        #[serde(default)]
        into_dir: bool,
    },
}

/// Init → supervisor, on the control socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ToSupervisor {
    /// Carries the egress proxy's listening socket (inside the sandbox's network namespace),
    /// which the supervisor serves from outside. Sent after the root is built, only when the
    /// plan has a proxy port.
    Listener,
    /// The root is built and the run's cgroups received; carries the /output fd. The payload
    /// is cloned next (into the cgroup, with v2).
    Ready,
    /// Carries the /work fd, for collecting the workspace after the run (sent before
    /// [`ToSupervisor::Ready`], only when the plan collects it).
    Work,
    /// What the payload applied (forwarded from [`FromPayload::Applied`]).
    Applied(Applied),
    /// The command was executed; `payload` is its pid in the sandbox's pid namespace (a
    /// live session's relay tells the interpreter from what its cells leave behind).
    Started { payload: i32 },
    /// The command could not be executed (forwarded from the payload).
    ExecFailed { program: String, error: String },
    /// A set-up step failed, in the init or (forwarded) in the payload.
    SetupFailed { step: String, error: String },
    /// The seccomp filter refused this syscall.
    Denial { syscall: String },
    /// The payload ended with this raw wait status.
    Exit {
        status: i32,
        cpu_us: u64,
        maxrss_kb: u64,
    },
}

/// Payload → init, on the payload's socket, before it execs.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum FromPayload {
    /// What was applied, with the seccomp listener fd when there is one.
    Applied(Applied),
    /// `execve` failed.
    ExecFailed { program: String, error: String },
    /// A set-up step failed.
    SetupFailed { step: String, error: String },
}

/// Protections the payload applied to itself.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    pub landlock_abi: Option<u32>,
    pub seccomp_notify: bool,
    pub rlimits: Vec<String>,
    pub degraded: Vec<String>,
}

/// Sends a message, with at most one fd attached.
pub fn send<M: Serialize>(
    sock: BorrowedFd<'_>,
    msg: &M,
    fd: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    match fd {
        Some(fd) => send_fds(sock, msg, &[fd]),
        None => send_fds(sock, msg, &[]),
    }
}

/// Most fds one message carries.
const MAX_FDS: usize = 4;
/// Largest control message (JSON) either side sends; the receive buffer lives on the stack.
const MAX_MSG: usize = 16 * 1024;

/// Sends a message with up to [`MAX_FDS`] fds attached.
pub fn send_fds<M: Serialize>(
    sock: BorrowedFd<'_>,
    msg: &M,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(std::io::Error::other("too many fds for one message"));
    }
    let bytes = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    if bytes.len() > MAX_MSG {
        return Err(std::io::Error::other("control message too large"));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        cmsg.push(SendAncillaryMessage::ScmRights(fds));
    }
    sendmsg(
        sock,
        &[IoSlice::new(&bytes)],
        &mut cmsg,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receives a message and the first fd attached. `Ok(None)` at end of stream.
pub fn recv<M: DeserializeOwned>(
    sock: BorrowedFd<'_>,
) -> std::io::Result<Option<(M, Option<OwnedFd>)>> {
    Ok(recv_fds(sock)?.map(|(m, fds)| (m, fds.into_iter().next())))
}

/// Receives a message and every fd attached (at most [`MAX_FDS`]; the kernel closes any
/// beyond what the buffer holds). `Ok(None)` at end of stream.
pub fn recv_fds<M: DeserializeOwned>(
    sock: BorrowedFd<'_>,
) -> std::io::Result<Option<(M, Vec<OwnedFd>)>> {
    let mut buf = [0u8; MAX_MSG];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut buf)],
        &mut cmsg,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    if r.bytes == 0 {
        return Ok(None);
    }
    if r.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(std::io::Error::other("control message truncated"));
    }
    let msg = serde_json::from_slice(&buf[..r.bytes]).map_err(std::io::Error::other)?;
    Ok(Some((msg, fds)))
}
