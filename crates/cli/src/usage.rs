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

/// A word as a POSIX shell reads it back: bare when safe, else in single quotes.
fn shell_word(w: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c);
    if !w.is_empty() && w.chars().all(safe) {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// For `run`/`manifest` refusing a bare word (`agentjail run python3 -c …`): the same command
/// line with `--` before that word, where the program and its arguments go.
fn forgotten_double_dash(e: &clap::Error, args: &[OsString]) -> Option<String> {
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let word = context(e, ContextKind::InvalidArg)?;
    let sub = args.get(1)?.to_str()?;
    if word.starts_with('-') || !matches!(sub, "run" | "manifest") || args.iter().any(|a| a == "--")
    {
        return None;
    }
    let at = args.iter().skip(2).position(|a| *a == *word)? + 2;
    let mut words: Vec<String> = vec!["agentjail".into()];
    for (i, a) in args.iter().enumerate().skip(1) {
        if i == at {
            words.push("--".into());
        }
        words.push(shell_word(&a.to_string_lossy()));
    }
    let mut line = words.join(" ");
    if line.chars().count() > 200 {
        line = line.chars().take(200).collect::<String>() + "…";
    }
    Some(format!(
        "unexpected argument '{word}': the program and its arguments go after `--`: {line}"
    ))
}

/// clap's suggestion for a mistyped flag or subcommand, which its first line leaves out.
fn did_you_mean(e: &clap::Error) -> Option<String> {
    match (
        e.get(ContextKind::SuggestedArg),
        e.get(ContextKind::SuggestedSubcommand),
    ) {
        (Some(ContextValue::String(s)), _) => return Some(format!("did you mean `{s}`?")),
        (_, Some(ContextValue::Strings(v))) if !v.is_empty() => {
            return Some(format!("did you mean `{}`?", v.join("` or `")));
        }
        _ => {}
    }
    match e.get(ContextKind::Suggested) {
        Some(ContextValue::StyledStrs(v)) if !v.is_empty() => Some(
            v.iter()
                .map(|s| format!("tip: {s}"))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        _ => None,
    }
}

/// One line for a usage error (without the `agentjail: error: ` prefix); `args` is the command
/// line clap refused.
pub fn one_line(e: &clap::Error, args: &[OsString]) -> String {
    if let Some(line) = forgotten_double_dash(e, args) {
        return line;
    }
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
    match (e.kind(), arg, did_you_mean(e)) {
        (ErrorKind::MissingRequiredArgument, Some(missing), _) => {
            format!("missing {missing}; see --help")
        }
        (_, _, Some(tip)) => format!("{first}; {tip}"),
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
