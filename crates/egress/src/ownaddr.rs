//! The gateway host's own addresses, kept exact without listing them on every request.
//!
//! A destination that resolves to one of the host's own addresses reaches the host's own
//! services, so it is blocked like loopback. Listing the addresses (`getifaddrs`) on every
//! request cost about half of a kept-alive request; a cache with a time to live would be wrong
//! for that long after an address is added. Instead [`OwnAddrs`] subscribes to the kernel's
//! address events (a non-blocking `NETLINK_ROUTE` socket bound to `RTMGRP_IPV4_IFADDR |
//! RTMGRP_IPV6_IFADDR`) *before* it lists the addresses once, and before each use drains that
//! socket: any message, an overrun (`ENOBUFS`) or any other error means the list is listed
//! again before the answer. The kernel queues an IPv4 address's event while the `ip addr add`
//! (or any other change) is still in its system call; an IPv6 address's event comes from the
//! kernel's address-configuration work a little later, but before that work installs the
//! address's local route. Either way, by the time a connection to the new address could reach
//! this host, its event is queued and the next check sees the new list.
//!
//! Fail closed: when the socket cannot be opened or bound, or fails in a way that is not
//! "nothing queued", the addresses are listed on every use, as before the cache existed.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, socket,
};

use crate::addr::canonical;

/// The host's own addresses (see the module documentation).
#[derive(Debug)]
pub(crate) struct OwnAddrs {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The subscription; `None` when it could not be made or broke: list on every use.
    events: Option<OwnedFd>,
    /// The addresses as of the last listing.
    addrs: Arc<Vec<IpAddr>>,
    /// The last listing failed: list again on the next use.
    failed: bool,
    /// How many times the addresses were listed (for tests and measurements).
    listings: u64,
}

impl OwnAddrs {
    /// Subscribes to address events, then lists the addresses (in that order, so no change
    /// falls between the two). Outcomes of later uses depend on the network namespace of the
    /// calling thread, which must be the one the gateway connects from.
    pub(crate) fn new() -> OwnAddrs {
        let events = match subscribe() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "egress gateway cannot watch its own addresses; listing them on every request"
                );
                None
            }
        };
        let (addrs, failed) = match list() {
            Some(a) => (a, false),
            None => (Vec::new(), true),
        };
        OwnAddrs {
            state: Mutex::new(State {
                events,
                addrs: Arc::new(addrs),
                failed,
                listings: 1,
            }),
        }
    }

    /// The current addresses: the cached list unless an address event (or an error) arrived
    /// since it was made, then a fresh one.
    pub(crate) fn current(&self) -> Arc<Vec<IpAddr>> {
        let mut st = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let stale = match &st.events {
            None => true,
            Some(_) if st.failed => true,
            Some(fd) => match drain(fd) {
                Drain::Quiet => false,
                Drain::Changed => true,
                Drain::Broken(e) => {
                    tracing::warn!(
                        error = %e,
                        "egress gateway lost its address-event socket; listing its own addresses on every request"
                    );
                    st.events = None;
                    true
                }
            },
        };
        if stale {
            match list() {
                Some(a) => {
                    st.addrs = Arc::new(a);
                    st.failed = false;
                }
                None => {
                    st.addrs = Arc::new(Vec::new());
                    st.failed = true;
                }
            }
            st.listings = st.listings.saturating_add(1);
        }
        st.addrs.clone()
    }

    /// How many times the addresses were listed so far.
    #[cfg(test)]
    pub(crate) fn listings(&self) -> u64 {
        match self.state.lock() {
            Ok(g) => g.listings,
            Err(p) => p.into_inner().listings,
        }
    }

    /// Whether the address events are watched (false: listing on every use).
    #[cfg(test)]
    pub(crate) fn watching(&self) -> bool {
        match self.state.lock() {
            Ok(g) => g.events.is_some(),
            Err(p) => p.into_inner().events.is_some(),
        }
    }
}

/// A non-blocking `NETLINK_ROUTE` socket subscribed to IPv4 and IPv6 address events.
fn subscribe() -> nix::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    let groups = (nix::libc::RTMGRP_IPV4_IFADDR | nix::libc::RTMGRP_IPV6_IFADDR) as u32;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
    Ok(fd)
}

enum Drain {
    /// Nothing was queued.
    Quiet,
    /// At least one event, or an overrun: the list must be made again.
    Changed,
    /// The socket failed otherwise: stop trusting it.
    Broken(Errno),
}

/// Reads every queued event (their content does not matter: any event means "list again").
fn drain(fd: &OwnedFd) -> Drain {
    let mut buf = [0u8; 8192];
    let mut changed = false;
    loop {
        match recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(_) => changed = true,
            Err(Errno::EAGAIN) => {
                return if changed {
                    Drain::Changed
                } else {
                    Drain::Quiet
                };
            }
            Err(Errno::EINTR) => {}
            // Events were dropped because the queue overflowed: something changed; the
            // socket stays usable, so go on draining.
            Err(Errno::ENOBUFS) => changed = true,
            Err(e) => return Drain::Broken(e),
        }
    }
}

