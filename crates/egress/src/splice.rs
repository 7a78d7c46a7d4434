//! Zero-copy tunnel relaying: `splice(2)` from one TCP socket into a pipe and from the pipe into
//! the other socket, so tunnel payload never passes through user space.
//!
//! Every chunk is metered when it enters the pipe and forwarded only if the run's budget takes
//! it all: a chunk over the budget is dropped with its pipe, so no byte past a limit reaches
//! the other side, and the counts are exactly what was moved in. The calls are nix's safe
//! wrappers; no `unsafe` here.

use std::io;
use std::os::fd::OwnedFd;

use nix::fcntl::{OFlag, SpliceFFlags, splice};
use nix::sys::socket::{Shutdown, shutdown};
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::meter::{Dir, Meter};

/// Largest chunk moved per splice (the default pipe capacity is 64 KiB).
const CHUNK: usize = 64 << 10;

fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
}

/// One direction: `src` to `dst` until `src` ends (then `dst`'s write side is shut down) or an
/// error or the byte budget stops it.
async fn pump(src: &TcpStream, dst: &TcpStream, meter: &Meter, dir: Dir) -> io::Result<()> {
    let (pipe_r, pipe_w): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(io::Error::from)?;
    loop {
        src.readable().await?;
        let n = match src.try_io(Interest::READABLE, || {
            splice(src, None, &pipe_w, None, CHUNK, flags()).map_err(io::Error::from)
        }) {
            Ok(0) => {
                let _ = shutdown(std::os::fd::AsRawFd::as_raw_fd(dst), Shutdown::Write);
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if !meter.take(dir, n as u64) {
            // The chunk stays in the pipe, which is dropped: nothing past the budget goes on.
            return Err(io::Error::other("byte budget exceeded"));
        }
        let mut left = n;
        while left > 0 {
            dst.writable().await?;
            match dst.try_io(Interest::WRITABLE, || {
                splice(&pipe_r, None, dst, None, left, flags()).map_err(io::Error::from)
            }) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
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
