//! `agentjail worker`: an executor of a PostgreSQL deployment (docs/deploy.md, "The fleet").

use std::path::PathBuf;

use clap::Args;

// No doc comment here: it would replace the subcommand's about text.
#[derive(Args)]
pub struct WorkerArgs {
    /// PostgreSQL URL, `postgres://user@host:port/db` (no password in it: the config's
    /// server.database_password_file or $PGPASSWORD) [default: the config's server.database].
    #[arg(long, value_name = "URL")]
    database: Option<String>,
    /// Runs executing at once [default: the config's max_concurrent_runs, else the CPUs].
    #[arg(long, value_name = "N")]
    slots: Option<usize>,
    /// Labels this worker has, comma-separated: it claims runs of task types whose `labels`
    /// it all has (a task type without labels: any worker).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    labels: Vec<String>,
    /// This worker's name in the database [default: the config's server.node_id, else the
    /// host name]; unique per worker process.
    #[arg(long, value_name = "ID")]
    node_id: Option<String>,
    /// Configuration file, the one `serve` uses (task types, keys, data directory).
    #[arg(long, value_name = "FILE", required = true)]
    config: PathBuf,
    /// Data directory of this worker (job folders, objects, receipt key) [default: the config's].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Run even where a protection cannot be applied (listed in each report).
    #[arg(long)]
    allow_degraded: bool,
    /// Serve this worker's GET /metrics, /healthz and /readyz on ADDR (e.g. 0.0.0.0:9464 in a
    /// pod, 127.0.0.1:0 for any free port) [default: no listener].
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
}

pub fn run(a: WorkerArgs) -> Result<u8, String> {
    agentjail_server::worker_blocking(agentjail_server::WorkerOptions {
        config: Some(a.config),
        data_dir: a.data_dir,
        database: a.database,
        slots: a.slots,
        labels: a.labels,
        node_id: a.node_id,
        allow_degraded: a.allow_degraded,
        listen: a.listen,
    })
    .map(|()| 0)
    .map_err(|e| e.to_string())
}
