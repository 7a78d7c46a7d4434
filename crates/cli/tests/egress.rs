//! Egress tests: real HTTP clients (curl, Python's urllib) inside the sandbox go through the
//! egress gateway to test servers.
//!
//! Every test runs on its own thread that first moves into a fresh network namespace with only
//! loopback in it (`unshare(CLONE_NEWNET)`), then starts its upstream HTTP server, its DNS
//! server and `agentjail` from that thread (children inherit the thread's namespace). So no
//! packet can leave this machine even if the gateway had a bug. Needs root; without it each
//! test prints a skip line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::netns::{RunOut, Upstream, dns, egress_flags as flags, in_netns, run_sh};

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;

use serde_json::Value;

/// A tiny HTTP/1.1 server on 127.0.0.1 that counts connections.
fn upstream() -> Upstream {
    common::netns::upstream(Ipv4Addr::LOCALHOST, |path| {
        let (status, extra, body): (&str, String, Vec<u8>) = match path {
            "/ok" => ("200 OK", String::new(), b"UPSTREAM-OK\n".to_vec()),
            "/big" => ("200 OK", String::new(), vec![b'x'; 3 << 20]),
            p if p.starts_with("/redirect?to=") => (
                "302 Found",
                format!("Location: {}\r\n", &p["/redirect?to=".len()..]),
                Vec::new(),
            ),
            _ => ("404 Not Found", String::new(), Vec::new()),
        };
        let mut answer = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(&body);
        answer
    })
}

/// Runs a shell script in the sandbox with the given extra `run` flags.
fn run(work: &Path, flags: &[String], script: &str) -> RunOut {
    run_sh(work, flags, 20, script)
}

/// `curl` printing `NAME <http code>` (000 when the connection failed).
fn curl(name: &str, url: &str) -> String {
    format!("echo {name} $(curl -s -m 5 -o /dev/null -w '%{{http_code}}' '{url}')\n")
}

fn names() -> HashMap<&'static str, Vec<Ipv4Addr>> {
    let lo = Ipv4Addr::LOCALHOST;
    HashMap::from([
        ("allowed.test", vec![lo]),
        ("other.test", vec![lo]),
        ("evil.test", vec![lo]),
        ("private.test", vec![Ipv4Addr::new(10, 0, 0, 1)]),
        ("metadata.test", vec![Ipv4Addr::new(169, 254, 169, 254)]),
        ("mixed.test", vec![lo, Ipv4Addr::new(10, 0, 0, 1)]),
        ("rebind.test", vec![lo, Ipv4Addr::new(10, 0, 0, 1)]),
    ])
}

#[test]
fn allowed_host_is_reached_and_others_are_refused_with_a_reason() {
    in_netns(&[], || {
        let up = upstream();
        let (dns_port, _) = dns(names());
        let work = common::tmp();
        let p = up.port;
        let script = format!(
            "{}{}{}/usr/bin/python3 -c \"import urllib.request as u; print('PY', u.urlopen('http://allowed.test:{p}/ok').read().decode().strip())\"\n",
            curl("ALLOWED", &format!("http://allowed.test:{p}/ok")),
            curl("OTHER_HOST", &format!("http://other.test:{p}/ok")),
            curl("OTHER_PORT", &format!("http://allowed.test:{}/ok", p + 1)),
        );
        let o = run(
            work.path(),
            &flags(dns_port, &[format!("allowed.test:{p}")], &["127.0.0.1/32"]),
            &script,
        );
        assert_eq!(o.line("ALLOWED"), "200", "{}", o.stderr);
        assert_eq!(o.line("PY"), "UPSTREAM-OK");
        assert_eq!(o.line("OTHER_HOST"), "403");
        assert_eq!(o.line("OTHER_PORT"), "403");
        assert!(o.denied("other.test"), "{}", o.report);
        assert!(
            o.denied(&format!("port {} is not allowed", p + 1)),
            "{}",
            o.report
        );
        let conns = o.connections();
        assert_eq!(conns.len(), 2, "{}", o.report);
        assert!(
            conns
                .iter()
                .all(|c| c["host"] == "allowed.test" && c["address"] == "127.0.0.1")
        );
        assert_eq!(up.connections_once(2), 2);
        assert_eq!(o.code, 0);
    });
}

