//! The network probes of `agentjail selftest` (see [`super`]).

use super::super::kit::{Env, Probe, RunOut, Tier, Verdict};
use super::common::*;

pub(super) const NET: &[Probe] = &[
    Probe {
        id: "net.tcp_host",
        layer: "network namespace + Landlock TCP rules",
        attempt: "connect to a listener on the host's 127.0.0.1",
        expect: "refused (EACCES from Landlock natively); the host listener sees nothing",
    },
    Probe {
        id: "net.tcp_listen",
        layer: "Landlock TCP rules",
        attempt: "bind and listen on a TCP port",
        expect: "refused (EACCES)",
    },
    Probe {
        id: "net.udp_host",
        layer: "network namespace",
        attempt: "send UDP to a socket on the host's 127.0.0.1",
        expect: "the host socket receives nothing",
    },
    Probe {
        id: "net.dns",
        layer: "network namespace",
        attempt: "resolve example.com",
        expect: "fails (no name server reachable)",
    },
    Probe {
        id: "net.raw",
        layer: "no CAP_NET_RAW",
        attempt: "open a raw ICMP socket",
        expect: "refused",
    },
    Probe {
        id: "net.abstract_unix",
        layer: "network namespace + Landlock scoping",
        attempt: "connect to an abstract unix socket the host listens on",
        expect: "refused; the host listener sees nothing",
    },
    Probe {
        id: "net.interfaces",
        layer: "network namespace",
        attempt: "list network interfaces",
        expect: "loopback only",
    },
    Probe {
        id: "net.vsock",
        layer: "seccomp socket-family allowlist",
        attempt: "socket(AF_VSOCK) and socketpair(AF_VSOCK) (vsock is not split per network namespace)",
        expect: "refused and reported",
    },
    Probe {
        id: "net.socket_families",
        layer: "seccomp socket-family allowlist",
        attempt: "socket() with every address family 0..45 but AF_UNIX, AF_INET, AF_INET6, AF_NETLINK",
        expect: "each refused and reported",
    },
];

pub(super) const NET_PY: &str = r#"
def tcp():
    s = socket.create_connection(("127.0.0.1", @TCP@), timeout=3)
    s.sendall(b"LEAK")
attempt("tcp_host", tcp)
def listen():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
attempt("tcp_listen", listen)
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"LEAK", ("127.0.0.1", @UDP@))
attempt("udp_host", udp)
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
def abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(b"\0@ABS@")
    s.sendall(b"LEAK")
attempt("abstract_unix", abstract)
def ifaces():
    names = [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]]
    print("IFACES", " ".join(sorted(names)), flush=True)
attempt("ifaces", ifaces)
attempt("vsock", lambda: socket.socket(40, socket.SOCK_STREAM))
attempt("vsock_pair", lambda: socket.socketpair(40, socket.SOCK_STREAM))
for fam in range(0, 46):
    if fam in (1, 2, 10, 16):
        continue
    r = None
    for typ in (1, 2, 3, 5):
        try:
            socket.socket(fam, typ, 0).close()
            r = "ok"
            break
        except OSError as e:
            r = r or ("errno=%d" % (e.errno or 0))
    print("FAMILY", fam, r, flush=True)
"#;

/// Linux address family names, by number: the names the engine reports refusals with.
pub(super) fn af_name(n: u32) -> String {
    agentjail_engine::seccomp::family_name(n)
}

/// A `socket`/`socketpair` denial that names family `n` (by name or number).
pub(super) fn family_reported(o: &RunOut, n: u32) -> bool {
    let name = af_name(n);
    let num = n.to_string();
    o.denial("syscall", |d| {
        d.contains("socket")
            && (d.contains(&name)
                || name
                    .strip_prefix("AF_")
                    .is_some_and(|short| d.contains(&short.to_ascii_lowercase()))
                || d.split(|c: char| !c.is_ascii_digit()).any(|t| t == num))
    })
}

