//! `agentjail receipt`: verify signed run receipts and self-test attestations, or print the
//! receipt public key (of an existing key: `--create` to make one).
//!
//! A self-test attestation is authentic whatever it found; `verify` also reads its claim
//! (`agentjail_verify::selftest`) and exits 0 only for PASSED (the whole corpus of its tiers,
//! strict mode, no failure) unless `--accept-partial` / `--accept-degraded` accept less
//! (docs/receipts.md, docs/selftest.md).

use std::path::{Path, PathBuf};

use clap::Subcommand;

#[derive(Subcommand)]
pub enum ReceiptCmd {
    /// Check a receipt's signature and that artifacts match its subjects; for a self-test
    /// attestation, also its verdict. Exit 0 verified (a self-test: PASSED, or accepted), 1 not
    /// verified, 2 a FAILED self-test, 3 a PARTIAL or DEGRADED self-test not accepted, or a
    /// live session's cell receipt without `--live-cell`.
    Verify {
        receipt: PathBuf,
        /// An artifact to check against the receipt's subjects (repeatable).
        #[arg(long = "artifact", value_name = "FILE")]
        artifacts: Vec<PathBuf>,
        /// A log of the command's stdout (the service's `GET /v1/runs/{id}/logs?stream=stdout`,
        /// or what `agentjail run` printed): checked against the sha256 the receipt carries.
        #[arg(long, value_name = "FILE")]
        stdout: Option<PathBuf>,
        /// A log of the command's stderr, likewise.
        #[arg(long, value_name = "FILE")]
        stderr: Option<PathBuf>,
        /// A workspace checkpoint (`run --workspace-out`): checked against the digest of the
        /// workspace after the run that the receipt carries.
        #[arg(long, value_name = "FILE")]
        workspace: Option<PathBuf>,
        /// Public key (PEM); default: the key in the user's data directory.
        #[arg(long, value_name = "FILE")]
        pubkey: Option<PathBuf>,
        /// Accept a self-test attestation that does not cover the whole corpus of its tiers
        /// (`selftest --only`, a tier or the gateway that could not be attacked); exit 0 for it.
        #[arg(long)]
        accept_partial: bool,
        /// Accept a self-test attestation made in degraded mode (a strict run was refused on
        /// that host); exit 0 for it.
        #[arg(long)]
        accept_degraded: bool,
        /// Accept a live session's cell receipt (signed by the service that ran the cell; its
        /// subject is the cell's code, `code.py`): it is not a run's receipt, and without this
        /// flag an authentic one exits 3.
        #[arg(long)]
        live_cell: bool,
    },
    /// Print the public key of a receipt signing key. Reading a key never creates one: exit 0
    /// printed, 125 when there is no key at that path (nothing is created) or it cannot be
    /// read. `run --receipt` and `selftest --receipt` create the key they sign with; so does
    /// `--create`.
    Pubkey {
        /// The private key (PEM) [default: $XDG_DATA_HOME/agentjail/receipt-key.pem].
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
        /// Create the key (mode 0600, missing folders 0700) when there is none at that path.
        #[arg(long)]
        create: bool,
    },
}

pub fn dispatch(c: ReceiptCmd) -> Result<u8, String> {
    match c {
        ReceiptCmd::Verify {
            receipt,
            artifacts,
            stdout,
            stderr,
            workspace,
            pubkey,
            accept_partial,
            accept_degraded,
            live_cell,
        } => verify(
            &receipt,
            &artifacts,
            [stdout, stderr, workspace],
            pubkey.as_deref(),
            Accept {
                partial: accept_partial,
                degraded: accept_degraded,
                live_cell,
            },
        ),
        ReceiptCmd::Pubkey { key, create } => pubkey(key, create),
    }
}

/// `receipt pubkey`: prints the public half of the key at `key` (default: the user's), which
/// must exist unless `create`. A mistyped or not-yet-made path (docs/api.md names the service's
/// key) must not become a fresh key whose receipts nobody can verify.
fn pubkey(key: Option<PathBuf>, create: bool) -> Result<u8, String> {
    use agentjail_verify::receipt::{ReceiptKey, default_key_path};
    let path = key.unwrap_or_else(default_key_path);
    let k = if create {
        ReceiptKey::load_or_create(&path)
    } else {
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let shown = std::path::absolute(&path).unwrap_or_else(|_| path.clone());
                return Err(format!(
                    "no receipt key at {} (nothing was created); check the path, or make a new key on purpose: agentjail receipt pubkey --create --key {}",
                    shown.display(),
                    path.display()
                ));
            }
            _ => ReceiptKey::load(&path),
        }
    }
    .map_err(|e| e.to_string())?;
    out!("{}", k.public_key_pem());
    Ok(0)
}

