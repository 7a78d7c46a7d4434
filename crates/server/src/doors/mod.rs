//! The front doors: each takes requests in its own transport, calls the transport-neutral
//! [`crate::service`] and maps its results (and typed refusals) to its own form.
//!
//! - [`api`]: the HTTP API (handlers, authentication, RFC 9457 problem details, OpenAPI).
//! - [`mcp`]: the MCP server, over stdio (`agentjail mcp`) and at `/mcp` behind the API's
//!   authentication.
//! - [`console`]: the operator console at `/console` (its embedded page and its JSON routes,
//!   behind its own cookie sessions for operators; docs/console.md).
//! - [`local_sessions`]: the session service over a Unix socket for its owner only (the
//!   daemon of `agentjail session`, checked with SO_PEERCRED).
//! - [`problem`]: RFC 9457 problem details, the HTTP error form of the API and the worker's
//!   endpoint.
//! - `sessions_api`: the sessions' HTTP routes (mounted by [`api`]).
//! - [`worker_http`]: a worker's own endpoint (`/metrics`, `/healthz`, `/readyz`).
//!
//! May use every lower layer (service, app, execution, policy, storage). Nothing below may
//! use a door, and a door does not reach into another's transport: the one exception is
//! [`worker_http`] answering with the API's problem details ([`problem::ApiError`]), so that
//! both of them speak the same error form. The crate root composes the doors into a router.

pub mod api;
pub mod console;
pub mod local_sessions;
pub mod mcp;
pub mod problem;
mod sessions_api;
pub mod worker_http;
