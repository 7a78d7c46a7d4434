//! The command line's grammar: the clap definition of `agentjail` and its subcommands
//! ([`Cli`], [`Command`]), the `--version` line, and [`parse_args`], which `main` calls. The man
//! pages and completion scripts are generated from the same definition (`manpages`).
//!
//! What may live here: argument declarations and parsing only. What may not: carrying a
//! command out (that is `cmd/`, reached from `main`'s dispatch) or anything `main` defines;
//! this module never refers back up to the crate root.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::cmd;
use crate::cmd::run::RunArgs;

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
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process and matched at once: the size of the `run` variant (its many flags)
// costs nothing, and boxing it would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
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
    /// Sessions for local use (docs/sessions-cli.md): cells sharing a persistent /work, served
    /// by a per-user background daemon reachable by its owner only.
    #[command(subcommand)]
    Session(cmd::session::SessionCmd),
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

/// Parses the command line. `run` is parsed with a command made of `run`'s own arguments
/// only: building clap's whole tree (every subcommand and its arguments) cost ~0.2 ms of every
/// run's start-up, for nothing `run` uses. Help, errors and values are the same either way
/// (the test `run_parses_the_same_alone_as_in_the_whole_tree` compares them).
pub fn parse_args() -> Result<Cli, clap::Error> {
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
