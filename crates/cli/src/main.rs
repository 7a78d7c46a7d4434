//! The `agentjail` binary: thin argument parsing over the library crates.
//!
//! Exit status of `agentjail run`: the command's own code; 128+N when signal N ended it; 124 on
//! timeout; 65 when output was rejected; 125 when agentjail could not set up the run or the
//! arguments were wrong (one line on stderr, never a backtrace).
//!
//! Any subcommand whose stdout reader left before it was written (`agentjail check | head -1`)
//! exits 141, quietly, like coreutils (128 + SIGPIPE); a lost stderr changes nothing (`out`).

//!
//! Layout: `flags` holds the flags that describe a run and their translation into a manifest;
//! `cmd/` one module per subcommand; `pipeline` one run end to end (image, engine, output
//! verification, delivery, receipt, report). `agentjail serve` runs each job as a child
//! `agentjail run --lifeline`, so the pipeline has one caller: this binary.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

// First: its macros (`outln!`, `errln!`) are for every module after it.
#[macro_use]
mod out;
mod cmd;
mod flags;
mod manpages;
mod pipeline;
mod usage;

use cmd::run::RunArgs;

/// On musl, dlmalloc instead of musl's own allocator, whose per-block mmap/munmap cost ~0.3 ms
/// of every run (docs/performance.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// Exit status for setup and usage errors.
const EXIT_SETUP: u8 = 125;

/// What `--version` prints after the name: the version, the commit and its date, and the
/// target triple, e.g. `0.1.0 (commit abcdef0, 2026-12-03, x86_64-unknown-linux-musl)`
/// (build.rs; `commit unknown` when built outside a git checkout without the release
/// script's `AGENTJAIL_BUILD_COMMIT`).
const VERSION_LINE: &str = env!("AGENTJAIL_VERSION_LINE");

#[derive(Parser)]
#[command(
    name = "agentjail",
    version = VERSION_LINE,
    about = "Run code that AI agents write, with kernel-enforced bounds",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process and matched at once: the size of the `run` variant (its many flags)
// costs nothing, and boxing it would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run a command (or a manifest) in a sandbox.
    Run(RunArgs),
    /// Import, list, remove and verify digest-pinned root images (docs/images.md).
    #[command(subcommand)]
    Image(cmd::image::ImageCmd),
    /// Print the manifest that `run` flags describe, or the manifest format's JSON Schema.
    Manifest(cmd::manifest::ManifestArgs),
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
    Receipt(cmd::receipt::ReceiptCmd),
    /// Print the JSON Schema of the run report.
    Report {
        #[arg(long, required = true)]
        schema: bool,
    },
    /// Start the orchestrator HTTP service (docs/server.md); without --config, the built-in
    /// example with a dev token kept in DATA/private/dev-token (delete it to rotate).
    Serve(cmd::serve::ServeArgs),
    /// Serve the orchestrator's tools over MCP on stdin/stdout (docs/mcp.md) as one actor. The
    /// token comes from --token-file or $AGENTJAIL_TOKEN, never from the command line.
    Mcp(cmd::mcp::McpArgs),
    /// Claim and execute runs from the shared PostgreSQL queue, without the HTTP API
    /// (docs/deploy.md, "The fleet"); stops claiming on SIGTERM and finishes the runs it holds.
    Worker(cmd::worker::WorkerArgs),
    /// Attack this host's sandbox with the escape corpus and report what holds
    /// (docs/selftest.md); exit 0 only when no probe failed.
    Selftest(cmd::selftest::SelftestArgs),
    /// Verify the service's audit chain (a file, or the PostgreSQL database replicas share),
    /// or export the database's chain as JSONL.
    #[command(subcommand)]
    Audit(cmd::audit::AuditCmd),
    /// Print the JSON Schema of the server configuration.
    Config {
        #[arg(long, required = true)]
        schema: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout, e.g.
    /// `agentjail completions bash > /etc/bash_completion.d/agentjail`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (agentjail.1 and one per subcommand) into DIR (used by the
    /// release build and the Debian package).
    #[command(hide = true)]
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let code = out::quiet_on_lost_streams(main_inner);
    agentjail_engine::discard_prespawned();
    // Undo a claim of our own cgroup v2 (`cgroup::release`): nothing of ours is left behind.
    agentjail_engine::cgroup::release();
    ExitCode::from(out::exit_code(code))
}

fn main_inner() -> u8 {
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
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    0
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                    EXIT_SETUP
                }
                _ => {
                    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
                    let line = usage::one_line(&e, &args);
                    if args.get(1).and_then(|a| a.to_str()) == Some("run") {
                        let report = usage::report_path(&args);
                        if cmd::run::clear_stale_report(report.as_deref()).is_ok() {
                            cmd::run::report_setup_error(
                                report.as_deref(),
                                agentjail_manifest::Limits::default(),
                                &line,
                            );
                        }
                    }
                    errln!("agentjail: error: {line}");
                    EXIT_SETUP
                }
            };
        }
    };
    match dispatch(cli) {
        Ok(code) => {
            agentjail_engine::timing::mark("main: returning");
            code
        }
        Err(msg) => {
            errln!("agentjail: error: {msg}");
            EXIT_SETUP
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
            .version(VERSION_LINE),
    )
    .about("Run a command (or a manifest) in a sandbox")
}

fn dispatch(cli: Cli) -> Result<u8, String> {
    match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Image(c) => cmd::image::dispatch(c),
        Command::Manifest(a) => cmd::manifest::run(a),
        Command::Check { json } => cmd::check::run(json),
        Command::Demo {
            allow_degraded,
            report,
        } => cmd::demo::run(allow_degraded, report),
        Command::Receipt(c) => cmd::receipt::dispatch(c),
        Command::Report { .. } => cmd::report::run(),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Mcp(a) => cmd::mcp::run(a),
        Command::Worker(a) => cmd::worker::run(a),
        Command::Selftest(a) => cmd::selftest::run(a),
        Command::Audit(c) => cmd::audit::dispatch(c),
        Command::Config { .. } => cmd::config::run(),
        Command::Completions { shell } => manpages::completions(shell),
        Command::Man { dir } => manpages::write_all(&dir),
    }
}

/// Prints `v` as pretty JSON and a newline on stdout.
fn print_json<T: serde::Serialize>(v: &T) {
    let s = serde_json::to_string_pretty(v).unwrap_or_default();
    outln!("{s}");
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
