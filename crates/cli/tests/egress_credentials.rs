//! Credentials bound to a destination (issue #20, item 3), attacked from inside the sandbox.
//!
//! The manifest binds `Authorization: <secret>` to `api.test` for paths under `/v1/`. The
//! secret lives only in the environment of the `agentjail` process (the supervisor). A TLS
//! upstream (Python's `http.server` behind `ssl`, with a certificate from a test CA made by
//! `openssl`) records every request's `Host`, path and `Authorization` headers, and echoes
//! the header back on `/v1/echo`. Everything runs on a thread that first moved into a fresh
//! network namespace with only loopback (`unshare(CLONE_NEWNET)`), so nothing can leave the
//! machine.
//!
//! The probe prints one line per case. For the secret itself it prints `SECRET_SEEN` (the
//! attack worked) or `NOT_SEEN`, and a positive control shows that the same search finds a
//! planted string, so "not found" cannot mean "the search failed".

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// The shared test DNS server (one A record per known name, NXDOMAIN otherwise).
fn dns(answers: HashMap<&'static str, Ipv4Addr>) -> u16 {
    common::netns::dns(answers.into_iter().map(|(k, v)| (k, vec![v])).collect()).0
}

/// Kills the child when dropped.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) -> bool {
    Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A test CA (`ca.pem`), an unrelated CA (`wrong-ca.pem`) and a leaf for api.test and
/// other.test signed by the first (`leaf.pem`, `leaf.key`), in `dir`.
fn make_pki(dir: &Path) -> bool {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca = |name: &str, cn: &str| {
        let key = format!("{name}.key");
        let pem = format!("{name}.pem");
        let subj = format!("/CN={cn}");
        let mut a = vec!["req", "-x509"];
        a.extend(ec);
        a.extend(["-days", "2", "-subj", &subj, "-keyout", &key, "-out", &pem]);
        openssl(dir, &a)
    };
    if !(ca("ca", "agentjail test upstream CA") && ca("wrong-ca", "some other CA")) {
        return false;
    }
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:api.test,DNS:other.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n",
    )
    .unwrap();
    let mut a = vec!["req"];
    a.extend(ec);
    a.extend([
        "-subj",
        "/CN=api.test",
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
    ]);
    openssl(dir, &a)
        && openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
                "-out",
                "leaf.pem",
            ],
        )
}

/// The upstream: HTTPS on 127.0.0.1:`port`, one JSON line per request in `log`.
const UPSTREAM: &str = r#"
import http.server, json, ssl, sys
port, cert, key, log = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        auth = self.headers.get_all("Authorization") or []
        with open(log, "a") as f:
            f.write(json.dumps({"host": self.headers.get("Host"), "path": self.path, "auth": auth}) + "\n")
        body = b"UPSTREAM-OK"
        self.send_response(200)
        if self.path.startswith("/v1/echo"):
            for a in auth:
                self.send_header("X-Echo", "you sent " + a)
                self.send_header("Set-Cookie", "t=" + a + "; Secure")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print("READY", flush=True)
srv.serve_forever()
"#;

fn tls_upstream(dir: &Path, port: u16) -> Option<Reap> {
    if !make_pki(dir) {
        common::skip("openssl could not make the test certificates");
        return None;
    }
    std::fs::write(dir.join("upstream.py"), UPSTREAM).unwrap();
    let child = Command::new("python3")
        .arg(dir.join("upstream.py"))
        .arg(port.to_string())
        .arg(dir.join("leaf.pem"))
        .arg(dir.join("leaf.key"))
        .arg(dir.join("upstream.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        common::skip("python3 is not installed");
        return None;
    };
    let child = Reap(child);
    for _ in 0..100 {
        if std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Some(child);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the TLS upstream did not start");
}

/// What the upstream saw: (host, path, authorization headers).
fn seen(dir: &Path) -> Vec<(String, String, Vec<String>)> {
    std::fs::read_to_string(dir.join("upstream.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["host"].as_str().unwrap_or("").to_string(),
                v["path"].as_str().unwrap_or("").to_string(),
                v["auth"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect()
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    report_text: String,
    report: Value,
}

impl Out {
    fn line(&self, key: &str) -> String {
        self.stdout
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("{key} "))
                    .or((l == key).then_some(""))
            })
            .unwrap_or_else(|| panic!("no {key} line in {}\n{}", self.stdout, self.stderr))
            .trim()
            .to_string()
    }
    fn denied(&self, needle: &str) -> bool {
        self.report["denials"].as_array().is_some_and(|a| {
            a.iter().any(|d| {
                d["kind"] == "network" && d["detail"].as_str().unwrap_or("").contains(needle)
            })
        })
    }
}

/// Runs `script` in the sandbox with a manifest binding the secret (from the supervisor's
/// environment variable `AJ_TEST_TOKEN`) to api.test, paths `/v1/`.
fn run(
    work: &Path,
    dns_port: u16,
    port: u16,
    secret: Option<&str>,
    upstream_ca: &Path,
    script: &str,
) -> Out {
    run_on(work, dns_port, &[port], port, secret, upstream_ca, script)
}

/// [`run`] with the allowlist admitting api.test and other.test on `ports`, and the
/// credential bound to api.test's `cred_port` (given as `ports` unless it is 443, the
/// default).
fn run_on(
    work: &Path,
    dns_port: u16,
    ports: &[u16],
    cred_port: u16,
    secret: Option<&str>,
    upstream_ca: &Path,
    script: &str,
) -> Out {
    let mut credential = serde_json::json!({
        "host": "api.test",
        "header": "Authorization",
        "value_from": "env:AJ_TEST_TOKEN",
        "paths": ["/v1/"]
    });
    if cred_port != 443 {
        credential["ports"] = serde_json::json!([cred_port]);
    }
    let manifest = serde_json::json!({
        "command": ["/bin/sh", "-c", script],
        "network": {
            "allow": [
                {"host": "api.test", "ports": ports},
                {"host": "other.test", "ports": ports}
            ],
            "allow_private": ["127.0.0.1/32"],
            "credentials": [credential],
            "upstream_ca_file": upstream_ca.to_str().unwrap()
        },
        "limits": {"seconds": 60}
    });
    let mpath = work.join("m.json");
    std::fs::write(&mpath, manifest.to_string()).unwrap();
    let report = work.join("report.json");
    let _ = std::fs::remove_file(&report);
    let mut cmd = Command::new(common::bin());
    cmd.args(["run", "--egress-dns", &format!("127.0.0.1:{dns_port}")])
        .arg("--report")
        .arg(&report)
        .arg("--manifest")
        .arg(&mpath)
        .stdin(Stdio::null())
        .env_remove("AJ_TEST_TOKEN");
    if let Some(s) = secret {
        cmd.env("AJ_TEST_TOKEN", s);
    }
    let out = cmd.output().unwrap();
    let report_text = std::fs::read_to_string(&report).unwrap_or_default();
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: serde_json::from_str(&report_text).unwrap_or(Value::Null),
        report_text,
    }
}

fn names() -> HashMap<&'static str, Ipv4Addr> {
    HashMap::from([
        ("api.test", Ipv4Addr::LOCALHOST),
        ("other.test", Ipv4Addr::LOCALHOST),
    ])
}