/// Every address assigned to an interface in this network namespace, canonical. `None` (and
/// the failure logged) when they cannot be listed: the caller then knows none (loopback is
/// blocked anyway) and lists again on the next use.
fn list() -> Option<Vec<IpAddr>> {
    match nix::ifaddrs::getifaddrs() {
        Ok(list) => Some(
            list.filter_map(|i| i.address)
                .filter_map(|a| {
                    if let Some(v4) = a.as_sockaddr_in() {
                        Some(IpAddr::V4(v4.ip()))
                    } else {
                        a.as_sockaddr_in6().map(|v6| canonical(IpAddr::V6(v6.ip())))
                    }
                })
                .collect(),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "egress gateway could not list its own addresses");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// Runs `f` on a thread in a fresh network namespace with `lo` up; `None` (with a skip
    /// line, or a panic under CI) when it cannot be made.
    fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        std::thread::spawn(move || {
            // SAFETY: unshare with a flag only changes this thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                let why = format!(
                    "cannot create a network namespace: {}",
                    std::io::Error::last_os_error()
                );
                assert!(std::env::var_os("CI").is_none(), "{why}");
                eprintln!("SKIP: {why}");
                return None;
            }
            assert!(ip(&["link", "set", "lo", "up"]), "ip link set lo up");
            Some(f())
        })
        .join()
        .unwrap()
    }

    fn ip(args: &[&str]) -> bool {
        Command::new("ip")
            .args(args)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Waits (at most 10 s) until a TCP connection to `addr` reaches a listener on it here.
    fn reachable(addr: IpAddr) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ok = std::net::TcpListener::bind((addr, 0)).and_then(|l| {
                let to = l.local_addr()?;
                std::net::TcpStream::connect_timeout(&to, Duration::from_millis(200)).map(|_| ())
            });
            match ok {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("{addr} never became reachable: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    const NEW: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1));

    #[test]
    fn an_address_added_or_removed_is_seen_on_the_very_next_use() {
        in_netns(|| {
            let own = OwnAddrs::new();
            assert!(own.watching(), "the address-event socket must open as root");
            assert!(!own.current().contains(&NEW));
            // Quiet uses do not list again (the point of the cache).
            let before = own.listings();
            for _ in 0..100 {
                assert!(!own.current().contains(&NEW));
            }
            assert_eq!(own.listings(), before, "no event, no listing");
            assert!(ip(&["addr", "add", "10.77.0.1/32", "dev", "lo"]));
            assert!(own.current().contains(&NEW), "added address not seen");
            assert!(ip(&["addr", "del", "10.77.0.1/32", "dev", "lo"]));
            assert!(!own.current().contains(&NEW), "removed address still seen");
            // IPv6 events are watched too. The kernel sends an IPv6 address's event from its
            // address-configuration work, after `ip` returned but before it installs the
            // address's local route: the address is in a listing a little before its event,
            // but no connection reaches this host through it before the event is queued.
            // So: once a connection to the address succeeds, the very next use must see it.
            let v6: IpAddr = "fd77::1".parse().unwrap();
            assert!(ip(&["addr", "add", "fd77::1/128", "dev", "lo", "nodad"]));
            reachable(v6);
            assert!(own.current().contains(&v6), "added IPv6 address not seen");
        });
    }

    /// The same sequence against a cache with a time to live (what the exact cache replaces):
    /// it answers the stale list, which is why the gateway must not use one. This is the
    /// failure the test above and `egress_edges.rs`'
    /// `an_address_added_while_the_gateway_runs_is_refused_on_the_next_request` catch.
    #[test]
    fn a_cache_with_a_time_to_live_would_miss_the_new_address() {
        struct Ttl {
            at: Instant,
            addrs: Vec<IpAddr>,
        }
        impl Ttl {
            fn current(&mut self) -> Vec<IpAddr> {
                if self.at.elapsed() > Duration::from_secs(5) {
                    self.addrs = list().unwrap();
                    self.at = Instant::now();
                }
                self.addrs.clone()
            }
        }
        in_netns(|| {
            let mut ttl = Ttl {
                at: Instant::now(),
                addrs: list().unwrap(),
            };
            let own = OwnAddrs::new();
            assert!(ip(&["addr", "add", "10.77.0.1/32", "dev", "lo"]));
            assert!(!ttl.current().contains(&NEW), "the stale cache misses it");
            assert!(own.current().contains(&NEW), "the exact cache sees it");
        });
    }

    /// An overrun (more events than the socket's queue holds) still forces a new listing.
    #[test]
    fn an_overrun_event_queue_forces_a_new_listing() {
        in_netns(|| {
            let own = OwnAddrs::new();
            {
                let st = own.state.lock().unwrap();
                let fd = st.events.as_ref().unwrap();
                nix::sys::socket::setsockopt(fd, nix::sys::socket::sockopt::RcvBuf, &0).unwrap();
            }
            for i in 1..=200u32 {
                let a = format!("10.78.{}.{}/32", i / 250, i % 250 + 1);
                assert!(ip(&["addr", "add", &a, "dev", "lo"]));
            }
            let now = own.current();
            assert!(now.contains(&IpAddr::V4(Ipv4Addr::new(10, 78, 0, 200))));
            assert!(own.watching(), "an overrun is not a broken socket");
            let n = own.listings();
            own.current();
            assert_eq!(own.listings(), n, "drained: quiet again");
        });
    }
}
