//! Integration tests of the gateway with real sockets.
//!
//! Every test runs on a dedicated thread that first moves into a fresh network namespace
//! (`unshare(CLONE_NEWNET)`) and brings its loopback up, so the gateway, the upstream
//! servers, the test DNS server and the clients see **only loopback**: even a bug cannot reach
//! another machine. Names resolve through a tiny DNS server on 127.0.0.1 inside the namespace.
//! Without the privilege to create a namespace, each test prints a SKIP line and passes, except
//! under CI (`CI` set), where it fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../cli/tests/common/skip.rs"]
mod skip;
use skip::skip;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentjail_egress::{
    Decision, Gateway, GatewayLimits, HickoryResolver, Resolve, StaticResolver, spawn_gateway,
};
use agentjail_manifest::{AllowRule, EgressPolicy};
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

// ---------------------------------------------------------------------------------------------
// Network namespace harness

fn bring_lo_up() -> std::io::Result<()> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ifreq is a plain C struct for which all-zero bytes are a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo\0".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: fd is an open socket and ifr a valid, NUL-terminated ifreq.
    let mut r = unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS as libc::Ioctl, &mut ifr) };
    if r == 0 {
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
        // SAFETY: as above.
        r = unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS as libc::Ioctl, &ifr) };
    }
    let err = std::io::Error::last_os_error();
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    if r == 0 { Ok(()) } else { Err(err) }
}

/// Runs `f` on a fresh thread inside a new network namespace with only `lo` (up), on a
/// current-thread tokio runtime built on that thread. Returns false if skipped.
fn in_netns<F, Fut>(name: &str, f: F) -> bool
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let name = name.to_owned();
    let t = std::thread::spawn(move || {
        // SAFETY: unshare(2) only changes this thread's network namespace; nothing else in
        // the thread depends on the old one.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            let e = std::io::Error::last_os_error();
            skip(&format!(
                "{name}: cannot create a network namespace ({e}); needs root"
            ));
            return false;
        }
        bring_lo_up().expect("bring lo up in the test namespace");
        assert_only_loopback();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            tokio::time::timeout(Duration::from_secs(60), f())
                .await
                .expect("test timed out");
        });
        true
    });
    match t.join() {
        Ok(ran) => ran,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// The namespace must hold nothing but `lo`.
fn assert_only_loopback() {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").expect("read net/dev");
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, vec!["lo"], "test namespace must contain only lo");
}

// ---------------------------------------------------------------------------------------------
// Test DNS server (hand-written, UDP, A/AAAA only)

#[derive(Clone, Default)]
struct Dns {
    /// A-query counts per name.
    queries: Arc<Mutex<HashMap<String, usize>>>,
}

impl Dns {
    fn count(&self, name: &str) -> usize {
        self.queries.lock().unwrap().get(name).copied().unwrap_or(0)
    }

    fn answer(&self, name: &str) -> Option<Vec<Ipv4Addr>> {
        let n = {
            let mut q = self.queries.lock().unwrap();
            let c = q.entry(name.to_owned()).or_default();
            *c += 1;
            *c
        };
        let lo = Ipv4Addr::LOCALHOST;
        Some(match name {
            "allowed.test" | "other.test" => vec![lo],
            "private.test" => vec![Ipv4Addr::new(10, 0, 0, 1)],
            "mixed.test" => vec![lo, Ipv4Addr::new(10, 0, 0, 1)],
            "loop2.test" => vec![Ipv4Addr::new(127, 0, 0, 2)],
            "metadata.test" => vec![Ipv4Addr::new(169, 254, 169, 254)],
            "rebind.test" if n == 1 => vec![lo],
            "rebind.test" => vec![Ipv4Addr::new(10, 0, 0, 1)],
            _ => return None,
        })
    }

    async fn start(self) -> SocketAddr {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                    return;
                };
                if let Some(resp) = self.respond(&buf[..n]) {
                    let _ = sock.send_to(&resp, peer).await;
                }
            }
        });
        addr
    }

    fn respond(&self, q: &[u8]) -> Option<Vec<u8>> {
        if q.len() < 12 {
            return None;
        }
        let mut i = 12;
        let mut labels = Vec::new();
        loop {
            let len = *q.get(i)? as usize;
            i += 1;
            if len == 0 {
                break;
            }
            labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_ascii_lowercase());
            i += len;
        }
        let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
        let qend = i + 4;
        q.get(..qend)?;
        let name = labels.join(".");
        let (rcode, answers): (u16, Vec<Vec<u8>>) = if qtype == 1 {
            match self.answer(&name) {
                Some(ips) => (0, ips.iter().map(|ip| ip.octets().to_vec()).collect()),
                None => (3, vec![]),
            }
        } else {
            // AAAA and everything else: no records (NXDOMAIN for unknown names).
            let known = matches!(
                name.as_str(),
                "allowed.test"
                    | "other.test"
                    | "private.test"
                    | "mixed.test"
                    | "loop2.test"
                    | "metadata.test"
                    | "rebind.test"
            );
            (if known { 0 } else { 3 }, vec![])
        };
        let mut r = Vec::with_capacity(512);
        r.extend_from_slice(&q[0..2]);
        r.extend_from_slice(&(0x8580u16 | rcode).to_be_bytes());
        r.extend_from_slice(&1u16.to_be_bytes());
        r.extend_from_slice(&(answers.len() as u16).to_be_bytes());
        r.extend_from_slice(&[0, 0, 0, 0]);
        r.extend_from_slice(&q[12..qend]);
        for a in answers {
            r.extend_from_slice(&[0xc0, 0x0c]);
            r.extend_from_slice(&qtype.to_be_bytes());
            r.extend_from_slice(&1u16.to_be_bytes());
            r.extend_from_slice(&0u32.to_be_bytes());
            r.extend_from_slice(&(a.len() as u16).to_be_bytes());
            r.extend_from_slice(&a);
        }
        Some(r)
    }
}

