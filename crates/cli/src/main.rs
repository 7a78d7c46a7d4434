//! The `agentjail` binary: thin argument parsing over the library crates.
//!
//! Exit status of `agentjail run`: the command's own code; 128+N when signal N ended it; 124 on
//! timeout; 65 when output was rejected; 125 when agentjail could not set up the run or the
//! arguments were wrong (one line on stderr, never a backtrace).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agentjail::pipeline::{self, Delivery, SetupFailure};
use agentjail_engine::{RunOptions, Sink};
use agentjail_manifest::report::RunReport;
use agentjail_manifest::{
    AllowRule, EgressPolicy, Input, Limits, Manifest, Mode, Network, SourcePolicy,
};
use clap::{Args, Parser, Subcommand};

mod image_cmd;
mod selftest;

/// On musl, dlmalloc instead of musl's own allocator, whose per-block mmap/munmap cost ~0.3 ms
/// of every run (docs/performance.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// Exit status for setup and usage errors.
const EXIT_SETUP: u8 = 125;

#[derive(Parser)]
#[command(
    name = "agentjail",
    version,
    about = "Run code that AI agents write, with kernel-enforced bounds",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command (or a manifest) in a sandbox.
    Run(RunArgs),
    /// Import, list, remove and verify digest-pinned root images (docs/images.md).
    #[command(subcommand)]
    Image(image_cmd::ImageCmd),
    /// Print the manifest that `run` flags describe, or the manifest format's JSON Schema.
    Manifest(ManifestArgs),
    /// Which protections this host offers to this user; non-zero if a strict run is refused.
    Check {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Run the CSV-summary example (shipped in examples/csv-summary) end to end.
    Demo {
        /// Run even where a protection cannot be applied (listed in the report).
        #[arg(long)]
        allow_degraded: bool,
        /// Also write the run report here.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
    },
    /// Verify signed run receipts, or print the receipt public key.
    #[command(subcommand)]
    Receipt(ReceiptCmd),
    /// Print the JSON Schema of the run report.
    Report {
        #[arg(long, required = true)]
        schema: bool,
    },
    /// Start the orchestrator HTTP service (docs/server.md); without --config, the built-in
    /// example with a fresh dev token printed on stderr.
    Serve {
        /// Configuration file (TOML or YAML; `agentjail config --schema` prints its schema).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Address to listen on [default: 127.0.0.1:8787, or the config's].
        #[arg(long, value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
        /// Data directory [default: $XDG_DATA_HOME/agentjail/server, or the config's].
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Run even where a protection cannot be applied (listed in each report).
        #[arg(long)]
        allow_degraded: bool,
    },
    /// Serve the orchestrator's tools over MCP on stdin/stdout (docs/mcp.md) as one actor. The
    /// token comes from --token-file or $AGENTJAIL_TOKEN, never from the command line.
    Mcp {
        /// Configuration file (as for `serve`); without it, the built-in example, whose `dev`
        /// actor then accepts the given token (local development only).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Data directory [default: $XDG_DATA_HOME/agentjail/server, or the config's]; one
        /// process per data directory.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// The tenant to act for (must be the token's).
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// The actor to act as (must be the token's).
        #[arg(long, value_name = "ACTOR")]
        actor: String,
        /// File holding the actor's bearer token [default: $AGENTJAIL_TOKEN].
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Run even where a protection cannot be applied (listed in each report).
        #[arg(long)]
        allow_degraded: bool,
        /// A host directory from which `upload_input` may read a file by `path` (repeatable;
        /// read as this process's user, never following a symlink out; docs/mcp.md).
        #[arg(long = "input-root", value_name = "DIR")]
        input_roots: Vec<PathBuf>,
    },
    /// Attack this host's sandbox with the escape corpus and report what holds
    /// (docs/selftest.md); exit 0 only when no probe failed.
    Selftest(selftest::SelftestArgs),
    /// Print the JSON Schema of the server configuration.
    Config {
        #[arg(long, required = true)]
        schema: bool,
    },
}

