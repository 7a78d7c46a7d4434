//! `agentjail selftest --egress`: attacks on the egress gateway.
//!
//! The probes need destinations, and the self-test must never send a packet off this machine:
//! the group re-executes this binary with `unshare --net` (root), i.e. in a new network
//! namespace holding only loopback. There, the inner self-test brings `lo` up, checks that no
//! other interface exists, starts a fake HTTP upstream and a fake name server on 127.0.0.1 and
//! runs sandboxes whose only way out is the gateway (`--allow-host`, `--egress-dns`). The outer
//! self-test takes the inner one's verdicts.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::kit::{Env, Group, Probe, RunOut, Tier, Verdict};

pub static GROUPS: &[Group] = &[Group {
    name: "egress",
    tiers: &[Tier::Native],
    probes: EGRESS,
    run: egress,
}];

const EGRESS: &[Probe] = &[
    Probe {
        id: "egress.allowed",
        layer: "egress gateway",
        attempt: "fetch an allowed name through the gateway",
        expect: "works (control: the gateway is reachable and forwards)",
    },
    Probe {
        id: "egress.not_allowed",
        layer: "egress gateway policy",
        attempt: "fetch a name that is not on the allowlist",
        expect: "403, reported; the upstream not contacted for it",
    },
    Probe {
        id: "egress.private",
        layer: "egress gateway address checks",
        attempt: "allowed names that resolve to 10.0.0.1, and to loopback without --allow-private",
        expect: "403 and reported before any connect",
    },
    Probe {
        id: "egress.metadata",
        layer: "egress gateway address checks",
        attempt: "the cloud metadata address 169.254.169.254, by an allowed name and as a literal",
        expect: "refused and reported",
    },
    Probe {
        id: "egress.ip_literal",
        layer: "egress gateway host parsing",
        attempt: "CONNECT to loopback spelled 2130706433, 0177.0.0.1, 0x7f.0.0.1, 127.1, [::ffff:127.0.0.1]",
        expect: "each refused (400/403)",
    },
    Probe {
        id: "egress.rebinding",
        layer: "egress gateway (resolve once, vet, connect to the vetted address)",
        attempt: "a name answered with loopback, then with 10.0.0.1",
        expect: "no connection to anything but the vetted address",
    },
    Probe {
        id: "egress.redirect",
        layer: "egress gateway policy",
        attempt: "the allowed upstream redirects to a name not allowed",
        expect: "403 instead of the redirect's target; reported",
    },
    Probe {
        id: "egress.userinfo",
        layer: "egress gateway URL parsing",
        attempt: "allowed.test:P@evil.test:P as a CONNECT target and in a URL",
        expect: "refused (400/403)",
    },
    Probe {
        id: "egress.direct",
        layer: "Landlock TCP rules + network namespace",
        attempt: "connect straight to the upstream's port, around the proxy",
        expect: "EACCES; the upstream sees nothing from it",
    },
];

/// The outer half: re-run the egress probes in a private network namespace.
fn egress(env: &Env, _tier: Tier) -> Vec<(&'static str, Verdict)> {
    if env.egress_inner {
        return inner(env);
    }
    let all = |v: Verdict| EGRESS.iter().map(|p| (p.id, v.clone())).collect();
    if !super::kit::rustix_is_root() {
        return all(Verdict::Skip(
            "needs root to create a private network namespace for the fake upstreams".into(),
        ));
    }
    for tool in ["unshare", "ip"] {
        if which(tool).is_none() {
            return all(Verdict::Skip(format!(
                "`{tool}` not found (util-linux, iproute2)"
            )));
        }
    }
    let exe = match std::fs::read_link("/proc/self/exe") {
        Ok(e) => e,
        Err(e) => return all(Verdict::Fail(format!("/proc/self/exe: {e}"))),
    };
    let out = Command::new("unshare")
        .arg("--net")
        .arg("--")
        .arg(exe)
        .args([
            "selftest",
            "--json",
            "--tier",
            "native",
            "--egress",
            "--egress-inner",
            "--only",
            "egress.",
        ])
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => return all(Verdict::Fail(format!("unshare --net: {e}"))),
    };
    let v: Value = match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(_) => {
            let err = String::from_utf8_lossy(&out.stderr);
            return all(Verdict::Fail(format!(
                "the self-test in a private network namespace printed no result: {}",
                super::kit::printable(err.lines().last().unwrap_or(""), 300)
            )));
        }
    };
    EGRESS
        .iter()
        .map(|p| {
            let r = v["probes"]
                .as_array()
                .and_then(|a| a.iter().find(|r| r["id"] == p.id));
            let d = r
                .and_then(|r| r["detail"].as_str())
                .unwrap_or("no verdict")
                .to_string();
            let verdict = match r.and_then(|r| r["outcome"].as_str()) {
                Some("pass") => Verdict::Pass(d),
                Some("skip") => Verdict::Skip(d),
                _ => Verdict::Fail(d),
            };
            (p.id, verdict)
        })
        .collect()
}

