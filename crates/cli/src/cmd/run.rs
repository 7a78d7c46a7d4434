//! `agentjail run`: one run from flags, a manifest file, or (for `agentjail serve`) a manifest on
//! the lifeline; the pipeline does the rest.

use std::path::{Path, PathBuf};

use agentjail_engine::{RunOptions, Sink};
use agentjail_manifest::report::RunReport;
use agentjail_manifest::{Limits, Manifest, SourcePolicy};
use clap::Args;

use crate::flags::ManifestFlags;
use crate::out::print_json;
use crate::pipeline::{self, Delivery, SetupFailure};

#[derive(Args)]
pub struct RunArgs {
    /// Run what this manifest file (YAML or JSON) describes.
    #[arg(long, value_name = "FILE", conflicts_with = "ManifestFlags")]
    pub manifest: Option<PathBuf>,
    /// Allow manifest sources below this folder too (repeatable; default: the manifest's folder).
    #[arg(long, value_name = "DIR")]
    pub source_root: Vec<PathBuf>,
    /// Copy verified output here (created if absent; refused if not empty).
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Write the run report (JSON) here.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Write a signed receipt (DSSE envelope, in-toto statement) here.
    #[arg(long, value_name = "FILE")]
    pub receipt: Option<PathBuf>,
    /// Write the workspace checkpoint (a tar archive of /work, manifest `workspace` with
    /// `collect: true`) here, atomically; its sha256 is the report's `workspace.sha256`.
    #[arg(long, value_name = "FILE")]
    pub workspace_out: Option<PathBuf>,
    /// Receipt signing key (default: $XDG_DATA_HOME/agentjail/receipt-key.pem).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Run even where a protection cannot be applied; the report lists what was not.
    #[arg(long)]
    pub allow_degraded: bool,
    /// Print the setup plan (mounts, Landlock rules, environment names) and exit.
    #[arg(long)]
    pub dry_run: bool,
    /// Pass the command's stdout/stderr through byte for byte even to a terminal (by default,
    /// on a terminal its control characters are shown escaped, e.g. `\x1b`).
    #[arg(long)]
    pub raw_output: bool,
    /// Name server (IP:PORT) the egress gateway resolves destinations with, instead of the
    /// host's /etc/hosts and /etc/resolv.conf (repeatable).
    #[arg(long = "egress-dns", value_name = "IP:PORT")]
    pub egress_dns: Vec<std::net::SocketAddr>,
    /// For `agentjail serve`: stdin carries the manifest (one line of JSON; sources relative to
    /// the working directory) and then stays open; when it hangs up (the service died), the
    /// sandbox is killed and the run ends.
    #[arg(long, hide = true, conflicts_with = "manifest")]
    pub lifeline: bool,
    /// For `agentjail serve` (with `--lifeline`): change into this folder (the job's) before
    /// anything else, as if started there. The service names it here rather than starting the
    /// runner in it, because a child given a working directory is started with fork(), and
    /// without one with posix_spawn() (vfork: no copy of the service's page tables).
    #[arg(long, hide = true, value_name = "DIR", requires = "lifeline")]
    pub job_dir: Option<PathBuf>,
    /// For `agentjail serve` (with `--lifeline`, which is then a Unix socket): send the
    /// verified artifact, the signed receipt (with `--key`) and the report back over the
    /// lifeline instead of writing files (agentjail_manifest::results); the output is
    /// collected and verified in memory. Sources must lie below a `--source-root`.
    #[arg(
        long,
        hide = true,
        requires = "lifeline",
        conflicts_with_all = ["job_dir", "output_dir", "report", "receipt", "workspace_out"]
    )]
    pub results_on_lifeline: bool,
    /// For `agentjail serve`'s live sessions (with `--lifeline`): connect to the Unix socket
    /// at PATH (the service listens on it, in the job folder) and give the connection to the
    /// command as its stdin, the control channel of the session's resident interpreter.
    #[arg(long, hide = true, value_name = "PATH", requires = "lifeline")]
    pub live_control: Option<PathBuf>,
    /// For a fleet executor (with `--lifeline`): the run's lease ends at this time
    /// (nanoseconds of `CLOCK_BOOTTIME`) unless a renewal moves it; the executor sends
    /// renewals on the lifeline after the manifest (agentjail_manifest::results::LEASE). When
    /// it passes, the sandbox is killed, so that no payload outlives a lease its executor lost
    /// (docs/deploy.md, "Leases and fencing").
    #[arg(long, hide = true, value_name = "NS", requires = "lifeline")]
    pub lease_until: Option<u64>,
    /// Image store that a manifest's `image: sha256:…` is taken from (docs/images.md).
    #[arg(long, value_name = "DIR", env = "AGENTJAIL_IMAGE_STORE")]
    pub image_store: Option<PathBuf>,
    #[command(flatten)]
    pub flags: ManifestFlags,
}

