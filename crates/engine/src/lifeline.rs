//! The caller's lifeline, watched while a sandbox runs (both tiers: the supervisor's loop and
//! gVisor's). A runner of `agentjail serve` has as stdin a socket whose other end only the
//! service holds. Its hang-up (the service died) kills the sandbox. A runner with a lease
//! (`RunOptions::lease`, a fleet executor's run) also kills it when the lease's end passes
//! with no renewal received: the executor sends each renewal as a frame
//! ([`agentjail_manifest::results::LEASE`]) holding the new end on `CLOCK_BOOTTIME`, read here
//! and armed on a timerfd of that clock, so that a paused, stuck or cut-off executor (whose
//! socket stays open) cannot leave a payload running past the lease it lost, and a host
//! suspended meanwhile counts that time too (the monotonic clock stops during a suspend).
//! Without a lease, nothing is ever written to the runner's end: any byte there is taken as
//! the caller's end, as before.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use rustix::event::{PollFd, PollFlags};
use rustix::time::{
    ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec,
};

/// The lease a runner starts under: its end, and the bytes of the lifeline that were read
/// past the manifest's line (the start of the renewal frames).
#[derive(Debug, Clone, Default)]
pub struct LeaseStart {
    /// The lease's end on `CLOCK_BOOTTIME`, in nanoseconds (see [`boottime_ns`]).
    pub until_ns: u64,
    /// Bytes already read from the lifeline after the manifest.
    pub pending: Vec<u8>,
}

/// Now on `CLOCK_BOOTTIME` (nanoseconds since boot, suspend included): the clock that a
/// lease's end is given in. The service and its runner share it (one host).
pub fn boottime_ns() -> u64 {
    let t = rustix::time::clock_gettime(ClockId::Boottime);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// Why the sandbox must end now, as the report says it.
pub const GONE: &str = "the caller (lifeline) is gone; the sandbox was killed";
/// The lease ended with no renewal received.
pub const LEASE_ENDED: &str = "the executor's lease ended with no renewal reaching the runner \
(the executor was paused, cut off or stuck): the sandbox was killed before the lease could be \
taken over";

/// A lifeline being watched: the caller's socket and, with a lease, its end and timer.
pub(crate) struct Watch {
    fd: Arc<OwnedFd>,
    lease: Option<Lease>,
}

struct Lease {
    until_ns: u64,
    timer: OwnedFd,
    buf: Vec<u8>,
}

impl Watch {
    /// Starts watching `opts.lifeline` (None without one). Err: the lease has already ended,
    /// or its timer cannot be made (then nothing may start).
    pub(crate) fn start(
        lifeline: Option<&Arc<OwnedFd>>,
        lease: Option<&LeaseStart>,
    ) -> Result<Option<Watch>, String> {
        let Some(fd) = lifeline.cloned() else {
            return Ok(None);
        };
        let lease = match lease {
            None => None,
            Some(l) => {
                let timer = rustix::time::timerfd_create(
                    TimerfdClockId::Boottime,
                    TimerfdFlags::CLOEXEC | TimerfdFlags::NONBLOCK,
                )
                .map_err(|e| format!("lifeline: a CLOCK_BOOTTIME timer: {e}"))?;
                let mut lease = Lease {
                    until_ns: l.until_ns,
                    timer,
                    buf: l.pending.clone(),
                };
                match agentjail_manifest::results::take_lease_frames(&mut lease.buf) {
                    Ok(Some(until)) => lease.until_ns = until,
                    Ok(None) => {}
                    Err(e) => return Err(e.into()),
                }
                if lease.ended() {
                    return Err(LEASE_ENDED
                        .replace("the sandbox was killed", "the sandbox was not started"));
                }
                lease.arm()?;
                Some(lease)
            }
        };
        Ok(Some(Watch { fd, lease }))
    }

    /// The descriptors to poll for readability: the lifeline, then the lease's timer.
    pub(crate) fn poll_fds(&self) -> Vec<PollFd<'_>> {
        let mut v = vec![PollFd::new(&*self.fd, PollFlags::IN)];
        if let Some(l) = &self.lease {
            v.push(PollFd::new(&l.timer, PollFlags::IN));
        }
        v
    }

    /// After a poll (or at any time): takes the renewals that arrived, and says why the
    /// sandbox must be killed now, if it must.
    pub(crate) fn check(&mut self) -> Option<String> {
        let mut chunk = [0u8; 512];
        loop {
            let mut fds = [PollFd::new(&*self.fd, PollFlags::IN)];
            let zero = Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            if !matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0) {
                break;
            }
            let Some(lease) = &mut self.lease else {
                // No lease: the caller never writes; readable means gone.
                return Some(GONE.into());
            };
            match rustix::io::read(&*self.fd, &mut chunk) {
                Ok(0) => return Some(GONE.into()),
                Ok(n) => lease.buf.extend_from_slice(&chunk[..n]),
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
                Err(_) => return Some(GONE.into()),
            }
            match agentjail_manifest::results::take_lease_frames(&mut lease.buf) {
                Ok(Some(until)) => {
                    lease.until_ns = until;
                    if lease.arm().is_err() {
                        return Some(LEASE_ENDED.into());
                    }
                }
                Ok(None) => {}
                Err(e) => return Some(format!("{e}; the sandbox was killed")),
            }
        }
        match &self.lease {
            Some(l) if l.ended() => Some(LEASE_ENDED.into()),
            _ => None,
        }
    }
}

/// What made the [`Watchdog`] kill the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fired {
    /// The run's wall-clock limit passed.
    Deadline,
    /// The caller is gone or its lease ended (the reason, as the report says it).
    Caller(String),
}