#[derive(Subcommand)]
enum ReceiptCmd {
    /// Check a receipt's signature and that artifacts match its subjects.
    Verify {
        receipt: PathBuf,
        /// An artifact to check against the receipt's subjects (repeatable).
        #[arg(long = "artifact", value_name = "FILE")]
        artifacts: Vec<PathBuf>,
        /// Public key (PEM); default: the key in the user's data directory.
        #[arg(long, value_name = "FILE")]
        pubkey: Option<PathBuf>,
    },
    /// Print the public key of the receipt signing key (created if absent).
    Pubkey {
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
}

/// Flags that build a manifest (the same type a manifest file holds).
#[derive(Args, Clone, Default)]
struct ManifestFlags {
    /// Read-only input, file or directory: HOST_PATH[:SANDBOX_PATH] (default /input/<name>).
    #[arg(long = "ro", value_name = "HOST_PATH[:SANDBOX_PATH]")]
    ro: Vec<String>,
    /// Bound on the total bytes under /output, in MiB [default: 5].
    #[arg(long, value_name = "N")]
    output_max_mb: Option<u64>,
    /// Wall-clock limit in seconds [default: 30].
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Memory limit for the whole tree in MiB [default: 256].
    #[arg(long, value_name = "N")]
    memory_mb: Option<u64>,
    /// Process/thread limit for the whole tree [default: 16].
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// CPU limit of the whole tree in CPUs, fractional (0.5 = half of one CPU) [default: 1].
    #[arg(long, value_name = "N")]
    cpus: Option<f64>,
    /// Environment for the command: KEY=VALUE (repeatable). Nothing else of ours leaks in.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Network mode: `deny` (the default: loopback only). With --allow-host, the only way out
    /// is the egress gateway's proxy inside the sandbox.
    #[arg(long, value_name = "MODE")]
    net: Option<String>,
    /// Allow connections through the egress gateway to HOST (exact name, `*.domain`, or an
    /// IP) on PORT (default 443), e.g. api.example.com:443 (repeatable).
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    allow_host: Vec<String>,
    /// Isolation tier: `native` (default) or `gvisor` (runs on gVisor's runsc).
    #[arg(long, value_name = "TIER")]
    isolation: Option<String>,
    /// Let the gateway reach this private/loopback CIDR, e.g. 127.0.0.1/32 (repeatable).
    #[arg(long = "allow-private", value_name = "CIDR")]
    allow_private: Vec<String>,
    /// The one output file the run must produce, e.g. /output/summary.json.
    #[arg(long, value_name = "SANDBOX_PATH")]
    output: Option<String>,
    /// JSON Schema (host file) the output must satisfy.
    #[arg(long, value_name = "FILE")]
    output_schema: Option<String>,
    /// Identifier recorded in the report and receipt.
    #[arg(long, value_name = "ID")]
    request_id: Option<String>,
    /// Refuse to start after this instant (RFC 3339).
    #[arg(long, value_name = "TIME")]
    expires_at: Option<String>,
    /// The program and its arguments.
    #[arg(last = true, value_name = "PROGRAM [ARGS]...")]
    command: Vec<String>,
}

/// Splits `HOST[:PORT]` (IPv6 literals in brackets); the port defaults to 443.
fn split_host_port(s: &str) -> Result<(String, u16), String> {
    let bad = || format!("--allow-host {s}: expected HOST[:PORT], e.g. api.example.com:443");
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if after.is_empty() => 443,
            None => return Err(bad()),
        };
        (format!("[{h}]"), port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad())?),
            None => (s.to_string(), 443),
        }
    };
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host, port))
}

impl ManifestFlags {
    fn is_empty(&self) -> bool {
        self.ro.is_empty()
            && self.output_max_mb.is_none()
            && self.timeout.is_none()
            && self.memory_mb.is_none()
            && self.pids.is_none()
            && self.cpus.is_none()
            && self.env.is_empty()
            && self.net.is_none()
            && self.allow_host.is_empty()
            && self.isolation.is_none()
            && self.allow_private.is_empty()
            && self.output.is_none()
            && self.output_schema.is_none()
            && self.request_id.is_none()
            && self.expires_at.is_none()
            && self.command.is_empty()
    }

