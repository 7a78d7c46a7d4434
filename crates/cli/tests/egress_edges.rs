//! Egress edge cases attacked from inside the sandbox (issue #20, item 2): TLS SNI that names
//! another host than the CONNECT target (domain fronting), `Location` headers on responses that
//! are not the classic redirects, destinations that are the gateway host's own addresses, and
//! refusals that used to leave no denial in the report.
//!
//! Like `egress.rs`, every test runs on a thread that first moved into a fresh network namespace
//! with only loopback (`unshare(CLONE_NEWNET)`); the upstreams (a Rust HTTP server and
//! `openssl s_server`), a small DNS server and `agentjail` all run in it, so nothing can leave
//! the machine. Each probe prints a line naming its case; "refused by us" is told apart from
//! "failed anyway" by the denial the gateway must record in the run report.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::netns::{RunOut, Upstream, egress_flags as flags, in_netns, run_sh};
use common::skip;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;

/// A tiny HTTP/1.1 server with hand-written answers (so it can send what hyper would not).
fn upstream(bind: Ipv4Addr) -> Upstream {
    common::netns::upstream(bind, |path| {
        let answer: String = if path == "/addaddr" {
            // Gives the namespace (the gateway host) a new address while the gateway runs.
            let ok = Command::new("ip")
                .args(["addr", "add", "11.77.0.1/32", "dev", "lo"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            let body = if ok { "ADDED\n" } else { "FAILED\n" };
            format!(
                "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                if ok { 200 } else { 500 },
                body.len()
            )
        } else if path == "/ok" {
            "HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nUPSTREAM-OK\n".into()
        } else if let Some(rest) = path.strip_prefix("/loc/") {
            // /loc/<status>?to=<url>: any status with a Location header.
            let (status, to) = rest.split_once("?to=").unwrap_or((rest, "/ok"));
            format!(
                "HTTP/1.1 {status} X\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        } else if let Some(to) = path.strip_prefix("/dup?to=") {
            format!(
                "HTTP/1.1 302 Found\r\nLocation: /ok\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        } else if let Some(to) = path.strip_prefix("/cloc?to=") {
            format!(
                "HTTP/1.1 200 OK\r\nContent-Location: {to}\r\nContent-Length: 3\r\nConnection: close\r\n\r\nhi\n"
            )
        } else if path == "/clte" {
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .into()
        } else if path == "/badchunk" {
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
                .into()
        } else {
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into()
        };
        answer.into_bytes()
    })
}

/// A minimal DNS server on 127.0.0.1: one A record per known name, NXDOMAIN otherwise.
fn dns(answers: HashMap<&'static str, Ipv4Addr>) -> u16 {
    common::netns::dns(answers.into_iter().map(|(n, ip)| (n, vec![ip])).collect()).0
}

fn run(work: &Path, flags: &[String], script: &str) -> RunOut {
    run_sh(work, flags, 30, script)
}

/// Writes `name` into `work` readable by the sandbox and mounts it at `/input/<name>`.
fn input(work: &Path, f: &mut Vec<String>, name: &str, content: &[u8]) {
    let p = work.join(name);
    std::fs::write(&p, content).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    f.push("--ro".into());
    f.push(format!("{}:/input/{name}", p.display()));
}

fn curl(name: &str, url: &str) -> String {
    format!("echo {name} $(curl -s -m 5 -o /dev/null -w '%{{http_code}}' '{url}')\n")
}

fn names() -> HashMap<&'static str, Ipv4Addr> {
    HashMap::from([
        ("allowed.test", Ipv4Addr::LOCALHOST),
        ("evil.test", Ipv4Addr::LOCALHOST),
        ("own.test", Ipv4Addr::new(11, 22, 33, 44)),
        ("late.test", Ipv4Addr::new(11, 77, 0, 1)),
    ])
}

/// Kills the child when dropped.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TLS upstream (`openssl s_server -www`) on 127.0.0.1:`port` whose certificate names
/// allowed.test and evil.test (so the client would accept both: only the gateway can refuse).
/// Returns the server and the PEM of the certificate, which is its own trust anchor.
fn tls_upstream(dir: &Path, port: u16) -> Option<(Reap, Vec<u8>)> {
    let key = dir.join("key.pem");
    let cert = dir.join("cert.pem");
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .arg("ec_paramgen_curve:prime256v1")
        .args(["-nodes", "-days", "2", "-subj", "/CN=allowed.test"])
        .args(["-addext", "subjectAltName=DNS:allowed.test,DNS:evil.test"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !made.map(|s| s.success()).unwrap_or(false) {
        skip("openssl could not make a test certificate");
        return None;
    }
    let child = Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let child = Reap(child);
    for _ in 0..100 {
        if std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Some((child, std::fs::read(&cert).unwrap()));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("openssl s_server did not start");
}

/// The probe: CONNECTs through the sandbox's proxy, then speaks TLS with a chosen SNI (or none,
/// or no TLS at all), and prints `NAME OK <first bytes>` or `NAME ERR <why>`.
const TLS_PROBE: &str = r#"
import os, socket, ssl, sys
proxy = os.environ["http_proxy"].split("//")[-1].strip("/")
ph, pp = proxy.rsplit(":", 1)
def tunnel(target):
    s = socket.create_connection((ph, int(pp)), timeout=5)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            raise OSError("proxy closed")
        head += c
    status = head.split(b" ")[1]
    if status != b"200":
        raise OSError("proxy answered " + status.decode())
    return s
def tls(name, target, sni, verify_name=True):
    try:
        s = tunnel(target)
        ctx = ssl.create_default_context(cafile="/input/cert.pem")
        if sni is None or sni[0].isdigit() or not verify_name:
            ctx.check_hostname = False
        t = ctx.wrap_socket(s, server_hostname=sni)
        t.sendall(b"GET / HTTP/1.0\r\n\r\n")
        data = t.recv(64)
        print(name, "OK", data[:8], flush=True)
    except Exception as e:
        print(name, "ERR", type(e).__name__, str(e)[:60].replace("\n", " "), flush=True)
def plain(name, target):
    try:
        s = tunnel(target)
        s.sendall(b"GET / HTTP/1.0\r\nHost: evil.test\r\n\r\n")
        data = s.recv(64)
        print(name, "OK" if data else "ERR closed", data[:8], flush=True)
    except Exception as e:
        print(name, "ERR", type(e).__name__, flush=True)
P = int(sys.argv[1])
tls("MATCH", "allowed.test:%d" % P, "allowed.test")
tls("MATCH_CASE", "allowed.test:%d" % P, "ALLOWED.test.", False)
tls("FRONTED", "allowed.test:%d" % P, "evil.test")
tls("NO_SNI", "allowed.test:%d" % P, None)
plain("NOT_TLS", "allowed.test:%d" % P)
tls("IP_NO_SNI", "127.0.0.1:%d" % P, None)
tls("IP_FRONTED", "127.0.0.1:%d" % P, "evil.test")
"#;

#[test]
fn tunnels_must_carry_tls_whose_sni_names_the_connect_target() {
    in_netns(&[], || {
        let work = common::tmp();
        let port = 8443;
        let Some((_server, cert)) = tls_upstream(work.path(), port) else {
            return;
        };
        let dns_port = dns(names());
        let mut f = flags(
            dns_port,
            &[format!("allowed.test:{port}"), format!("127.0.0.1:{port}")],
            &["127.0.0.1/32"],
        );
        input(work.path(), &mut f, "cert.pem", &cert);
        input(work.path(), &mut f, "probe.py", TLS_PROBE.as_bytes());
        // curl as well: a real client whose SNI is set by --connect-to while the CONNECT
        // target stays allowed.test.
        let script = format!(
            "/usr/bin/python3 /input/probe.py {port}\n\
             echo CURL_MATCH $(curl -s -m 5 -o /dev/null -w '%{{http_code}}' --cacert /input/cert.pem https://allowed.test:{port}/)\n\
             echo CURL_FRONTED $(curl -s -m 5 -o /dev/null -w '%{{http_code}}' --cacert /input/cert.pem --connect-to evil.test:{port}:allowed.test:{port} https://evil.test:{port}/)\n"
        );
        let o = run(work.path(), &f, &script);
        // The setup works: matching SNI (any case, trailing dot) and an IP literal without SNI
        // reach the TLS server.
        for k in ["MATCH", "MATCH_CASE", "IP_NO_SNI"] {
            assert!(
                o.line(k).starts_with("OK"),
                "{k}: {}\n{}",
                o.line(k),
                o.report
            );
        }
        assert_eq!(o.line("CURL_MATCH"), "200", "{}", o.report);
        // Fronting, a missing SNI and non-TLS bytes are cut, and each leaves its denial.
        for k in ["FRONTED", "NO_SNI", "NOT_TLS", "IP_FRONTED"] {
            assert!(
                o.line(k).starts_with("ERR"),
                "{k}: {}\n{}",
                o.line(k),
                o.report
            );
        }
        assert_ne!(o.line("CURL_FRONTED"), "200", "{}", o.report);
        let fronted = o.denials("sni_mismatch");
        assert!(
            fronted
                .iter()
                .any(|d| d["detail"].as_str().unwrap().contains("evil.test")),
            "{}",
            o.report
        );
        assert!(o.denied("sni_missing"), "{}", o.report);
        assert!(o.denied("not_tls"), "{}", o.report);
        // python FRONTED, IP_FRONTED and curl: three fronting attempts in all.
        let n: u64 = fronted
            .iter()
            .map(|d| d["count"].as_u64().unwrap_or(1))
            .sum();
        assert!(n >= 2, "{}", o.report);
    });
}

#[test]
fn location_headers_are_checked_on_every_response() {
    in_netns(&[], || {
        let up = upstream(Ipv4Addr::LOCALHOST);
        let dns_port = dns(names());
        let work = common::tmp();
        let p = up.port;
        let evil = format!("http://evil.test:{p}/ok");
        let base = format!("http://allowed.test:{p}");
        let script = [
            curl("S300", &format!("{base}/loc/300?to={evil}")),
            curl("S305", &format!("{base}/loc/305?to={evil}")),
            curl("S201", &format!("{base}/loc/201?to={evil}")),
            curl("S200", &format!("{base}/loc/200?to={evil}")),
            curl("DUP", &format!("{base}/dup?to={evil}")),
            curl("CLOC", &format!("{base}/cloc?to={evil}")),
            // Control: a Location on the same origin passes, on any status.
            curl("SAME", &format!("{base}/loc/201?to=/ok")),
        ]
        .concat();
        let o = run(
            work.path(),
            &flags(dns_port, &[format!("allowed.test:{p}")], &["127.0.0.1/32"]),
            &script,
        );
        assert_eq!(o.line("SAME"), "201", "{}", o.report);
        for k in ["S300", "S305", "S201", "S200", "DUP", "CLOC"] {
            assert_eq!(o.line(k), "403", "{k}: {}", o.report);
        }
        let d = o.denials(&format!("redirect from allowed.test:{p} refused"));
        let n: u64 = d.iter().map(|d| d["count"].as_u64().unwrap_or(1)).sum();
        assert_eq!(n, 6, "{}", o.report);
        assert!(o.denied("several location headers"), "{}", o.report);
        assert!(o.denied("content-location: host evil.test"), "{}", o.report);
    });
}

#[test]
fn the_gateway_hosts_own_addresses_are_refused_like_loopback() {
    in_netns(&["11.22.33.44/32"], || {
        // Listens on every address of the namespace, as a host service bound to 0.0.0.0 does.
        let up = upstream(Ipv4Addr::UNSPECIFIED);
        let dns_port = dns(names());
        let work = common::tmp();
        let p = up.port;
        let script = format!(
            "{}{}{}",
            curl("CONTROL", &format!("http://allowed.test:{p}/ok")),
            curl("OWN_NAME", &format!("http://own.test:{p}/ok")),
            curl("OWN_IP", &format!("http://11.22.33.44:{p}/ok")),
        );
        let o = run(
            work.path(),
            &flags(
                dns_port,
                &[
                    format!("allowed.test:{p}"),
                    format!("own.test:{p}"),
                    format!("11.22.33.44:{p}"),
                ],
                &["127.0.0.1/32"],
            ),
            &script,
        );
        assert_eq!(o.line("CONTROL"), "200", "{}", o.report);
        assert_eq!(o.line("OWN_NAME"), "403", "{}", o.report);
        assert_eq!(o.line("OWN_IP"), "403", "{}", o.report);
        let d = o.denials("own address");
        assert!(
            d.iter()
                .any(|d| d["detail"].as_str().unwrap().contains("own.test")),
            "{}",
            o.report
        );
        assert_eq!(
            up.connections.load(Ordering::SeqCst),
            1,
            "only the control request may reach the upstream"
        );
    });
}

/// The gateway caches the host's own addresses and refreshes them on the kernel's address
/// events: an address added while it runs must be refused on the very next request (a cache
/// with a time to live would let it through; see `ownaddr.rs`' unit tests). 11.77.0.1 is
/// public, so only the own-address check can refuse it.
#[test]
fn an_address_added_while_the_gateway_runs_is_refused_on_the_next_request() {
    in_netns(&[], || {
        let up = upstream(Ipv4Addr::UNSPECIFIED);
        let dns_port = dns(names());
        let work = common::tmp();
        let p = up.port;
        // BEFORE: 11.77.0.1 is nobody's yet (no route: 502); ADD makes it the host's own
        // address (the upstream runs `ip addr add` in the namespace); AFTER must be refused.
        let script = format!(
            "{}echo ADD $(curl -s -m 5 'http://allowed.test:{p}/addaddr')\n{}{}",
            curl("BEFORE", &format!("http://late.test:{p}/ok")),
            curl("AFTER", &format!("http://late.test:{p}/ok")),
            curl("CONTROL", &format!("http://allowed.test:{p}/ok")),
        );
        let o = run(
            work.path(),
            &flags(
                dns_port,
                &[format!("allowed.test:{p}"), format!("late.test:{p}")],
                &["127.0.0.1/32"],
            ),
            &script,
        );
        assert_eq!(o.line("ADD"), "ADDED", "{}\n{}", o.stdout, o.stderr);
        assert_eq!(o.line("BEFORE"), "502", "{}", o.report);
        assert_eq!(o.line("AFTER"), "403", "{}", o.report);
        assert_eq!(o.line("CONTROL"), "200", "{}", o.report);
        let d = o.denials("own address");
        assert!(
            d.iter()
                .any(|d| d["detail"].as_str().unwrap().contains("late.test")),
            "{}",
            o.report
        );
        assert_eq!(
            up.connections.load(Ordering::SeqCst),
            2,
            "only the ADD and CONTROL requests may reach the upstream"
        );
    });
}

const RAW_PROBE: &str = r#"
import os, socket, sys
proxy = os.environ["http_proxy"].split("//")[-1].strip("/")
ph, pp = proxy.rsplit(":", 1)
def raw(name, data):
    try:
        s = socket.create_connection((ph, int(pp)), timeout=5)
        s.sendall(data)
        print(name, s.recv(64).split(b"\r\n")[0].decode(), flush=True)
    except Exception as e:
        print(name, "ERR", type(e).__name__, flush=True)
P = int(sys.argv[1])
raw("GARBAGE", b"GET\x01 / HTTP/1.1\r\n\r\n")
raw("HUGE", ("GET http://allowed.test:%d/ok HTTP/1.1\r\nHost: allowed.test:%d\r\nX-Big: %s\r\n\r\n" % (P, P, "a" * 40000)).encode())
"#;

#[test]
fn every_refusal_leaves_a_denial() {
    in_netns(&[], || {
        let up = upstream(Ipv4Addr::LOCALHOST);
        let dns_port = dns(names());
        let work = common::tmp();
        let p = up.port;
        let mut f = flags(dns_port, &[format!("allowed.test:{p}")], &["127.0.0.1/32"]);
        input(work.path(), &mut f, "raw.py", RAW_PROBE.as_bytes());
        let script = format!(
            "/usr/bin/python3 /input/raw.py {p}\n{}{}{}",
            curl("CONTROL", &format!("http://allowed.test:{p}/ok")),
            curl("CLTE", &format!("http://allowed.test:{p}/clte")),
            "echo BADCHUNK $(curl -s -m 5 -o /dev/null -w '%{http_code}' http://allowed.test:PORT/badchunk; echo rc=$?)\n"
                .replace("PORT", &p.to_string()),
        );
        let o = run(work.path(), &f, &script);
        assert_eq!(o.line("CONTROL"), "200", "{}", o.report);
        // The client sees a refusal (or a cut body), and each leaves a denial with its reason.
        assert!(o.line("GARBAGE").contains("400"), "{}", o.line("GARBAGE"));
        assert!(o.line("HUGE").contains("431"), "{}", o.line("HUGE"));
        assert_eq!(o.line("CLTE"), "502", "{}", o.report);
        assert!(
            !o.line("BADCHUNK").ends_with("rc=0"),
            "{}",
            o.line("BADCHUNK")
        );
        assert!(o.denied("malformed request"), "{}", o.report);
        assert!(o.denied("request head too large"), "{}", o.report);
        assert!(
            o.denied("both Content-Length and Transfer-Encoding"),
            "{}",
            o.report
        );
        assert!(o.denied("response body"), "{}", o.report);
    });
}
