//! # agentjail-verify
//!
//! Everything agentjail does with a run's output after the command ends. The output is treated
//! as hostile until checked.
//!
//! 1. [`collect()`]: copies what the command left in its output directory into a private host
//!    staging folder. It never follows a symlink, never opens a FIFO, socket or device, refuses
//!    hard links and unsafe names, and bounds depth, entry count and total bytes. Each file is
//!    hashed as it is copied.
//! 2. [`json`]: parses JSON strictly. The document must be UTF-8 without a BOM and nest at most
//!    64 levels, checked by an iterative scan before any recursive parsing. Duplicate keys are
//!    refused at every level.
//! 3. [`schema`]: compiles an untrusted JSON Schema and checks a document against it. External
//!    `$ref`s are refused and nothing is fetched. Error messages are built from the error kind
//!    and the schema, never from the document's text.
//! 4. [`receipt`]: signs a run receipt (an in-toto Statement v1 in a DSSE envelope, Ed25519
//!    over the PAE, RFC 8785 canonical JSON) and verifies one against artifacts. It also
//!    manages the key file (0600, owner-checked). The format is in `docs/receipts.md`.
//! 5. [`selftest`]: reads what a signed self-test result claims (tiers, filter, mode,
//!    completeness, counts) and sorts it into passed, failed, partial or degraded.
//!
//! The crate makes no process, mount or network calls of its own. It works on a descriptor, a
//! path and bytes handed to it, so the engine and CLI decide where and as whom it runs.
//!
//! ## Limitations
//!
//! * [`collect::collect`] walks a tree that should no longer be changing (the sandbox's
//!   processes are dead). It still re-checks every entry after opening it (type, inode, device)
//!   and refuses anything that changed. Contents that change during the copy are copied as read
//!   and hashed as copied. The sha256 always describes the staged copy.
//! * When the byte budget runs out, the files already copied stay and the rest are refused, in
//!   name order. The caller decides whether a partial output is acceptable; it is not, when the
//!   manifest names one output.
//! * Messages from [`schema`] quote schema values (limits, enum values, patterns, required
//!   names), cut to 80 characters with control characters escaped. JSON Pointers in
//!   `instance_path` name keys of the document: they are locations, escaped the same way and
//!   bounded in length. A pointer that holds an escape is therefore no longer an exact RFC 6901
//!   pointer.
//! * The receipt key is a plain file. There is no HSM, KMS or transparency log.
//!
//! ## Tests
//!
//! Unit tests in each module build hostile trees in temporary folders: symlinks to a canary
//! file outside (which must never be copied), a symlinked directory, a FIFO (with a timeout, to
//! prove collection never blocks), a unix socket, hard links, names with `\n`, ESC, a bidi
//! override or invalid UTF-8, oversized files, 10,050 files, and 30-deep nesting. Other unit
//! tests cover a 100,000-deep JSON document parsed on a 64 KiB stack, duplicate keys, BOMs,
//! trailing garbage and non-UTF-8 input; schemas with `http://` and `file://` `$ref`s, checked
//! against a local listener that must see no connection; a proof that instance text
//! (`IGNORE PREVIOUS INSTRUCTIONS`) never appears in a message; and receipts with a flipped
//! byte in the payload, the signature or the artifact, another key, and key file permissions.
//! `tests/third_party.rs` has Rust write a receipt and verifies it with the Python script
//! documented in `docs/receipts.md`, and with securesystemslib's DSSE implementation when
//! either is installed.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod checkpoint;
pub mod collect;
pub mod digest;
pub mod json;
pub mod receipt;
pub mod schema;
pub mod selftest;
pub mod text;

/// The workspace's one way for a test to say that a prerequisite is missing (a failure under CI).
#[cfg(test)]
#[path = "../../cli/tests/common/skip.rs"]
mod test_skip;

pub use collect::{CollectError, CollectReport, collect};
pub use json::{JsonError, MAX_DEPTH, check_json};
pub use receipt::{
    Artifact, Envelope, ReceiptError, ReceiptKey, Statement, VerifiedReceipt, default_key_path,
    sign, verify,
};
pub use schema::{SchemaChecker, SchemaError};
