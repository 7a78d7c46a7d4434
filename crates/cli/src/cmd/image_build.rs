//! `agentjail image build`: a new pinned image from a stored base image and a pip lock file
//! with hashes. The installer runs **in a sandbox** on the base image (`agentjail run`, this
//! binary, as a child we hold), whose only way out is the egress gateway to the package
//! index; what it installed comes back as one tar layer in `/output`, and the store adds that
//! layer to the base (add-only, through the same untrusting extractor as an import). The
//! image's digest is that of its file list, so the same base, lock file and index give the
//! same digest. docs/images.md, "Building an image".

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use agentjail_image::{Limits, Store};
use agentjail_manifest::text::printable;

/// The script run inside the sandbox (pip, then the layer packed into /output).
const SCRIPT: &str = include_str!("image_build.py");

#[derive(clap::Args)]
pub struct BuildArgs {
    /// The stored image to build on (`sha256:…`); it must hold the interpreter (`--python`)
    /// and pip.
    #[arg(long, value_name = "DIGEST")]
    base: String,
    /// The lock file: pip's `requirements.txt` with every requirement an exact pin
    /// (`name==version`) carrying `--hash=sha256:…` (as `pip-compile --generate-hashes`
    /// writes it), dependencies included.
    #[arg(long, value_name = "FILE")]
    requirements: PathBuf,
    /// The package index (PEP 503 simple API, `http://` or `https://`), e.g.
    /// `https://pypi.org/simple/`: with `--allow-host`, the only destination the installer
    /// can reach.
    #[arg(long, value_name = "URL")]
    index_url: String,
    /// Another destination the installer may reach, `HOST[:PORT]` (port 443 by default), e.g.
    /// the index's file host `files.pythonhosted.org` (repeatable).
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    allow_host: Vec<String>,
    /// Addresses the index may have although they are not public, e.g. `10.0.0.5/32` for an
    /// index on the LAN (repeatable).
    #[arg(long = "allow-private", value_name = "CIDR")]
    allow_private: Vec<String>,
    /// Name server (IP:PORT) the egress gateway resolves with, instead of the host's
    /// /etc/hosts and /etc/resolv.conf (repeatable).
    #[arg(long = "egress-dns", value_name = "IP:PORT")]
    egress_dns: Vec<SocketAddr>,
    /// Let pip build source distributions. Their build step (package code) then runs during
    /// the build, in the same sandbox with the same network; build backends (setuptools …)
    /// come from the base image (`--no-build-isolation`). By default wheels only: no code of
    /// any package runs while the image is built.
    #[arg(long)]
    allow_source: bool,
    /// The interpreter in the base image that runs pip.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/python3")]
    python: String,
    /// Seconds the installer may take.
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    timeout: u32,
    /// Memory of the installer's sandbox in MiB (what it downloads and unpacks is held in
    /// memory-backed folders, counted here).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    memory_mb: u32,
    /// Write the installer run's report (JSON) here.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Run even where a protection cannot be applied; the report lists what was not.
    #[arg(long)]
    allow_degraded: bool,
    /// Image store directory [default: $XDG_DATA_HOME/agentjail/images].
    #[arg(long, value_name = "DIR", env = "AGENTJAIL_IMAGE_STORE")]
    store: Option<PathBuf>,
    /// Print the new image's record and its SBOM's digest as JSON instead of the digest.
    #[arg(long)]
    json: bool,
}

/// `scheme://host[:port]/…` → `host:port` for the allowlist (userinfo refused; the gateway
/// checks the host itself at run start like any destination).
fn index_destination(url: &str) -> Result<String, String> {
    let bad = |why: &str| format!("--index-url {}: {why}", printable(url, 200));
    let (rest, port) = if let Some(r) = url.strip_prefix("https://") {
        (r, 443)
    } else if let Some(r) = url.strip_prefix("http://") {
        (r, 80)
    } else {
        return Err(bad("expected an http:// or https:// URL"));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') {
        return Err(bad(
            "expected a host (no user name or password) after the scheme",
        ));
    }
    let has_port = match authority.strip_prefix('[') {
        Some(v6) => v6
            .split_once(']')
            .is_some_and(|(_, after)| after.starts_with(':')),
        None => authority.contains(':'),
    };
    Ok(if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:{port}")
    })
}