/// Removes a report left at `path` by an earlier run, so that after the pipeline a file at
/// `path` is always this run's report (the pipeline's own, or the setup-error report written
/// when the pipeline failed without one). Refuses when an existing entry cannot be removed.
pub fn clear_stale_report(path: Option<&Path>) -> Result<(), String> {
    match path.map(std::fs::remove_file) {
        None | Some(Ok(())) => Ok(()),
        Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Some(Err(e)) => Err(format!(
            "--report {}: cannot replace the existing file: {e}",
            path.map(|p| p.display().to_string()).unwrap_or_default()
        )),
    }
}

/// [`report_setup_error`] over the lifeline (stdin, a socket: `--results-on-lifeline`).
fn report_setup_error_on_lifeline(limits: Limits, msg: &str) {
    let r = RunReport::setup_error(limits, msg.to_string());
    if let (Ok(bytes), Ok(fd)) = (
        serde_json::to_vec(&r),
        std::os::fd::AsFd::as_fd(&std::io::stdin()).try_clone_to_owned(),
    ) {
        let _ = pipeline::send_frame(&fd, agentjail_manifest::results::REPORT, &bytes);
    }
}

/// Writes a setup-error report when the run never got to the engine.
pub fn report_setup_error(path: Option<&Path>, limits: Limits, msg: &str) {
    if let Some(p) = path {
        let r = RunReport::setup_error(limits, msg.to_string());
        if let Ok(mut bytes) = serde_json::to_vec_pretty(&r) {
            bytes.push(b'\n');
            let _ = pipeline::write_atomic(p, &bytes);
        }
    }
}