    fn to_manifest(&self) -> Result<Manifest, String> {
        if self.command.is_empty() {
            return Err(
                "no command given; usage: agentjail run [OPTIONS] -- PROGRAM [ARGS...]".into(),
            );
        }
        let mut m = Manifest::for_command(self.command.clone());
        let d = Limits::default();
        m.limits = Limits {
            seconds: self.timeout.unwrap_or(d.seconds),
            memory_mb: self.memory_mb.unwrap_or(d.memory_mb),
            processes: self.pids.unwrap_or(d.processes),
            cpus: self.cpus.unwrap_or(d.cpus),
            output_mb: self.output_max_mb.unwrap_or(d.output_mb),
            ..d
        };
        match self.net.as_deref() {
            None | Some("deny") => {}
            Some(other) => {
                return Err(format!(
                    "--net {other}: `deny` is the only mode; allow destinations with --allow-host"
                ));
            }
        }
        m.isolation = match self.isolation.as_deref() {
            None | Some("native") => agentjail_manifest::Tier::Native,
            Some("gvisor") => agentjail_manifest::Tier::Gvisor,
            Some(other) => {
                return Err(format!(
                    "--isolation {other}: expected `native` or `gvisor`"
                ));
            }
        };
        if !self.allow_host.is_empty() {
            let mut allow: Vec<AllowRule> = Vec::new();
            for h in &self.allow_host {
                let (host, port) = split_host_port(h)?;
                match allow.iter_mut().find(|r| r.host == host) {
                    Some(r) if !r.ports.contains(&port) => r.ports.push(port),
                    Some(_) => {}
                    None => allow.push(AllowRule {
                        host,
                        ports: vec![port],
                    }),
                }
            }
            m.network = Network::Allow(EgressPolicy {
                allow,
                allow_private: self.allow_private.clone(),
            });
        } else if !self.allow_private.is_empty() {
            return Err("--allow-private needs at least one --allow-host".into());
        }
        for ro in &self.ro {
            let (host, mount) = match ro.rsplit_once(':') {
                Some((h, m)) if m.starts_with('/') => (h.to_string(), m.to_string()),
                _ => {
                    let name = Path::new(ro)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .ok_or_else(|| {
                            format!("--ro {ro}: no file name to mount it under /input")
                        })?;
                    (ro.clone(), format!("/input/{name}"))
                }
            };
            let abs = std::path::absolute(&host).map_err(|e| format!("--ro {ro}: {e}"))?;
            m.inputs.push(Input {
                source: abs.to_string_lossy().into_owned(),
                mount,
                mode: Mode::ReadOnly,
            });
        }
        let mut env = BTreeMap::new();
        for kv in &self.env {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("--env {kv}: expected KEY=VALUE"))?;
            env.insert(k.to_string(), v.to_string());
        }
        m.env = env;
        m.output = self.output.clone();
        m.output_schema = match &self.output_schema {
            Some(s) => Some(
                std::path::absolute(s)
                    .map_err(|e| format!("--output-schema {s}: {e}"))?
                    .to_string_lossy()
                    .into_owned(),
            ),
            None => None,
        };
        m.request_id = self.request_id.clone();
        m.expires_at = self.expires_at.clone();
        Ok(m)
    }
}

