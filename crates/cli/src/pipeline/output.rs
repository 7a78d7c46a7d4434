//! What the command left in `/output`, collected and verified: the collector's refusals into
//! the report, only the manifest's named output kept, and that output's type and schema
//! checks. Collects into a staging folder or into memory ([`Dest`]); delivers nothing.

use std::path::Path;

use agentjail_manifest::ValidatedManifest;
use agentjail_manifest::report::{DenialKind, OutputError, OutputFile, RunReport, Status};

/// Where [`verify_output`] collects `/output` to.
#[derive(Clone, Copy)]
pub(super) enum Dest<'a> {
    /// Nowhere: `/output` is empty (no staging folder was made).
    Empty,
    /// A private staging folder.
    Dir(&'a Path),
    /// Memory (`run --results-on-lifeline`).
    Memory,
}

pub(super) fn verify_output(
    vm: &ValidatedManifest,
    report: &mut RunReport,
    fd: std::os::fd::BorrowedFd<'_>,
    dest: Dest<'_>,
    output_full: bool,
    schema: Option<&agentjail_verify::schema::SchemaChecker>,
    artifact: &mut Option<Vec<u8>>,
) {
    let limit = vm.manifest.limits.output_bytes();
    let mut in_memory = Vec::new();
    let collected = match dest {
        // No staging folder: /output was empty.
        Dest::Empty => Ok(agentjail_verify::collect::CollectReport::default()),
        Dest::Dir(stage) => agentjail_verify::collect::collect(fd, stage, limit),
        Dest::Memory => {
            let keep = vm.output_relative();
            agentjail_verify::collect::collect_to_memory(fd, limit, keep.as_deref()).map(|m| {
                in_memory = m.contents;
                m.report
            })
        }
    };
    let collected = match collected {
        Ok(c) => c,
        Err(e) => {
            report.deny(DenialKind::Output, format!("collection failed: {e}"));
            if report.status == Status::Ok {
                report.status = Status::OutputRejected;
            }
            return;
        }
    };
    let command_ok = report.status == Status::Ok;
    for r in &collected.rejected {
        report.deny(DenialKind::Output, format!("{}: {}", r.path, r.reason));
    }
    // Refusals the collector counted but did not list are not listed here either.
    report.denials_dropped = report
        .denials_dropped
        .saturating_add(collected.rejected_dropped);
    report.output.rejected = collected.rejected;
    report.output.rejected_dropped = collected.rejected_dropped;
    let mut failed = false;
    if output_full {
        report.deny(
            DenialKind::Output,
            format!(
                "output: /output reached its limit of {} MiB; files may be truncated, nothing is passed on",
                vm.manifest.limits.output_mb
            ),
        );
        for f in &collected.files {
            list_rejected(report, f.path.clone(), "output limit reached".into());
        }
        report.output.files.clear();
        if command_ok {
            report.status = Status::OutputRejected;
        }
        return;
    }
    match vm.output_relative() {
        None => {
            report.output.files = collected.files;
            failed = !report.output.rejected.is_empty();
        }
        Some(name) => {
            let mut kept: Vec<OutputFile> = Vec::new();
            for f in collected.files {
                if f.path == name {
                    kept.push(f);
                } else {
                    report.deny(
                        DenialKind::Output,
                        format!("{}: not the manifest's output ({name}): dropped", f.path),
                    );
                    list_rejected(
                        report,
                        f.path,
                        format!("not the manifest's output ({name}): dropped"),
                    );
                }
            }
            match kept.pop() {
                None => {
                    failed = true;
                    if command_ok && !report.output.rejected.iter().any(|r| r.path == name) {
                        report.deny(DenialKind::Output, format!("{name}: missing"));
                    }
                    report.output.errors.push(OutputError {
                        instance_path: String::new(),
                        message: format!(
                            "the expected output {name} was not produced or was refused"
                        ),
                    });
                }
                Some(f) => {
                    let bytes = match dest {
                        Dest::Memory => in_memory
                            .iter_mut()
                            .find(|(p, _)| *p == f.path)
                            .map(|(_, c)| std::mem::take(c))
                            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)),
                        Dest::Dir(s) => std::fs::read(s.join(&f.path)),
                        Dest::Empty => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
                    };
                    let errors = check_artifact(bytes, &name, schema, artifact);
                    if errors.is_empty() {
                        report.output.files.push(f);
                    } else {
                        failed = true;
                        report.deny(DenialKind::Output, verification_denial(&name, &errors));
                        list_rejected(
                            report,
                            f.path,
                            "failed verification (see output.errors)".into(),
                        );
                        report.output.errors = errors;
                        *artifact = None;
                    }
                }
            }
        }
    }
    if failed && command_ok {
        report.status = Status::OutputRejected;
    }
}

/// The denial for an output that failed verification: its first error, located, and how many
/// more there are (all of them are in the report's `output.errors`), so that the one line
/// `agentjail run` prints says what is wrong:
/// `summary.json: /rows: expected integer, got string (and 2 more errors in output.errors)`.
fn verification_denial(name: &str, errors: &[OutputError]) -> String {
    let Some(first) = errors.first() else {
        return format!("{name}: failed verification");
    };
    let at = if first.instance_path.is_empty() {
        String::new()
    } else {
        format!("{}: ", first.instance_path)
    };
    let more = match errors.len() - 1 {
        0 => String::new(),
        1 => " (and 1 more error in output.errors)".to_string(),
        n => format!(" (and {n} more errors in output.errors)"),
    };
    format!("{name}: {at}{}{more}", first.message)
}

/// Adds an entry to `output.rejected`, or counts it once that list is full.
fn list_rejected(report: &mut RunReport, path: String, reason: String) {
    let out = &mut report.output;
    if out.rejected.len() >= agentjail_manifest::report::MAX_REJECTED_LISTED {
        out.rejected_dropped = out.rejected_dropped.saturating_add(1);
    } else {
        out.rejected
            .push(agentjail_manifest::report::RejectedFile { path, reason });
    }
}

/// Type and schema checks of the named output.
fn check_artifact(
    collected: std::io::Result<Vec<u8>>,
    name: &str,
    schema: Option<&agentjail_verify::schema::SchemaChecker>,
    artifact: &mut Option<Vec<u8>>,
) -> Vec<OutputError> {
    let bytes = match collected {
        Ok(b) => b,
        Err(e) => {
            return vec![OutputError {
                instance_path: String::new(),
                message: format!("cannot read the collected file: {e}"),
            }];
        }
    };
    let is_json = name.ends_with(".json") || schema.is_some();
    if is_json {
        match agentjail_verify::json::check_json(&bytes) {
            Err(e) => return vec![e],
            Ok(v) => {
                if let Some(s) = schema {
                    let errs = s.check(&v);
                    if !errs.is_empty() {
                        return errs;
                    }
                }
            }
        }
    } else if (name.ends_with(".txt") || name.ends_with(".csv") || name.ends_with(".md"))
        && let Err(e) = std::str::from_utf8(&bytes)
    {
        return vec![OutputError {
            instance_path: String::new(),
            message: format!("not valid UTF-8 text (byte {})", e.valid_up_to()),
        }];
    }
    *artifact = Some(bytes);
    Vec::new()
}
