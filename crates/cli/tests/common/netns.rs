//! The egress tests' harness: a thread in a fresh network namespace with only loopback (so no
//! packet can leave the machine even if the gateway had a bug), a small HTTP upstream with
//! hand-written answers, a small DNS server, and `agentjail run` of a shell script with its
//! report read back.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::skip;

/// Runs `f` on a thread inside a new network namespace with only `lo`, up; `extra` addresses
/// are added to `lo` (the namespace's own non-loopback addresses). `None` (after [`skip`])
/// when the namespace cannot be made.
pub fn in_netns<T: Send + 'static>(
    extra: &'static [&'static str],
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    std::thread::spawn(move || {
        // SAFETY: unshare with a flag only changes this thread's network namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            skip(&format!(
                "cannot create a network namespace (needs root): {}",
                std::io::Error::last_os_error()
            ));
            return None;
        }
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        if !ok(&["link", "set", "lo", "up"]) {
            skip("`ip link set lo up` failed");
            return None;
        }
        for a in extra {
            assert!(ok(&["addr", "add", a, "dev", "lo"]), "ip addr add {a}");
        }
        let links = Command::new("ip").args(["-o", "link"]).output().ok()?;
        let links = String::from_utf8_lossy(&links.stdout).into_owned();
        assert_eq!(
            links.lines().count(),
            1,
            "only loopback may exist here: {links}"
        );
        Some(f())
    })
    .join()
    .expect("test thread")
}

/// A tiny HTTP/1.1 server that counts connections.
pub struct Upstream {
    pub port: u16,
    pub connections: Arc<AtomicUsize>,
}

/// Starts an [`Upstream`] on `bind`: each request's head is read, and `answer(path)` is
/// written back as the whole response (status line, headers and body), so it can send what a
/// real HTTP library would not.
pub fn upstream(bind: Ipv4Addr, answer: fn(&str) -> Vec<u8>) -> Upstream {
    let l = TcpListener::bind((bind, 0)).expect("bind the upstream");
    let port = l.local_addr().expect("upstream address").port();
    let connections = Arc::new(AtomicUsize::new(0));
    let c = connections.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            c.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let _ = s.write_all(&answer(&path));
            });
        }
    });
    Upstream { port, connections }
}

/// A minimal DNS server on 127.0.0.1: A records from `answers` (a list per name, answered in
/// turn for successive queries; a name starting with `mixed` answers every address at once),
/// empty answers for other types, NXDOMAIN for unknown names. Returns its port and the names
/// it answered A queries for.
pub fn dns(answers: HashMap<&'static str, Vec<Ipv4Addr>>) -> (u16, Arc<Mutex<Vec<String>>>) {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the DNS server");
    let port = sock.local_addr().expect("DNS server address").port();
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        let mut asked: HashMap<String, usize> = HashMap::new();
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                return;
            };
            let q = &buf[..n];
            if n < 17 {
                continue;
            }
            // Question name.
            let mut i = 12;
            let mut labels = Vec::new();
            while i < n && q[i] != 0 {
                let len = q[i] as usize;
                labels
                    .push(String::from_utf8_lossy(&q[i + 1..(i + 1 + len).min(n)]).to_lowercase());
                i += 1 + len;
            }
            let qend = i + 5;
            if qend > n {
                continue;
            }
            let qtype = u16::from_be_bytes([q[i + 1], q[i + 2]]);
            let name = labels.join(".");
            let mut resp = Vec::new();
            resp.extend_from_slice(&q[0..2]);
            let known = answers.get(name.as_str());
            let rcode = if known.is_some() { 0 } else { 3 };
            resp.extend_from_slice(&[0x81, 0x80 | rcode]);
            resp.extend_from_slice(&[0, 1]);
            let ips: Vec<Ipv4Addr> = match (known, qtype) {
                (Some(list), 1) => {
                    log2.lock().unwrap().push(name.clone());
                    let k = asked.entry(name.clone()).or_insert(0);
                    let ip = list[(*k).min(list.len() - 1)];
                    *k += 1;
                    if name.starts_with("mixed") {
                        list.clone()
                    } else {
                        vec![ip]
                    }
                }
                _ => Vec::new(),
            };
            resp.extend_from_slice(&(ips.len() as u16).to_be_bytes());
            resp.extend_from_slice(&[0, 0, 0, 0]);
            resp.extend_from_slice(&q[12..qend]);
            for ip in ips {
                resp.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
                resp.extend_from_slice(&ip.octets());
            }
            let _ = sock.send_to(&resp, peer);
        }
    });
    (port, log)
}

/// What one `agentjail run` produced, with its report (`Null` when there is none).
pub struct RunOut {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub report: Value,
}

impl RunOut {
    /// The rest of the stdout line that starts with `KEY `.
    pub fn line(&self, key: &str) -> String {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no {key} line in {}\n{}", self.stdout, self.stderr))
            .to_string()
    }

    /// The network denials of the report whose detail contains `needle`.
    pub fn denials(&self, needle: &str) -> Vec<Value> {
        self.report["denials"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|d| {
                        d["kind"] == "network"
                            && d["detail"].as_str().unwrap_or("").contains(needle)
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the report has a network denial whose detail contains `needle`.
    pub fn denied(&self, needle: &str) -> bool {
        !self.denials(needle).is_empty()
    }

    /// The report's `network.connections`.
    pub fn connections(&self) -> Vec<Value> {
        self.report["network"]["connections"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// Runs `/bin/sh -c SCRIPT` in the sandbox with the extra `run` flags and `--timeout SECONDS`;
/// the report is written below `work`.
pub fn run_sh(work: &Path, flags: &[String], seconds: u32, script: &str) -> RunOut {
    let report = work.join(format!("report-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let out = Command::new(super::bin())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .args(flags)
        .args([
            "--timeout",
            &seconds.to_string(),
            "--",
            "/bin/sh",
            "-c",
            script,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run agentjail");
    let super::Out {
        code,
        stdout,
        stderr,
    } = out.into();
    RunOut {
        code,
        stdout,
        stderr,
        report: std::fs::read(&report)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null),
    }
}

/// The `run` flags of an egress test: the DNS server, the allowed hosts and the allowed private
/// addresses.
pub fn egress_flags(dns_port: u16, allow: &[String], private: &[&str]) -> Vec<String> {
    let mut f = vec!["--egress-dns".to_string(), format!("127.0.0.1:{dns_port}")];
    for a in allow {
        f.push("--allow-host".into());
        f.push(a.clone());
    }
    for p in private {
        f.push("--allow-private".into());
        f.push(p.to_string());
    }
    f
}
