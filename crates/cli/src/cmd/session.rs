//! `agentjail session start|exec|ls|stop` (docs/sessions-cli.md): sessions for local use. A
//! per-user background daemon (`session daemon`, hidden) serves the service's sessions
//! (agentjail_server::doors::local_sessions: the engine and session code `serve` and `run`
//! use) on a Unix socket in a private directory: `--state-dir`, else
//! `$XDG_RUNTIME_DIR/agentjail-session`, else `/tmp/agentjail-session-UID`, made 0700 and
//! refused when another user owns it. `start` launches the daemon when nobody answers on the
//! socket; the daemon exits when its last session ends. No process is ever signalled: the
//! daemon is told over its socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::out::EXIT_SETUP;

/// The built-in task of `session start` without `--config`: Python, run from `/work`, its
/// stdout and stderr shown; the wrapper writes the small output every task needs, so a cell's
/// status is its code's exit.
const BUILTIN_TASK: &str = "python";

fn builtin_config(token_sha256: &str) -> String {
    format!(
        r#"# Written by `agentjail session start` (the built-in local Python task).
[tenants.local]

[actors.local]
tenant = "local"
token_sha256 = "{token_sha256}"

[tasks.{BUILTIN_TASK}]
description = "Python 3 cells sharing /work"
code = "allowed"
command = ["/usr/bin/python3", "-c", "import json, os, runpy\nos.chdir('/work')\ntry:\n    runpy.run_path('/input/code.py', run_name='__main__')\nfinally:\n    json.dump({{}}, open('/output/cell.json', 'w'))\n"]
allowed_actors = ["local"]
stdout_bytes = 65536
expose_stderr_bytes = 65536
max_code_bytes = 1048576

[tasks.{BUILTIN_TASK}.output]
path = "/output/cell.json"
media_type = "application/json"
max_bytes = 64

[tasks.{BUILTIN_TASK}.limits]
seconds = 60
memory_mb = 1024

[tasks.{BUILTIN_TASK}.session]
max_cells = 1000
"#
    )
}

#[derive(Subcommand)]
pub enum SessionCmd {
    /// Open a session (starting this user's session daemon if none runs); prints its id.
    Start {
        /// Configuration file whose task to open (as for `serve`) [default: a built-in
        /// Python task, `python`].
        #[arg(long, value_name = "FILE", requires = "task")]
        config: Option<PathBuf>,
        /// The task to open a session of (a code task of --config).
        #[arg(long, value_name = "NAME")]
        task: Option<String>,
        /// The actor to act as [default: the configuration's only actor].
        #[arg(long, value_name = "NAME")]
        actor: Option<String>,
        #[command(flatten)]
        dir: StateDir,
        /// Run even where a protection cannot be applied (listed in each cell's report).
        #[arg(long)]
        allow_degraded: bool,
    },
    /// Run a cell: code from -c, a file, or - (stdin); prints what it printed, exits as `run`.
    #[command(
        after_long_help = "Exit status: the cell's own (0 when it ended ok); 124 time limit; 137 memory limit; 128+N signal N; 65 output rejected; 125 refused (no daemon running, unknown or ended session, unreadable code file, no code) or the cell could not be set up, with one line on stderr."
    )]
    Exec {
        /// The session's id (from `session start`).
        #[arg(value_name = "ID")]
        id: String,
        /// The cell's code.
        #[arg(short = 'c', value_name = "CODE", conflicts_with = "file")]
        code: Option<String>,
        /// A file holding the cell's code, or - for stdin.
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        #[command(flatten)]
        dir: StateDir,
    },
    /// List the open sessions of this user's daemon.
    Ls {
        #[command(flatten)]
        dir: StateDir,
    },
    /// End a session (or --all); the daemon exits with its last session.
    Stop {
        /// The session's id.
        #[arg(
            value_name = "ID",
            required_unless_present = "all",
            conflicts_with = "all"
        )]
        id: Option<String>,
        /// End every session and stop the daemon.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        dir: StateDir,
    },
    /// The daemon itself (started by `session start`).
    #[command(hide = true)]
    Daemon {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        #[arg(long, value_name = "ID")]
        config_id: String,
        #[command(flatten)]
        dir: StateDir,
        #[arg(long)]
        allow_degraded: bool,
    },
}

#[derive(Args)]
pub struct StateDir {
    /// The daemon's private directory (socket, database, checkpoints, keys) [default:
    /// $XDG_RUNTIME_DIR/agentjail-session, else /tmp/agentjail-session-UID].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

impl StateDir {
    /// The directory, made if missing: 0700, and ours (another user's is refused).
    fn open(&self) -> Result<PathBuf, String> {
        let dir = match &self.state_dir {
            Some(d) => d.clone(),
            None => match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
                Some(r) => PathBuf::from(r).join("agentjail-session"),
                None => PathBuf::from(format!("/tmp/agentjail-session-{}", uid())),
            },
        };
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
        let m = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !m.is_dir() || m.uid() != uid() {
            return Err(format!(
                "{} is not a directory of yours: the session daemon keeps its socket only in a private directory",
                dir.display()
            ));
        }
        if m.mode() & 0o077 != 0 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        Ok(dir)
    }
}