fn which(tool: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// A tiny HTTP/1.1 upstream on 127.0.0.1: `/ok`, `/redirect?to=URL`; counts connections.
fn upstream() -> std::io::Result<(u16, Arc<AtomicUsize>)> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let port = l.local_addr()?.port();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            c.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, extra, body) = if path == "/ok" {
                    ("200 OK", String::new(), "UPSTREAM-OK\n")
                } else if let Some(to) = path.strip_prefix("/redirect?to=") {
                    ("302 Found", format!("Location: {to}\r\n"), "")
                } else {
                    ("404 Not Found", String::new(), "")
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
                    body.len()
                );
            });
        }
    });
    Ok((port, count))
}

/// A minimal DNS server on 127.0.0.1: A records from `answers`, one per query in turn (the
/// last repeated), NXDOMAIN for unknown names, empty answers for other types.
fn dns(answers: HashMap<&'static str, Vec<Ipv4Addr>>) -> std::io::Result<u16> {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    let port = sock.local_addr()?.port();
    std::thread::spawn(move || {
        let asked: Mutex<HashMap<String, usize>> = Mutex::new(HashMap::new());
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                return;
            };
            let Some(resp) = dns_answer(buf.get(..n).unwrap_or_default(), &answers, &asked) else {
                continue;
            };
            let _ = sock.send_to(&resp, peer);
        }
    });
    Ok(port)
}

fn dns_answer(
    q: &[u8],
    answers: &HashMap<&'static str, Vec<Ipv4Addr>>,
    asked: &Mutex<HashMap<String, usize>>,
) -> Option<Vec<u8>> {
    let n = q.len();
    if n < 17 {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    while i < n && *q.get(i)? != 0 {
        let len = *q.get(i)? as usize;
        labels.push(String::from_utf8_lossy(q.get(i + 1..(i + 1 + len).min(n))?).to_lowercase());
        i += 1 + len;
    }
    let qend = i + 5;
    if qend > n {
        return None;
    }
    let qtype = u16::from_be_bytes([*q.get(i + 1)?, *q.get(i + 2)?]);
    let name = labels.join(".");
    let known = answers.get(name.as_str());
    let mut resp = Vec::new();
    resp.extend_from_slice(q.get(0..2)?);
    resp.extend_from_slice(&[0x81, 0x80 | if known.is_some() { 0 } else { 3 }]);
    resp.extend_from_slice(&[0, 1]);
    let ips: Vec<Ipv4Addr> = match (known, qtype) {
        (Some(list), 1) => {
            let mut asked = asked.lock().ok()?;
            let k = asked.entry(name).or_insert(0);
            let ip = *list.get((*k).min(list.len().saturating_sub(1)))?;
            *k += 1;
            vec![ip]
        }
        _ => Vec::new(),
    };
    resp.extend_from_slice(&(ips.len() as u16).to_be_bytes());
    resp.extend_from_slice(&[0, 0, 0, 0]);
    resp.extend_from_slice(q.get(12..qend)?);
    for ip in ips {
        resp.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        resp.extend_from_slice(&ip.octets());
    }
    Some(resp)
}

/// Requests through the gateway's proxy (127.0.0.1:3128 inside the sandbox), printing
/// `HTTP NAME <status>` (or `errno=N`).
const EGRESS_PY: &str = r#"
def first_line(s):
    data = b""
    while b"\r\n" not in data and len(data) < 4096:
        chunk = s.recv(512)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n")[0].decode(errors="replace")
def get(name, url):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=8)
        host = url.split("/")[2]
        s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (url, host)).encode())
        line = first_line(s)
        print("HTTP", name, line.split(" ")[1] if " " in line else "none", flush=True)
    except OSError as e:
        print("HTTP", name, "errno=%d" % (e.errno or 0), flush=True)
def connect(name, target):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=8)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        line = first_line(s)
        print("HTTP", name, line.split(" ")[1] if " " in line else "none", flush=True)
    except OSError as e:
        print("HTTP", name, "errno=%d" % (e.errno or 0), flush=True)
