//! Task types on pinned images (`image = "sha256:…"`, docs/images.md): where the service's image
//! store is, the start-up check of every image a task type names (missing or changed: the
//! service refuses to start, naming the task), and a probe command run in a real sandbox on a
//! task's image (the MCP description's runtime line).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentjail_image::{ImageError, Store};

use crate::config::{Config, ServerSettings, Task};

/// The service's image store: `server.image_store`, else `<data_dir>/images`.
pub fn store_dir(s: &ServerSettings, data_dir: &Path) -> PathBuf {
    s.image_store
        .clone()
        .unwrap_or_else(|| data_dir.join("images"))
}

/// Every image the task types name, with the tasks that name it.
fn pinned(config: &Config) -> BTreeMap<&str, Vec<&str>> {
    let mut by_image: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, t) in &config.tasks {
        if let Some(d) = &t.image {
            by_image.entry(d.as_str()).or_default().push(name.as_str());
        }
    }
    by_image
}

/// Before `serve`, `mcp` or `worker` accepts work: each image a task type names is in the store,
/// every one of its files re-hashes to the recorded list (`agentjail image verify`), and its
/// per-run check (the keyed fingerprint) passes. Otherwise the service refuses to start, naming
/// the task and the image (exit 125): every run of that task would be refused anyway.
pub fn check_at_startup(config: &Config, store: &Path) -> Result<(), String> {
    let s = Store::at(Some(store));
    for (digest, tasks) in pinned(config) {
        let task = tasks.join("`, `");
        let refuse =
            |why: String| format!("refusing to start: task `{task}`: image {digest} {why}");
        let v = match s.verify(digest) {
            Ok(v) => v,
            Err(ImageError::NotFound { .. }) => {
                return Err(refuse(format!(
                    "is not in the image store {} (import it with `agentjail image import --store {} PATH`, or set server.image_store)",
                    store.display(),
                    store.display()
                )));
            }
            Err(e) => return Err(refuse(format!("cannot be checked: {e}"))),
        };
        if !v.ok {
            let first = v.changes.first().cloned().unwrap_or_default();
            return Err(refuse(format!(
                "changed since it was imported into {} ({first}; `agentjail image verify --store {} {digest}` lists every change): re-import it",
                store.display(),
                store.display()
            )));
        }
        s.resolve(digest)
            .map_err(|e| refuse(format!("fails its per-run check: {e}")))?;
        tracing::info!(image = %digest, tasks = %task, "image verified");
    }
    Ok(())
}

/// How to run a command in a sandbox on a task's image: the runner binary, the image store and
/// the degraded-mode switch the service's runs use.
#[derive(Debug, Clone)]
pub struct Sandboxed {
    pub runner: PathBuf,
    pub store: PathBuf,
    pub allow_degraded: bool,
}

impl Sandboxed {
    /// Runs `argv` (with the task's env, image, isolation tier and limits; network denied; no
    /// inputs) as a real `agentjail run` and returns its stdout (at most 4 KiB) when it exited
    /// 0 within `timeout`; None otherwise (logged).
    pub fn stdout_of(&self, task: &Task, argv: Vec<String>, timeout: Duration) -> Option<String> {
        use std::io::Read;
        let mut m = agentjail_manifest::Manifest::for_command(argv);
        m.image = task.image.clone();
        m.env = task.env.clone();
        m.isolation = task.isolation;
        m.limits = task.limits;
        m.limits.seconds = m.limits.seconds.min(timeout.as_secs().max(1));
        let dir = tempdir()?;
        let file = dir.join("probe.json");
        std::fs::write(&file, serde_json::to_vec(&m).ok()?).ok()?;
        let mut cmd = std::process::Command::new(&self.runner);
        cmd.arg("run")
            .arg("--manifest")
            .arg(&file)
            .arg("--image-store")
            .arg(&self.store);
        if self.allow_degraded {
            cmd.arg("--allow-degraded");
        }
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(k) = std::env::var_os(agentjail_image::KEY_ENV) {
            cmd.env(agentjail_image::KEY_ENV, k);
        }
        let result = (|| {
            let mut child = cmd.spawn().ok()?;
            let (status, out) = finish_within(&mut child, timeout + Duration::from_secs(5))?;
            let mut err = String::new();
            let _ = child.stderr.take()?.take(1024).read_to_string(&mut err);
            if !status.success() {
                tracing::warn!(image = ?task.image, stderr = %err.trim(), "sandboxed probe failed");
                return None;
            }
            Some(out)
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result
    }
}

/// Waits for `child` at most `timeout` (past it: killed, reaped, None); then its exit status
/// and the first 4 KiB of its stdout. For probes whose output is small.
pub fn finish_within(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<(std::process::ExitStatus, String)> {
    use std::io::Read;
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let mut out = String::new();
    child
        .stdout
        .take()?
        .take(4096)
        .read_to_string(&mut out)
        .ok()?;
    Some((status, out))
}

/// A fresh private directory for the probe's manifest.
fn tempdir() -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let d = std::env::temp_dir().join(format!(
        "agentjail-probe-{}-{}",
        std::process::id(),
        crate::util::random_hex(8).ok()?
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&d).ok()?;
    Some(d)
}
