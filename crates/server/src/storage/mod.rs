//! Storage: where runs, inputs and the audit trail are kept.
//!
//! - [`store`]: the `Store` trait every other layer uses, and its SQLite implementation over
//!   [`db`] (the SQLite schema and queries).
//! - [`pg`]: the shared PostgreSQL store of a fleet (schema migrations, the run queue, leases
//!   with fencing tokens, the audit chain in a table).
//! - [`sessions`]: sessions and their cells on SQLite, each cell's end and the session's new
//!   head in one transaction (on PostgreSQL: `pg::sessions`, the checkpoints in the database);
//!   [`session_store`]: either store behind one interface; [`checkpoint_refs`]: the
//!   checkpoints they still refer to, which the retention sweep keeps.
//! - [`audit`]: the hash-chained, append-only audit log and its verifier (both stores build
//!   their records with it).
//!
//! Depends only on the crate's leaves ([`crate::run_state`], [`crate::util`]) and other crates;
//! never on policy, the shared state, execution, the service or a front door.

pub mod audit;
pub mod checkpoint_refs;
pub mod db;
pub mod pg;
pub mod session_store;
pub mod sessions;
pub mod store;