P = @P@
get("allowed", "http://allowed.test:%d/ok" % P)
get("other", "http://other.test:%d/ok" % P)
get("private", "http://private.test:%d/ok" % P)
get("metadata", "http://metadata.test:%d/ok" % P)
connect("metadata_literal", "169.254.169.254:80")
for name, t in [("decimal", "2130706433"), ("octal", "0177.0.0.1"), ("hex", "0x7f.0.0.1"),
                ("short", "127.1"), ("mapped", "[::ffff:127.0.0.1]")]:
    connect("literal_" + name, "%s:%d" % (t, P))
connect("userinfo_connect", "allowed.test:%d@evil.test:%d" % (P, P))
get("userinfo_url", "http://allowed.test:%d@evil.test:%d/ok" % (P, P))
get("redirect", "http://allowed.test:%d/redirect?to=http://evil.test:%d/ok" % (P, P))
get("rebind1", "http://rebind.test:%d/ok" % P)
get("rebind2", "http://rebind.test:%d/ok" % P)
attempt("direct", lambda: socket.create_connection(("127.0.0.1", P), timeout=3))
"#;

const LOOPBACK_PY: &str = r#"
def first_line(s):
    return s.recv(512).split(b"\r\n")[0].decode(errors="replace")
try:
    s = socket.create_connection(("127.0.0.1", 3128), timeout=8)
    s.sendall(("GET http://allowed.test:@P@/ok HTTP/1.1\r\nHost: allowed.test:@P@\r\nConnection: close\r\n\r\n").encode())
    line = first_line(s)
    print("HTTP loopback", line.split(" ")[1] if " " in line else "none", flush=True)
except OSError as e:
    print("HTTP loopback errno=%d" % (e.errno or 0), flush=True)
"#;

fn http(o: &RunOut, name: &str) -> String {
    o.line(&format!("HTTP {name} "))
        .unwrap_or_else(|| "no result".into())
}

fn net_denied(o: &RunOut, needle: &str) -> bool {
    o.denied("network", needle)
}