/// `HOST[:PORT]` → a manifest allow rule.
fn allow_rule(s: &str) -> Result<serde_json::Value, String> {
    let (host, port) = crate::flags::split_host_port(s)?;
    Ok(
        serde_json::json!({"host": host.trim_start_matches('[').trim_end_matches(']'), "ports": [port]}),
    )
}

fn read_lock(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let shown = path.display();
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut bytes = Vec::new();
    f.take(agentjail_image::requirements::MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if bytes.len() as u64 > agentjail_image::requirements::MAX_BYTES {
        return Err(format!("{shown} is larger than 16 MiB"));
    }
    String::from_utf8(bytes).map_err(|_| format!("{shown} is not UTF-8"))
}

pub fn build(a: BuildArgs) -> Result<u8, String> {
    let lock = read_lock(&a.requirements)?;
    // pip reads the file rebuilt from what was checked, never the user's text.
    let canonical = match agentjail_image::requirements::hashed_lock(&lock) {
        Ok(c) => c,
        Err(problems) => {
            for p in &problems {
                errln!(
                    "agentjail image build: {}: {}",
                    a.requirements.display(),
                    printable(p, 300)
                );
            }
            return Ok(1);
        }
    };
    let index = index_destination(&a.index_url)?;
    let mut allow = vec![allow_rule(&index)?];
    for h in &a.allow_host {
        allow.push(allow_rule(h)?);
    }
    let store = Store::at(a.store.as_deref());
    let v = store.verify(&a.base).map_err(|e| e.to_string())?;
    if !v.ok {
        return Err(format!(
            "the base image {} changed since it was stored; see `agentjail image verify {}`",
            a.base, a.base
        ));
    }
    let tmp = tempfile::Builder::new()
        .prefix("agentjail-build-")
        .tempdir()
        .map_err(|e| format!("cannot make a temporary folder: {e}"))?;
    let dir = tmp.path();
    let write = |name: &str, body: &[u8]| {
        std::fs::write(dir.join(name), body).map_err(|e| format!("cannot write {name}: {e}"))
    };
    write("requirements.txt", canonical.as_bytes())?;
    write("build.py", SCRIPT.as_bytes())?;
    let mut command = vec![
        a.python.clone(),
        "-I".into(),
        "/input/build.py".into(),
        "--index-url".into(),
        a.index_url.clone(),
    ];
    if a.index_url.starts_with("http://") {
        // pip ignores a plain-HTTP index unless told it is meant; the hashes of the lock
        // file, not the transport, are what make the files the expected ones.
        command.extend(["--trusted-host".into(), index.clone()]);
    }
    command.push(if a.allow_source {
        "--no-build-isolation".into()
    } else {
        "--only-binary=:all:".into()
    });
    let manifest = serde_json::json!({
        "image": a.base,
        "inputs": [
            {"source": "requirements.txt", "mount": "/input/requirements.txt"},
            {"source": "build.py", "mount": "/input/build.py"},
        ],
        "network": {"allow": allow, "allow_private": a.allow_private},
        "limits": {
            "seconds": a.timeout,
            "memory_mb": a.memory_mb,
            "processes": 64,
            "output_mb": 4096,
            "network_down_mb": 16384,
            "network_connections": 1000,
        },
        "env": {
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "PIP_CONFIG_FILE": "/dev/null",
        },
        "command": command,
    });
    write(
        "manifest.json",
        serde_json::to_string(&manifest)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    let report_path = dir.join("report.json");
    let out_dir = dir.join("out");
    let exe = std::env::current_exe().map_err(|e| format!("cannot find agentjail itself: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("run")
        .arg("--manifest")
        .arg(dir.join("manifest.json"))
        .arg("--output-dir")
        .arg(&out_dir)
        .arg("--report")
        .arg(&report_path)
        .arg("--image-store")
        .arg(store.root());
    for d in &a.egress_dns {
        cmd.arg("--egress-dns").arg(d.to_string());
    }
    if a.allow_degraded {
        cmd.arg("--allow-degraded");
    }
    errln!(
        "agentjail image build: installing {} in a sandbox on {} (index {})",
        a.requirements.display(),
        a.base,
        printable(&a.index_url, 200)
    );
    let done = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot start the installer's run: {e}"))?;
    let report: serde_json::Value = std::fs::read(&report_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if let Some(keep) = &a.report
        && report_path.exists()
    {
        std::fs::copy(&report_path, keep)
            .map_err(|e| format!("cannot write {}: {e}", keep.display()))?;
    }
    let status = report["status"].as_str().unwrap_or("no report");
    if !done.status.success() || status != "ok" {
        let stderr = String::from_utf8_lossy(&done.stderr);
        if status == "setup_error" || report.is_null() {
            return Err(format!(
                "the installer's sandbox could not start: {}",
                printable(stderr.lines().last().unwrap_or("no reason given"), 500)
            ));
        }
        errln!("agentjail image build: the install failed ({status}); nothing was stored");
        for d in report["denials"].as_array().into_iter().flatten() {
            errln!(
                "agentjail image build: refused ({}): {}",
                printable(d["kind"].as_str().unwrap_or(""), 40),
                printable(d["detail"].as_str().unwrap_or(""), 500)
            );
        }
        let lines: Vec<&str> = stderr.lines().collect();
        for l in &lines[lines.len().saturating_sub(20)..] {
            errln!("  {}", printable(l, 500));
        }
        return Ok(1);
    }
    let layer = out_dir.join("layer.tar");
    if !layer.is_file() {
        errln!("agentjail image build: the installer wrote no layer; nothing was stored");
        return Ok(1);
    }
    let lock_digest = agentjail_manifest::sha256_digest(lock.as_bytes());
    let source = format!(
        "build: {} ({lock_digest}) from {} with {}{} on {}",
        a.requirements.display(),
        a.index_url,
        a.python,
        if a.allow_source { "" } else { " (wheels only)" },
        a.base
    );
    let imp = store
        .build_on(&a.base, &layer, &source, &Limits::default())
        .map_err(|e| format!("the installed layer was refused: {e}"))?;
    let digest = imp.record.digest.clone();
    let sbom = store.sbom(&digest).map_err(|e| e.to_string())?;
    let sbom_sha256 =
        agentjail_manifest::sha256_digest(agentjail_image::sbom::text(&sbom).as_bytes());
    if a.json {
        let mut v = serde_json::to_value(&imp.record).unwrap_or_default();
        v["sbom_sha256"] = serde_json::json!(sbom_sha256);
        v["already_present"] = serde_json::json!(imp.already_present);
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        outln!("{digest}");
    }
    if imp.already_present {
        errln!("agentjail image build: {digest} was already in the store (the same build)");
    }
    errln!("agentjail image build: SBOM {sbom_sha256} (`agentjail image show {digest} --sbom`)");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_url_gives_one_destination() {
        assert_eq!(
            index_destination("https://pypi.org/simple/").unwrap(),
            "pypi.org:443"
        );
        assert_eq!(
            index_destination("http://index.test:8080/simple").unwrap(),
            "index.test:8080"
        );
        assert_eq!(
            index_destination("http://[::1]/simple").unwrap(),
            "[::1]:80"
        );
        assert_eq!(index_destination("http://[::1]:81/").unwrap(), "[::1]:81");
        for bad in ["ftp://x/", "https://u:p@pypi.org/", "https://", "pypi.org"] {
            assert!(index_destination(bad).is_err(), "{bad}");
        }
    }
}
