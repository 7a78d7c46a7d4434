//! Usage errors (what clap refuses) as one line on stderr, like every other refusal (exit 125):
//! `agentjail: error: --isolation foo: expected `native` or `gvisor``.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// What to say of a refused value of these flags, instead of listing the values.
const HINTS: &[(&str, &str)] = &[(
    "--net",
    "`deny` is the only mode; allow destinations with --allow-host",
)];

/// `--net <MODE>` → `--net`.
fn flag_of(arg: &str) -> &str {
    arg.split_once([' ', '=']).map_or(arg, |(f, _)| f)
}

fn context(e: &clap::Error, k: ContextKind) -> Option<String> {
    match e.get(k)? {
        ContextValue::String(s) => Some(s.clone()),
        ContextValue::Strings(v) => Some(v.join(", ")),
        _ => None,
    }
}

/// "`a`, `b` or `c`".
fn alternatives(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

/// One line for a usage error (without the `agentjail: error: ` prefix).
pub fn one_line(e: &clap::Error) -> String {
    let arg = context(e, ContextKind::InvalidArg);
    match e.kind() {
        ErrorKind::InvalidValue => {
            if let (Some(arg), Some(value), Some(ContextValue::Strings(valid))) = (
                arg.as_deref(),
                context(e, ContextKind::InvalidValue),
                e.get(ContextKind::ValidValue),
            ) {
                let flag = flag_of(arg);
                return match HINTS.iter().find(|(f, _)| *f == flag) {
                    Some((_, hint)) => format!("{flag} {value}: {hint}"),
                    None => format!("{flag} {value}: expected {}", alternatives(valid)),
                };
            }
        }
        ErrorKind::ArgumentConflict => {
            if let (Some(a), Some(b)) = (arg.as_deref(), context(e, ContextKind::PriorArg)) {
                let (a, b) = (flag_of(a), flag_of(&b));
                // --manifest conflicts with the whole group of flags that describe a run.
                if (a == "--manifest" || b == "--manifest")
                    && a != "--lifeline"
                    && b != "--lifeline"
                {
                    return "--manifest cannot be combined with flags that describe the run (the manifest is the one description); hint: `agentjail manifest --print` shows what flags produce".into();
                }
                return format!("{a} cannot be combined with {b}");
            }
        }
        _ => {}
    }
    // Clap's own first line, and where to read more.
    let text = e.render().to_string();
    let first = text
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .trim_end_matches(':');
    match (e.kind(), arg) {
        (ErrorKind::MissingRequiredArgument, Some(missing)) => {
            format!("missing {missing}; see --help")
        }
        _ => format!("{first}; see --help"),
    }
}

/// The `--report` path of a `run` command line that clap refused (only before `--`), so that a
/// usage error, like any other refusal, leaves a `setup_error` report there rather than an
/// earlier run's.
pub fn report_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(2).take_while(|a| *a != "--");
    while let Some(a) = it.next() {
        if a == "--report" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.to_str().and_then(|s| s.strip_prefix("--report=")) {
            return Some(PathBuf::from(p));
        }
    }
    None
}
