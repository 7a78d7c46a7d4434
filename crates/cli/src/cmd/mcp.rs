//! `agentjail mcp`: the orchestrator's tools over MCP on stdin/stdout (docs/mcp.md).

use std::path::PathBuf;

use clap::Args;

// No doc comment here: it would replace the subcommand's about text.
#[derive(Args)]
pub struct McpArgs {
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
}

pub fn run(a: McpArgs) -> Result<u8, String> {
    // The token never comes from the command line, where other users could read it.
    let token = match &a.token_file {
        Some(f) => {
            std::fs::read_to_string(f).map_err(|e| format!("--token-file {}: {e}", f.display()))?
        }
        None => std::env::var("AGENTJAIL_TOKEN")
            .map_err(|_| "no token: give --token-file FILE or set AGENTJAIL_TOKEN".to_string())?,
    };
    agentjail_server::mcp::serve_stdio_blocking(agentjail_server::mcp::McpOptions {
        config: a.config,
        data_dir: a.data_dir,
        tenant: a.tenant,
        actor: a.actor,
        token: token.trim().to_string(),
        allow_degraded: a.allow_degraded,
        input_roots: a.input_roots,
    })
    .map(|()| 0)
    .map_err(|e| e.to_string())
}
