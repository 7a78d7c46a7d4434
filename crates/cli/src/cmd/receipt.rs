//! `agentjail receipt`: verify signed run receipts and self-test attestations, or print the
//! receipt public key.

use std::path::{Path, PathBuf};

use clap::Subcommand;

#[derive(Subcommand)]
pub enum ReceiptCmd {
    /// Check a receipt's signature and that artifacts match its subjects.
    Verify {
        receipt: PathBuf,
        /// An artifact to check against the receipt's subjects (repeatable).
        #[arg(long = "artifact", value_name = "FILE")]
        artifacts: Vec<PathBuf>,
        /// Public key (PEM); default: the key in the user's data directory.
        #[arg(long, value_name = "FILE")]
        pubkey: Option<PathBuf>,
    },
    /// Print the public key of the receipt signing key (created if absent).
    Pubkey {
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
}

pub fn dispatch(c: ReceiptCmd) -> Result<u8, String> {
    match c {
        ReceiptCmd::Verify {
            receipt,
            artifacts,
            pubkey,
        } => verify(&receipt, &artifacts, pubkey.as_deref()),
        ReceiptCmd::Pubkey { key } => {
            let path = key.unwrap_or_else(agentjail_verify::receipt::default_key_path);
            let k = agentjail_verify::receipt::ReceiptKey::load_or_create(&path)
                .map_err(|e| e.to_string())?;
            print!("{}", k.public_key_pem());
            Ok(0)
        }
    }
}

fn verify(receipt: &Path, artifacts: &[PathBuf], pubkey: Option<&Path>) -> Result<u8, String> {
    let env = std::fs::read(receipt).map_err(|e| format!("{}: {e}", receipt.display()))?;
    let pem = match pubkey {
        Some(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    let arts: Vec<agentjail_verify::receipt::Artifact> = artifacts
        .iter()
        .map(|p| agentjail_verify::receipt::Artifact::from_path(p).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    use agentjail_verify::receipt::VerifiedAny;
    match agentjail_verify::receipt::verify_any(&env, pem.as_deref(), &arts) {
        Ok(VerifiedAny::Run(v)) => {
            println!(
                "receipt OK: signed by key {}; status {}; {} subject(s); {} artifact(s) match",
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
        Ok(VerifiedAny::Selftest(v)) => {
            let p = &v.statement.predicate;
            let n = |k: &str| p["summary"][k].as_u64().unwrap_or(0);
            println!(
                "receipt OK: selftest attestation signed by key {}; {}: {} passed, {} failed, {} skipped; agentjail {} (binary sha256:{}) on kernel {}, {} mode, at {}; {} artifact(s) match",
                v.keyid,
                if p["passed"] == true {
                    "PASSED"
                } else {
                    "FAILED"
                },
                n("passed"),
                n("failed"),
                n("skipped"),
                p["agentjail_version"].as_str().unwrap_or("?"),
                v.statement
                    .subject
                    .first()
                    .and_then(|s| s.digest.get("sha256"))
                    .map(String::as_str)
                    .unwrap_or("?"),
                p["host"]["kernel"].as_str().unwrap_or("?"),
                p["mode"].as_str().unwrap_or("?"),
                p["started_at"].as_str().unwrap_or("?"),
                arts.len()
            );
            Ok(0)
        }
        Err(e) => {
            eprintln!("agentjail: receipt verification failed: {e}");
            Ok(1)
        }
    }
}