#[derive(Args)]
struct RunArgs {
    /// Run what this manifest file (YAML or JSON) describes.
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
    /// Allow manifest sources below this folder too (repeatable; default: the manifest's folder).
    #[arg(long, value_name = "DIR")]
    source_root: Vec<PathBuf>,
    /// Copy verified output here (created if absent; refused if not empty).
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Write the run report (JSON) here.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Write a signed receipt (DSSE envelope, in-toto statement) here.
    #[arg(long, value_name = "FILE")]
    receipt: Option<PathBuf>,
    /// Receipt signing key (default: $XDG_DATA_HOME/agentjail/receipt-key.pem).
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Run even where a protection cannot be applied; the report lists what was not.
    #[arg(long)]
    allow_degraded: bool,
    /// Print the setup plan (mounts, Landlock rules, environment names) and exit.
    #[arg(long)]
    dry_run: bool,
    /// Pass the command's stdout/stderr through byte for byte even to a terminal (by default,
    /// on a terminal its control characters are shown escaped, e.g. `\x1b`).
    #[arg(long)]
    raw_output: bool,
    /// Name server (IP:PORT) the egress gateway resolves destinations with, instead of the
    /// host's /etc/hosts and /etc/resolv.conf (repeatable).
    #[arg(long = "egress-dns", value_name = "IP:PORT")]
    egress_dns: Vec<std::net::SocketAddr>,
    /// For `agentjail serve`: stdin carries the manifest (one line of JSON; sources relative to
    /// the working directory) and then stays open; when it hangs up (the service died), the
    /// sandbox is killed and the run ends.
    #[arg(long, hide = true, conflicts_with = "manifest")]
    lifeline: bool,
    /// Image store that a manifest's `image: sha256:…` is taken from (docs/images.md).
    #[arg(long, value_name = "DIR", env = "AGENTJAIL_IMAGE_STORE")]
    image_store: Option<PathBuf>,
    #[command(flatten)]
    flags: ManifestFlags,
}

#[derive(Args)]
struct ManifestArgs {
    /// Print the JSON Schema of the manifest format.
    #[arg(long, conflicts_with = "print")]
    schema: bool,
    /// Print the manifest (JSON) that the given `run` flags produce.
    #[arg(long)]
    print: bool,
    #[command(flatten)]
    flags: ManifestFlags,
}

fn main() -> ExitCode {
    let code = main_inner();
    agentjail_engine::discard_prespawned();
    // Undo a claim of our own cgroup v2 (`cgroup::release`): nothing of ours is left behind.
    agentjail_engine::cgroup::release();
    code
}

fn main_inner() -> ExitCode {
    agentjail_engine::timing::init_from_env();
    agentjail_engine::timing::mark("main");
    // A run's sandbox init is cloned before anything else, while this process is small and
    // single-threaded; the kernel builds its network namespace while the arguments are parsed
    // and checked. An init no run claims is killed and reaped before `main` returns.
    if matches!(
        std::env::args_os()
            .nth(1)
            .as_deref()
            .and_then(|a| a.to_str()),
        Some("run" | "demo")
    ) {
        agentjail_engine::prespawn();
    }
    let cli = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            let code = match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => EXIT_SETUP,
                _ => EXIT_SETUP,
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match dispatch(cli) {
        Ok(code) => {
            agentjail_engine::timing::mark("main: returning");
            ExitCode::from(code)
        }
        Err(msg) => {
            eprintln!("agentjail: error: {msg}");
            ExitCode::from(EXIT_SETUP)
        }
    }
}

/// Parses the command line. `run` is parsed with a command made of `run`'s own arguments
/// only: building clap's whole tree (every subcommand and its arguments) cost ~0.2 ms of every
/// run's start-up, for nothing `run` uses. Help, errors and values are the same either way
/// (the test `run_parses_the_same_alone_as_in_the_whole_tree` compares them).
fn parse_args() -> Result<Cli, clap::Error> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).and_then(|a| a.to_str()) == Some("run") {
        let m = run_command().try_get_matches_from(&args[1..])?;
        let a = <RunArgs as clap::FromArgMatches>::from_arg_matches(&m)?;
        return Ok(Cli {
            command: Command::Run(a),
        });
    }
    Cli::try_parse_from(args)
}

/// The `run` subcommand on its own, as `Cli` declares it (name, about text, version).
fn run_command() -> clap::Command {
    use clap::Args as _;
    // The about text after the arguments: a flattened struct's doc comment would replace it.
    RunArgs::augment_args(
        clap::Command::new("run")
            .bin_name("agentjail run")
            .version(env!("CARGO_PKG_VERSION")),
    )
    .about("Run a command (or a manifest) in a sandbox")
}

