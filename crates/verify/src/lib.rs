//! # agentjail-verify
//!
//! Placeholder crate doc; completed below.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod collect;
pub mod json;
pub mod receipt;
pub mod schema;
pub mod text;
