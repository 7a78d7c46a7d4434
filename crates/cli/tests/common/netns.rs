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

impl Upstream {
    /// The connections accepted so far, once there are at least `n` (or after 10 s): the
    /// gateway's connect completes in the kernel before this upstream's accept loop counts it,
    /// so a count read right after the run can lag behind on a loaded machine.
    pub fn connections_once(&self, n: usize) -> usize {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let c = self.connections.load(Ordering::SeqCst);
            if c >= n || std::time::Instant::now() > deadline {
                return c;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
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

/// Test hosts on one machine (issue #19's fleet topology): each host is a named network
/// namespace `agentjail-t-<pid>-<n>-<host>` with `lo` and one veth link `eth0` at
/// `10.201.0.<i>/24`, whose peer (`v-<host>`) is a port of the bridge `br0` in a "switch"
/// namespace. Nothing is added to the host's own namespace (no address, no route), so no
/// packet of the test can leave the machine. Every namespace is deleted on drop (also when a
/// test panics); kill the processes inside before (declare the topology first).
pub struct Topology {
    prefix: String,
    hosts: Vec<String>,
}

fn ip_ok(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

static TOPOLOGIES: AtomicUsize = AtomicUsize::new(0);

impl Topology {
    /// Makes the switch and one host per name (at most 6 bytes each; host `i` of `hosts` gets
    /// `10.201.0.<i+1>`). `None` (after [`skip`]) when `ip` or named namespaces are missing.
    pub fn new(hosts: &[&str]) -> Option<Topology> {
        if Command::new("ip").arg("-V").output().is_err() {
            skip("`ip` (iproute2) not found");
            return None;
        }
        if Command::new("nsenter").arg("--version").output().is_err() {
            skip("`nsenter` (util-linux) not found");
            return None;
        }
        // Namespaces left by a test process that was killed (drop never ran): their pid is gone.
        for e in std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix("agentjail-t-")
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = ip_ok(&["netns", "del", &name]);
            }
        }
        let n = TOPOLOGIES.fetch_add(1, Ordering::SeqCst);
        let mut t = Topology {
            prefix: format!("agentjail-t-{}-{n}-", std::process::id()),
            hosts: Vec::new(),
        };
        let sw = t.ns("sw");
        if let Err(e) = ip_ok(&["netns", "add", &sw]) {
            skip(&format!("cannot create a named network namespace: {e}"));
            return None;
        }
        t.hosts.push("sw".into());
        let setup = |t: &mut Topology| -> Result<(), String> {
            ip_ok(&["-n", &sw, "link", "set", "lo", "up"])?;
            ip_ok(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
            ip_ok(&["-n", &sw, "link", "set", "br0", "up"])?;
            for (i, h) in hosts.iter().enumerate() {
                assert!(h.len() <= 6 && *h != "sw", "host name {h:?}");
                let ns = t.ns(h);
                ip_ok(&["netns", "add", &ns])?;
                t.hosts.push(h.to_string());
                let port = format!("v-{h}");
                ip_ok(&[
                    "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                    "netns", &ns,
                ])?;
                ip_ok(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
                ip_ok(&["-n", &ns, "link", "set", "lo", "up"])?;
                let a = format!("10.201.0.{}/24", i + 1);
                ip_ok(&["-n", &ns, "addr", "add", &a, "dev", "eth0"])?;
                ip_ok(&["-n", &ns, "link", "set", "eth0", "up"])?;
            }
            Ok(())
        };
        if let Err(e) = setup(&mut t) {
            // Under CI this is a failure; elsewhere (no CAP_NET_ADMIN…) a skip.
            skip(&format!("cannot build the test hosts: {e}"));
            return None;
        }
        Some(t)
    }

    /// The namespace's name of `host`.
    pub fn ns(&self, host: &str) -> String {
        format!("{}{host}", self.prefix)
    }

    /// The namespace's file of `host` (for `nsenter --net=`).
    pub fn ns_path(&self, host: &str) -> String {
        format!("/run/netns/{}", self.ns(host))
    }

    /// `host`'s address on the switch, e.g. `10.201.0.3`.
    pub fn addr(&self, host: &str) -> String {
        let i = self
            .hosts
            .iter()
            .skip(1)
            .position(|h| h == host)
            .unwrap_or_else(|| panic!("no test host {host}"));
        format!("10.201.0.{}", i + 1)
    }

    /// The command prefix that runs a program on `host`: `nsenter --net=… --` (only the network
    /// namespace changes: no mount tricks, so /sys/fs/cgroup stays what the sandbox expects).
    pub fn wrap(&self, host: &str) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!("--net={}", self.ns_path(host)),
            "--".into(),
        ]
    }

    /// Plugs `host`'s cable out of the switch (`down`) or back in: its switch port goes down,
    /// so its packets are dropped silently and `eth0` loses its carrier.
    pub fn set_link(&self, host: &str, up: bool) {
        let port = format!("v-{host}");
        ip_ok(&[
            "-n",
            &self.ns("sw"),
            "link",
            "set",
            &port,
            if up { "up" } else { "down" },
        ])
        .unwrap();
    }

    /// Runs `f` on a new thread whose network namespace is `host`'s (so is every thread it
    /// starts, e.g. an HTTP client's runtime); a panic in `f` is the caller's panic.
    pub fn run_on<T: Send>(&self, host: &str, f: impl FnOnce() -> T + Send) -> T {
        let path = self.ns_path(host);
        let r = std::thread::scope(|s| {
            s.spawn(move || {
                use std::os::fd::AsRawFd;
                let ns = std::fs::File::open(&path).unwrap();
                // SAFETY: setns with an open namespace file and CLONE_NEWNET only moves this
                // thread (made for it) into that network namespace; `ns` outlives the call.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
        });
        match r {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for h in self.hosts.iter().rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(h)])
                .stderr(Stdio::null())
                .status();
        }
    }
}
