//! The front doors: each takes requests in its own transport, calls the transport-neutral
//! [`crate::service`] and maps its results (and typed refusals) to its own form.
//!
//! - [`api`]: the HTTP API (handlers, authentication, RFC 9457 problem details, OpenAPI).
//! - [`mcp`]: the MCP server, over stdio (`agentjail mcp`) and at `/mcp` behind the API's
//!   authentication.
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
pub mod mcp;
pub mod problem;
mod sessions_api;
pub mod worker_http;
