//! What every probe uses: the tiers, a probe and its verdict, the groups, the environment that
//! runs `agentjail run` for a probe ([`Env`]) and what a run gave back ([`RunOut`]). Kept apart
//! from the command ([`super`]) so that the probe families depend on it, not on the command
//! that lists them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

/// An isolation tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Native,
    Gvisor,
}

impl Tier {
    pub(super) fn name(self) -> &'static str {
        match self {
            Tier::Native => "native",
            Tier::Gvisor => "gvisor",
        }
    }
}

/// What happened to one probe.
#[derive(Clone, Debug)]
pub enum Verdict {
    Pass(String),
    Fail(String),
    Skip(String),
}

impl Verdict {
    pub(super) fn word(&self) -> &'static str {
        match self {
            Verdict::Pass(_) => "pass",
            Verdict::Fail(_) => "fail",
            Verdict::Skip(_) => "skip",
        }
    }
    pub(super) fn detail(&self) -> &str {
        match self {
            Verdict::Pass(d) | Verdict::Fail(d) | Verdict::Skip(d) => d,
        }
    }
}

/// One probe as documented: id, the layer that stops it, what it attempts, what is expected.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    pub id: &'static str,
    pub layer: &'static str,
    pub attempt: &'static str,
    pub expect: &'static str,
}

/// A group of probes checked from the same sandbox run(s).
pub struct Group {
    pub name: &'static str,
    pub tiers: &'static [Tier],
    pub probes: &'static [Probe],
    /// Runs the group on a tier; returns a verdict per probe id (a probe without one fails).
    pub run: fn(&Env, Tier) -> Vec<(&'static str, Verdict)>,
}

/// One line of the result.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeResult {
    pub id: String,
    pub tier: Tier,
    pub layer: String,
    pub attempt: String,
    pub expect: String,
    pub outcome: String,
    pub detail: String,
    pub ms: u64,
}

/// Where the probes run and how: the binary, a scratch folder, the mode of this host.
pub struct Env {
    exe: PathBuf,
    dir: tempfile::TempDir,
    /// A strict run is refused here: every probe runs with `--allow-degraded`.
    pub degraded: bool,
    /// This process is the `--egress` half inside a private network namespace.
    pub egress_inner: bool,
    counter: std::cell::Cell<u32>,
}

/// What one `agentjail run` did.
pub struct RunOut {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub report: Value,
    pub elapsed: Duration,
}

impl RunOut {
    pub fn status(&self) -> &str {
        self.report["status"].as_str().unwrap_or("")
    }
    /// The probe program ran to its end (it prints `PROBE-COMPLETE` last).
    pub fn complete(&self) -> bool {
        self.stdout.contains("PROBE-COMPLETE")
    }
    /// `RESULT name X` → X.
    pub fn result(&self, name: &str) -> Option<String> {
        let prefix = format!("RESULT {name} ");
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(str::to_string)
    }
    /// The first line starting with `prefix`, without it.
    pub fn line(&self, prefix: &str) -> Option<String> {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(|s| s.trim().to_string())
    }
    pub fn denied(&self, kind: &str, needle: &str) -> bool {
        self.denial(kind, |d| d.contains(needle))
    }
    pub fn denial(&self, kind: &str, f: impl Fn(&str) -> bool) -> bool {
        self.report["denials"]
            .as_array()
            .map(|a| {
                a.iter()
                    .any(|d| d["kind"] == kind && f(d["detail"].as_str().unwrap_or("")))
            })
            .unwrap_or(false)
    }
    /// Why a probe program did not get to its end, in one line.
    pub fn incomplete(&self) -> String {
        let err = self
            .stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        format!(
            "the probe did not complete (exit {}, status {:?}): {}",
            self.code,
            self.status(),
            printable(err, 200)
        )
    }
}

/// At most `max` characters, control characters escaped.
pub fn printable(s: &str, max: usize) -> String {
    let mut out = String::new();
    for c in s.chars().take(max) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The Python preamble of every probe program: `attempt(name, fn)` prints `RESULT name ok` or
/// `RESULT name errno=N`; `sys_call(name, nr, *args)` makes a raw syscall the same way.
pub(super) const PY_PREAMBLE: &str = r#"import os, sys, socket, ctypes, errno, time
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, fn):
    try:
        r = fn()
        print("RESULT", name, "ok", flush=True)
        return r
    except OSError as e:
        print("RESULT", name, "errno=%d" % (e.errno or 0), flush=True)
    except Exception as e:
        print("RESULT", name, "error=%s" % type(e).__name__, flush=True)
def sys_call(name, nr, *args):
    ctypes.set_errno(0)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    print("RESULT", name, "ok" if r >= 0 else "errno=%d" % e, flush=True)
"#;

/// The interpreter the probe programs run with (inside the sandbox, from the host's /usr).
pub const PY: &str = "/usr/bin/python3";

