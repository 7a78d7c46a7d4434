//! The MCP server: a second front door onto the same orchestrator, built on the official Rust
//! SDK (`rmcp`). Over stdio (`agentjail mcp`, one configured actor) and over Streamable HTTP at
//! `/mcp` on `agentjail serve` (the bearer token of each request names the actor).
//!
//! Tools come from the task catalogue as the calling actor sees it (`GET /v1/tasks`): one tool
//! per task type, plus `upload_input` and `get_run`, and the session tools (`session_open`,
//! `session_run`, `session_close`) for an actor who may open a session of some task. Every
//! call goes through the functions the HTTP handlers call ([`service::upload`],
//! [`service::submit`], [`service::get`], the sessions' functions), so policy,
//! the input store, execute-once, the runner, the audit log and the metrics are the same code.
//! Each call is also audited as `mcp_tool_call` and counted in `agentjail_mcp_tool_calls_total`.
//!
//! Errors: invalid arguments (schema, unknown tool) are JSON-RPC `-32602`; a denied or failed
//! run is a tool result with `isError: true` and a reason an agent can act on. Verified output
//! reaches the agent only as data (`structuredContent` and a JSON text block).
//!
//! The parts, each a file under `mcp/`: [`catalogue`] (the tools, their schemas and
//! descriptions), [`results`] (a call's result as MCP content), [`roots`] (the
//! input roots of stdio), [`server`] (the handler: the
//! tools' calls through the service), [`session_tools`] and [`sessions`] (the session tools
//! and their calls), [`progress`] and [`transport`] (stdio and `/mcp`). This file only
//! names them and what the rest of the crate (and `crates/cli`) uses; none of them uses it.

mod catalogue;
mod progress;
mod results;
mod roots;
mod server;
mod session_tools;
mod sessions;
mod transport;

pub use catalogue::{
    ERROR_META_KEY, GET_RUN, MAX_DESCRIPTION, META_KEY, UPLOAD_INPUT, output_shape, probe_runtimes,
    runtime_line, task_description, task_input_schema, task_output_schema,
};
pub use roots::{InputRoot, read_beneath};
pub use server::McpServer;
pub use session_tools::{SESSION_CLOSE, SESSION_OPEN, SESSION_RUN};
pub(crate) use transport::http_router;
pub use transport::{McpOptions, serve_stdio_blocking};

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