/// The secret's fixed part: the probe searches for it, built from pieces so that the script
/// text itself never holds it.
const SECRET_PART: &str = "sk-agentjail-test-s3cret";

/// Python's own TLS stack (OpenSSL through `ssl`, trusting SSL_CERT_FILE), and a ClientHello
/// naming another host inside a CONNECT to the credentialed one.
const PY_PROBE: &str = r#"/usr/bin/python3 - <<'PY'
import os, socket, ssl, urllib.request
try:
    print("PY", urllib.request.urlopen("API/v1/py", timeout=10).read().decode(), flush=True)
except Exception as e:
    print("PY ERR", type(e).__name__, e, flush=True)
ph, pp = os.environ["https_proxy"].split("//")[-1].strip("/").rsplit(":", 1)
try:
    s = socket.create_connection((ph, int(pp)), timeout=10)
    s.sendall(b"CONNECT api.test:PORT HTTP/1.1\r\nHost: api.test:PORT\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    t = ctx.wrap_socket(s, server_hostname="other.test")
    t.sendall(b"GET /v1/fronted HTTP/1.1\r\nHost: api.test\r\n\r\n")
    print("FRONTED OK", t.recv(64)[:12], flush=True)
except Exception as e:
    print("FRONTED ERR", type(e).__name__, flush=True)
PY
"#;

fn probe(port: u16) -> String {
    let get = |name: &str, extra: &str, url: &str| {
        format!(
            "echo {name} $(curl -s -m 10 {extra} -w ' %{{http_code}}' '{url}' 2>/dev/null || echo CURL_FAILED)\n"
        )
    };
    let api = format!("https://api.test:{port}");
    let mut s = String::from("S=\"sk-agentjail\"\"-test-s3cret\"\n");
    s += &get("V1", "", &format!("{api}/v1/data"));
    s += &get("V2", "", &format!("{api}/v2/data"));
    s += &get(
        "OVERRIDE_V1",
        "-H 'Authorization: Bearer MINE-v1'",
        &format!("{api}/v1/override"),
    );
    s += &get(
        "OVERRIDE_V2",
        "-H 'Authorization: Bearer MINE-v2'",
        &format!("{api}/v2/override"),
    );
    s += &get(
        "OTHER_HOST",
        "-k",
        &format!("https://other.test:{port}/v1/data"),
    );
    s += &get(
        "DOTDOT",
        "--path-as-is -o /dev/null",
        &format!("{api}/v1/../admin"),
    );
    s += &format!(
        "curl -s -m 10 -D /tmp/echo-head -o /dev/null '{api}/v1/echo'\n\
         if grep -qF \"$S\" /tmp/echo-head; then echo ECHO SECRET_SEEN; \
         elif grep -qi '^x-echo' /tmp/echo-head; then echo ECHO OTHER_ECHO; \
         elif grep -q '^HTTP/1.1 200' /tmp/echo-head; then echo ECHO STRIPPED; \
         else echo ECHO FAILED; fi\n"
    );
    // Python's own TLS stack (OpenSSL through `ssl`, trusting SSL_CERT_FILE), and a ClientHello
    // naming another host inside the CONNECT to the credentialed one.
    s += &PY_PROBE
        .replace("API", &api)
        .replace("PORT", &port.to_string());
    s += "if env | grep -qF \"$S\"; then echo ENV SECRET_SEEN; else echo ENV NOT_SEEN; fi\n";
    s += "echo planted-control-value > /tmp/control\n";
    s += "f=$(grep -rlsF \"$S\" /etc /tmp /work /output /proc/[0-9]*/environ 2>/dev/null | head -1); echo FILES ${f:-NOT_SEEN}\n";
    s += "c=$(grep -rlsF planted-control /etc /tmp /work /output /proc/[0-9]*/environ 2>/dev/null | head -1); echo CONTROL ${c:-NOT_FOUND}\n";
    // The supervisor (and its gateway thread) is not among the processes the sandbox sees.
    s += "n=0; for p in /proc/[0-9]*; do if tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q \"agentjail\"\" run\"; then n=$((n+1)); fi; done; echo SUPERVISOR_VISIBLE $n\n";
    s += "echo CA_KEY $(grep -rlsE 'PRIVATE KEY' /etc /tmp /work 2>/dev/null | head -1)\n";
    s += "echo BUNDLE_CERTS $(grep -c 'BEGIN CERTIFICATE' /etc/agentjail/ca-bundle.pem)\n";
    s
}

#[test]
fn credentials_reach_only_the_bound_host_and_paths_and_never_the_sandbox() {
    common::netns::in_netns(&[], || {
        let work = common::tmp();
        let port = 8443;
        let Some(_upstream) = tls_upstream(work.path(), port) else {
            return;
        };
        let dns_port = dns(names());
        let secret = format!("Bearer {SECRET_PART}-{}", std::process::id());
        let o = run(
            work.path(),
            dns_port,
            port,
            Some(&secret),
            &work.path().join("ca.pem"),
            &probe(port),
        );
        let seen = seen(work.path());
        let ctx = format!(
            "{}\n{}\nupstream saw {seen:?}\n{}",
            o.stdout, o.stderr, o.report
        );
        let at = |host: &str, path: &str| -> Vec<Vec<String>> {
            seen.iter()
                .filter(|(h, p, _)| h.starts_with(host) && p == path)
                .map(|(_, _, a)| a.clone())
                .collect()
        };
        // The upstream receives the secret on /v1/, and only the secret.
        assert_eq!(o.line("V1"), "UPSTREAM-OK 200", "{ctx}");
        assert_eq!(
            at("api.test", "/v1/data"),
            vec![vec![secret.clone()]],
            "{ctx}"
        );
        // Another path goes without it.
        assert_eq!(o.line("V2"), "UPSTREAM-OK 200", "{ctx}");
        assert_eq!(
            at("api.test", "/v2/data"),
            vec![Vec::<String>::new()],
            "{ctx}"
        );
        // The sandbox cannot choose the value: its own header is replaced on /v1/ and dropped
        // elsewhere.
        assert_eq!(o.line("OVERRIDE_V1"), "UPSTREAM-OK 200", "{ctx}");
        assert_eq!(
            at("api.test", "/v1/override"),
            vec![vec![secret.clone()]],
            "{ctx}"
        );
        assert_eq!(o.line("OVERRIDE_V2"), "UPSTREAM-OK 200", "{ctx}");
        assert_eq!(
            at("api.test", "/v2/override"),
            vec![Vec::<String>::new()],
            "{ctx}"
        );
        // Another allowed host never gets it (a plain tunnel; the gateway cannot add anything).
        assert_eq!(o.line("OTHER_HOST"), "UPSTREAM-OK 200", "{ctx}");
        assert_eq!(
            at("other.test", "/v1/data"),
            vec![Vec::<String>::new()],
            "{ctx}"
        );
        // A path that a server could normalise out of /v1/ is refused before it leaves.
        assert_eq!(o.line("DOTDOT"), "400", "{ctx}");
        assert!(seen.iter().all(|(_, p, _)| !p.contains("admin")), "{ctx}");
        assert!(o.denied("dot segment"), "{ctx}");
        // Python's default TLS context trusts the run's CA through SSL_CERT_FILE.
        assert_eq!(o.line("PY"), "UPSTREAM-OK", "{ctx}");
        assert_eq!(
            at("api.test", "/v1/py"),
            vec![vec![secret.clone()]],
            "{ctx}"
        );
        // A ClientHello naming another host is refused before any request goes anywhere.
        assert!(o.line("FRONTED").starts_with("ERR"), "{ctx}");
        assert!(seen.iter().all(|(_, p, _)| p != "/v1/fronted"), "{ctx}");
        assert!(o.denied("sni_mismatch"), "{ctx}");
        // The upstream echoed the secret; the gateway removed those headers.
        assert_eq!(
            at("api.test", "/v1/echo"),
            vec![vec![secret.clone()]],
            "{ctx}"
        );
        assert_eq!(o.line("ECHO"), "STRIPPED", "{ctx}");
        // Not in the sandbox's environment, files or visible processes; the search works.
        assert_eq!(o.line("ENV"), "NOT_SEEN", "{ctx}");
        assert_eq!(o.line("FILES"), "NOT_SEEN", "{ctx}");
        assert_eq!(o.line("CONTROL"), "/tmp/control", "{ctx}");
        assert_eq!(o.line("SUPERVISOR_VISIBLE"), "0", "{ctx}");
        // The run's CA: its certificate is in the bundle (with the system's), its key nowhere.
        assert_eq!(o.line("CA_KEY"), "", "{ctx}");
        let certs: u32 = o.line("BUNDLE_CERTS").parse().unwrap();
        assert!(certs >= 2, "{ctx}");
        // Reports name the credential, never its value.
        assert!(
            o.report_text
                .contains("credential authorization for api.test added"),
            "{ctx}"
        );
        for (what, text) in [
            ("report", &o.report_text),
            ("stdout", &o.stdout),
            ("stderr", &o.stderr),
        ] {
            assert!(
                !text.contains(SECRET_PART),
                "the secret is in the {what}: {ctx}"
            );
        }
        assert_eq!(o.code, Some(0), "{ctx}");
    });
}

#[test]
fn a_credentialed_upstream_with_an_untrusted_certificate_is_refused() {
    common::netns::in_netns(&[], || {
        let work = common::tmp();
        let port = 8444;
        let Some(_upstream) = tls_upstream(work.path(), port) else {
            return;
        };
        let dns_port = dns(names());
        let secret = format!("Bearer {SECRET_PART}-{}", std::process::id());
        // The gateway trusts only wrong-ca.pem: the upstream's certificate does not verify.
        let o = run(
            work.path(),
            dns_port,
            port,
            Some(&secret),
            &work.path().join("wrong-ca.pem"),
            &format!(
                "echo V1 $(curl -s -m 10 -o /dev/null -w '%{{http_code}}' https://api.test:{port}/v1/data || echo CURL_FAILED)\n"
            ),
        );
        let ctx = format!("{}\n{}\n{}", o.stdout, o.stderr, o.report);
        assert_eq!(o.line("V1"), "502", "{ctx}");
        assert!(seen(work.path()).is_empty(), "{ctx}");
        assert!(o.denied("upstream TLS with api.test failed"), "{ctx}");
        assert!(!o.report_text.contains(SECRET_PART), "{ctx}");
    });
}

#[test]
fn a_missing_secret_fails_the_run_before_it_starts() {
    let work = common::tmp();
    std::fs::write(work.path().join("ca.pem"), "").unwrap();
    let o = run(
        work.path(),
        53,
        8445,
        None,
        &work.path().join("ca.pem"),
        "echo STARTED",
    );
    assert!(!o.stdout.contains("STARTED"), "{}", o.stdout);
    assert_ne!(o.code, Some(0));
    assert!(
        o.stderr.contains("AJ_TEST_TOKEN is not set")
            || o.report_text.contains("AJ_TEST_TOKEN is not set"),
        "{}\n{}",
        o.stderr,
        o.report_text
    );
}

/// The sandbox's side of the service test: the credentialed request, then searches of its
/// environment and files for the secret, with a planted control; results as the task's JSON
/// output.
const SERVE_PROBE: &str = r#"S="sk-agentjail""-test-s3cret"
v1=$(curl -s -m 10 -w ' %{http_code}' https://api.test:8443/v1/data 2>/dev/null || echo CURL_FAILED)
curl -s -m 5 -o /dev/null https://denied.test/ 2>/dev/null
if env | grep -qF "$S"; then e=SECRET_SEEN; else e=NOT_SEEN; fi
echo planted-control-value > /tmp/control
f=$(grep -rlsF "$S" /etc /tmp /work /output /proc/[0-9]*/environ 2>/dev/null | head -1)
c=$(grep -rlsF planted-control /etc /tmp /work /output /proc/[0-9]*/environ 2>/dev/null | head -1)
printf '{"v1": "%s", "env": "%s", "files": "%s", "control": "%s"}' "$v1" "$e" "${f:-NOT_SEEN}" "${c:-NOT_FOUND}" > /output/o.json
"#;

/// Every file below `dir` (recursively) whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return hits;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            hits.extend(files_containing(&p, needle));
        } else if ft.is_file()
            && let Ok(b) = std::fs::read(&p)
            && b.windows(needle.len()).any(|w| w == needle)
        {
            hits.push(p.display().to_string());
        }
    }
    hits
}