pub fn run(a: RunArgs) -> Result<u8, String> {
    agentjail_engine::timing::mark("run: arguments parsed");
    if let Some(d) = &a.job_dir {
        // Before anything is read or written: the relative --report, --receipt and
        // --output-dir, and the sources' base folder, are the job folder's. On failure no
        // report is written (it would land in the wrong folder); the service, finding none
        // (and no announcement of the sandbox's start), records a set-up error.
        std::env::set_current_dir(d).map_err(|e| format!("--job-dir {}: {e}", d.display()))?;
    }
    let mut lifeline = None;
    let mut lease = None;
    // A report that the run could not be set up: to `--report`, or over the lifeline.
    let setup_error = |limits: Limits, msg: &str| {
        if a.results_on_lifeline {
            report_setup_error_on_lifeline(limits, msg);
        } else {
            report_setup_error(a.report.as_deref(), limits, msg);
        }
    };
    let (manifest, policy) = match &a.manifest {
        None if a.lifeline => {
            let (text, pending) = read_manifest_line().inspect_err(|e| {
                setup_error(Limits::default(), e);
            })?;
            // The service's runner holds its manifest: from now on its stderr carries the
            // sandbox's bytes only (crate::out), and what it would say goes in the report. A
            // refusal before this point (no manifest) is its one line there, with no sandbox.
            crate::out::own_stderr_off();
            lease = a
                .lease_until
                .map(|until_ns| agentjail_engine::lifeline::LeaseStart { until_ns, pending });
            let m = Manifest::parse(&text).map_err(|e| {
                setup_error(Limits::default(), &e.to_string());
                e.to_string()
            })?;
            // Results on the lifeline: no job folder, so the working directory is nobody's,
            // neither a root of sources nor their base (the first `--source-root` is).
            let cwd = match (a.results_on_lifeline, a.source_root.first()) {
                (true, Some(r)) => r.clone(),
                (true, None) => PathBuf::from("/"),
                (false, _) => {
                    std::env::current_dir().map_err(|e| format!("current directory: {e}"))?
                }
            };
            let mut roots = if a.results_on_lifeline {
                Vec::new()
            } else {
                vec![cwd.clone()]
            };
            for r in &a.source_root {
                roots.push(
                    r.canonicalize()
                        .map_err(|e| format!("--source-root {}: {e}", r.display()))?,
                );
            }
            use std::os::fd::AsFd;
            lifeline = Some(std::sync::Arc::new(
                std::io::stdin()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| format!("lifeline: {e}"))?,
            ));
            (
                m,
                SourcePolicy {
                    base_dir: cwd,
                    roots: Some(roots),
                },
            )
        }
        Some(path) => {
            // Flags that describe the run conflict with --manifest (clap refuses them).
            let m = match Manifest::load(path) {
                Ok(m) => m,
                Err(e) => {
                    report_setup_error(a.report.as_deref(), Limits::default(), &e.to_string());
                    return Err(e.to_string());
                }
            };
            let base = path
                .parent()
                .map(|p| {
                    if p.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        p
                    }
                })
                .unwrap_or(Path::new("."))
                .canonicalize()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let mut roots = vec![base.clone()];
            for r in &a.source_root {
                roots.push(
                    r.canonicalize()
                        .map_err(|e| format!("--source-root {}: {e}", r.display()))?,
                );
            }
            (
                m,
                SourcePolicy {
                    base_dir: base,
                    roots: Some(roots),
                },
            )
        }
        None => {
            let m = a.flags.to_manifest().inspect_err(|e| {
                report_setup_error(a.report.as_deref(), Limits::default(), e);
            })?;
            let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
            // The caller names host paths on its own command line: any path it can read.
            (
                m,
                SourcePolicy {
                    base_dir: cwd,
                    roots: None,
                },
            )
        }
    };
    let limits = manifest.limits;
    agentjail_engine::timing::mark("run: manifest built");
    let vm = match manifest.validate(&policy, jiff::Timestamp::now()) {
        Ok(vm) => vm,
        Err(e) => {
            // A flag-built run's error names the flag the user typed, not the field.
            let msg = if a.manifest.is_none() && !a.lifeline {
                crate::flags::flag_error(&e, &a.flags.ro)
            } else {
                e.to_string()
            };
            setup_error(limits, &msg);
            return Err(msg);
        }
    };
    if a.dry_run {
        // The plan on the image the run would use; a refusal is shown, not hidden.
        let (image, root) = match pipeline::select_root(&vm, a.image_store.as_deref()) {
            Ok((d, r)) => (serde_json::json!(d), r),
            Err(e) => (
                serde_json::json!({ "refused": e }),
                agentjail_engine::RootImage::Host,
            ),
        };
        let plan = agentjail_engine::plan::Plan::for_root(&vm, &root);
        let env_names: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
        // Inline inputs by size and digest (like env, by name): their content is the run's
        // (e.g. a model's code), not the plan's.
        let ops: Vec<serde_json::Value> = plan
            .ops
            .iter()
            .map(|op| match op {
                agentjail_engine::plan::Op::Inline { dest, content } => serde_json::json!({
                    "op": "inline",
                    "dest": dest,
                    "bytes": content.len(),
                    "sha256": agentjail_verify::digest::bytes_digest(content.as_bytes()),
                }),
                op => serde_json::json!(op),
            })
            .collect();
        print_json(&serde_json::json!({
            "manifest_digest": vm.digest,
            "image": image,
            "ops": ops,
            "landlock": plan.rules,
            "argv": plan.argv,
            "env": env_names,
            "cwd": plan.cwd,
        }));
        return Ok(0);
    }
    clear_stale_report(a.report.as_deref())?;
    let terminal = Terminal::of_our_streams(a.raw_output);
    let results = if a.results_on_lifeline {
        lifeline.clone()
    } else {
        None
    };
    let opts = RunOptions {
        allow_degraded: a.allow_degraded,
        stdout: terminal.stdout_sink(),
        stderr: terminal.stderr_sink(),
        egress_dns: a.egress_dns.clone(),
        lifeline,
        lease,
        workspace_restore: None,
        live_denials: live_denials_to(results.as_ref()),
        stdin: match &a.live_control {
            Some(p) => match agentjail_engine::live::short_socket_path(p)
                .and_then(|(_dir, short)| std::os::unix::net::UnixStream::connect(short))
            {
                Ok(s) => Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(s))),
                Err(e) => {
                    return Err(format!(
                        "cannot connect to the live session's control socket: {e}"
                    ));
                }
            },
            None => None,
        },
    };
    let delivery = Delivery {
        output_dir: a.output_dir.clone(),
        report: a.report.clone(),
        receipt: a.receipt.clone(),
        key: a.key.clone(),
        for_service: a.job_dir.is_some() || a.results_on_lifeline,
        results,
        workspace_out: a.workspace_out.clone(),
    };
    let finished = match pipeline::execute_in(&vm, &opts, &delivery, a.image_store.as_deref()) {
        Ok(f) => f,
        Err(SetupFailure(msg)) => {
            if a.report.as_ref().map(|p| !p.exists()).unwrap_or(false) {
                report_setup_error(a.report.as_deref(), limits, &msg);
            }
            // On the lifeline the service takes the first report: one the pipeline already
            // sent stands, and this one is ignored.
            if a.results_on_lifeline {
                report_setup_error_on_lifeline(limits, &msg);
            }
            return Err(msg);
        }
    };
    let names = if a.manifest.is_none() && !a.lifeline {
        LimitNames::Flags
    } else {
        LimitNames::Manifest
    };
    summarize(&finished.report, terminal.stderr, names);
    Ok(finished.exit_code.clamp(0, 255) as u8)
}