fn dispatch(cli: Cli) -> Result<u8, String> {
    match cli.command {
        Command::Run(a) => run(a),
        Command::Image(c) => image_cmd::dispatch(c),
        Command::Manifest(a) => {
            if a.schema {
                print_json(&Manifest::json_schema());
                Ok(0)
            } else if a.print {
                print_json(&a.flags.to_manifest()?);
                Ok(0)
            } else {
                Err("manifest: give --schema or --print".into())
            }
        }
        Command::Check { json } => check(json),
        Command::Demo {
            allow_degraded,
            report,
        } => demo(allow_degraded, report),
        Command::Receipt(ReceiptCmd::Verify {
            receipt,
            artifacts,
            pubkey,
        }) => receipt_verify(&receipt, &artifacts, pubkey.as_deref()),
        Command::Receipt(ReceiptCmd::Pubkey { key }) => {
            let path = key.unwrap_or_else(agentjail_verify::receipt::default_key_path);
            let k = agentjail_verify::receipt::ReceiptKey::load_or_create(&path)
                .map_err(|e| e.to_string())?;
            print!("{}", k.public_key_pem());
            Ok(0)
        }
        Command::Report { .. } => {
            print_json(&RunReport::json_schema());
            Ok(0)
        }
        Command::Serve {
            config,
            listen,
            data_dir,
            allow_degraded,
        } => agentjail_server::serve_blocking(agentjail_server::ServeOptions {
            config,
            listen,
            data_dir,
            allow_degraded,
        })
        .map(|()| 0)
        .map_err(|e| e.to_string()),
        Command::Mcp {
            config,
            data_dir,
            tenant,
            actor,
            token_file,
            allow_degraded,
            input_roots,
        } => {
            let token = match &token_file {
                Some(f) => std::fs::read_to_string(f)
                    .map_err(|e| format!("--token-file {}: {e}", f.display()))?,
                None => std::env::var("AGENTJAIL_TOKEN").map_err(|_| {
                    "no token: give --token-file FILE or set AGENTJAIL_TOKEN".to_string()
                })?,
            };
            agentjail_server::mcp::serve_stdio_blocking(agentjail_server::mcp::McpOptions {
                config,
                data_dir,
                tenant,
                actor,
                token: token.trim().to_string(),
                allow_degraded,
                input_roots,
            })
            .map(|()| 0)
            .map_err(|e| e.to_string())
        }
        Command::Selftest(a) => selftest::run(a),
        Command::Config { .. } => {
            print_json(&agentjail_server::config_schema());
            Ok(0)
        }
    }
}

fn print_json<T: serde::Serialize>(v: &T) {
    let s = serde_json::to_string_pretty(v).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}");
}

/// Removes a report left at `path` by an earlier run, so that after the pipeline a file at
/// `path` is always this run's report (the pipeline's own, or the setup-error report written
/// when the pipeline failed without one). Refuses when an existing entry cannot be removed.
fn clear_stale_report(path: Option<&Path>) -> Result<(), String> {
    match path.map(std::fs::remove_file) {
        None | Some(Ok(())) => Ok(()),
        Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Some(Err(e)) => Err(format!(
            "--report {}: cannot replace the existing file: {e}",
            path.map(|p| p.display().to_string()).unwrap_or_default()
        )),
    }
}

/// Writes a setup-error report when the run never got to the engine.
fn report_setup_error(path: Option<&Path>, limits: Limits, msg: &str) {
    if let Some(p) = path {
        let r = RunReport::setup_error(limits, msg.to_string());
        if let Ok(mut bytes) = serde_json::to_vec_pretty(&r) {
            bytes.push(b'\n');
            let _ = pipeline::write_atomic(p, &bytes);
        }
    }
}