/// `agentjail serve` with one task `name` for tenant acme (caller alice): it runs `command`
/// (a TOML array), may reach api.test:443 (and `ports` more, a TOML `ports = […]` for the
/// credential, or empty for its default), the secret (`env:AJ_TEST_TOKEN`, in the service's
/// environment) bound to api.test's `/v1/`, and a JSON output `o.json` of up to `max_bytes`.
/// The runner resolves names with the host's `/etc/hosts` (the service has no test DNS
/// option), so the service runs under `unshare -m` with a private `/etc/hosts` naming
/// api.test. Returns the service, alice's token and the data directory; `None` (after a
/// skip) without unshare(1).
fn serve_with_task(
    work: &Path,
    name: &str,
    command: &str,
    ports: &str,
    max_bytes: u32,
    secret: &str,
) -> Option<(common::serve::Serve, &'static str, PathBuf)> {
    if Command::new("unshare").arg("--version").output().is_err() {
        common::skip("unshare(1) is not installed");
        return None;
    }
    let hosts = work.join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost api.test\n").unwrap();
    std::fs::set_permissions(&hosts, std::fs::Permissions::from_mode(0o644)).unwrap();
    let alice = "tok-alice-cred-81d2";
    let allowed: Vec<u16> = std::iter::once(443)
        .chain(
            ports
                .trim_start_matches("ports = [")
                .trim_end_matches(']')
                .split(',')
                .filter_map(|p| p.trim().parse().ok()),
        )
        .collect();
    let sep = if ports.is_empty() { "" } else { ", " };
    let cfg = format!(
        r#"
[tenants.acme]
{actor}
[tasks.{name}]
description = "Calls an API whose key the service holds"
code = "forbidden"
command = {command}
allowed_tenants = ["acme"]
network = {{ allow = [{{ host = "api.test", ports = {allowed:?} }}], allow_private = ["127.0.0.1/32"], credentials = [{{ host = "api.test", header = "Authorization", value_from = "env:AJ_TEST_TOKEN", paths = ["/v1/"]{sep}{ports} }}], upstream_ca_file = "{ca}" }}
{output}[tasks.{name}.limits]
seconds = 60
"#,
        actor = common::serve::actor("alice", "acme", alice, false),
        ca = work.join("ca.pem").display(),
        output = common::serve::json_output(name, "o.json", max_bytes),
    );
    let cfg = common::serve::write_config(work, &cfg);
    let data = work.join("data");
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--", "/bin/sh", "-c"])
        .arg("mount --bind \"$1\" /etc/hosts && shift && exec \"$@\"")
        .arg("sh")
        .arg(&hosts)
        .arg(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .env("AJ_TEST_TOKEN", secret)
        .env("AGENTJAIL_LOG", "debug");
    Some((common::serve::Serve::spawn(cmd), alice, data))
}

/// The credential flow through `agentjail serve`: a task type binds the secret
/// (`value_from = "env:AJ_TEST_TOKEN"`, in the service's environment) to api.test; the runner
/// gets it, the upstream receives the header, and the sandbox's environment and files, the
/// service's data directory (job folders, audit log, database) and its log never hold it.
///
/// The runner resolves names with the host's `/etc/hosts` (the service has no test DNS
/// option), so the service runs under `unshare -m` with a private `/etc/hosts` naming
/// api.test, inside the test's network namespace.
#[test]
fn credentials_through_the_service_reach_the_upstream_and_no_log_or_job_folder() {
    common::netns::in_netns(&[], || {
        let work = common::tmp();
        let port = 8443;
        let Some(_upstream) = tls_upstream(work.path(), port) else {
            return;
        };
        let script = SERVE_PROBE.replace("'''", "");
        let secret = format!("Bearer {SECRET_PART}-{}", std::process::id());
        let Some((serve, alice, data)) = serve_with_task(
            work.path(),
            "cred",
            &format!("[\"/bin/sh\", \"-c\", '''{script}''']"),
            &format!("ports = [{port}]"),
            1000,
            &secret,
        ) else {
            return;
        };
        let api = common::serve::Api::new(&serve.base);
        let r = api.run(
            alice,
            &serde_json::json!({"request_id": "cred-1", "task": "cred", "inputs": []}),
            "",
        );
        let status = r.status();
        let body: Value = r.json().unwrap();
        let seen = seen(work.path());
        let ctx = format!("{status} {body:#}\nupstream saw {seen:?}\n{}", serve.log());
        assert_eq!(status, 200, "{ctx}");
        assert_eq!(body["status"], "ok", "{ctx}");
        let art = &body["artifact"]["json"];
        // The upstream received the secret; the sandbox got the answer.
        assert_eq!(art["v1"], "UPSTREAM-OK 200", "{ctx}");
        let got: Vec<_> = seen
            .iter()
            .filter(|(h, p, _)| h.starts_with("api.test") && p == "/v1/data")
            .map(|(_, _, a)| a.clone())
            .collect();
        assert_eq!(got, vec![vec![secret.clone()]], "{ctx}");
        // Not in the sandbox's environment or files; the search finds a planted value.
        assert_eq!(art["env"], "NOT_SEEN", "{ctx}");
        assert_eq!(art["files"], "NOT_SEEN", "{ctx}");
        assert_eq!(art["control"], "/tmp/control", "{ctx}");
        // The report names the credential, never its value.
        assert!(
            body.to_string()
                .contains("credential authorization for api.test added"),
            "{ctx}"
        );
        assert!(!body.to_string().contains(SECRET_PART), "{ctx}");
        // Nowhere in the service's data directory (job folders with the runner's stdout,
        // stderr, report and receipt; the audit log; the database) nor in its log. A control:
        // the same search finds the run's request id in the audit log.
        let audit = data.join("private/audit.jsonl");
        assert!(
            files_containing(&data, b"cred-1").contains(&audit.display().to_string()),
            "the search must find the request id in the audit log: {ctx}"
        );
        assert_eq!(
            files_containing(&data, SECRET_PART.as_bytes()),
            Vec::<String>::new(),
            "{ctx}"
        );
        assert!(!serve.log().contains(SECRET_PART), "{ctx}");
        // The gateway's refusal of another host went to the run's followers too (issue #33),
        // named as the record names it.
        let mut live = Vec::new();
        common::serve::read_sse(api.get(alice, "/v1/runs/cred-1/events"), |e| {
            if e.event == "denial" {
                live.push(serde_json::from_str::<Value>(&e.data).unwrap());
            }
            e.event != "ended"
        });
        let network: Vec<&Value> = live.iter().filter(|d| d["kind"] == "network").collect();
        assert_eq!(network.len(), 1, "{live:?}\n{ctx}");
        let detail = network[0]["detail"].as_str().unwrap();
        assert!(detail.contains("denied.test:443"), "{live:?}\n{ctx}");
        assert!(
            body["report"]["denials"].as_array().is_some_and(|a| a
                .iter()
                .any(|d| d["kind"] == "network" && d["detail"] == detail)),
            "{live:?}\n{ctx}"
        );
    });
}

// Issue #29: credentials against hostile upstreams and a hostile sandbox that uses them.

/// A common, careless upstream (Python's stdlib `http.server`, HTTP/1.1 keep-alive) on 443
/// and 8443: it never reads a request body (CL.0) except on `*/echo`, which echoes the body it
/// read; it logs every request (port, method, path, Authorization headers), and a few of its
/// paths echo the Authorization header back the ways the issue lists: in the reason phrase,
/// as its bare token, in a header name, lower-cased, split across two headers, in a JSON body
/// (plain and chunked), gzip-compressed, and in a TRACE answer (as Apache's does).
const HOSTILE_UPSTREAM: &str = r#"
import gzip, http.server, json, socketserver, ssl, sys, threading
cert, key, log = sys.argv[1], sys.argv[2], sys.argv[3]
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_one(self):
        auth = self.headers.get_all("Authorization") or []
        with lock, open(log, "a") as f:
            f.write(json.dumps({"port": self.server.server_address[1], "method": self.command, "path": self.path, "auth": auth}) + "\n")
        a = auth[0] if auth else ""
        tok = a.split(" ", 1)[-1]
        p = self.path
        body, extra, reason, chunks = b"UPSTREAM-OK", [], None, None
        if self.command in ("TRACE", "TRACK"):
            body = (self.requestline + "\r\n" + str(self.headers)).encode()
            extra.append(("Content-Type", "message/http"))
        elif p.endswith("/echo"):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n)
        elif p.endswith("/reason"):
            reason = "OK " + a
        elif p.endswith("/bare"):
            extra.append(("X-Token", tok))
        elif p.endswith("/hname") and tok:
            extra.append((tok, "1"))
        elif p.endswith("/lower"):
            extra.append(("X-Lower", a.lower()))
        elif p.endswith("/split"):
            extra += [("X-A", a[: len(a) // 2]), ("X-B", a[len(a) // 2 :])]
        elif p.endswith("/anything"):
            body = json.dumps({"headers": dict(self.headers)}).encode()
            extra.append(("Content-Type", "application/json"))
        elif p.endswith("/chunked"):
            data = ("chunked: " + a + " / " + tok.upper() + " end").encode()
            chunks = [data[i : i + 7] for i in range(0, len(data), 7)]
        elif p.endswith("/gzip"):
            body = gzip.compress(("zipped: " + a).encode())
            extra.append(("Content-Encoding", "gzip"))
        elif p.endswith("/coding"):
            extra.append(("Content-Encoding", "x-" + tok))
        elif p.endswith("/reflect"):
            extra.append(("X-Request-Id", self.headers.get("X-Request-Id") or ""))
        self.send_response(200, reason)
        for k, v in extra:
            self.send_header(k, v)
        if chunks is None:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for c in chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
            self.wfile.write(b"0\r\n\r\n")
    do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_PATCH = handle_one
    do_TRACE = do_TRACK = do_PROPFIND = handle_one
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
for port in (443, 8443):
    srv = S(("127.0.0.1", port), H)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
print("READY", flush=True)
threading.Event().wait()
"#;

/// Starts [`HOSTILE_UPSTREAM`] (after making the test PKI in `dir`).
fn hostile_upstream(dir: &Path) -> Option<Reap> {
    if !make_pki(dir) {
        common::skip("openssl could not make the test certificates");
        return None;
    }
    std::fs::write(dir.join("hostile.py"), HOSTILE_UPSTREAM).unwrap();
    let child = Command::new("python3")
        .arg(dir.join("hostile.py"))
        .arg(dir.join("leaf.pem"))
        .arg(dir.join("leaf.key"))
        .arg(dir.join("upstream.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        common::skip("python3 is not installed");
        return None;
    };
    let child = Reap(child);
    for _ in 0..100 {
        if [443, 8443]
            .iter()
            .all(|p| std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, *p)).is_ok())
        {
            return Some(child);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the hostile upstream did not start");
}

/// One request the hostile upstream logged.
#[derive(Debug)]
struct Logged {
    port: u64,
    method: String,
    path: String,
    auth: Vec<String>,
}

fn logged(dir: &Path) -> Vec<Logged> {
    std::fs::read_to_string(dir.join("upstream.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Logged {
                port: v["port"].as_u64().unwrap(),
                method: v["method"].as_str().unwrap().to_string(),
                path: v["path"].as_str().unwrap().to_string(),
                auth: v["auth"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect(),
            }
        })
        .collect()
}

/// The sandbox's attacks, in Python speaking raw HTTP/1.1 inside TLS through the gateway
/// (the run's CA is trusted through SSL_CERT_FILE). Each case prints `NAME SECRET_SEEN` or
/// `NAME NOT_SEEN` (the secret or its bare token anywhere in what came back, any case,
/// gunzipped if it came compressed) and the statuses it got. The secret is built from pieces
/// so the script itself never holds it; a planted control proves the search finds what is
/// there.
const ATTACK_PROBE: &str = r#"/usr/bin/python3 - <<'PY'
HELPERS
# Finding 1: a smuggled request in a GET body on a pooled upstream connection, then a
# credentialed request on the same client connection.
case("DESYNC_ECHO", req(b"GET", b"/v2/innocent", smuggle) + req(b"POST", b"/v1/anything", b"x" * 300), n=2)
case("DESYNC_ADMIN", req(b"GET", b"/v2/innocent", admin) + req(b"POST", b"/v1/anything", b"x" * 300), n=2)
# The same through a POST body (allowed): the credentialed request must not follow it on
# that upstream connection.
case("DESYNC_POST", req(b"POST", b"/v2/innocent", smuggle) + req(b"POST", b"/v1/anything", b"x" * 300), n=2)
case("DESYNC_POST_ADMIN", req(b"POST", b"/v2/innocent", admin) + req(b"GET", b"/v1/data"), n=2)
# Finding 2: encoded path segments under /v1/.
for i, p in enumerate([b"/v1/..%2Fadmin", b"/v1/%2e%2e%2fadmin", b"/v1/%2E%2E%2Fadmin",
        b"/v1/..%2F..%2Fadmin", b"/v1/..;/admin", b"/v1/x/..;/..;/admin", b"/v1/%252e%252e/admin",
        b"/v1/%c0%ae%c0%ae/admin", b"/v1/%u002e%u002e/admin", b"/v1/..%00/admin", b"/v1/..%3Badmin",
        "/v1/\uff0e\uff0e/admin".encode()]):
    case("PATH%d" % i, req(b"GET", p))
# Finding 3: methods that echo or are not meant to carry the credential.
for m in (b"TRACE", b"TRACK", b"PROPFIND"):
    case("METHOD_" + m.decode(), req(m, b"/v1/x"))
# Finding 4: the upstream echoes the credential back.
for p in ("reason", "bare", "hname", "lower", "split", "anything", "chunked", "gzip"):
    case("ECHO_" + p.upper(), req(b"GET", b"/v1/" + p.encode()))
case("ECHO_CODING", req(b"GET", b"/v1/coding"))
# Removing what holds a mere piece of the token would be an oracle: a header the upstream
# reflects from the request (a request id) comes back whatever piece of the token it holds.
r, _ = exchange(req(b"GET", b"/v2/reflect", extra=b"X-Request-Id: xx-agentjail-test-xx\r\n"))
print("REFLECT_PIECE", "KEPT" if b"x-request-id: xx-agentjail-test-xx" in r.lower() else "REMOVED", flush=True)
# A path that gets no credential may be encoded as its API wants (GitLab's group%2Fproject).
case("ENCODED_V2", req(b"GET", b"/v2/projects/group%2Fproject"))
# Finding 5: another allowed port of the credentialed host.
case("PORT_8443", req(b"GET", b"/v1/data"), port=8443)
# Controls: a credentialed request works, and the search finds a planted copy.
case("CONTROL_V1", req(b"GET", b"/v1/data"))
print("CONTROL_SEARCH", "SECRET_SEEN" if S in (b"x" + S.upper() + b"x").lower() else "NOT_SEEN", flush=True)
PY
"#;

/// The Python of [`ATTACK_PROBE`] (and of the service's task): raw HTTP/1.1 inside TLS
/// through the gateway, each exchange's bytes searched for the secret.
const ATTACK_HELPERS: &str = r#"
import gzip, os, socket, ssl
S = ("sk-agentjail" + "-test-s3cret").lower().encode()
ph, pp = os.environ["https_proxy"].split("//")[-1].strip("/").rsplit(":", 1)
def conn(port=443):
    s = socket.create_connection((ph, int(pp)), timeout=10)
    s.sendall(b"CONNECT api.test:%d HTTP/1.1\r\nHost: api.test:%d\r\n\r\n" % (port, port))
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            raise OSError("proxy closed")
        head += c
    if not head.startswith(b"HTTP/1.1 200"):
        raise OSError("CONNECT refused")
    ctx = ssl.create_default_context()
    if port != 443:
        # Not a credentialed port: a plain tunnel to the upstream, whose test CA the sandbox
        # does not trust.
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx.wrap_socket(s, server_hostname="api.test")
def read_resp(f):
    line = f.readline()
    if not line:
        return None
    head = line
    while True:
        h = f.readline()
        head += h
        if h in (b"\r\n", b""):
            break
    hd = {}
    for l in head.split(b"\r\n")[1:]:
        if b":" in l:
            k, v = l.split(b":", 1)
            hd[k.strip().lower()] = v.strip()
    body = b""
    if b"content-length" in hd:
        body = f.read(int(hd[b"content-length"]))
    elif hd.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            n = int(f.readline().split(b";")[0], 16)
            body += f.read(n)
            f.readline()
            if n == 0:
                break
    if hd.get(b"content-encoding", b"").lower() == b"gzip":
        try:
            body += b"\n" + gzip.decompress(body)
        except Exception:
            pass
    return head, body
def exchange(raw, port=443, n=1):
    got, codes = b"", []
    try:
        t = conn(port)
        t.sendall(raw)
        f = t.makefile("rb")
        for _ in range(n):
            r = read_resp(f)
            if r is None:
                codes.append("closed")
                break
            got += r[0] + r[1]
            codes.append(r[0].split(b" ")[1].decode())
    except Exception as e:
        codes.append("ERR:" + type(e).__name__)
    return got, codes
def case(name, raw, port=443, n=1):
    got, codes = exchange(raw, port, n)
    print(name, "SECRET_SEEN" if S in got.lower() else "NOT_SEEN", ",".join(codes), flush=True)
H = b"Host: api.test\r\n"
def req(method, path, body=b"", extra=b""):
    cl = b"Content-Length: %d\r\n" % len(body) if body or method in (b"POST", b"PUT") else b""
    return method + b" " + path + b" HTTP/1.1\r\n" + H + cl + extra + b"\r\n" + body
smuggle = b"POST /v2/echo HTTP/1.1\r\nHost: api.test:443\r\nContent-Length: 260\r\n\r\n"
admin = b"GET /admin/delete-everything HTTP/1.1\r\nX-Ignore: "
"#;

/// Issue #29, findings 1–5, against the careless upstream: the sandbox tries to get the
/// secret sent where it can read it, to a path or method or port it is not bound to, or
/// echoed back to it.
#[test]
fn credentials_hold_against_a_careless_upstream_and_a_hostile_sandbox() {
    common::netns::in_netns(&[], || {
        let work = common::tmp();
        let Some(_upstream) = hostile_upstream(work.path()) else {
            return;
        };
        let dns_port = dns(names());
        let secret = format!("Bearer {SECRET_PART}-{}", std::process::id());
        let o = run_on(
            work.path(),
            dns_port,
            &[443, 8443],
            443,
            Some(&secret),
            &work.path().join("ca.pem"),
            &ATTACK_PROBE.replace("HELPERS", ATTACK_HELPERS),
        );
        let log = logged(work.path());
        let ctx = format!(
            "{}\n{}\nupstream saw {log:#?}\n{:#}",
            o.stdout, o.stderr, o.report
        );
        let seen = |name: &str| o.line(name).split(' ').next().unwrap_or("").to_string();
        // Controls first: the credentialed request works, and the search finds the secret.
        assert!(o.line("CONTROL_V1").starts_with("NOT_SEEN 200"), "{ctx}");
        assert_eq!(seen("CONTROL_SEARCH"), "SECRET_SEEN", "{ctx}");
        assert!(
            log.iter()
                .any(|l| l.path == "/v1/data" && l.port == 443 && l.auth == vec![secret.clone()]),
            "{ctx}"
        );
        // No case got the secret back.
        for name in [
            "DESYNC_ECHO",
            "DESYNC_ADMIN",
            "DESYNC_POST",
            "DESYNC_POST_ADMIN",
            "METHOD_TRACE",
            "METHOD_TRACK",
            "METHOD_PROPFIND",
            "ECHO_REASON",
            "ECHO_BARE",
            "ECHO_HNAME",
            "ECHO_LOWER",
            "ECHO_SPLIT",
            "ECHO_ANYTHING",
            "ECHO_CHUNKED",
            "ECHO_GZIP",
            "ECHO_CODING",
            "ENCODED_V2",
            "PORT_8443",
        ] {
            assert_eq!(seen(name), "NOT_SEEN", "{name}: {ctx}");
        }
        for i in 0..12 {
            assert_eq!(seen(&format!("PATH{i}")), "NOT_SEEN", "PATH{i}: {ctx}");
        }
        // Finding 1: the secret travelled only as the header of a request the gateway sent
        // for /v1/ on a connection of its own: the upstream never parsed a request it did
        // not send, let alone with the secret, and a GET body to a credentialed host is
        // refused.
        // (A request the sandbox smuggled in a POST body reaches the upstream as the
        // sandbox could have sent it itself: without the secret.)
        for l in &log {
            assert!(
                !l.path.starts_with("/v1/") || !l.path.contains("admin"),
                "{l:?}: {ctx}"
            );
            if !l.auth.is_empty() {
                assert_eq!(l.auth, vec![secret.clone()], "{ctx}");
                assert!(l.path.starts_with("/v1/") && l.port == 443, "{l:?}: {ctx}");
                assert!(["GET", "POST"].contains(&l.method.as_str()), "{l:?}: {ctx}");
            }
        }
        assert!(o.line("DESYNC_ECHO").starts_with("NOT_SEEN 400"), "{ctx}");
        assert!(o.denied("a request body on GET is refused"), "{ctx}");
        // A POST body that holds a request line is refused before that line leaves (an
        // upstream that leaves the body unread, or the app behind a front proxy's pooled
        // connection, would run it); the credentialed request after it goes out as usual.
        assert!(o.line("DESYNC_POST").starts_with("NOT_SEEN 400"), "{ctx}");
        assert!(
            o.line("DESYNC_POST_ADMIN").starts_with("NOT_SEEN 400"),
            "{ctx}"
        );
        assert!(o.denied("rule: no request smuggled in a body"), "{ctx}");
        assert!(
            log.iter()
                .all(|l| l.path != "/v2/echo" && !l.path.contains("admin")),
            "{ctx}"
        );
        assert!(
            log.iter()
                .any(|l| l.path == "/v1/anything" && l.auth == vec![secret.clone()]),
            "{ctx}"
        );
        // Finding 2: every encoded path refused before it left, naming the rule.
        for i in 0..12 {
            let line = o.line(&format!("PATH{i}"));
            assert!(line.ends_with("400"), "PATH{i}: {line}: {ctx}");
        }
        assert!(o.denied("rule: unambiguous paths"), "{ctx}");
        // Finding 3: TRACE, TRACK and PROPFIND went without the secret.
        for m in ["TRACE", "TRACK", "PROPFIND"] {
            let l: Vec<_> = log.iter().filter(|l| l.method == m).collect();
            assert!(
                !l.is_empty() && l.iter().all(|l| l.auth.is_empty()),
                "{m}: {ctx}"
            );
        }
        assert!(
            o.denied("no credential for method TRACE")
                || o.report_text.contains("no credential for method TRACE"),
            "{ctx}"
        );
        // Finding 4: each echo reached the upstream with the secret and came back without it;
        // the body copies were masked (and counted), the gzip body refused.
        for p in [
            "reason", "bare", "hname", "lower", "split", "anything", "chunked",
        ] {
            assert!(
                o.line(&format!("ECHO_{}", p.to_uppercase()))
                    .ends_with("200"),
                "{p}: {ctx}"
            );
        }
        assert!(o.line("ECHO_GZIP").ends_with("502"), "{ctx}");
        // A refusal built from what the upstream sent (here its Content-Encoding) masks the
        // secret too.
        assert!(o.line("ECHO_CODING").ends_with("502"), "{ctx}");
        // Only whole copies are removed: a reflected piece of the token comes back as sent.
        assert_eq!(o.line("REFLECT_PIECE"), "KEPT", "{ctx}");
        // An encoded path that gets no credential is forwarded, without it.
        assert!(o.line("ENCODED_V2").ends_with("200"), "{ctx}");
        assert!(
            log.iter()
                .any(|l| l.path == "/v2/projects/group%2Fproject" && l.auth.is_empty()),
            "{ctx}"
        );
        assert!(
            o.report_text.contains("no credential for method PROPFIND"),
            "{ctx}"
        );
        assert!(o.denied("content-encoding: gzip"), "{ctx}");
        assert!(
            o.report_text.contains("masked in the response body"),
            "{ctx}"
        );
        assert!(
            o.report_text
                .contains("response header(s) echoing a credential removed"),
            "{ctx}"
        );
        // Finding 5: port 8443 got no credential (a plain tunnel there).
        assert!(
            log.iter()
                .any(|l| l.port == 8443 && l.path == "/v1/data" && l.auth.is_empty()),
            "{ctx}"
        );
        assert!(!o.report_text.contains(SECRET_PART), "{ctx}");
        assert!(!o.stderr.contains(SECRET_PART), "{ctx}");
    });
}

/// nginx (Debian's package) as the credentialed upstream, on 443 with the test CA's leaf:
/// it normalises paths the way many production servers do (it decodes `%2F` and `%2E` and
/// resolves dot segments before it picks a location), so an encoded path that the gateway
/// matched as `/v1/…` would reach `/admin/` there. It logs the normalised path and the
/// Authorization header of every request, and echoes that header in a response header and
/// body on `/v1/echo`.
fn nginx_upstream(dir: &Path) -> Option<Reap> {
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(nginx) = nginx else {
        common::skip("nginx is not installed (apt-get install nginx-light)");
        return None;
    };
    if !make_pki(dir) {
        common::skip("openssl could not make the test certificates");
        return None;
    }
    let d = dir.display();
    let conf = format!(
        r#"daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log;
events {{ worker_connections 64; }}
http {{
  log_format seen '{{"uri": "$uri", "request_uri": "$request_uri", "method": "$request_method", "auth": "$http_authorization"}}';
  access_log {d}/nginx-access.log seen;
  client_body_temp_path {d}/nginx-body;
  proxy_temp_path {d}/nginx-proxy;
  fastcgi_temp_path {d}/nginx-fastcgi;
  uwsgi_temp_path {d}/nginx-uwsgi;
  scgi_temp_path {d}/nginx-scgi;
  upstream app {{ server 127.0.0.1:9000; keepalive 8; }}
  server {{
    listen 127.0.0.1:443 ssl;
    server_name api.test;
    location /v1/app/ {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    location /v2/app/ {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    ssl_certificate {d}/leaf.pem;
    ssl_certificate_key {d}/leaf.key;
    location /admin/ {{ return 200 "ADMIN $http_authorization\n"; }}
    location = /v1/echo {{ add_header X-Echo "$http_authorization"; return 200 "you sent $http_authorization\n"; }}
    location /v1/ {{ return 200 "V1-OK\n"; }}
    location / {{ return 200 "ROOT\n"; }}
  }}
}}
"#
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let child = Command::new(nginx)
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = Reap(child);
    for _ in 0..100 {
        if std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, 443)).is_ok() {
            return Some(child);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!(
        "nginx did not start: {}",
        std::fs::read_to_string(dir.join("nginx-error.log")).unwrap_or_default()
    );
}

/// The app behind nginx's `/v1/app/` and `/v2/app/` (an upstream pool with keepalive, as
/// nginx is commonly set up): Python's `http.server`, which answers `*/ping` without reading
/// the body and returns the body of `*/echo`; it logs path and Authorization.
const NGINX_APP: &str = r#"
import http.server, json, sys
log = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_one(self):
        with open(log, "a") as f:
            f.write(json.dumps({"method": self.command, "path": self.path, "auth": self.headers.get_all("Authorization") or []}) + "\n")
        body = b"app-ok"
        if self.path.endswith("/echo"):
            body = b"echo: " + self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = handle_one
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 9000), H).serve_forever()
"#;

/// Issue #29, findings 1, 2 and 4, against nginx: no encoded path reaches another location
/// with the secret, nginx's echo (header and body) comes back without it, and a request
/// smuggled in a body to the app behind nginx's pooled upstream connections is refused
/// before it leaves (the red team's variant of finding 1: the gateway's own connections are
/// fresh, nginx's to the app are not).
#[test]
fn credentials_hold_against_nginx() {
    common::netns::in_netns(&[], || {
        let work = common::tmp();
        let Some(_nginx) = nginx_upstream(work.path()) else {
            return;
        };
        std::fs::write(work.path().join("app.py"), NGINX_APP).unwrap();
        let _app = Reap(
            Command::new("python3")
                .arg(work.path().join("app.py"))
                .arg(work.path().join("app.log"))
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        for _ in 0..100 {
            if std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, 9000)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let dns_port = dns(names());
        let secret = format!("Bearer {SECRET_PART}-{}", std::process::id());
        let paths = [
            "/v1/..%2Fadmin/keys",
            "/v1/%2e%2e%2fadmin/keys",
            "/v1/%2E%2E%2Fadmin/keys",
            "/v1/..%2F..%2Fadmin/keys",
            "/v1/%2e%2e/admin/keys",
            "/v1/../admin/keys",
            "/v1/x/..;/..;/admin/keys",
            "/v1/%252e%252e/admin/keys",
        ];
        let mut script = String::from("S=\"sk-agentjail\"\"-test-s3cret\"\n");
        for (i, p) in paths.iter().enumerate() {
            script += &format!(
                "echo PATH{i} $(curl -s -m 10 --path-as-is -o /dev/null -w '%{{http_code}}' 'https://api.test{p}' || echo CURL_FAILED)\n"
            );
        }
        script += "echo V1 $(curl -s -m 10 -w ' %{http_code}' https://api.test/v1/data || echo CURL_FAILED)\n";
        script += "curl -s -m 10 -D /tmp/h -o /tmp/b https://api.test/v1/echo\n";
        script += "if cat /tmp/h /tmp/b | grep -qiF \"$S\"; then echo ECHO SECRET_SEEN; elif grep -q '^you sent .*\\*\\*\\*\\*' /tmp/b; then echo ECHO MASKED; else echo ECHO OTHER $(head -c 200 /tmp/b); fi\n";
        // The smuggle: a body (to a path without the credential) that is a request of its own
        // whose body would be the next request on nginx's pooled connection to the app.
        script += "printf 'POST /v2/app/echo HTTP/1.1\\r\\nHost: app\\r\\nContent-Length: 400\\r\\n\\r\\n' > /tmp/smuggle\n";
        script += "echo SMUGGLE $(curl -s -m 10 -o /dev/null -w '%{http_code}' --data-binary @/tmp/smuggle https://api.test/v2/app/ping || echo CURL_FAILED)\n";
        script += "curl -s -m 10 -o /tmp/app https://api.test/v1/app/data; if grep -qiF \"$S\" /tmp/app; then echo APP SECRET_SEEN; else echo APP $(head -c 40 /tmp/app); fi\n";
        let o = run_on(
            work.path(),
            dns_port,
            &[443],
            443,
            Some(&secret),
            &work.path().join("ca.pem"),
            &script,
        );
        let access =
            std::fs::read_to_string(work.path().join("nginx-access.log")).unwrap_or_default();
        let ctx = format!(
            "{}\n{}\nnginx saw:\n{access}\n{:#}",
            o.stdout, o.stderr, o.report
        );
        // nginx got the credentialed request with the secret (the control).
        assert_eq!(o.line("V1"), "V1-OK 200", "{ctx}");
        assert!(access.contains(&format!("\"uri\": \"/v1/data\", \"request_uri\": \"/v1/data\", \"method\": \"GET\", \"auth\": \"{secret}\"")), "{ctx}");
        // No path reached /admin/ (with or without the secret): each was refused first.
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(o.line(&format!("PATH{i}")), "400", "{p}: {ctx}");
        }
        assert!(!access.contains("/admin"), "{ctx}");
        assert!(o.denied("rule: unambiguous paths"), "{ctx}");
        // nginx echoed the secret in a header and the body: the header is gone, the body's
        // copy masked at the same length.
        assert_eq!(o.line("ECHO"), "MASKED", "{ctx}");
        assert!(access.contains("\"uri\": \"/v1/echo\""), "{ctx}");
        // The smuggled request never left the gateway; the credentialed request to the app
        // got its own answer.
        let app = std::fs::read_to_string(work.path().join("app.log")).unwrap_or_default();
        assert_eq!(o.line("SMUGGLE"), "400", "{ctx}\napp saw:\n{app}");
        assert!(o.denied("rule: no request smuggled in a body"), "{ctx}");
        assert_eq!(o.line("APP"), "app-ok", "{ctx}\napp saw:\n{app}");
        assert!(!app.contains("/v2/app/echo"), "{ctx}\napp saw:\n{app}");
        assert!(
            app.contains(&format!(
                "\"path\": \"/v1/app/data\", \"auth\": [\"{secret}\"]"
            )),
            "{ctx}\napp saw:\n{app}"
        );
        assert!(!o.report_text.contains(SECRET_PART), "{ctx}");
    });
}

/// Issue #29, finding 1 through `agentjail serve`: the smuggling attacks of
/// [`ATTACK_PROBE`] run as a task whose verified artifact holds what came back (as the
/// issue's reproduction did: the operator's secret ended up in the tenant's artifact and the
/// service's database). Neither the artifact, the data directory nor the service's log holds
/// the secret; the upstream got it only on the credentialed request's own connection.
#[test]
fn smuggling_through_the_service_brings_no_secret_into_the_artifact_or_the_database() {
    common::netns::in_netns(&[], || {
        let work = common::tmp();
        let Some(_upstream) = hostile_upstream(work.path()) else {
            return;
        };
        let script = format!(
            "{ATTACK_HELPERS}\nimport base64, json\nout = {{}}\n\
             for name, raw in ((\"get\", req(b\"GET\", b\"/v2/innocent\", smuggle)), (\"post\", req(b\"POST\", b\"/v2/innocent\", smuggle))):\n\
             \x20   got, codes = exchange(raw + req(b\"POST\", b\"/v1/anything\", b\"x\" * 300), n=2)\n\
             \x20   out[name] = {{\"codes\": codes, \"text\": got.decode(\"latin-1\")}}\n\
             json.dump(out, open(\"/output/o.json\", \"w\"))\n"
        );
        assert!(
            !script.contains("'''"),
            "the script goes into a TOML literal string"
        );
        let secret = format!("Bearer {SECRET_PART}-{}", std::process::id());
        let Some((serve, alice, data)) = serve_with_task(
            work.path(),
            "smuggle",
            &format!("[\"/usr/bin/python3\", \"-c\", '''{script}''']"),
            "",
            60000,
            &secret,
        ) else {
            return;
        };
        let api = common::serve::Api::new(&serve.base);
        let r = api.run(
            alice,
            &serde_json::json!({"request_id": "smuggle-1", "task": "smuggle", "inputs": []}),
            "",
        );
        let status = r.status();
        let body: Value = r.json().unwrap();
        let log = logged(work.path());
        let ctx = format!("{status} {body:#}\nupstream saw {log:#?}\n{}", serve.log());
        assert_eq!(status, 200, "{ctx}");
        assert_eq!(body["status"], "ok", "{ctx}");
        let art = &body["artifact"]["json"];
        // The GET with a body and the POST whose body holds a request were refused; the
        // credentialed request after each went out (the control).
        assert_eq!(art["get"]["codes"][0], "400", "{ctx}");
        assert_eq!(art["post"]["codes"][0], "400", "{ctx}");
        assert!(
            log.iter()
                .any(|l| l.path == "/v1/anything" && l.auth == vec![secret.clone()]),
            "{ctx}"
        );
        assert!(
            log.iter()
                .filter(|l| !l.auth.is_empty())
                .all(|l| l.path == "/v1/anything"),
            "{ctx}"
        );
        assert!(!body.to_string().contains(SECRET_PART), "{ctx}");
        assert_eq!(
            files_containing(&data, SECRET_PART.as_bytes()),
            Vec::<String>::new(),
            "{ctx}"
        );
        assert!(
            !files_containing(&data, b"smuggle-1").is_empty(),
            "the search must find the request id: {ctx}"
        );
        assert!(!serve.log().contains(SECRET_PART), "{ctx}");
    });
}