fn socket(dir: &Path) -> PathBuf {
    dir.join("daemon.sock")
}

/// One request, one answer. `Err` is the one-line error to show.
fn ask(dir: &Path, req: &Value) -> Result<Value, String> {
    let sock = socket(dir);
    let mut s = UnixStream::connect(&sock).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => format!(
            "no session daemon is running in {} (start a session with `agentjail session start`)",
            dir.display()
        ),
        _ => format!("cannot reach the session daemon at {}: {e}", sock.display()),
    })?;
    let line = req.to_string() + "\n";
    // A refusal (another uid) may come before the daemon reads anything: the write then
    // fails with a broken pipe, and the answer is still there to read.
    if let Err(e) = s.write_all(line.as_bytes())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(format!("the session daemon: {e}"));
    }
    let mut answer = String::new();
    BufReader::new(s)
        .read_line(&mut answer)
        .map_err(|e| format!("the session daemon: {e}"))?;
    if answer.is_empty() {
        return Err("the session daemon closed the connection without an answer".into());
    }
    let v: Value = serde_json::from_str(&answer)
        .map_err(|e| format!("the session daemon's answer is not JSON: {e}"))?;
    if v["ok"] == true {
        Ok(v)
    } else {
        Err(format!(
            "{} ({})",
            v["detail"].as_str().unwrap_or("refused"),
            v["error"].as_str().unwrap_or("error")
        ))
    }
}

fn alive(dir: &Path) -> bool {
    UnixStream::connect(socket(dir)).is_ok()
}

/// Starts the daemon in its own process group, its log in DIR/daemon.log; waits until it
/// answers on its socket.
fn launch(dir: &Path, config: &Path, config_id: &str, allow_degraded: bool) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find agentjail itself: {e}"))?;
    let log_path = dir.join("daemon.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("session")
        .arg("daemon")
        .arg("--config")
        .arg(config)
        .arg("--config-id")
        .arg(config_id)
        .arg("--state-dir")
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2);
    if allow_degraded {
        cmd.arg("--allow-degraded");
    }
    // Its own process group: a Ctrl-C in this terminal does not reach it.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the session daemon: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if alive(dir) {
            // Reaped by init once this process exits; never signalled.
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last = log
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            return Err(format!(
                "the session daemon exited ({st}) before listening: {last} (log: {})",
                log_path.display()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the session daemon did not listen within 60 s (log: {})",
                log_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(
    config: Option<PathBuf>,
    task: Option<String>,
    actor: Option<String>,
    dir: &StateDir,
    allow_degraded: bool,
) -> Result<u8, String> {
    let dir = dir.open()?;
    let (config, config_id, task) = match config {
        Some(c) => {
            let abs = c
                .canonicalize()
                .map_err(|e| format!("--config {}: {e}", c.display()))?;
            // Refused here, in one line, rather than by a daemon that never starts.
            agentjail_server::Config::load(&abs)
                .map_err(|e| format!("--config {}: {e}", c.display()))?;
            let id = abs.display().to_string();
            (abs, id, task.unwrap_or_default())
        }
        None => {
            let p = dir.join("builtin.toml");
            // Written afresh for each daemon (never read back from a file another version
            // left).
            if !alive(&dir) {
                // The actor's token is never used (the socket's peer uid is the
                // authentication): a random one, forgotten at once.
                let mut token = [0u8; 32];
                std::fs::File::open("/dev/urandom")
                    .and_then(|mut f| f.read_exact(&mut token))
                    .map_err(|e| format!("no randomness: {e}"))?;
                let sha = agentjail_server::config::sha256_hex(&token);
                std::fs::write(&p, builtin_config(&sha))
                    .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
            }
            (
                p,
                "the built-in configuration".to_string(),
                task.unwrap_or_else(|| BUILTIN_TASK.to_string()),
            )
        }
    };
    if !alive(&dir) {
        launch(&dir, &config, &config_id, allow_degraded)?;
    }
    let v = ask(
        &dir,
        &json!({"op": "open", "task": task, "actor": actor, "config_id": config_id}),
    )
    .map_err(|e| format!("cannot open a session of task `{task}`: {e}"))?;
    outln!("{}", v["session"]["session_id"].as_str().unwrap_or(""));
    Ok(0)
}

fn show_stream(v: &Value, to_stdout: bool) {
    let Some(s) = v.as_object() else { return };
    let mut text = s
        .get("head")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let omitted = s.get("omitted_bytes").and_then(Value::as_u64).unwrap_or(0);
    if omitted > 0 {
        text.push_str(&format!("\n[... {omitted} bytes not shown ...]\n"));
        text.push_str(s.get("tail").and_then(Value::as_str).unwrap_or(""));
    }
    if to_stdout {
        crate::out::out_bytes(text.as_bytes());
    } else {
        crate::out::err(format_args!("{text}"));
    }
}

/// The exit status of a cell, as `run`'s (README, "exit status of `run`").
fn cell_exit(run: &Value) -> u8 {
    let report = &run["report"];
    match run["status"].as_str().unwrap_or("") {
        "ok" => 0,
        "exit_nonzero" => report["exit_code"]
            .as_i64()
            .filter(|c| (1..=255).contains(c))
            .map_or(1, |c| c as u8),
        "signaled" => report["signal"]
            .as_i64()
            .filter(|s| (1..=64).contains(s))
            .map_or(128, |s| 128 + s as u8),
        "timeout" => 124,
        "memory_limit" => 137,
        "output_rejected" => 65,
        _ => EXIT_SETUP,
    }
}

fn exec(
    id: &str,
    code: Option<String>,
    file: Option<PathBuf>,
    dir: &StateDir,
) -> Result<u8, String> {
    let code = match (code, file) {
        (Some(c), _) => c,
        (None, Some(f)) if f.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| format!("cannot read the code from stdin: {e}"))?;
            s
        }
        (None, Some(f)) => std::fs::read_to_string(&f)
            .map_err(|e| format!("cannot read the code from {}: {e}", f.display()))?,
        (None, None) => return Err("no code: give -c CODE, a FILE, or - for stdin".into()),
    };
    let dir = dir.open()?;
    let v = ask(&dir, &json!({"op": "cell", "session_id": id, "code": code}))?;
    let cell = &v["cell"];
    show_stream(&cell["stdout"], true);
    show_stream(&cell["stderr"], false);
    let status = cell["status"].as_str().unwrap_or("unknown");
    let rc = cell_exit(cell);
    if status != "ok" && status != "exit_nonzero" {
        errln!(
            "agentjail session: cell {} of {id}: {status}{}",
            cell["cell"],
            cell["reason"]
                .as_str()
                .map_or(String::new(), |r| format!(" ({r})"))
        );
    }
    Ok(rc)
}