/// Exit status of `receipt verify` for an authentic self-test attestation that is FAILED.
pub const EXIT_FAILED: u8 = 2;
/// Exit status of `receipt verify` for an authentic self-test attestation that is partial or
/// degraded, and not accepted by `--accept-partial` / `--accept-degraded`; and for an
/// authentic live cell's receipt without `--live-cell`.
pub const EXIT_NOT_ACCEPTED: u8 = 3;

/// What the verifier accepts besides a PASSED self-test attestation.
#[derive(Clone, Copy, Debug, Default)]
struct Accept {
    partial: bool,
    degraded: bool,
    live_cell: bool,
}

fn verify(
    receipt: &Path,
    artifacts: &[PathBuf],
    logs: [Option<PathBuf>; 3],
    pubkey: Option<&Path>,
    accept: Accept,
) -> Result<u8, String> {
    let env = std::fs::read(receipt).map_err(|e| format!("{}: {e}", receipt.display()))?;
    let pem = match pubkey {
        Some(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    let [stdout, stderr, workspace] = logs;
    let logs = [stdout, stderr];
    let workspace = match workspace {
        Some(p) => {
            Some(agentjail_verify::receipt::Artifact::from_path(&p).map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let arts: Vec<agentjail_verify::receipt::Artifact> = artifacts
        .iter()
        .map(|p| agentjail_verify::receipt::Artifact::from_path(p).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    use agentjail_verify::receipt::{StreamName, VerifiedAny};
    let logs: Vec<(StreamName, agentjail_verify::receipt::Artifact)> =
        [StreamName::Stdout, StreamName::Stderr]
            .into_iter()
            .zip(logs)
            .filter_map(|(n, p)| p.map(|p| (n, p)))
            .map(|(n, p)| {
                agentjail_verify::receipt::Artifact::from_path(&p)
                    .map(|a| (n, a))
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<_, _>>()?;
    let verified = agentjail_verify::receipt::verify_any(&env, pem.as_deref(), &arts);
    if let Ok(VerifiedAny::Run(v)) = &verified {
        for (which, log) in &logs {
            if let Err(e) = agentjail_verify::receipt::check_stream(&v.statement, *which, log) {
                errln!("agentjail: receipt verification failed: {e}");
                return Ok(1);
            }
        }
        if let Some(ck) = &workspace
            && let Err(e) = agentjail_verify::receipt::check_workspace(&v.statement, ck)
        {
            errln!("agentjail: receipt verification failed: {e}");
            return Ok(1);
        }
    } else if let Ok(VerifiedAny::LiveCell(v)) = &verified {
        for (which, log) in &logs {
            if let Err(e) = v.check_stream(*which, log) {
                errln!("agentjail: receipt verification failed: {e}");
                return Ok(1);
            }
        }
        if workspace.is_some() {
            errln!(
                "agentjail: receipt verification failed: a live cell's receipt carries no workspace digest (its interpreter's run receipt does: --workspace)"
            );
            return Ok(1);
        }
    } else if (!logs.is_empty() || workspace.is_some()) && verified.is_ok() {
        errln!(
            "agentjail: receipt verification failed: a self-test attestation carries no stream or workspace digests (--stdout/--stderr/--workspace)"
        );
        return Ok(1);
    }
    match verified {
        Ok(VerifiedAny::Run(v)) => {
            let mut streams = match logs.len() {
                0 => String::new(),
                n => format!("; {n} stream log(s) match"),
            };
            if workspace.is_some() {
                streams.push_str("; the workspace checkpoint matches");
            }
            outln!(
                "receipt OK: signed by key {}; status {}; {} subject(s); {} artifact(s) match{streams}",
                v.keyid,
                serde_json::to_value(v.statement.predicate.status)
                    .ok()
                    .and_then(|s| s.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                v.statement.subject.len(),
                arts.len()
            );
            Ok(0)
        }
        Ok(VerifiedAny::Selftest(v)) => Ok(selftest_verdict(&v, arts.len(), accept)),
        Ok(VerifiedAny::LiveCell(v)) => {
            use agentjail_verify::text::printable;
            let p = &v.statement.predicate;
            let streams = match logs.len() {
                0 => String::new(),
                n => format!("; {n} stream log(s) match"),
            };
            if !accept.live_cell {
                errln!(
                    "agentjail: receipt authentic, not accepted: it is a live session's cell receipt (signed by the service; its subject is the cell's code), not a run's; pass --live-cell to accept one"
                );
                return Ok(EXIT_NOT_ACCEPTED);
            }
            outln!(
                "receipt OK: live cell {} of session {} signed by key {}; status {}; interpreter {} ({}); previous receipt {}; {} artifact(s) match{streams}",
                p.session.cell,
                printable(&p.session.id, 200),
                v.keyid,
                printable(&p.status, 40),
                printable(&p.interpreter.state, 40),
                printable(
                    p.interpreter
                        .request_id
                        .as_deref()
                        .unwrap_or("none started"),
                    200
                ),
                printable(
                    p.session
                        .previous_receipt_sha256
                        .as_deref()
                        .unwrap_or("none"),
                    80
                ),
                arts.len()
            );
            Ok(0)
        }
        Err(e) => {
            errln!("agentjail: receipt verification failed: {e}");
            Ok(1)
        }
    }
}

/// Prints what an authentic self-test attestation claims (tiers, egress, filter, mode, counts)
/// and its verdict; returns the exit status: 0 for PASSED or an accepted partial/degraded
/// attestation, [`EXIT_FAILED`], [`EXIT_NOT_ACCEPTED`].
fn selftest_verdict(
    v: &agentjail_verify::receipt::VerifiedSelftest,
    artifacts: usize,
    accept: Accept,
) -> u8 {
    use agentjail_verify::selftest::{SelftestClaim, SelftestVerdict};
    use agentjail_verify::text::printable;
    let p = &v.statement.predicate;
    let c = SelftestClaim::from_predicate(p);
    let verdict = c.verdict();
    let missing: Vec<&str> = [
        (verdict.is_partial() && !accept.partial).then_some("--accept-partial"),
        (verdict.is_degraded() && !accept.degraded).then_some("--accept-degraded"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let code = match verdict {
        SelftestVerdict::Failed => EXIT_FAILED,
        _ if !missing.is_empty() => EXIT_NOT_ACCEPTED,
        _ => 0,
    };
    let accepted = match verdict {
        SelftestVerdict::Passed | SelftestVerdict::Failed => String::new(),
        _ if code == 0 => {
            let flags: Vec<&str> = [
                verdict.is_partial().then_some("--accept-partial"),
                verdict.is_degraded().then_some("--accept-degraded"),
            ]
            .into_iter()
            .flatten()
            .collect();
            format!(" (accepted: {})", flags.join(" "))
        }
        _ => " (not accepted)".into(),
    };
    let text = |k: &str| printable(p[k].as_str().unwrap_or("?"), 200);
    let head = if code == 0 {
        "receipt OK"
    } else {
        "receipt authentic, attestation not accepted"
    };
    outln!(
        "{head}: selftest attestation signed by key {}; {}{accepted}; agentjail {} (binary sha256:{}) on kernel {}, at {}; {artifacts} artifact(s) match",
        v.keyid,
        verdict.word(),
        text("agentjail_version"),
        printable(
            v.statement
                .subject
                .first()
                .and_then(|s| s.digest.get("sha256"))
                .map(String::as_str)
                .unwrap_or("?"),
            80
        ),
        printable(p["host"]["kernel"].as_str().unwrap_or("?"), 200),
        text("started_at"),
    );
    outln!(
        "  tiers: {}; egress: {}; filter: {}; mode: {}",
        if c.tiers.is_empty() {
            "none".to_string()
        } else {
            c.tiers.join("+")
        },
        if c.egress { "attacked" } else { "not attacked" },
        match &c.filter {
            None => "none".to_string(),
            Some(f) => f.join(","),
        },
        c.mode
    );
    outln!(
        "  probes: {} of {} run: {} passed, {} failed, {} skipped",
        c.total,
        c.corpus
            .map_or_else(|| "an unrecorded number".to_string(), |n| n.to_string()),
        c.passed,
        c.failed,
        c.skipped
    );
    if !c.failed_probes.is_empty() {
        outln!("  failed: {}", c.failed_probes.join(", "));
    }
    for why in &c.incomplete {
        outln!("  partial: {why}");
    }
    if verdict.is_degraded() {
        outln!(
            "  degraded: a strict run was refused on the attested host (mode {})",
            c.mode
        );
    }
    match verdict {
        SelftestVerdict::Failed => {
            let what = if c.failed > 0 {
                format!(
                    "{} probe(s) failed ({})",
                    c.failed,
                    if c.failed_probes.is_empty() {
                        "not listed".to_string()
                    } else {
                        c.failed_probes.join(", ")
                    }
                )
            } else {
                "the attestation does not claim a pass (predicate.passed is not true)".into()
            };
            errln!(
                "agentjail: selftest attestation not accepted: FAILED: {what}; no flag accepts a failure"
            );
        }
        _ if code != 0 => {
            let mut why: Vec<String> = c.incomplete.clone();
            if verdict.is_degraded() {
                why.push(format!("mode {}", c.mode));
            }
            errln!(
                "agentjail: selftest attestation not accepted: {} ({}); pass {} to accept it",
                verdict.word(),
                why.join("; "),
                missing.join(" ")
            );
        }
        _ => {}
    }
    code
}