#[test]
fn names_resolving_to_private_addresses_are_refused_before_any_connect() {
    in_netns(&[], || {
        let up = upstream();
        let (dns_port, _) = dns(names());
        let work = common::tmp();
        let p = up.port;
        let allow: Vec<String> = [
            "allowed.test",
            "private.test",
            "metadata.test",
            "mixed.test",
        ]
        .iter()
        .map(|h| format!("{h}:{p}"))
        .collect();
        // No --allow-private: loopback is as forbidden as 10/8 and 169.254/16.
        let script = format!(
            "{}{}{}{}",
            curl("LOOPBACK", &format!("http://allowed.test:{p}/ok")),
            curl("PRIVATE", &format!("http://private.test:{p}/ok")),
            curl("METADATA", &format!("http://metadata.test:{p}/ok")),
            curl("MIXED", &format!("http://mixed.test:{p}/ok")),
        );
        let o = run(work.path(), &flags(dns_port, &allow, &[]), &script);
        for k in ["LOOPBACK", "PRIVATE", "METADATA", "MIXED"] {
            assert_eq!(o.line(k), "403", "{k}: {}", o.report);
        }
        assert!(o.denied("127.0.0.1"));
        assert!(o.denied("10.0.0.1"));
        assert!(o.denied("169.254.169.254"));
        assert_eq!(
            up.connections.load(Ordering::SeqCst),
            0,
            "the upstream was contacted"
        );
        assert!(o.connections().is_empty());
    });
}

#[test]
fn redirects_are_checked_like_requests() {
    in_netns(&[], || {
        let up = upstream();
        let (dns_port, _) = dns(names());
        let work = common::tmp();
        let p = up.port;
        let to_evil = curl(
            "TO_EVIL",
            &format!("http://allowed.test:{p}/redirect?to=http://evil.test:{p}/ok"),
        );
        // -L: curl follows the redirect itself, through the gateway again.
        let script = format!(
            "{to_evil}echo TO_OK $(curl -s -m 5 -L -o /dev/null -w '%{{http_code}}' 'http://allowed.test:{p}/redirect?to=http://allowed.test:{p}/ok')\n"
        );
        let o = run(
            work.path(),
            &flags(dns_port, &[format!("allowed.test:{p}")], &["127.0.0.1/32"]),
            &script,
        );
        // The redirect to a disallowed host is answered with a refusal, not forwarded.
        assert_eq!(o.line("TO_EVIL"), "403", "{}", o.report);
        assert!(o.denied("evil.test"), "{}", o.report);
        // A redirect to an allowed host is followed.
        assert_eq!(o.line("TO_OK"), "200", "{}", o.report);
    });
}

#[test]
fn a_changed_dns_answer_cannot_change_the_destination() {
    in_netns(&[], || {
        let up = upstream();
        let (dns_port, asked) = dns(names());
        let work = common::tmp();
        let p = up.port;
        let script = format!(
            "{}{}",
            curl("FIRST", &format!("http://rebind.test:{p}/ok")),
            curl("SECOND", &format!("http://rebind.test:{p}/ok")),
        );
        let o = run(
            work.path(),
            &flags(dns_port, &[format!("rebind.test:{p}")], &["127.0.0.1/32"]),
            &script,
        );
        assert_eq!(o.line("FIRST"), "200", "{}", o.report);
        assert!(asked.lock().unwrap().iter().any(|n| n == "rebind.test"));
        // Whatever the resolver answered later, no connection went anywhere but the vetted
        // loopback address; a later answer of 10.0.0.1 is refused, not connected to.
        for c in o.connections() {
            assert_eq!(c["address"], "127.0.0.1", "{}", o.report);
        }
        match o.line("SECOND").as_str() {
            "200" => {}
            "403" => assert!(o.denied("10.0.0.1"), "{}", o.report),
            other => panic!("unexpected {other}: {}", o.report),
        }
    });
}