pub(super) fn net(env: &Env, tier: Tier) -> Verdicts {
    use std::os::linux::net::SocketAddrExt;
    let setup = || -> std::io::Result<_> {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0")?;
        tcp.set_nonblocking(true)?;
        let udp = std::net::UdpSocket::bind("127.0.0.1:0")?;
        udp.set_nonblocking(true)?;
        let abs_name = env.unique("agentjail-selftest-abstract");
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(abs_name.as_bytes())?;
        let abs = std::os::unix::net::UnixListener::bind_addr(&addr)?;
        abs.set_nonblocking(true)?;
        Ok((tcp, udp, abs, abs_name))
    };
    let (tcp, udp, abs, abs_name) = match setup() {
        Ok(x) => x,
        Err(e) => return all(NET, fail(format!("setup: host sockets: {e}"))),
    };
    let port = |r: std::io::Result<std::net::SocketAddr>| {
        r.map(|a| a.port().to_string()).unwrap_or_default()
    };
    let body = NET_PY
        .replace("@TCP@", &port(tcp.local_addr()))
        .replace("@UDP@", &port(udp.local_addr()))
        .replace("@ABS@", &abs_name);
    let o = env.py(tier, &body, &[]);
    if !o.complete() {
        return all(NET, fail(o.incomplete()));
    }
    let tcp_seen = tcp.accept().is_ok();
    let udp_seen = udp.recv_from(&mut [0u8; 64]).is_ok();
    let abs_seen = abs.accept().is_ok();
    let native = tier == Tier::Native;
    // Landlock's TCP rules exist from ABI 4 on; below it (Linux 6.1: ABI 2) the run's report
    // names the network namespace as their substitute (docs/isolation.md), and the probes
    // expect that layer's answers instead of Landlock's EACCES.
    let tcp_rules = o.report["isolation"]["landlock_rights"]
        .as_array()
        .is_some_and(|a| a.iter().any(|r| r == "tcp"));
    let tcp_v = match (tcp_seen, res(&o, "tcp_host").as_str()) {
        (true, _) => fail("the host listener accepted a connection from the sandbox"),
        (false, "errno=13") => pass("EACCES (Landlock); the host listener saw nothing"),
        (false, r) if (!native || !tcp_rules) && r.starts_with("errno=") => pass(format!(
            "{r} (the network namespace: no Landlock TCP rules here); the host listener saw nothing"
        )),
        (false, r) => fail(format!(
            "{r}: not refused by Landlock (an empty network namespace would give ECONNREFUSED=111)"
        )),
    };
    let listen_v = match res(&o, "tcp_listen").as_str() {
        "errno=13" => pass("EACCES (Landlock)"),
        r if !native => Verdict::Skip(format!(
            "gVisor's network stack is the boundary here (no Landlock): {r}"
        )),
        r if !tcp_rules => Verdict::Skip(format!(
            "no Landlock TCP rules on this kernel (ABI < 4): the port is the sandbox's own network namespace's, unreachable from outside: {r}"
        )),
        r => fail(format!("{r}: a TCP port could be bound")),
    };
    let udp_v = if udp_seen {
        fail("the host UDP socket received a datagram from the sandbox")
    } else {
        pass(format!(
            "the host socket received nothing (sendto inside: {})",
            res(&o, "udp_host")
        ))
    };
    let abs_v = if abs_seen {
        fail("the host's abstract unix socket accepted a connection")
    } else {
        refused(&o, &["abstract_unix"])
    };
    let ifaces = o.line("IFACES ").unwrap_or_default();
    let ifaces_v = if ifaces == "lo" || (!native && ifaces.is_empty()) {
        pass(format!("interfaces: {ifaces:?}"))
    } else {
        fail(format!("interfaces: {ifaces}"))
    };
    let vsock_v = {
        let r = refused(&o, &["vsock", "vsock_pair"]);
        match r {
            Verdict::Pass(d) if native && !family_reported(&o, 40) => fail(format!(
                "{d}, but no socket denial naming AF_VSOCK in the report"
            )),
            v => v,
        }
    };
    let mut not_refused = Vec::new();
    let mut not_reported = Vec::new();
    for line in o.stdout.lines().filter_map(|l| l.strip_prefix("FAMILY ")) {
        let mut it = line.split(' ');
        let (Some(n), Some(r)) = (it.next(), it.next()) else {
            continue;
        };
        let n: u32 = n.parse().unwrap_or(0);
        if !r.starts_with("errno=") {
            not_refused.push(af_name(n));
        } else if native && !family_reported(&o, n) {
            not_reported.push(af_name(n));
        }
    }
    let families_v = if !not_refused.is_empty() {
        fail(format!("created: {}", not_refused.join(", ")))
    } else if !not_reported.is_empty() {
        fail(format!(
            "refused, but not reported (refused by the kernel, not by agentjail): {}",
            not_reported.join(", ")
        ))
    } else {
        pass("every other family refused and reported")
    };
    vec![
        ("net.tcp_host", tcp_v),
        ("net.tcp_listen", listen_v),
        ("net.udp_host", udp_v),
        ("net.dns", refused(&o, &["dns"])),
        ("net.raw", refused(&o, &["raw"])),
        ("net.abstract_unix", abs_v),
        ("net.interfaces", ifaces_v),
        ("net.vsock", vsock_v),
        ("net.socket_families", families_v),
    ]
}
