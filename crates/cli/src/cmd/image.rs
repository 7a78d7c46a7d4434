//! `agentjail image …`: the digest-pinned image store (docs/images.md).

use std::path::PathBuf;

use agentjail_image::{Limits, Store};

#[derive(clap::Args, Clone)]
pub struct StoreArg {
    /// Image store directory [default: $XDG_DATA_HOME/agentjail/images].
    #[arg(long, value_name = "DIR", env = "AGENTJAIL_IMAGE_STORE")]
    store: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum ImageCmd {
    /// Import an OCI image layout (directory or tar of one) or a plain root file system
    /// (directory or tarball); every blob is checked against its digest first. Prints the digest.
    Import {
        path: PathBuf,
        #[command(flatten)]
        store: StoreArg,
        /// Refuse archives with more entries than this (all layers together) [default: 500000].
        #[arg(long, value_name = "N")]
        max_entries: Option<u64>,
        /// Refuse images whose files add up to more than this, in MiB [default: 16384].
        #[arg(long, value_name = "N")]
        max_total_mb: Option<u64>,
        /// Print the stored record (JSON) instead of the digest.
        #[arg(long)]
        json: bool,
    },
    /// List stored images.
    Ls {
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Remove a stored image.
    Rm {
        digest: String,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Re-hash a stored image's every file against its record; exit 1 and list what changed.
    Verify {
        digest: String,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
}

pub fn dispatch(c: ImageCmd) -> Result<u8, String> {
    match c {
        ImageCmd::Import {
            path,
            store,
            max_entries,
            max_total_mb,
            json,
        } => {
            let mut limits = Limits::default();
            if let Some(n) = max_entries {
                limits.max_entries = n;
            }
            if let Some(mb) = max_total_mb {
                limits.max_total_bytes = mb.saturating_mul(1 << 20);
            }
            let s = Store::at(store.store.as_deref());
            let imp = s.import(&path, &limits).map_err(|e| e.to_string())?;
            if json {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&imp.record).unwrap_or_default()
                );
            } else {
                outln!("{}", imp.record.digest);
            }
            if imp.already_present {
                errln!(
                    "agentjail image: {} was already in the store",
                    imp.record.digest
                );
            }
            if imp.record.dropped_count > 0 {
                errln!(
                    "agentjail image: {} entr(y/ies) not reproduced (device nodes, FIFOs, setuid bits, xattrs); see `image ls --json`",
                    imp.record.dropped_count
                );
            }
            Ok(0)
        }
        ImageCmd::Ls { store, json } => {
            let s = Store::at(store.store.as_deref());
            let all = s.list().map_err(|e| e.to_string())?;
            if json {
                let v: Vec<serde_json::Value> = all
                    .iter()
                    .map(|r| match r {
                        Ok(r) => serde_json::to_value(r).unwrap_or_default(),
                        Err(e) => serde_json::json!({ "error": e.to_string() }),
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else if all.is_empty() {
                outln!(
                    "no images (in {}; add one with `agentjail image import`)",
                    s.root().display()
                );
            } else {
                for r in all {
                    match r {
                        Ok(r) => outln!(
                            "{}  {:<10} {:>8} files {:>12} bytes  {}  {}",
                            r.digest,
                            r.kind,
                            r.entries,
                            r.bytes,
                            r.created,
                            r.source
                        ),
                        Err(e) => outln!("{e}"),
                    }
                }
            }
            Ok(0)
        }
        ImageCmd::Rm { digest, store } => {
            Store::at(store.store.as_deref())
                .remove(&digest)
                .map_err(|e| e.to_string())?;
            errln!("agentjail image: removed {digest}");
            Ok(0)
        }
        ImageCmd::Verify {
            digest,
            store,
            json,
        } => {
            let v = Store::at(store.store.as_deref())
                .verify(&digest)
                .map_err(|e| e.to_string())?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else if v.ok {
                outln!("{digest}: ok (every file matches the record)");
            } else {
                outln!("{digest}: CHANGED since import");
                for c in &v.changes {
                    outln!("  {c}");
                }
            }
            Ok(if v.ok { 0 } else { 1 })
        }
    }
}