// ---------------------------------------------------------------------------------------------
// Upstream servers

#[derive(Clone)]
struct Upstream {
    http: SocketAddr,
    echo: SocketAddr,
    http_conns: Arc<AtomicUsize>,
    echo_conns: Arc<AtomicUsize>,
    loop2_conns: Arc<AtomicUsize>,
    seen_headers: Arc<Mutex<Vec<String>>>,
}

async fn start_upstream() -> Upstream {
    let http_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = http_l.local_addr().unwrap();
    let echo_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo = echo_l.local_addr().unwrap();
    // A listener on 127.0.0.2 with the echo port: reachable on lo, never allowed.
    let loop2_l = TcpListener::bind(("127.0.0.2", echo.port())).await.unwrap();
    let up = Upstream {
        http,
        echo,
        http_conns: Arc::default(),
        echo_conns: Arc::default(),
        loop2_conns: Arc::default(),
        seen_headers: Arc::default(),
    };
    {
        let up = up.clone();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = http_l.accept().await else {
                    return;
                };
                up.http_conns.fetch_add(1, Ordering::SeqCst);
                let up = up.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let up = up.clone();
                        async move { Ok::<_, std::convert::Infallible>(upstream_route(&up, req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
    }
    for (l, counter) in [
        (echo_l, up.echo_conns.clone()),
        (loop2_l, up.loop2_conns.clone()),
    ] {
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
    }
    up
}

fn upstream_route(up: &Upstream, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    {
        let mut seen = up.seen_headers.lock().unwrap();
        for (k, v) in req.headers() {
            seen.push(format!("{k}: {}", v.to_str().unwrap_or("?")));
        }
    }
    let port = up.http.port();
    let redirect = |loc: String| {
        Response::builder()
            .status(302)
            .header("location", loc)
            .body(Full::new(Bytes::from_static(b"UPSTREAM-REDIRECT-BODY")))
            .unwrap()
    };
    match req.uri().path() {
        "/hello" => Response::new(Full::new(Bytes::from_static(b"hello from upstream"))),
        "/big" => Response::new(Full::new(Bytes::from(vec![b'x'; 1 << 20]))),
        "/redirect-evil" => redirect("http://evil.test/".into()),
        "/redirect-private" => redirect(format!("http://private.test:{port}/hello")),
        "/redirect-ip" => redirect(format!("http://2130706433:{port}/hello")),
        "/redirect-userinfo" => redirect(format!("http://allowed.test@evil.test:{port}/")),
        "/redirect-ok" => redirect(format!("http://other.test:{port}/hello")),
        "/redirect-relative" => redirect("/hello".into()),
        _ => Response::builder()
            .status(404)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    }
}

// ---------------------------------------------------------------------------------------------
// Gateway and clients

struct World {
    up: Upstream,
    dns: Dns,
    dns_addr: SocketAddr,
}

async fn world() -> World {
    let up = start_upstream().await;
    let dns = Dns::default();
    let dns_addr = dns.clone().start().await;
    World { up, dns, dns_addr }
}

impl World {
    fn policy(&self) -> EgressPolicy {
        let ports = vec![self.up.http.port(), self.up.echo.port()];
        let rule = |h: &str| AllowRule {
            host: h.into(),
            ports: ports.clone(),
        };
        EgressPolicy {
            allow: vec![
                rule("allowed.test"),
                rule("other.test"),
                rule("private.test"),
                rule("mixed.test"),
                rule("loop2.test"),
                rule("metadata.test"),
                rule("rebind.test"),
            ],
            allow_private: vec!["127.0.0.1/32".into()],
            ..EgressPolicy::default()
        }
    }

    fn resolver(&self) -> Arc<dyn Resolve> {
        Arc::new(
            HickoryResolver::with_name_servers(&[self.dns_addr], Duration::from_secs(2)).unwrap(),
        )
    }

    async fn gateway(&self, limits: GatewayLimits) -> RunningGateway {
        let gw = Gateway::new(&self.policy(), limits, self.resolver()).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(gw.serve(listener, async move {
            let _ = rx.await;
        }));
        RunningGateway { addr, tx, task }
    }
}

struct RunningGateway {
    addr: SocketAddr,
    tx: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<Decision>>,
}

impl RunningGateway {
    async fn stop(self) -> Vec<Decision> {
        let _ = self.tx.send(());
        self.task.await.unwrap()
    }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

fn parse_head(head: &str) -> u16 {
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Sends a raw request through the proxy and reads until the server closes.
async fn exchange(proxy: SocketAddr, raw: &str) -> Resp {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    let head = read_head(&mut s).await;
    let mut body = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut body)).await;
    Resp {
        status: parse_head(&head),
        head,
        body,
    }
}

async fn get(proxy: SocketAddr, url: &str, host: &str) -> Resp {
    exchange(
        proxy,
        &format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// A minimal, well-formed TLS ClientHello record with `host` as server name (none for an IP).
fn client_hello(host: &str) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    let mut ext = Vec::new();
    if host.parse::<IpAddr>().is_err() {
        let n = host.len() as u16;
        ext.extend_from_slice(&[0, 0]);
        ext.extend_from_slice(&(n + 5).to_be_bytes());
        ext.extend_from_slice(&(n + 3).to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&n.to_be_bytes());
        ext.extend_from_slice(host.as_bytes());
    }
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&((body.len() + 4) as u16).to_be_bytes());
    rec.extend_from_slice(&[1, 0, (body.len() >> 8) as u8, body.len() as u8]);
    rec.extend_from_slice(&body);
    rec
}

/// CONNECT; on 200 returns the tunnel, after a ClientHello naming the target went through.
async fn connect(proxy: SocketAddr, target: &str) -> (Resp, Option<TcpStream>) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    let status = parse_head(&head);
    if status == 200 {
        // Tunnels carry TLS only, with the CONNECT target as server name: open with a
        // ClientHello (the echo upstreams send it back).
        let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
        let hello = client_hello(host.trim_start_matches('[').trim_end_matches(']'));
        s.write_all(&hello).await.unwrap();
        let mut back = vec![0u8; hello.len()];
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back)).await;
        (
            Resp {
                status,
                head,
                body: vec![],
            },
            Some(s),
        )
    } else {
        let mut body = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut body)).await;
        (Resp { status, head, body }, None)
    }
}