/// Kills the sandbox by itself, on a thread of its own, when the run's deadline passes, the
/// caller's lifeline hangs up or its lease ends: the supervisor's loop relays the command's
/// output with blocking writes, and a writer whose reader is paused (a stopped executor's
/// log pipe, a slow `| cmd`) would hold that loop, and with it every kill it makes, for as
/// long as the reader stays away (found by the red team: a payload that printed 300 KB ran
/// 6.5 s past its lease). The loop learns what happened from [`Watchdog::fired`].
pub(crate) struct Watchdog {
    fired: Arc<std::sync::Mutex<Option<Fired>>>,
    stop: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching: `kill` ends the sandbox (idempotent; called at most once).
    pub(crate) fn start(
        watch: Option<Watch>,
        deadline: std::time::Instant,
        mut kill: impl FnMut() + Send + 'static,
    ) -> std::io::Result<Watchdog> {
        let stop = Arc::new(rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?);
        let fired = Arc::new(std::sync::Mutex::new(None));
        let (f, s) = (fired.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("agentjail-watchdog".into())
            .spawn(move || {
                let mut watch = watch;
                loop {
                    let why = watch.as_mut().and_then(Watch::check).map(Fired::Caller);
                    let remaining = deadline.saturating_duration_since(std::time::Instant::now());
                    let why = why.or_else(|| remaining.is_zero().then_some(Fired::Deadline));
                    if let Some(why) = why {
                        // Said before it is done: whoever sees the sandbox die sees why.
                        *f.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                        kill();
                        return;
                    }
                    let mut fds = vec![PollFd::new(&*s, PollFlags::IN)];
                    if let Some(w) = &watch {
                        fds.extend(w.poll_fds());
                    }
                    let timeout = Timespec {
                        tv_sec: remaining.as_secs() as i64,
                        tv_nsec: remaining.subsec_nanos() as i64,
                    };
                    let _ = rustix::event::poll(&mut fds, Some(&timeout));
                    if !fds[0].revents().is_empty() {
                        return;
                    }
                }
            })?;
        Ok(Watchdog {
            fired,
            stop,
            thread: Some(thread),
        })
    }

    /// Whether it killed the sandbox, and why.
    pub(crate) fn fired(&self) -> Option<Fired> {
        self.fired.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Watchdog {
    /// Stops the thread (the run is over) and waits for it.
    fn drop(&mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Lease {
    fn ended(&self) -> bool {
        boottime_ns() >= self.until_ns
    }

    /// Arms the timer at the lease's end (absolute, `CLOCK_BOOTTIME`): a poll on it wakes then.
    fn arm(&self) -> Result<(), String> {
        let at = Timespec {
            tv_sec: (self.until_ns / 1_000_000_000) as i64,
            tv_nsec: (self.until_ns % 1_000_000_000) as i64,
        };
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: at,
        };
        rustix::time::timerfd_settime(&self.timer, TimerfdTimerFlags::ABSTIME, &spec)
            .map(drop)
            .map_err(|e| format!("lifeline: arming the lease's timer: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(fd: OwnedFd, lease: Option<LeaseStart>) -> Result<Option<Watch>, String> {
        Watch::start(Some(&Arc::new(fd)), lease.as_ref())
    }

    #[test]
    fn renewals_move_the_end_and_silence_ends_it() {
        use std::io::Write;
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let soon = boottime_ns() + 300_000_000;
        let mut w = start(
            theirs.into(),
            Some(LeaseStart {
                until_ns: soon,
                pending: Vec::new(),
            }),
        )
        .unwrap()
        .unwrap();
        assert_eq!(w.check(), None);
        // A renewal, in two pieces, moves the end a long way.
        let frame = agentjail_manifest::results::lease_frame(boottime_ns() + 60_000_000_000);
        ours.write_all(&frame[..5]).unwrap();
        assert_eq!(w.check(), None);
        ours.write_all(&frame[5..]).unwrap();
        assert_eq!(w.check(), None);
        std::thread::sleep(std::time::Duration::from_millis(400));
        assert_eq!(w.check(), None, "the renewal was not taken");
        // An end in the past: the timer wakes a poll, and the check says so.
        ours.write_all(&agentjail_manifest::results::lease_frame(
            boottime_ns() + 50_000_000,
        ))
        .unwrap();
        let mut fds = w.poll_fds();
        let _ = rustix::event::poll(&mut fds, None);
        drop(fds);
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert_eq!(w.check().as_deref(), Some(LEASE_ENDED));
    }

    #[test]
    fn a_hang_up_or_a_stranger_frame_ends_it() {
        use std::io::Write;
        let far = boottime_ns() + 60_000_000_000;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let lease = LeaseStart {
            until_ns: far,
            pending: Vec::new(),
        };
        let mut w = start(theirs.into(), Some(lease.clone())).unwrap().unwrap();
        drop(ours);
        assert_eq!(w.check().as_deref(), Some(GONE));
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut w = start(theirs.into(), Some(lease.clone())).unwrap().unwrap();
        ours.write_all(&agentjail_manifest::results::header(b'R', 8))
            .unwrap();
        assert!(w.check().unwrap().contains("other than a lease renewal"));
        // Without a lease, any byte is the end (the caller never writes).
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut w = start(theirs.into(), None).unwrap().unwrap();
        assert_eq!(w.check(), None);
        ours.write_all(b"x").unwrap();
        assert_eq!(w.check().as_deref(), Some(GONE));
        // A lease that ended before the start: nothing may start.
        let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let past = LeaseStart {
            until_ns: boottime_ns().saturating_sub(1),
            pending: Vec::new(),
        };
        assert!(start(theirs.into(), Some(past)).is_err());
    }
}