fn run(a: RunArgs) -> Result<u8, String> {
    agentjail_engine::timing::mark("run: arguments parsed");
    let mut lifeline = None;
    let (manifest, policy) = match &a.manifest {
        None if a.lifeline => {
            let text = read_manifest_line().inspect_err(|e| {
                report_setup_error(a.report.as_deref(), Limits::default(), e);
            })?;
            let m = Manifest::parse(&text).map_err(|e| {
                report_setup_error(a.report.as_deref(), Limits::default(), &e.to_string());
                e.to_string()
            })?;
            let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
            let mut roots = vec![cwd.clone()];
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
            if !a.flags.is_empty() {
                let msg = "--manifest cannot be combined with flags that describe the run (the manifest is the one description); hint: `agentjail manifest --print` shows what flags produce";
                report_setup_error(a.report.as_deref(), Limits::default(), msg);
                return Err(msg.into());
            }
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
            report_setup_error(a.report.as_deref(), limits, &e.to_string());
            return Err(e.to_string());
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
        print_json(&serde_json::json!({
            "manifest_digest": vm.digest,
            "image": image,
            "ops": plan.ops,
            "landlock": plan.rules,
            "argv": plan.argv,
            "env": env_names,
            "cwd": plan.cwd,
        }));
        return Ok(0);
    }
    clear_stale_report(a.report.as_deref())?;
    let terminal = Terminal::of_our_streams(a.raw_output);
    let opts = RunOptions {
        allow_degraded: a.allow_degraded,
        stdout: terminal.stdout_sink(),
        stderr: terminal.stderr_sink(),
        egress_dns: a.egress_dns.clone(),
        lifeline,
    };
    let delivery = Delivery {
        output_dir: a.output_dir.clone(),
        report: a.report.clone(),
        receipt: a.receipt.clone(),
        key: a.key.clone(),
    };
    let finished = match pipeline::execute_in(&vm, &opts, &delivery, a.image_store.as_deref()) {
        Ok(f) => f,
        Err(SetupFailure(msg)) => {
            if a.report.as_ref().map(|p| !p.exists()).unwrap_or(false) {
                report_setup_error(a.report.as_deref(), limits, &msg);
            }
            return Err(msg);
        }
    };
    summarize(&finished.report, terminal.stderr);
    Ok(finished.exit_code.clamp(0, 255) as u8)
}

/// Which of our own streams are terminals that the sandbox's output must not drive
/// (`agentjail_engine::term`); none with `--raw-output`.
#[derive(Clone, Copy)]
struct Terminal {
    stdout: bool,
    stderr: bool,
}

impl Terminal {
    fn of_our_streams(raw: bool) -> Terminal {
        use std::io::IsTerminal;
        Terminal {
            stdout: !raw && std::io::stdout().is_terminal(),
            stderr: !raw && std::io::stderr().is_terminal(),
        }
    }
    fn stdout_sink(self) -> Sink {
        if self.stdout {
            Sink::StdoutInert
        } else {
            Sink::Stdout
        }
    }
    fn stderr_sink(self) -> Sink {
        if self.stderr {
            Sink::StderrInert
        } else {
            Sink::Stderr
        }
    }
}

/// Reads the manifest that `--lifeline` passes on stdin: bytes up to the first newline (the
/// service writes compact JSON and a newline, and keeps the pipe open as the lifeline).
fn read_manifest_line() -> Result<String, String> {
    use std::io::Read;
    const MAX: usize = 4 * 1024 * 1024;
    let mut stdin = std::io::stdin().lock();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while !buf.ends_with(b"\n") {
        let n = stdin
            .read(&mut chunk)
            .map_err(|e| format!("lifeline: reading the manifest: {e}"))?;
        if n == 0 {
            return Err("lifeline: stdin ended before the manifest's newline".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX {
            return Err("lifeline: the manifest is larger than 4 MiB".into());
        }
    }
    String::from_utf8(buf).map_err(|_| "lifeline: the manifest is not UTF-8".into())
}

/// A status as the report spells it (`ok`, `exit_nonzero`, …).
fn status_word(s: agentjail_manifest::report::Status) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// One line on stderr for a person: what happened, and why when it was not `ok`.
///
/// When stderr is a terminal (and the sandbox's output is filtered), the line is printed for
/// every status, `ok` included, and starts with [`agentjail_engine::term::OUR_TAG`]: an escape
/// sequence that the filtered output of the sandbox cannot contain, so it cannot be forged.
fn summarize(r: &RunReport, terminal: bool) {
    use agentjail_manifest::report::Status;
    let mut line = match r.status {
        Status::Ok if !terminal => return,
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
    if terminal {
        eprintln!(
            "{} {}",
            agentjail_engine::term::OUR_TAG,
            agentjail_engine::term::inert_line(&line)
        );
    } else {
        eprintln!("agentjail: {line}");
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

fn check(json: bool) -> Result<u8, String> {
    let r = agentjail_engine::check::check();
    if json {
        print_json(&r);
    } else {
        for i in &r.items {
            println!(
                "{:<16} {:<4} {}",
                i.name,
                if i.ok { "ok" } else { "NO" },
                i.detail
            );
        }
        println!("{:<16} {:<4} {}", "host image", "", r.host_image);
        if !r.strict_run_ok {
            println!(
                "a strict run is refused here; `agentjail run --allow-degraded` runs with what is available and lists the rest in the report"
            );
        }
    }
    Ok(if r.strict_run_ok { 0 } else { 1 })
}

const DEMO_FILES: &[(&str, &str)] = &[
    (
        "manifest.yaml",
        include_str!("../../../examples/csv-summary/manifest.yaml"),
    ),
    (
        "report.csv",
        include_str!("../../../examples/csv-summary/report.csv"),
    ),
    (
        "summarize.py",
        include_str!("../../../examples/csv-summary/summarize.py"),
    ),
    (
        "summary.schema.json",
        include_str!("../../../examples/csv-summary/summary.schema.json"),
    ),
];

fn demo(allow_degraded: bool, report: Option<PathBuf>) -> Result<u8, String> {
    let dir = tempfile::Builder::new()
        .prefix("agentjail-demo-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary folder: {e}"))?;
    for (name, content) in DEMO_FILES {
        std::fs::write(dir.path().join(name), content)
            .map_err(|e| format!("cannot write the demo files: {e}"))?;
    }
    // The sandbox user (an unprivileged uid in root mode) must be able to read the inputs.
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755));
    let out_dir = dir.path().join("out");
    clear_stale_report(report.as_deref())?;
    let m = Manifest::load(&dir.path().join("manifest.yaml")).map_err(|e| e.to_string())?;
    let base = dir.path().canonicalize().map_err(|e| e.to_string())?;
    let vm = m
        .validate(
            &SourcePolicy {
                base_dir: base.clone(),
                roots: Some(vec![base]),
            },
            jiff::Timestamp::now(),
        )
        .map_err(|e| e.to_string())?;
    eprintln!(
        "agentjail demo: summarizing report.csv with python3 in a sandbox (network denied, /input read-only)"
    );
    // Both of the command's streams go to our stderr.
    let terminal = Terminal::of_our_streams(false);
    let f = pipeline::execute(
        &vm,
        &RunOptions {
            allow_degraded,
            stdout: terminal.stderr_sink(),
            stderr: terminal.stderr_sink(),
            egress_dns: Vec::new(),
            lifeline: None,
        },
        &Delivery {
            output_dir: Some(out_dir),
            report,
            receipt: None,
            key: None,
        },
    )
    .map_err(|SetupFailure(m)| m)?;
    let r = &f.report;
    match &f.artifact {
        Some(bytes) => {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(bytes);
            if !bytes.ends_with(b"\n") {
                let _ = out.write_all(b"\n");
            }
            let status = status_word(r.status);
            eprintln!(
                "agentjail demo: status {status}, verified against summary.schema.json; wall {} ms, cpu {} ms, peak memory {} KiB; isolation: landlock ABI {}, seccomp {}, cgroup {}",
                r.wall_ms,
                r.cpu_ms,
                r.peak_memory_bytes / 1024,
                r.isolation
                    .landlock_abi
                    .map_or_else(|| "none".to_string(), |a| a.to_string()),
                if r.isolation.seccomp { "on" } else { "off" },
                r.isolation.cgroup.as_deref().unwrap_or("none")
            );
        }
        None => summarize(r, terminal.stderr),
    }
    Ok(f.exit_code.clamp(0, 255) as u8)
}

fn receipt_verify(
    receipt: &Path,
    artifacts: &[PathBuf],
    pubkey: Option<&Path>,
) -> Result<u8, String> {
    let env = std::fs::read(receipt).map_err(|e| format!("{}: {e}", receipt.display()))?;
    let pem = match pubkey {
        Some(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    let arts: Vec<agentjail_verify::receipt::Artifact> = artifacts
        .iter()
        .map(|p| agentjail_verify::receipt::Artifact::from_path(p).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    use agentjail_verify::receipt::VerifiedAny;
    match agentjail_verify::receipt::verify_any(&env, pem.as_deref(), &arts) {
        Ok(VerifiedAny::Run(v)) => {
            println!(
                "receipt OK: signed by key {}; status {}; {} subject(s); {} artifact(s) match",
                v.keyid,
                serde_json::to_value(v.statement.predicate.status)
                    .ok()
                    .and_then(|s| s.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                v.statement.subject.len(),
                arts.len()
            );
            Ok(0)
        }
        Ok(VerifiedAny::Selftest(v)) => {
            let p = &v.statement.predicate;
            let n = |k: &str| p["summary"][k].as_u64().unwrap_or(0);
            println!(
                "receipt OK: selftest attestation signed by key {}; {}: {} passed, {} failed, {} skipped; agentjail {} (binary sha256:{}) on kernel {}, {} mode, at {}; {} artifact(s) match",
                v.keyid,
                if p["passed"] == true {
                    "PASSED"
                } else {
                    "FAILED"
                },
                n("passed"),
                n("failed"),
                n("skipped"),
                p["agentjail_version"].as_str().unwrap_or("?"),
                v.statement
                    .subject
                    .first()
                    .and_then(|s| s.digest.get("sha256"))
                    .map(String::as_str)
                    .unwrap_or("?"),
                p["host"]["kernel"].as_str().unwrap_or("?"),
                p["mode"].as_str().unwrap_or("?"),
                p["started_at"].as_str().unwrap_or("?"),
                arts.len()
            );
            Ok(0)
        }
        Err(e) => {
            eprintln!("agentjail: receipt verification failed: {e}");
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn whole_run() -> clap::Command {
        let mut whole = Cli::command();
        whole.build();
        whole.find_subcommand("run").expect("run").clone()
    }

    #[test]
    fn run_parses_the_same_alone_as_in_the_whole_tree() {
        let (mut inside, mut alone) = (whole_run(), run_command());
        assert_eq!(
            inside.render_long_help().to_string(),
            alone.render_long_help().to_string()
        );
        assert_eq!(
            inside.render_usage().to_string(),
            alone.render_usage().to_string()
        );
        let ids = |c: &clap::Command| {
            c.get_arguments()
                .map(|a| format!("{:?} {:?} {:?}", a.get_id(), a.get_long(), a.get_action()))
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&inside), ids(&alone));
        // The same values, and the same errors, from both parsers.
        let argv = [
            "agentjail",
            "run",
            "--ro",
            "/a/b.csv:/input/r.csv",
            "--timeout",
            "3",
            "--env",
            "A=b",
            "--allow-degraded",
            "--report",
            "r.json",
            "--",
            "prog",
            "--x",
        ];
        let via_tree = match Cli::try_parse_from(argv).expect("parses").command {
            Command::Run(a) => a,
            _ => panic!("not run"),
        };
        let m = run_command()
            .try_get_matches_from(&argv[1..])
            .expect("parses");
        let via_alone = <RunArgs as clap::FromArgMatches>::from_arg_matches(&m).expect("args");
        let show = |a: &RunArgs| {
            format!(
                "{:?} {:?} {:?} {:?} {} {:?}",
                a.flags.ro,
                a.flags.timeout,
                a.flags.env,
                a.report,
                a.allow_degraded,
                a.flags.command
            )
        };
        assert_eq!(show(&via_tree), show(&via_alone));
        let bad = ["agentjail", "run", "--timeout", "soon", "--", "x"];
        let e1 = Cli::try_parse_from(bad).err().expect("refused").to_string();
        let e2 = run_command()
            .try_get_matches_from(&bad[1..])
            .expect_err("refused")
            .to_string();
        assert_eq!(e1, e2);
    }
}