async fn echo_through(tunnel: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    tunnel.write_all(msg).await.unwrap();
    let mut got = vec![0u8; msg.len()];
    tunnel.read_exact(&mut got).await.unwrap();
    got
}

fn find(log: &[Decision], pred: impl Fn(&Decision) -> bool) -> Vec<&Decision> {
    log.iter().filter(|d| pred(d)).collect()
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn allowed_connect_and_get_and_no_secrets_in_log() {
    in_netns("allowed_connect_and_get_and_no_secrets_in_log", || async {
        let w = world().await;
        let gw = w.gateway(GatewayLimits::default()).await;
        let echo_port = w.up.echo.port();
        let http_port = w.up.http.port();

        // CONNECT tunnels bytes both ways, by name, with a trailing dot and in upper case.
        for target in [
            format!("allowed.test:{echo_port}"),
            format!("ALLOWED.test.:{echo_port}"),
        ] {
            let (resp, tunnel) = connect(gw.addr, &target).await;
            assert_eq!(resp.status, 200, "{resp:?}");
            let mut t = tunnel.unwrap();
            assert_eq!(
                echo_through(&mut t, b"ping through the tunnel").await,
                b"ping through the tunnel"
            );
            let big = vec![7u8; 200_000];
            assert_eq!(echo_through(&mut t, &big).await, big);
        }

        // Plain GET, with credentials and a secret query that must never be logged.
        let r = exchange(
            gw.addr,
            &format!(
                "GET http://allowed.test:{http_port}/hello?token=SECRET456 HTTP/1.1\r\n\
                 Host: allowed.test:{http_port}\r\nAuthorization: Bearer SECRET123\r\n\
                 Proxy-Authorization: Basic SECRET789\r\nCookie: session=SECRETCOOKIE\r\n\
                 Connection: close\r\n\r\n"
            ),
        )
        .await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body, b"hello from upstream");
        // Proxy credentials are not forwarded; end-to-end headers are.
        let seen = w.up.seen_headers.lock().unwrap().join("\n");
        assert!(
            !seen.to_ascii_lowercase().contains("proxy-authorization"),
            "{seen}"
        );
        assert!(seen.contains("Bearer SECRET123"));

        // Keep-alive: two requests on one client connection.
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        for _ in 0..2 {
            s.write_all(
                format!("GET http://allowed.test:{http_port}/hello HTTP/1.1\r\nHost: allowed.test:{http_port}\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
            let head = read_head(&mut s).await;
            assert_eq!(parse_head(&head), 200, "{head}");
            let mut body = vec![0u8; b"hello from upstream".len()];
            s.read_exact(&mut body).await.unwrap();
        }
        drop(s);

        let log = gw.stop().await;
        let connects = find(&log, |d| d.method == "CONNECT" && d.allowed);
        assert_eq!(connects.len(), 2, "{log:#?}");
        for d in &connects {
            assert_eq!(d.host, "allowed.test");
            assert_eq!(d.port, echo_port);
            assert_eq!(d.address, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
            assert!(d.bytes_up >= 200_000 && d.bytes_down >= 200_000, "{d:?}");
            assert!(d.reason.contains("allowed by rule allowed.test"), "{d:?}");
            assert!(d.reason.contains("allow_private 127.0.0.1/32"), "{d:?}");
        }
        let gets = find(&log, |d| d.method == "GET" && d.allowed);
        assert_eq!(gets.len(), 3, "{log:#?}");
        assert!(gets.iter().all(|d| d.bytes_down >= 19 && d.bytes_up > 0));
        let dump = format!("{log:?} {}", serde_json::to_string(&log).unwrap());
        for secret in [
            "SECRET123",
            "SECRET456",
            "SECRET789",
            "SECRETCOOKIE",
            "token",
            "/hello",
        ] {
            assert!(
                !dump.contains(secret),
                "{secret} leaked into the log: {dump}"
            );
        }
    });
}

#[test]
fn policy_refusals_host_port_literals_userinfo() {
    in_netns("policy_refusals_host_port_literals_userinfo", || async {
        let w = world().await;
        let gw = w.gateway(GatewayLimits::default()).await;
        let echo_port = w.up.echo.port();
        let http_port = w.up.http.port();

        // Host not in the allowlist.
        let (r, t) = connect(gw.addr, &format!("evil.test:{echo_port}")).await;
        assert_eq!(r.status, 403);
        assert!(t.is_none());
        assert_eq!(
            r.header("x-agentjail-denied").as_deref(),
            Some("host evil.test is not in the allowlist")
        );
        // Allowed host, wrong port.
        let (r, _) = connect(gw.addr, "allowed.test:1").await;
        assert_eq!(r.status, 403);
        assert!(
            r.header("x-agentjail-denied")
                .unwrap()
                .contains("port 1 is not allowed")
        );
        let r = get(gw.addr, "http://allowed.test:1/hello", "allowed.test:1").await;
        assert_eq!(r.status, 403);

        // Every spelling of 127.0.0.1 is an IP literal, and no rule names it.
        for lit in [
            "127.0.0.1",
            "2130706433",
            "0x7f000001",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "127.1",
            "[::ffff:127.0.0.1]",
            "[::1]",
            "localhost",
        ] {
            let (r, t) = connect(gw.addr, &format!("{lit}:{echo_port}")).await;
            assert_eq!(r.status, 403, "{lit}: {r:?}");
            assert!(t.is_none());
            let url = format!("http://{lit}:{http_port}/hello");
            let r = get(gw.addr, &url, &format!("{lit}:{http_port}")).await;
            assert_eq!(r.status, 403, "{lit}: {r:?}");
        }

        // Userinfo and other authority tricks.
        for target in [
            format!("allowed.test@evil.test:{echo_port}"),
            format!("evil.test:{echo_port}@allowed.test:{echo_port}"),
            format!(":{echo_port}"),
            "allowed.test:0".into(),
            "allowed.test:65536".into(),
            "allowed.test".into(),
        ] {
            let (r, t) = connect(gw.addr, &target).await;
            assert!(t.is_none(), "{target}");
            assert!(matches!(r.status, 400 | 403), "{target}: {r:?}");
        }
        for url in [
            format!("http://allowed.test@evil.test:{http_port}/"),
            format!("http://evil.test#@allowed.test:{http_port}/"),
            format!("http://user:pw@allowed.test:{http_port}/"),
        ] {
            let r = get(gw.addr, &url, &format!("allowed.test:{http_port}")).await;
            assert!(matches!(r.status, 400 | 403), "{url}: {r:?}");
        }
        // https:// in absolute form is not forwarded (CONNECT is for TLS); origin-form neither.
        let r = get(
            gw.addr,
            &format!("https://allowed.test:{http_port}/"),
            "allowed.test",
        )
        .await;
        assert_eq!(r.status, 400);
        let r = get(gw.addr, "/hello", &format!("allowed.test:{http_port}")).await;
        assert_eq!(r.status, 400);

        // Nothing reached an upstream.
        assert_eq!(w.up.echo_conns.load(Ordering::SeqCst), 0);
        assert_eq!(w.up.http_conns.load(Ordering::SeqCst), 0);
        assert_eq!(w.up.loop2_conns.load(Ordering::SeqCst), 0);

        let log = gw.stop().await;
        assert!(log.iter().all(|d| !d.allowed), "{log:#?}");
        assert!(
            find(&log, |d| d.reason
                == "IP literal 127.0.0.1 is not in the allowlist")
            .iter()
            .map(|d| d.count)
            .sum::<u64>()
                >= 12
        );
        assert!(
            !find(&log, |d| d.host == "evil.test"
                && d.reason.contains("not in the allowlist"))
            .is_empty()
        );
        let dump = format!("{log:?}");
        assert!(!dump.contains("user:pw") && !dump.contains("pw@"), "{dump}");
    });
}

#[test]
fn private_answers_refused_before_connect_and_no_rebinding() {
    in_netns(
        "private_answers_refused_before_connect_and_no_rebinding",
        || async {
            let w = world().await;
            let gw = w.gateway(GatewayLimits::default()).await;
            let echo_port = w.up.echo.port();
            let http_port = w.up.http.port();

            for (name, why) in [
                ("private.test", "10.0.0.1 is private-use"),
                ("mixed.test", "10.0.0.1 is private-use"),
                ("loop2.test", "127.0.0.2 is loopback"),
                ("metadata.test", "169.254.169.254 is link-local"),
            ] {
                let (r, t) = connect(gw.addr, &format!("{name}:{echo_port}")).await;
                assert_eq!(r.status, 403, "{name}: {r:?}");
                assert!(t.is_none());
                let denied = r.header("x-agentjail-denied").unwrap();
                assert!(denied.contains(why), "{name}: {denied}");
                let r = get(
                    gw.addr,
                    &format!("http://{name}:{http_port}/hello"),
                    &format!("{name}:{http_port}"),
                )
                .await;
                assert_eq!(r.status, 403, "{name}: {r:?}");
            }
            // mixed.test has 127.0.0.1 (reachable, allowed) and 10.0.0.1: refused as a whole, and
            // the upstream saw nothing. loop2.test's 127.0.0.2 listener saw nothing.
            assert_eq!(w.up.echo_conns.load(Ordering::SeqCst), 0);
            assert_eq!(w.up.http_conns.load(Ordering::SeqCst), 0);
            assert_eq!(w.up.loop2_conns.load(Ordering::SeqCst), 0);

            // rebind.test answers 127.0.0.1 first and 10.0.0.1 afterwards. The first CONNECT uses
            // the one vetted answer (a single A query), the second is refused.
            let (r, t) = connect(gw.addr, &format!("rebind.test:{echo_port}")).await;
            assert_eq!(r.status, 200, "{r:?}");
            let mut t = t.unwrap();
            assert_eq!(
                echo_through(&mut t, b"still 127.0.0.1").await,
                b"still 127.0.0.1"
            );
            assert_eq!(w.dns.count("rebind.test"), 1);
            assert_eq!(w.up.echo_conns.load(Ordering::SeqCst), 1);
            let (r, _) = connect(gw.addr, &format!("rebind.test:{echo_port}")).await;
            assert_eq!(r.status, 403);
            assert!(r.header("x-agentjail-denied").unwrap().contains("10.0.0.1"));
            assert_eq!(w.up.echo_conns.load(Ordering::SeqCst), 1);
            drop(t);

            // Unknown name: a DNS failure, not a connection.
            let (r, _) = connect(gw.addr, &format!("missing.test:{echo_port}")).await;
            assert!(matches!(r.status, 403 | 502), "{r:?}");

            let log = gw.stop().await;
            let rebind = find(&log, |d| d.host == "rebind.test");
            assert_eq!(rebind.len(), 2, "{log:#?}");
            let ok = rebind.iter().find(|d| d.allowed).unwrap();
            assert_eq!(ok.address, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
            let no = rebind.iter().find(|d| !d.allowed).unwrap();
            assert_eq!(no.address, Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
            let meta = find(&log, |d| d.host == "metadata.test");
            assert!(
                meta.iter()
                    .all(|d| !d.allowed && d.address == Some("169.254.169.254".parse().unwrap()))
            );
        },
    );
}

#[test]
fn redirects_and_host_header_are_checked() {
    in_netns("redirects_and_host_header_are_checked", || async {
        let w = world().await;
        let gw = w.gateway(GatewayLimits::default()).await;
        let p = w.up.http.port();
        let host = format!("allowed.test:{p}");

        for (path, why) in [
            ("/redirect-evil", "host evil.test is not in the allowlist"),
            ("/redirect-private", "10.0.0.1 is private-use"),
            (
                "/redirect-ip",
                "IP literal 127.0.0.1 is not in the allowlist",
            ),
            ("/redirect-userinfo", "userinfo"),
        ] {
            let r = get(gw.addr, &format!("http://allowed.test:{p}{path}"), &host).await;
            assert_eq!(r.status, 403, "{path}: {r:?}");
            let denied = r.header("x-agentjail-denied").unwrap();
            assert!(denied.contains(why), "{path}: {denied}");
            assert!(
                denied.contains(&format!("redirect from allowed.test:{p} refused")),
                "{denied}"
            );
            assert!(r.header("location").is_none(), "redirect forwarded: {r:?}");
            assert!(!String::from_utf8_lossy(&r.body).contains("UPSTREAM-REDIRECT-BODY"));
        }
        // Redirects to an allowed destination, and relative ones, pass through.
        for (path, loc) in [
            ("/redirect-ok", format!("http://other.test:{p}/hello")),
            ("/redirect-relative", "/hello".to_owned()),
        ] {
            let r = get(gw.addr, &format!("http://allowed.test:{p}{path}"), &host).await;
            assert_eq!(r.status, 302, "{path}: {r:?}");
            assert_eq!(r.header("location"), Some(loc));
        }

        // Host header disagreeing with the URL: 400, nothing forwarded.
        let before = w.up.http_conns.load(Ordering::SeqCst);
        for bad_host in ["evil.test", "allowed.test:1", "other.test"] {
            let r = get(
                gw.addr,
                &format!("http://allowed.test:{p}/hello"),
                &format!("{bad_host}:{p}"),
            )
            .await;
            assert_eq!(r.status, 400, "{bad_host}: {r:?}");
        }
        let r = exchange(
            gw.addr,
            &format!("GET http://allowed.test:{p}/hello HTTP/1.1\r\nHost: {host}\r\nHost: evil.test\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert_eq!(r.status, 400);
        assert_eq!(w.up.http_conns.load(Ordering::SeqCst), before);
        // A Host header that is the same destination in another spelling is fine.
        let r = get(
            gw.addr,
            &format!("http://allowed.test:{p}/hello"),
            &format!("ALLOWED.TEST.:{p}"),
        )
        .await;
        assert_eq!(r.status, 200, "{r:?}");

        let log = gw.stop().await;
        let redirect_denials = find(&log, |d| {
            !d.allowed && d.reason.starts_with("redirect from")
        });
        assert_eq!(redirect_denials.len(), 4, "{log:#?}");
        assert!(
            redirect_denials
                .iter()
                .any(|d| d.host == "evil.test" && d.port == 80)
        );
        let mismatch = find(&log, |d| {
            d.reason == "Host header does not match the request URL"
        });
        // Identical refusals are one entry with a count.
        assert_eq!(mismatch.iter().map(|d| d.count).sum::<u64>(), 4, "{log:#?}");
        // The Host header value is not recorded.
        assert!(mismatch.iter().all(|d| d.host == "allowed.test"));
    });
}

#[test]
fn byte_and_connection_limits_hold() {
    in_netns("byte_and_connection_limits_hold", || async {
        let w = world().await;
        let p = w.up.http.port();
        let echo_port = w.up.echo.port();

        // Download bound: a 1 MiB body through a gateway allowing 100 kB down.
        let gw = w
            .gateway(GatewayLimits {
                max_bytes_down: 100_000,
                ..GatewayLimits::default()
            })
            .await;
        let r = get(
            gw.addr,
            &format!("http://allowed.test:{p}/big"),
            &format!("allowed.test:{p}"),
        )
        .await;
        assert!(r.body.len() <= 100_000, "got {} bytes", r.body.len());
        // The budget is run-wide: the next request is refused outright.
        let r = get(
            gw.addr,
            &format!("http://allowed.test:{p}/hello"),
            &format!("allowed.test:{p}"),
        )
        .await;
        assert_eq!(r.status, 403, "{r:?}");
        let log = gw.stop().await;
        assert!(
            !find(&log, |d| !d.allowed
                && d.reason.contains("max_bytes_down (100000) exceeded"))
            .is_empty(),
            "{log:#?}"
        );
        let big = find(&log, |d| d.allowed && d.method == "GET");
        assert!(big.iter().all(|d| d.bytes_down <= 100_000), "{log:#?}");

        // Upload bound through a tunnel.
        let gw = w
            .gateway(GatewayLimits {
                max_bytes_up: 10_000,
                ..GatewayLimits::default()
            })
            .await;
        let (r, t) = connect(gw.addr, &format!("allowed.test:{echo_port}")).await;
        assert_eq!(r.status, 200);
        let mut t = t.unwrap();
        assert_eq!(echo_through(&mut t, &[1u8; 5_000]).await.len(), 5_000);
        let _ = t.write_all(&[2u8; 50_000]).await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), t.read_to_end(&mut sink)).await;
        assert!(
            sink.len() <= 5_000,
            "echoed {} bytes past the bound",
            sink.len()
        );
        let log = gw.stop().await;
        let tunnel = find(&log, |d| d.allowed && d.method == "CONNECT");
        assert_eq!(tunnel.len(), 1);
        assert!(tunnel[0].bytes_up <= 10_000);
        assert!(
            !find(&log, |d| !d.allowed
                && d.reason.contains("max_bytes_up (10000) exceeded"))
            .is_empty(),
            "{log:#?}"
        );

        // Download bound through a tunnel (relayed with splice(2)): nothing past the budget
        // reaches the client, and the recorded count is exactly what it received.
        let gw = w
            .gateway(GatewayLimits {
                max_bytes_down: 20_000,
                ..GatewayLimits::default()
            })
            .await;
        let (r, t) = connect(gw.addr, &format!("allowed.test:{echo_port}")).await;
        assert_eq!(r.status, 200);
        let mut t = t.unwrap();
        let hello_len = client_hello("allowed.test").len();
        assert_eq!(echo_through(&mut t, &[3u8; 5_000]).await.len(), 5_000);
        let _ = t.write_all(&[4u8; 60_000]).await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), t.read_to_end(&mut sink)).await;
        let received = (hello_len + 5_000 + sink.len()) as u64;
        assert!(
            received <= 20_000,
            "received {received} bytes past the bound"
        );
        let log = gw.stop().await;
        let tunnel = find(&log, |d| d.allowed && d.method == "CONNECT");
        assert_eq!(tunnel.len(), 1, "{log:#?}");
        assert_eq!(tunnel[0].bytes_down, received, "{log:#?}");
        assert!(
            !find(&log, |d| !d.allowed
                && d.reason.contains("max_bytes_down (20000) exceeded"))
            .is_empty(),
            "{log:#?}"
        );

        // Connection bounds: one at a time, three in total.
        let gw = w
            .gateway(GatewayLimits {
                max_concurrent_connections: 1,
                max_total_connections: 3,
                ..GatewayLimits::default()
            })
            .await;
        let (r, held) = connect(gw.addr, &format!("allowed.test:{echo_port}")).await;
        assert_eq!(r.status, 200);
        let r = get(
            gw.addr,
            &format!("http://allowed.test:{p}/hello"),
            &format!("allowed.test:{p}"),
        )
        .await;
        assert_eq!(r.status, 503, "{r:?}");
        drop(held);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = get(
            gw.addr,
            &format!("http://allowed.test:{p}/hello"),
            &format!("allowed.test:{p}"),
        )
        .await;
        assert_eq!(r.status, 200, "third connection, one at a time: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = get(
            gw.addr,
            &format!("http://allowed.test:{p}/hello"),
            &format!("allowed.test:{p}"),
        )
        .await;
        assert_eq!(r.status, 503, "fourth connection is past the total: {r:?}");
        let log = gw.stop().await;
        assert!(
            !find(&log, |d| d
                .reason
                .contains("max_concurrent_connections (1) reached"))
            .is_empty()
        );
        assert!(
            !find(&log, |d| d
                .reason
                .contains("max_total_connections (3) exceeded"))
            .is_empty()
        );

        // Connection lifetime.
        let gw = w
            .gateway(GatewayLimits {
                max_connection_time: Duration::from_millis(300),
                ..GatewayLimits::default()
            })
            .await;
        let (r, t) = connect(gw.addr, &format!("allowed.test:{echo_port}")).await;
        assert_eq!(r.status, 200);
        let mut t = t.unwrap();
        let mut sink = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), t.read_to_end(&mut sink)).await;
        assert!(closed.is_ok(), "tunnel outlived max_connection_time");
        let log = gw.stop().await;
        assert!(
            !find(&log, |d| !d.allowed
                && d.reason.contains("max_connection_time"))
            .is_empty(),
            "{log:#?}"
        );
    });
}

#[test]
fn spawn_gateway_blocking_api_with_static_resolver() {
    in_netns(
        "spawn_gateway_blocking_api_with_static_resolver",
        || async {
            let w = world().await;
            let echo_port = w.up.echo.port();
            let policy = EgressPolicy {
                allow: vec![AllowRule {
                    host: "*.static.test".into(),
                    ports: vec![echo_port],
                }],
                allow_private: vec!["127.0.0.1".into()],
                ..EgressPolicy::default()
            };
            let resolver = StaticResolver::new()
                .insert("api.static.test", &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
                .insert("static.test", &[IpAddr::V4(Ipv4Addr::LOCALHOST)]);
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            // spawn_gateway's runtime threads are created from this (namespaced) thread.
            let handle = spawn_gateway(
                &policy,
                GatewayLimits::default(),
                Arc::new(resolver),
                listener,
            )
            .unwrap();
            let (r, t) = connect(addr, &format!("api.static.test:{echo_port}")).await;
            assert_eq!(r.status, 200);
            let mut t = t.unwrap();
            assert_eq!(echo_through(&mut t, b"abc").await, b"abc");
            drop(t);
            // The wildcard does not cover the bare suffix.
            let (r, _) = connect(addr, &format!("static.test:{echo_port}")).await;
            assert_eq!(r.status, 403);
            tokio::time::sleep(Duration::from_millis(100)).await;
            let log = tokio::task::spawn_blocking(move || handle.stop())
                .await
                .unwrap();
            assert_eq!(log.iter().filter(|d| d.allowed).count(), 1, "{log:#?}");
            assert_eq!(log.iter().filter(|d| !d.allowed).count(), 1, "{log:#?}");
        },
    );
}

/// One GET on a kept-alive client connection: the status, and the body when it is 200.
async fn keep_alive_get(s: &mut TcpStream, host: &str, port: u16) -> u16 {
    s.write_all(
        format!("GET http://{host}:{port}/hello HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let head = read_head(s).await;
    let status = parse_head(&head);
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    if status == 200 {
        assert_eq!(body, b"hello from upstream");
    }
    status
}

#[test]
fn pooled_upstream_connections_serve_only_the_destination_they_were_vetted_for() {
    in_netns(
        "pooled_upstream_connections_serve_only_the_destination_they_were_vetted_for",
        || async {
            let w = world().await;
            let gw = w.gateway(GatewayLimits::default()).await;
            let port = w.up.http.port();
            let mut s = TcpStream::connect(gw.addr).await.unwrap();
            // Kept-alive requests to one destination reuse one upstream connection.
            for _ in 0..3 {
                assert_eq!(keep_alive_get(&mut s, "allowed.test", port).await, 200);
            }
            assert_eq!(w.up.http_conns.load(Ordering::SeqCst), 1);
            // Another name on the same address and port gets its own connection, never the
            // one vetted for allowed.test.
            assert_eq!(keep_alive_get(&mut s, "other.test", port).await, 200);
            assert_eq!(w.up.http_conns.load(Ordering::SeqCst), 2);
            // rebind.test answers 127.0.0.1, then 10.0.0.1: the second request is vetted again
            // and refused, although a connection to 127.0.0.1 for rebind.test is pooled.
            assert_eq!(keep_alive_get(&mut s, "rebind.test", port).await, 200);
            assert_eq!(w.up.http_conns.load(Ordering::SeqCst), 3);
            assert_eq!(keep_alive_get(&mut s, "rebind.test", port).await, 403);
            assert_eq!(w.up.http_conns.load(Ordering::SeqCst), 3);
            // And the pooled allowed.test connection is still the one used.
            assert_eq!(keep_alive_get(&mut s, "allowed.test", port).await, 200);
            assert_eq!(w.up.http_conns.load(Ordering::SeqCst), 3);
            drop(s);
            let log = gw.stop().await;
            let seen = w.up.seen_headers.lock().unwrap().join("\n");
            assert!(seen.contains(&format!("host: other.test:{port}")), "{seen}");
            assert!(
                !find(&log, |d| !d.allowed
                    && d.host == "rebind.test"
                    && d.reason.contains("10.0.0.1"))
                .is_empty(),
                "{log:#?}"
            );
            assert_eq!(find(&log, |d| d.allowed && d.method == "GET").len(), 6);
        },
    );
}

/// `max_requests` (one helper for the forward proxy and the terminated-TLS path): past it, a
/// request is answered `429` with `Connection: close` and leaves a denial; the ones before
/// reach the upstream.
#[test]
fn max_requests_refuses_the_request_past_the_bound() {
    in_netns(
        "max_requests_refuses_the_request_past_the_bound",
        || async {
            let w = world().await;
            let p = w.up.http.port();
            let gw = w
                .gateway(GatewayLimits {
                    max_requests: 2,
                    ..GatewayLimits::default()
                })
                .await;
            let url = format!("http://allowed.test:{p}/hello");
            let host = format!("allowed.test:{p}");
            for _ in 0..2 {
                assert_eq!(get(gw.addr, &url, &host).await.status, 200);
            }
            let r = get(gw.addr, &url, &host).await;
            assert_eq!(r.status, 429, "{r:?}");
            assert_eq!(r.header("connection").as_deref(), Some("close"), "{r:?}");
            let log = gw.stop().await;
            assert_eq!(
                find(&log, |d| !d.allowed
                    && d.reason == "max_requests (2) exceeded")
                .len(),
                1,
                "{log:#?}"
            );
            assert_eq!(find(&log, |d| d.allowed).len(), 2, "{log:#?}");
        },
    );
}

/// `spawn_gateway` runs the gateway on one thread (a `current_thread` runtime): a tunnel whose
/// bytes never stop must still let that thread serve everything else. While a client pumps
/// data through an echo tunnel as fast as it can, another client's CONNECT is answered, and the
/// streaming tunnel is closed at `max_connection_time` (its timer runs on the same thread).
#[test]
fn a_streaming_tunnel_does_not_starve_the_gateway_or_outlive_its_lifetime() {
    in_netns(
        "a_streaming_tunnel_does_not_starve_the_gateway_or_outlive_its_lifetime",
        || async {
            let w = world().await;
            let echo_port = w.up.echo.port();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let limits = GatewayLimits {
                max_connection_time: Duration::from_secs(3),
                max_bytes_up: 1 << 40,
                max_bytes_down: 1 << 40,
                ..GatewayLimits::default()
            };
            let handle = spawn_gateway(&w.policy(), limits, w.resolver(), listener).unwrap();
            let target = format!("allowed.test:{echo_port}");
            let (r, t) = connect(addr, &target).await;
            assert_eq!(r.status, 200);
            let (mut rd, mut wr) = t.unwrap().into_split();
            let opened = std::time::Instant::now();
            // Writer and reader as fast as they go: the echo keeps both directions busy.
            let writer = tokio::spawn(async move {
                let chunk = vec![0x5au8; 256 * 1024];
                let mut sent = 0u64;
                while wr.write_all(&chunk).await.is_ok() {
                    sent += chunk.len() as u64;
                }
                sent
            });
            let reader = tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut got = 0u64;
                loop {
                    match rd.read(&mut buf).await {
                        Ok(0) | Err(_) => return (got, opened.elapsed()),
                        Ok(n) => got += n as u64,
                    }
                }
            });
            // Let the stream get going, then ask for a second tunnel.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let asked = std::time::Instant::now();
            let second = tokio::time::timeout(Duration::from_secs(2), connect(addr, &target)).await;
            let answered_in = asked.elapsed();
            let (r2, t2) =
                second.expect("a second CONNECT was not answered while a tunnel streamed");
            assert_eq!(r2.status, 200, "second CONNECT: {r2:?}");
            let mut t2 = t2.unwrap();
            assert_eq!(echo_through(&mut t2, b"still here").await, b"still here");
            drop(t2);
            let (got, lived) = tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("the streaming tunnel outlived max_connection_time by far")
                .unwrap();
            let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
            assert!(
                got > 16 << 20,
                "the tunnel was not streaming (only {got} bytes echoed): the test proves nothing"
            );
            assert!(
                lived < Duration::from_secs(6),
                "the streaming tunnel lived {lived:?} (max_connection_time 3 s)"
            );
            eprintln!(
                "streamed {} MiB in {lived:?}; second CONNECT answered in {answered_in:?}",
                got >> 20
            );
            let log = tokio::task::spawn_blocking(move || handle.stop())
                .await
                .unwrap();
            assert!(
                !find(&log, |d| !d.allowed
                    && d.reason.contains("max_connection_time"))
                .is_empty(),
                "{log:#?}"
            );
        },
    );
}
