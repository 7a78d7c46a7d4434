//! The `agentjail` binary: thin argument parsing over the library crates.
//!
//! Exit status of `agentjail run`: the command's own code; 128+N when signal N ended it; 124 on
//! timeout; 65 when output was rejected; 125 when agentjail could not set up the run or the
//! arguments were wrong (one line on stderr, never a backtrace).
//!
//! Any subcommand whose stdout reader left before it was written (`agentjail check | head -1`)
//! exits 141, quietly, like coreutils (128 + SIGPIPE); a lost stderr changes nothing (`out`).

//!
//! Layout: `cli` holds the command line's grammar (clap) and its parsing; `out` our writers of
//! stdout and stderr and the exit statuses they decide; `flags` the flags that describe a run
//! and their translation into a manifest; `cmd/` one module per subcommand; `pipeline` one run
//! end to end (image, engine, output verification, delivery, receipt, report). This file is
//! only the entry point: the modules never refer back up to it. `agentjail serve` runs each
//! job as a child `agentjail run --lifeline`, so the pipeline has one caller: this binary.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

// First: its macros (`outln!`, `errln!`) are for every module after it.
#[macro_use]
mod out;
mod cli;
mod cmd;
mod flags;
mod manpages;
mod pipeline;
mod usage;

use cli::{Cli, Command, parse_args};
use out::EXIT_SETUP;

/// On musl, dlmalloc instead of musl's own allocator, whose per-block mmap/munmap cost ~0.3 ms
/// of every run (docs/performance.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

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
        Command::Session(c) => cmd::session::run(c),
        Command::Worker(a) => cmd::worker::run(a),
        Command::Selftest(a) => cmd::selftest::run(a),
        Command::Audit(c) => cmd::audit::dispatch(c),
        Command::Config { .. } => cmd::config::run(),
        Command::Completions { shell } => manpages::completions(shell),
        Command::Man { dir } => manpages::write_all(&dir),
    }
}