/// With `--results-on-lifeline`, for a service that reads them (it sets
/// [`agentjail_manifest::results::LIVE_DENIALS_ENV`]): each denial as the engine records it,
/// a [`agentjail_manifest::results::DENIAL`] frame on the lifeline. Never on our own stdout or
/// stderr, which carry the sandbox's bytes only.
fn live_denials_to(
    results: Option<&std::sync::Arc<std::os::fd::OwnedFd>>,
) -> Option<std::sync::Arc<agentjail_engine::LiveDenials>> {
    use agentjail_manifest::results::{DENIAL, LIVE_DENIALS_ENV};
    let fd = results?.clone();
    std::env::var_os(LIVE_DENIALS_ENV).filter(|v| v == "1")?;
    Some(std::sync::Arc::new(agentjail_engine::LiveDenials::new(
        move |d| {
            // A service that is gone fails the report's frame too, and says so there.
            if let Ok(body) = serde_json::to_vec(d) {
                let _ = pipeline::send_frame(&fd, DENIAL, &body);
            }
        },
    )))
}

/// Which of our own streams are terminals that the sandbox's output must not drive
/// (`agentjail_engine::term`); none with `--raw-output`.
#[derive(Clone, Copy)]
pub struct Terminal {
    pub stdout: bool,
    pub stderr: bool,
}

impl Terminal {
    pub fn of_our_streams(raw: bool) -> Terminal {
        use std::io::IsTerminal;
        Terminal {
            stdout: !raw && std::io::stdout().is_terminal(),
            stderr: !raw && std::io::stderr().is_terminal(),
        }
    }
    pub fn stdout_sink(self) -> Sink {
        if self.stdout {
            Sink::StdoutInert
        } else {
            Sink::Stdout
        }
    }
    pub fn stderr_sink(self) -> Sink {
        if self.stderr {
            Sink::StderrInert
        } else {
            Sink::Stderr
        }
    }
}