/// The inner half, in the private network namespace.
fn inner(env: &Env) -> Vec<(&'static str, Verdict)> {
    let all = |v: Verdict| EGRESS.iter().map(|p| (p.id, v.clone())).collect();
    let up = Command::new(which("ip").unwrap_or_else(|| "ip".into()))
        .args(["link", "set", "lo", "up"])
        .status();
    if !up.map(|s| s.success()).unwrap_or(false) {
        return all(Verdict::Fail("`ip link set lo up` failed".into()));
    }
    let links = Command::new(which("ip").unwrap_or_else(|| "ip".into()))
        .args(["-o", "link"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if links.lines().count() != 1 {
        return all(Verdict::Fail(format!(
            "refusing to run: this network namespace is not loopback-only: {}",
            super::kit::printable(&links, 300)
        )));
    }
    let lo = Ipv4Addr::LOCALHOST;
    let names = HashMap::from([
        ("allowed.test", vec![lo]),
        ("other.test", vec![lo]),
        ("evil.test", vec![lo]),
        ("private.test", vec![Ipv4Addr::new(10, 0, 0, 1)]),
        ("metadata.test", vec![Ipv4Addr::new(169, 254, 169, 254)]),
        ("rebind.test", vec![lo, Ipv4Addr::new(10, 0, 0, 1)]),
    ]);
    let started = upstream().and_then(|(p, c)| dns(names).map(|d| (p, c, d)));
    let (port, count, dns_port) = match started {
        Ok(x) => x,
        Err(e) => return all(Verdict::Fail(format!("fake upstream/DNS: {e}"))),
    };
    let mut flags: Vec<String> = vec![
        "--egress-dns".into(),
        format!("127.0.0.1:{dns_port}"),
        "--allow-private".into(),
        "127.0.0.1/32".into(),
        "--timeout".into(),
        "60".into(),
    ];
    for h in [
        "allowed.test",
        "private.test",
        "metadata.test",
        "rebind.test",
    ] {
        flags.push("--allow-host".into());
        flags.push(format!("{h}:{port}"));
    }
    let o = env.py(
        Tier::Native,
        &EGRESS_PY.replace("@P@", &port.to_string()),
        &flags,
    );
    if !o.complete() {
        return all(Verdict::Fail(o.incomplete()));
    }
    let contacted = count.load(Ordering::SeqCst);
    let conns: Vec<Value> = o.report["network"]["connections"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let only_vetted = conns.iter().all(|c| c["address"] == "127.0.0.1");

    // Loopback without --allow-private, in a run of its own.
    let before = count.load(Ordering::SeqCst);
    let o2 = env.py(
        Tier::Native,
        &LOOPBACK_PY.replace("@P@", &port.to_string()),
        &[
            "--egress-dns".into(),
            format!("127.0.0.1:{dns_port}"),
            "--allow-host".into(),
            format!("allowed.test:{port}"),
            "--timeout".into(),
            "60".into(),
        ],
    );
    let loopback_contacted = count.load(Ordering::SeqCst) - before;

    let refused = |v: &str| v == "403" || v == "400";
    let allowed = if http(&o, "allowed") == "200" {
        Verdict::Pass("200 through the gateway".into())
    } else {
        Verdict::Fail(format!(
            "the allowed destination did not work: {}",
            http(&o, "allowed")
        ))
    };
    // Without a working control, refusals prove nothing.
    let control = |v: Verdict| match (&allowed, v) {
        (Verdict::Pass(_), v) => v,
        (_, Verdict::Pass(d)) => Verdict::Fail(format!(
            "{d}, but the allowed destination failed too, so this proves nothing"
        )),
        (_, v) => v,
    };
    let other = if refused(&http(&o, "other")) && net_denied(&o, "other.test") {
        Verdict::Pass("403, reported".into())
    } else {
        Verdict::Fail(format!("other.test: {}", http(&o, "other")))
    };
    let private = if refused(&http(&o, "private"))
        && net_denied(&o, "10.0.0.1")
        && o2.complete()
        && refused(&http(&o2, "loopback"))
        && net_denied(&o2, "127.0.0.1")
        && loopback_contacted == 0
    {
        Verdict::Pass(
            "10.0.0.1 and (without --allow-private) 127.0.0.1 refused and reported; no connect"
                .into(),
        )
    } else {
        Verdict::Fail(format!(
            "private.test: {}; loopback without --allow-private: {} ({} upstream connection(s))",
            http(&o, "private"),
            http(&o2, "loopback"),
            loopback_contacted
        ))
    };
    let metadata = if refused(&http(&o, "metadata"))
        && net_denied(&o, "169.254.169.254")
        && refused(&http(&o, "metadata_literal"))
    {
        Verdict::Pass("refused by name and as a literal; reported".into())
    } else {
        Verdict::Fail(format!(
            "by name: {}, literal: {}",
            http(&o, "metadata"),
            http(&o, "metadata_literal")
        ))
    };
    let literals: Vec<String> = ["decimal", "octal", "hex", "short", "mapped"]
        .iter()
        .map(|n| format!("{n}: {}", http(&o, &format!("literal_{n}"))))
        .collect();
    let literal = if ["decimal", "octal", "hex", "short", "mapped"]
        .iter()
        .all(|n| refused(&http(&o, &format!("literal_{n}"))))
    {
        Verdict::Pass(format!("refused ({})", literals.join(", ")))
    } else {
        Verdict::Fail(format!("not all refused: {}", literals.join(", ")))
    };
    let rebind = match (http(&o, "rebind1").as_str(), http(&o, "rebind2").as_str()) {
        _ if !only_vetted => Verdict::Fail(format!(
            "a connection went to another address: {}",
            Value::Array(conns.clone())
        )),
        ("200", "200") => Verdict::Pass("both went to the vetted 127.0.0.1".into()),
        ("200", "403") if net_denied(&o, "10.0.0.1") => {
            Verdict::Pass("the changed answer (10.0.0.1) was refused, not connected to".into())
        }
        (a, b) => Verdict::Fail(format!("rebind: {a}, {b}")),
    };
    let redirect = if refused(&http(&o, "redirect")) && net_denied(&o, "evil.test") {
        Verdict::Pass("403 instead of following to evil.test; reported".into())
    } else {
        Verdict::Fail(format!("redirect: {}", http(&o, "redirect")))
    };
    let userinfo = if refused(&http(&o, "userinfo_connect")) && refused(&http(&o, "userinfo_url")) {
        Verdict::Pass("refused as CONNECT target and in a URL".into())
    } else {
        Verdict::Fail(format!(
            "CONNECT: {}, URL: {}",
            http(&o, "userinfo_connect"),
            http(&o, "userinfo_url")
        ))
    };
    let direct = match o.result("direct").as_deref() {
        Some("errno=13") => Verdict::Pass(format!(
            "EACCES; the upstream saw {contacted} connection(s), all through the gateway"
        )),
        r => Verdict::Fail(format!("direct connect: {r:?}")),
    };
    vec![
        ("egress.not_allowed", control(other)),
        ("egress.private", control(private)),
        ("egress.metadata", control(metadata)),
        ("egress.ip_literal", control(literal)),
        ("egress.rebinding", control(rebind)),
        ("egress.redirect", control(redirect)),
        ("egress.userinfo", control(userinfo)),
        ("egress.direct", control(direct)),
        ("egress.allowed", allowed),
    ]
}