#[test]
fn ip_literal_and_userinfo_tricks_are_refused() {
    in_netns(&[], || {
        let up = upstream();
        let (dns_port, _) = dns(names());
        let work = common::tmp();
        let p = up.port;
        // Raw CONNECT requests with host spellings of 127.0.0.1 and authority tricks.
        let py = format!(
            r#"
import socket
def connect(target):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    return s.recv(64).split(b"\r\n")[0].decode()
for name, t in [("DECIMAL", "2130706433:{p}"), ("OCTAL", "0177.0.0.1:{p}"), ("HEX", "0x7f.0.0.1:{p}"),
                ("SHORT", "127.1:{p}"), ("MAPPED", "[::ffff:127.0.0.1]:{p}"), ("DOTTED", "127.0.0.1:{p}"),
                ("USERINFO", "allowed.test:{p}@evil.test:{p}"), ("TRAILING_DOT", "allowed.test.:{p}")]:
    print(name, connect(t), flush=True)
"#
        );
        std::fs::write(work.path().join("tricks.py"), py).unwrap();
        std::fs::set_permissions(
            work.path().join("tricks.py"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let mut f = flags(dns_port, &[format!("allowed.test:{p}")], &["127.0.0.1/32"]);
        f.push("--ro".into());
        f.push(format!(
            "{}:/input/tricks.py",
            work.path().join("tricks.py").display()
        ));
        let o = run(
            work.path(),
            &f,
            "/usr/bin/python3 /input/tricks.py; echo done",
        );
        for k in [
            "DECIMAL", "OCTAL", "HEX", "SHORT", "MAPPED", "DOTTED", "USERINFO",
        ] {
            assert!(
                o.line(k).contains("403") || o.line(k).contains("400"),
                "{k}: {} / {}",
                o.line(k),
                o.report
            );
        }
        // A trailing dot is the same allowed name, not a bypass and not a refusal.
        assert!(o.line("TRAILING_DOT").contains("200"), "{}", o.report);
        assert_eq!(
            up.connections_once(1),
            1,
            "only the trailing-dot CONNECT may connect"
        );
    });
}

#[test]
fn direct_tcp_without_the_proxy_fails() {
    in_netns(&[], || {
        let up = upstream();
        let (dns_port, _) = dns(names());
        let work = common::tmp();
        let p = up.port;
        let script = format!(
            "/usr/bin/python3 -c \"\nimport socket\nfor port in ({p}, 53, 80):\n    try:\n        socket.create_connection(('127.0.0.1', port), timeout=2); print('DIRECT', port, 'connected')\n    except OSError as e:\n        print('DIRECT', port, 'errno', e.errno)\n\"\necho {} \n",
            "NOPROXY $(curl -s -m 5 --noproxy '*' -o /dev/null -w '%{http_code}' http://allowed.test:PORT/ok)".replace("PORT", &p.to_string())
        );
        let o = run(
            work.path(),
            &flags(dns_port, &[format!("allowed.test:{p}")], &["127.0.0.1/32"]),
            &script,
        );
        assert!(
            o.stdout.contains(&format!("DIRECT {p} errno 13")),
            "{}",
            o.stdout
        );
        assert!(o.stdout.contains("DIRECT 53 errno 13"), "{}", o.stdout);
        assert_eq!(o.line("NOPROXY"), "000");
        assert_eq!(up.connections.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn byte_and_connection_bounds_hold() {
    in_netns(&[], || {
        let up = upstream();
        let (dns_port, _) = dns(names());
        let work = common::tmp();
        let p = up.port;
        let manifest = serde_json::json!({
            "command": ["/bin/sh", "-c", format!(
                "echo BIG $(curl -s -m 10 -o /dev/null -w '%{{size_download}}' http://allowed.test:{p}/big)\n\
                 for i in 1 2 3 4; do echo CONN$i $(curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://allowed.test:{p}/ok); done")],
            "network": {"allow": [{"host": "allowed.test", "ports": [p]}], "allow_private": ["127.0.0.1/32"]},
            "limits": {"seconds": 30, "network_down_mb": 1, "network_connections": 3}
        });
        let mpath = work.path().join("m.json");
        std::fs::write(&mpath, manifest.to_string()).unwrap();
        let report = work.path().join("r.json");
        let out = Command::new(common::bin())
            .args([
                "run",
                "--egress-dns",
                &format!("127.0.0.1:{dns_port}"),
                "--report",
            ])
            .arg(&report)
            .arg("--manifest")
            .arg(&mpath)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        let big: u64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("BIG "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(big <= 1 << 20, "received {big} bytes past a 1 MiB bound");
        let codes: Vec<&str> = (1..=4)
            .map(|i| {
                stdout
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("CONN{i} ")))
                    .unwrap()
            })
            .collect();
        // Three connections in all (the big download was the first).
        assert!(
            codes.iter().filter(|c| **c == "200").count() <= 2,
            "{codes:?}"
        );
        let denials = r["denials"].to_string();
        assert!(denials.contains("network"), "{r}");
    });
}