fn ls(dir: &StateDir) -> Result<u8, String> {
    let dir = dir.open()?;
    if !alive(&dir) {
        return Ok(0);
    }
    let v = ask(&dir, &json!({"op": "list"}))?;
    for s in v["sessions"].as_array().into_iter().flatten() {
        outln!(
            "{}\t{}\t{}\t{} cell(s)\tuntil {}",
            s["session_id"].as_str().unwrap_or(""),
            s["task"].as_str().unwrap_or(""),
            s["state"].as_str().unwrap_or(""),
            s["cells"],
            s["expires_at"].as_str().unwrap_or("")
        );
    }
    Ok(0)
}

fn stop(id: Option<String>, all: bool, dir: &StateDir) -> Result<u8, String> {
    let dir = dir.open()?;
    let v = if all {
        if !alive(&dir) {
            return Ok(0);
        }
        ask(&dir, &json!({"op": "close_all"}))?
    } else {
        let id = id.unwrap_or_default();
        ask(&dir, &json!({"op": "close", "session_id": id}))?
    };
    // With its last session the daemon exits: wait until its socket and the sessions'
    // checkpoints are gone and its data directory's lock is released (the process has let go
    // of its state), so that what follows (a new `start`) does not meet a daemon on its way
    // out.
    if v["remaining"] == 0 {
        let deadline = Instant::now() + Duration::from_secs(10);
        let checkpoints = dir.join("data/checkpoints");
        let lock = dir.join("data/private/lock");
        let held = || {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&lock)
                .is_ok_and(|f| f.try_lock().is_err())
        };
        while (socket(&dir).exists() || checkpoints.exists() || held()) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(0)
}

fn daemon(
    config: PathBuf,
    config_id: String,
    dir: &StateDir,
    allow_degraded: bool,
) -> Result<u8, String> {
    let dir = dir.open()?;
    let cfg = agentjail_server::Config::load(&config)
        .map_err(|e| format!("--config {}: {e}", config.display()))?;
    agentjail_server::doors::local_sessions::serve_blocking(
        agentjail_server::doors::local_sessions::LocalOptions {
            config: cfg,
            data_dir: dir.join("data"),
            socket: socket(&dir),
            config_id,
            allow_degraded,
        },
    )
    .map(|()| 0)
    .map_err(|e| e.to_string())
}

pub fn run(c: SessionCmd) -> Result<u8, String> {
    match c {
        SessionCmd::Start {
            config,
            task,
            actor,
            dir,
            allow_degraded,
        } => start(config, task, actor, &dir, allow_degraded),
        SessionCmd::Exec {
            id,
            code,
            file,
            dir,
        } => exec(&id, code, file, &dir),
        SessionCmd::Ls { dir } => ls(&dir),
        SessionCmd::Stop { id, all, dir } => stop(id, all, &dir),
        SessionCmd::Daemon {
            config,
            config_id,
            dir,
            allow_degraded,
        } => daemon(config, config_id, &dir, allow_degraded),
    }
}
