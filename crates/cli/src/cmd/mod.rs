//! One module per subcommand: its arguments (when it has more than a flag or two) and the
//! function that carries it out, returning the exit status or the one-line error (exit 125).

// Its lines still use `println!`/`eprintln!`: `out::quiet_on_lost_streams` keeps a closed
// pipe from showing a panic; move them to `outln!`/`errln!` (crate::out).
#[allow(clippy::print_stdout, clippy::print_stderr)]
pub mod audit;
pub mod check;
pub mod config;
pub mod demo;
pub mod image;
mod image_build;
pub mod manifest;
pub mod mcp;
pub mod receipt;
pub mod report;
pub mod run;
pub mod selftest;
pub mod serve;
pub mod session;
pub mod worker;