/// Longest a single probe run may take before this process kills it (a hang is a failure).
pub(super) const RUN_GUARD: Duration = Duration::from_secs(90);

impl Env {
    pub(super) fn new(degraded: bool, egress_inner: bool) -> Result<Env, String> {
        let exe = std::fs::read_link("/proc/self/exe")
            .map_err(|e| format!("cannot find this binary (/proc/self/exe): {e}"))?;
        let dir = tempfile::Builder::new()
            .prefix("agentjail-selftest-")
            .tempdir()
            .map_err(|e| format!("cannot create a temporary folder: {e}"))?;
        // The sandbox user is an unprivileged host uid: it must be able to read the probes.
        set_mode(dir.path(), 0o755)?;
        Ok(Env {
            exe,
            dir,
            degraded,
            egress_inner,
            counter: std::cell::Cell::new(0),
        })
    }

    /// A fresh unique name (for files, markers, request ids).
    pub fn unique(&self, what: &str) -> String {
        let n = self.counter.get() + 1;
        self.counter.set(n);
        format!("{what}-{}-{n}", std::process::id())
    }

    /// The scratch folder (0755).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file (mode `mode`) into the scratch folder under a unique name.
    pub fn file(&self, what: &str, content: &[u8], mode: u32) -> Result<PathBuf, String> {
        let p = self.dir.path().join(self.unique(what));
        std::fs::write(&p, content).map_err(|e| format!("{}: {e}", p.display()))?;
        set_mode(&p, mode)?;
        Ok(p)
    }

    /// A new folder (0755) in the scratch folder.
    pub fn subdir(&self, what: &str) -> Result<PathBuf, String> {
        let p = self.dir.path().join(self.unique(what));
        std::fs::create_dir(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        set_mode(&p, 0o755)?;
        Ok(p)
    }

    /// `agentjail run --report R [--allow-degraded] [--isolation gvisor] ARGS`.
    pub fn command(&self, tier: Tier, args: &[String]) -> (Command, PathBuf) {
        let report = self
            .dir
            .path()
            .join(format!("{}.json", self.unique("report")));
        let mut cmd = Command::new(&self.exe);
        cmd.arg("run").arg("--report").arg(&report);
        if self.degraded {
            cmd.arg("--allow-degraded");
        }
        if tier == Tier::Gvisor {
            cmd.args(["--isolation", "gvisor"]);
        }
        cmd.args(args);
        (cmd, report)
    }

    /// Runs `agentjail run` (see [`Env::command`]) and collects what it did.
    pub fn run(&self, tier: Tier, args: &[String]) -> RunOut {
        let (cmd, report) = self.command(tier, args);
        run_command(cmd, &report)
    }

    /// Runs the Python probe `body` (with [`PY_PREAMBLE`]) at /input/probe.py.
    pub fn py(&self, tier: Tier, body: &str, extra: &[String]) -> RunOut {
        match self.py_command(tier, body, extra) {
            Ok((cmd, report)) => run_command(cmd, &report),
            Err(e) => RunOut {
                code: -1,
                stdout: String::new(),
                stderr: e,
                report: Value::Null,
                elapsed: Duration::ZERO,
            },
        }
    }

    /// The command [`Env::py`] runs, for callers that adjust it (environment, launcher).
    pub fn py_command(
        &self,
        tier: Tier,
        body: &str,
        extra: &[String],
    ) -> Result<(Command, PathBuf), String> {
        let src = format!("{PY_PREAMBLE}{body}\nprint(\"PROBE-COMPLETE\", flush=True)\n");
        let p = self.file("probe.py", src.as_bytes(), 0o644)?;
        let mut args = extra.to_vec();
        args.push("--ro".into());
        args.push(format!("{}:/input/probe.py", p.display()));
        args.extend(["--".into(), PY.into(), "/input/probe.py".into()]);
        Ok(self.command(tier, &args))
    }
}

/// Runs a prepared `agentjail run` command with a guard deadline; reads its report.
pub fn run_command(mut cmd: Command, report: &Path) -> RunOut {
    let t = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return RunOut {
                code: -1,
                stdout: String::new(),
                stderr: format!("cannot start agentjail: {e}"),
                report: Value::Null,
                elapsed: t.elapsed(),
            };
        }
    };
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(r) = r {
                let _ = r.take(8 << 20).read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let mut killed = false;
    let code = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s.code().unwrap_or(-1),
            Ok(None) if t.elapsed() > RUN_GUARD => {
                let _ = child.kill();
                killed = true;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break -1,
        }
    };
    let elapsed = t.elapsed();
    let stdout = out.join().unwrap_or_default();
    let mut stderr = err.join().unwrap_or_default();
    if killed {
        stderr.push_str("\nselftest: agentjail run did not end within the guard deadline; killed");
    }
    let report = std::fs::read(report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    RunOut {
        code,
        stdout,
        stderr,
        report,
        elapsed,
    }
}

pub(super) fn set_mode(p: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", p.display()))
}

pub fn rustix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}
