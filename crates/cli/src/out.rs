//! Our own lines on stdout and stderr: [`outln!`], [`out!`] and [`errln!`] instead of
//! `println!`, `print!` and `eprintln!` (clippy's `print_stdout` and `print_stderr` are denied
//! in this crate), and [`print_json`] for a value as pretty JSON.
//!
//! Closing a pipe early is ordinary in a shell (`agentjail check | head -1`, `$(…)` in a script
//! that exits). Rust ignores SIGPIPE, so a write to a pipe without a reader fails with EPIPE,
//! and `println!` turns that failure into a panic (exit 101, a backtrace on stderr). Here a
//! failed write never panics:
//! - stdout: the loss is remembered; when the command ends, [`exit_code`] makes its status
//!   141 (128 + SIGPIPE, what a shell shows for coreutils' `yes | head -1`), quietly. Another
//!   error (a full disk, EIO) is said once on stderr and the status is 125: the output is
//!   incomplete.
//! - stderr: nothing to tell anyone, nowhere to tell it; the status is unchanged.
//!
//! Why not restore SIGPIPE's default action, as coreutils has it? `agentjail run` relays the
//! sandbox's output (`agentjail_engine::outcome`), and after its reader left it must still
//! drain the sandbox's pipes, kill and reap the sandbox, release its cgroup and write the
//! report, receipt and output; the egress gateway and the service write to sockets and pipes
//! whose peers may leave too. The default action would kill the supervisor at the first relayed
//! write. Every subcommand shares these writers instead, whatever it is.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// State of our stdout: fine, its reader left (EPIPE), or another write error.
static STDOUT: AtomicU8 = AtomicU8::new(FINE);
const FINE: u8 = 0;
const GONE: u8 = 1;
const FAILED: u8 = 2;

/// Exit status of a command whose stdout reader left before it was written (128 + SIGPIPE).
pub const EXIT_STDOUT_GONE: u8 = 141;

/// Exit status for setup and usage errors.
pub const EXIT_SETUP: u8 = 125;

fn note_stdout_error(e: &std::io::Error) {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        let _ = STDOUT.compare_exchange(FINE, GONE, Ordering::Relaxed, Ordering::Relaxed);
    } else if STDOUT
        .compare_exchange(FINE, FAILED, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        err(format_args!("agentjail: error: writing to stdout: {e}\n"));
    }
}

/// Writes formatted text on stdout (use [`outln!`] / [`out!`]).
pub fn out(args: fmt::Arguments) {
    if STDOUT.load(Ordering::Relaxed) != FINE {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args) {
        note_stdout_error(&e);
    }
}

/// Writes bytes on stdout, as they are.
pub fn out_bytes(bytes: &[u8]) {
    if STDOUT.load(Ordering::Relaxed) != FINE {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(bytes) {
        note_stdout_error(&e);
    }
}

/// Our own lines on stderr are dropped ([`own_stderr_off`]).
static OWN_STDERR_OFF: AtomicBool = AtomicBool::new(false);

/// From now on [`errln!`] writes nothing. For a runner of the service (`run --lifeline`, once
/// it holds its manifest): its stderr is the sandboxed command's stderr and nothing else,
/// because the service shows it to the caller as the sandbox's (labelled untrusted) and
/// attests it by digest; what agentjail would say there (the summary, `degraded`, an error) is
/// in the report the service receives.
pub fn own_stderr_off() {
    OWN_STDERR_OFF.store(true, Ordering::Relaxed);
}

/// Writes formatted text on stderr (use [`errln!`]); a failure is ignored.
pub fn err(args: fmt::Arguments) {
    if OWN_STDERR_OFF.load(Ordering::Relaxed) {
        return;
    }
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// Flushes stdout; then the exit status of a command that would return `code`:
/// [`EXIT_STDOUT_GONE`] when its stdout reader left, 125 when stdout failed otherwise.
pub fn exit_code(code: u8) -> u8 {
    if let Err(e) = std::io::stdout().lock().flush() {
        note_stdout_error(&e);
    }
    match STDOUT.load(Ordering::Relaxed) {
        FINE => code,
        GONE => EXIT_STDOUT_GONE,
        _ => EXIT_SETUP,
    }
}

/// `println!` that never panics (the module's docs).
macro_rules! outln {
    () => {
        $crate::out::out_bytes(b"\n")
    };
    ($($arg:tt)*) => {
        $crate::out::out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that never panics (the module's docs).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::out(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics (the module's docs).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Prints `v` as pretty JSON and a newline on stdout.
pub fn print_json<T: serde::Serialize>(v: &T) {
    let s = serde_json::to_string_pretty(v).unwrap_or_default();
    outln!("{s}");
}

/// std's panic message when `println!`/`eprintln!` fail: "failed printing to stdout: …".
fn lost_stream(msg: Option<&str>) -> bool {
    msg.is_some_and(|m| {
        (m.starts_with("failed printing to stdout") || m.starts_with("failed printing to stderr"))
            && m.contains("Broken pipe")
    })
}

/// Runs `f` (the whole command) with a net under the writers above: code outside this crate
/// (the service's start-up lines, a library's warnings) may still use `println!`/`eprintln!`,
/// and std then panics on a closed pipe. That panic is told apart by std's message, printed
/// nowhere, and ends the command quietly with [`EXIT_STDOUT_GONE`] (on the main thread; on
/// another, only that thread ends, as before, without a backtrace). Any other panic is
/// reported and propagated as it would be without the net.
pub fn quiet_on_lost_streams(f: fn() -> u8) -> u8 {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied());
        if !lost_stream(msg) {
            report(info);
        }
    }));
    match std::panic::catch_unwind(f) {
        Ok(code) => code,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied());
            if !lost_stream(msg) {
                std::panic::resume_unwind(p);
            }
            let _ = STDOUT.compare_exchange(FINE, GONE, Ordering::Relaxed, Ordering::Relaxed);
            EXIT_STDOUT_GONE
        }
    }
}
