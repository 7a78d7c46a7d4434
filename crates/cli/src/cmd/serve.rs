//! `agentjail serve`: the orchestrator HTTP service (docs/server.md).

use std::path::PathBuf;

use clap::Args;

// No doc comment here: it would replace the subcommand's about text.
#[derive(Args)]
pub struct ServeArgs {
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
    /// Shared PostgreSQL store, `postgres://user@host:port/db` (no password in it: the
    /// config's server.database_password_file or $PGPASSWORD) [default: the config's
    /// server.database, else SQLite in the data directory].
    #[arg(long, value_name = "URL")]
    database: Option<String>,
    /// Runs this replica executes at once [default: the config's max_concurrent_runs, else
    /// the CPUs]; with --database, 0 makes it an API replica that only enqueues (workers run).
    #[arg(long, value_name = "N")]
    slots: Option<usize>,
}

pub fn run(a: ServeArgs) -> Result<u8, String> {
    agentjail_server::serve_blocking(agentjail_server::ServeOptions {
        config: a.config,
        listen: a.listen,
        data_dir: a.data_dir,
        allow_degraded: a.allow_degraded,
        database: a.database,
        slots: a.slots,
    })
    .map(|()| 0)
    .map_err(|e| e.to_string())
}
