//! `agentjail audit`: verify the service's hash-chained audit log, from its file or from the
//! PostgreSQL database replicas share, and export the database's chain as the file's JSONL.

use std::path::PathBuf;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum AuditCmd {
    /// Verify the chain (every record's hash, `prev` and `seq`; in a database, every node's
    /// chain and the cross-anchors between them): exit 0 when intact, 1 when broken (the first
    /// bad record is named), 125 when it cannot be read.
    Verify {
        /// An audit log file (`DATA/private/audit.jsonl`, or an export).
        #[arg(required_unless_present = "database", conflicts_with = "database")]
        file: Option<PathBuf>,
        /// A PostgreSQL URL (`postgres://user@host:port/db`, no password in it).
        #[arg(long, value_name = "URL")]
        database: Option<String>,
        /// File holding the database password (mode 0600); default: $PGPASSWORD.
        #[arg(long, value_name = "FILE", requires = "database")]
        database_password_file: Option<PathBuf>,
    },
    /// Write the database's chain on stdout as JSONL, the file log's format
    /// (`agentjail audit verify FILE` checks it).
    Export {
        /// A PostgreSQL URL (`postgres://user@host:port/db`, no password in it).
        #[arg(long, value_name = "URL", required = true)]
        database: String,
        /// File holding the database password (mode 0600); default: $PGPASSWORD.
        #[arg(long, value_name = "FILE")]
        database_password_file: Option<PathBuf>,
    },
}

pub fn dispatch(c: AuditCmd) -> Result<u8, String> {
    match c {
        AuditCmd::Verify {
            file,
            database,
            database_password_file,
        } => {
            let r = match (file, database) {
                (Some(f), _) => {
                    if !f.exists() {
                        return Err(format!("{}: no such file", f.display()));
                    }
                    agentjail_server::audit::verify_file_chains(&f).map_err(|e| e.to_string())
                }
                (None, Some(url)) => {
                    match agentjail_server::pg::verify(&url, database_password_file.as_deref()) {
                        Ok(v) => Ok(v),
                        Err(agentjail_server::pg::VerifyError::Broken(e)) => Err(e),
                        Err(agentjail_server::pg::VerifyError::Access(e)) => return Err(e),
                    }
                }
                (None, None) => return Err("name a file or --database".into()),
            };
            match r {
                Ok(v) => {
                    match v.chains.iter().next() {
                        // One chain (the file log): as ever.
                        Some((name, (n, head))) if v.chains.len() == 1 && name.is_empty() => {
                            println!("audit chain OK: {n} record(s), head {head}");
                        }
                        _ => {
                            println!(
                                "audit chain OK: {} record(s) in {} chain(s), {} cross-anchor(s) checked",
                                v.records,
                                v.chains.len(),
                                v.anchors
                            );
                            for (name, (n, head)) in &v.chains {
                                let name = if name.is_empty() {
                                    "(before per-node chains)"
                                } else {
                                    name
                                };
                                println!("  chain {name}: {n} record(s), head {head}");
                            }
                        }
                    }
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("agentjail: audit chain BROKEN: {e}");
                    Ok(1)
                }
            }
        }
        AuditCmd::Export {
            database,
            database_password_file,
        } => {
            let mut out = std::io::stdout().lock();
            let n = agentjail_server::pg::export(
                &database,
                database_password_file.as_deref(),
                &mut out,
            )?;
            eprintln!("agentjail: exported {n} audit record(s)");
            Ok(0)
        }
    }
}