/// Reads the manifest that `--lifeline` passes on stdin: bytes up to the first newline (the
/// service writes compact JSON and a newline, and keeps the pipe open as the lifeline), and
/// the bytes read past it (the start of the lease renewals that may follow it:
/// [`agentjail_engine::lifeline`]).
fn read_manifest_line() -> Result<(String, Vec<u8>), String> {
    use std::io::Read;
    // The service's manifests carry the task's env and the request's code (at most 1 MiB,
    // up to 6 MiB JSON-escaped) by value. A larger manifest fails its own run (a set-up
    // error), nothing else.
    const MAX: usize = 16 * 1024 * 1024;
    let mut stdin = std::io::stdin().lock();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let end = loop {
        let n = stdin
            .read(&mut chunk)
            .map_err(|e| format!("lifeline: reading the manifest: {e}"))?;
        if n == 0 {
            return Err("lifeline: stdin ended before the manifest's newline".into());
        }
        let at = buf.len();
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = chunk[..n].iter().position(|&b| b == b'\n') {
            break at + i + 1;
        }
        if buf.len() > MAX {
            return Err("lifeline: the manifest is larger than 16 MiB".into());
        }
    };
    let rest = buf.split_off(end);
    let text = String::from_utf8(buf).map_err(|_| "lifeline: the manifest is not UTF-8")?;
    Ok((text, rest))
}

/// A status as the report spells it (`ok`, `exit_nonzero`, …).
pub fn status_word(s: agentjail_manifest::report::Status) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// How the run's limits were set, to name the one that ended it in the words the user wrote.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum LimitNames {
    /// `agentjail run --timeout …`: the flags.
    Flags,
    /// A manifest file (or the service's): its fields.
    Manifest,
}

/// The limit that ended the run, as its flag or field and value (`--timeout 5`,
/// `limits.output_mb: 1`), so that the summary says what to change.
fn limit_hit(r: &RunReport, names: LimitNames) -> Option<String> {
    use agentjail_manifest::report::{DenialKind, Status};
    let l = &r.limits;
    let output_full = r.denials.iter().any(|d| {
        d.kind == DenialKind::Output
            && (d.detail.contains("exceeds its limit") || d.detail.contains("reached its limit"))
    });
    let (flag, field, value) = match r.status {
        Status::Timeout => ("--timeout", "limits.seconds", l.seconds),
        Status::MemoryLimit => ("--memory-mb", "limits.memory_mb", l.memory_mb),
        _ if output_full => ("--output-max-mb", "limits.output_mb", l.output_mb),
        _ => return None,
    };
    Some(match names {
        LimitNames::Flags => format!("limit set by {flag} {value}"),
        LimitNames::Manifest => format!("limit set by {field}: {value}"),
    })
}

/// One line on stderr for a person: what happened, and why when it was not `ok`; when a limit
/// ended it, the flag (or manifest field) that set it.
///
/// When stderr is a terminal (and the sandbox's output is filtered), the line is printed for
/// every status, `ok` included, and starts with [`agentjail_engine::term::OUR_TAG`]: an escape
/// sequence that the filtered output of the sandbox cannot contain, so it cannot be forged.
/// Elsewhere (a pipe, a file), an `ok` run prints it only when something was denied: the same
/// words, without the styling.
pub fn summarize(r: &RunReport, terminal: bool, names: LimitNames) {
    use agentjail_manifest::report::Status;
    let mut line = match r.status {
        Status::Ok if !terminal && r.denial_total() == 0 => return,
        Status::Ok => "run ended: ok".to_string(),
        Status::SetupError => format!(
            "error: {}",
            r.error.as_deref().unwrap_or("the run could not be set up")
        ),
        s => format!("run ended: {}", status_word(s)),
    };
    if r.status != Status::SetupError
        && let Some(d) = r.denials.first()
    {
        line.push_str(&format!(
            " ({} denial(s); first: {})",
            r.denial_total(),
            d.detail
        ));
    }
    if let Some(limit) = limit_hit(r, names) {
        line.push_str(&format!("; {limit}"));
    }
    if terminal {
        errln!(
            "{} {}",
            agentjail_engine::term::OUR_TAG,
            agentjail_engine::term::inert_line(&line)
        );
    } else {
        errln!("agentjail: {line}");
    }
    if r.status == Status::SetupError
        && r.error
            .as_deref()
            .map(|e| e.contains("refusing to run without"))
            .unwrap_or(false)
    {
        // The message already carries its hint.
    }
}
