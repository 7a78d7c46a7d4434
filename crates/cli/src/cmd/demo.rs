//! `agentjail demo`: the CSV-summary example (examples/csv-summary) end to end.

use std::path::PathBuf;

use agentjail_engine::RunOptions;
use agentjail_manifest::{Manifest, SourcePolicy};

use crate::cmd::run::{LimitNames, Terminal, clear_stale_report, status_word, summarize};
use crate::pipeline::{self, Delivery, SetupFailure};

const DEMO_FILES: &[(&str, &str)] = &[
    (
        "manifest.yaml",
        include_str!("../../../../examples/csv-summary/manifest.yaml"),
    ),
    (
        "report.csv",
        include_str!("../../../../examples/csv-summary/report.csv"),
    ),
    (
        "summarize.py",
        include_str!("../../../../examples/csv-summary/summarize.py"),
    ),
    (
        "summary.schema.json",
        include_str!("../../../../examples/csv-summary/summary.schema.json"),
    ),
];

pub fn run(allow_degraded: bool, report: Option<PathBuf>) -> Result<u8, String> {
    let dir = tempfile::Builder::new()
        .prefix("agentjail-demo-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary folder: {e}"))?;
    for (name, content) in DEMO_FILES {
        std::fs::write(dir.path().join(name), content)
            .map_err(|e| format!("cannot write the demo files: {e}"))?;
    }
    // The sandbox user (an unprivileged uid in root mode) must be able to read the inputs.
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755));
    let out_dir = dir.path().join("out");
    clear_stale_report(report.as_deref())?;
    let m = Manifest::load(&dir.path().join("manifest.yaml")).map_err(|e| e.to_string())?;
    let base = dir.path().canonicalize().map_err(|e| e.to_string())?;
    let vm = m
        .validate(
            &SourcePolicy {
                base_dir: base.clone(),
                roots: Some(vec![base]),
            },
            jiff::Timestamp::now(),
        )
        .map_err(|e| e.to_string())?;
    errln!(
        "agentjail demo: summarizing report.csv with python3 in a sandbox (network denied, /input read-only)"
    );
    // Both of the command's streams go to our stderr.
    let terminal = Terminal::of_our_streams(false);
    let f = pipeline::execute(
        &vm,
        &RunOptions {
            allow_degraded,
            stdout: terminal.stderr_sink(),
            stderr: terminal.stderr_sink(),
            egress_dns: Vec::new(),
            lifeline: None,
            lease: None,
            workspace_restore: None,
            live_denials: None,
            stdin: None,
        },
        &Delivery {
            output_dir: Some(out_dir),
            report,
            receipt: None,
            key: None,
            for_service: false,
            results: None,
            workspace_out: None,
        },
    )
    .map_err(|SetupFailure(m)| m)?;
    let r = &f.report;
    match &f.artifact {
        Some(bytes) => {
            crate::out::out_bytes(bytes);
            if !bytes.ends_with(b"\n") {
                outln!();
            }
            let status = status_word(r.status);
            errln!(
                "agentjail demo: status {status}, verified against summary.schema.json; wall {} ms, cpu {} ms, peak memory {} KiB; isolation: landlock ABI {}, seccomp {}, cgroup {}",
                r.wall_ms,
                r.cpu_ms,
                r.peak_memory_bytes / 1024,
                r.isolation
                    .landlock_abi
                    .map_or_else(|| "none".to_string(), |a| a.to_string()),
                if r.isolation.seccomp { "on" } else { "off" },
                r.isolation.cgroup.as_deref().unwrap_or("none")
            );
        }
        None => summarize(r, terminal.stderr, LimitNames::Manifest),
    }
    Ok(f.exit_code.clamp(0, 255) as u8)
}
