//! Zero-copy tunnel relaying: `splice(2)` from one TCP socket into a pipe and from the pipe into
//! the other socket, so tunnel payload never passes through user space.
//!
//! Each direction owns a pipe of up to [`PIPE_BYTES`] (`F_SETPIPE_SZ`; the default 64 KiB if
//! the kernel refuses) and fills and drains it independently: the source is read whenever the
//! pipe has room, the destination written whenever the pipe holds bytes, and the task waits
//! only when neither can move. A slow reader therefore does not stop the gateway from taking
//! what the sender has ready, and each wake-up moves as much as the socket holds.
//!
//! Every chunk is metered when it enters the pipe and forwarded only if the run's budget takes
//! it all: bytes already in the pipe (within the budget) are still delivered, the chunk over
//! the budget is dropped with its pipe, so no byte past a limit reaches the other side, and
//! the counts are exactly what was moved in. The calls are nix's safe wrappers; no `unsafe`
//! here.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use nix::sys::socket::{Shutdown, shutdown};
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::meter::{Dir, Meter};

/// Pipe capacity asked for per direction (the `/proc/sys/fs/pipe-max-size` default).
pub(crate) const PIPE_BYTES: usize = 1 << 20;

/// Pipe capacity when `F_SETPIPE_SZ` is refused (the kernel's default pipe size).
const DEFAULT_PIPE_BYTES: usize = 64 << 10;

fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
}

/// A non-blocking pipe and its capacity in bytes.
fn pipe() -> io::Result<(OwnedFd, OwnedFd, usize)> {
    let (r, w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(io::Error::from)?;
    let want = i32::try_from(PIPE_BYTES).unwrap_or(i32::MAX);
    // Over the per-user pipe quota (unprivileged, many pipes) the kernel says EPERM: keep the
    // default size, which only costs more calls per byte.
    let cap = match fcntl(&w, FcntlArg::F_SETPIPE_SZ(want)) {
        Ok(n) => usize::try_from(n).unwrap_or(DEFAULT_PIPE_BYTES),
        Err(_) => DEFAULT_PIPE_BYTES,
    };
    Ok((r, w, cap.max(4096)))
}

/// Outcome of one splice attempt.
enum Step {
    Moved(usize),
    /// The fd is not ready (readiness cleared by tokio); nothing moved.
    NotReady,
    /// End of the source stream.
    Eof,
}

fn try_splice(
    sock: &TcpStream,
    interest: Interest,
    f: impl FnOnce() -> nix::Result<usize>,
) -> io::Result<Step> {
    match sock.try_io(interest, || f().map_err(io::Error::from)) {
        Ok(0) => Ok(Step::Eof),
        Ok(n) => Ok(Step::Moved(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Step::NotReady),
        Err(e) => Err(e),
    }
}

/// Moves up to `len` bytes from the pipe into `dst`.
fn drain(pipe_r: &OwnedFd, dst: &TcpStream, len: usize) -> io::Result<Step> {
    match try_splice(dst, Interest::WRITABLE, || {
        splice(pipe_r, None, dst, None, len, flags())
    })? {
        Step::Eof => Err(io::ErrorKind::WriteZero.into()),
        s => Ok(s),
    }
}

/// One direction: `src` to `dst` until `src` ends and the pipe is empty (then `dst`'s write
/// side is shut down), or an error or the byte budget stops it.
async fn pump(src: &TcpStream, dst: &TcpStream, meter: &Meter, dir: Dir) -> io::Result<()> {
    let (pipe_r, pipe_w, cap) = pipe()?;
    // Bytes in the pipe, all metered.
    let mut held = 0usize;
    let mut eof = false;
    loop {
        let mut moved = false;
        if !eof && held < cap {
            match try_splice(src, Interest::READABLE, || {
                splice(src, None, &pipe_w, None, cap - held, flags())
            })? {
                Step::Eof => eof = true,
                Step::Moved(n) => {
                    if !meter.take(dir, n as u64) {
                        // Deliver what was within the budget; the chunk over it stays in the
                        // pipe, which is dropped: nothing past the budget goes on.
                        while held > 0 {
                            dst.writable().await?;
                            if let Step::Moved(m) = drain(&pipe_r, dst, held)? {
                                held -= m;
                            }
                        }
                        return Err(io::Error::other("byte budget exceeded"));
                    }
                    held += n;
                    moved = true;
                }
                Step::NotReady => {}
            }
        }
        if held > 0
            && let Step::Moved(m) = drain(&pipe_r, dst, held)?
        {
            held -= m;
            moved = true;
        }
        if eof && held == 0 {
            let _ = shutdown(dst.as_raw_fd(), Shutdown::Write);
            return Ok(());
        }
        if moved {
            // The loop awaits nothing while bytes keep moving: give the budget of tokio's
            // cooperative scheduling its due, so a busy tunnel yields (every 128 moves) to
            // the other connections, the lifetime timer and the shutdown on the one thread.
            tokio::task::coop::consume_budget().await;
            continue;
        }
        // Nothing could move: wait until the source has bytes (if the pipe has room) or the
        // destination has room (if the pipe holds bytes).
        let want_read = !eof && held < cap;
        let want_write = held > 0;
        tokio::select! {
            r = src.readable(), if want_read => r?,
            w = dst.writable(), if want_write => w?,
            // Not reachable (the pipe is never both full and empty); fail closed.
            else => return Err(io::Error::other("tunnel relay stalled")),
        }
    }
}

/// Relays both directions between `client` (the sandbox) and `upstream` until both ended, or
/// until either fails or hits its budget (which ends both, like an error in
/// `tokio::io::copy_bidirectional`).
pub(crate) async fn relay(client: &TcpStream, upstream: &TcpStream, meter: &Meter) {
    let _ = tokio::try_join!(
        pump(client, upstream, meter, Dir::Up),
        pump(upstream, client, meter, Dir::Down),
    );
}
