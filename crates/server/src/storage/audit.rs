//! The append-only audit log: one JSON object per line, each chained to the previous by sha256
//! and fsync'd before the decision it records takes effect.
//!
//! Record: `{"seq", "ts", "event", "actor", "tenant", "task", "request_id", "job_id",
//! "decision", "reason", "status", "denials", "prev", "hash"}` (absent fields omitted).
//! `hash` = `sha256:` + hex sha256 of the RFC 8785 (JCS) canonical JSON of the record without
//! `hash`; `prev` is the previous record's `hash` (the first record's `prev` is
//! `sha256:` + 64 zeros). JSON escaping makes line injection impossible: every value is a JSON
//! string or number, and no field ever holds a token, input content, code, environment value or
//! output content.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{Map, Value};

/// `prev` of the first record.
pub const GENESIS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// One audit event (the caller fills what applies).
#[derive(Debug, Default, Clone, Serialize)]
pub struct Event {
    pub event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_id: Option<String>,
    /// The session a `session_*` record is about (docs/api.md, "Sessions").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// `allow` or `deny` for policy decisions; omitted otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denials: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Method and route template (never the query string); `mcp stdio` / `mcp http` for MCP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// The MCP tool called (`mcp_tool_call` records only); never its arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The chain the record is on: the node that appended it (PostgreSQL: one chain per
    /// node); absent in the file log (one chain).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `audit_anchor` records only: the heads of the other chains as this node read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchors: Option<Vec<Anchor>>,
}

/// One cross-anchor: chain `node` had record `seq` with hash `hash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Anchor {
    pub node: String,
    pub seq: u64,
    pub hash: String,
}

struct Inner {
    file: File,
    seq: u64,
    prev: String,
}

/// Handle to the audit log.
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Mutex<Inner>>,
    /// Group commit: the log's file (a second descriptor) and the last `seq` known to be on
    /// disk. An appender writes its line under `inner`, then fsyncs under this lock unless a
    /// concurrent appender's fsync, issued after its line was written, already covered it.
    synced: Arc<Mutex<(File, u64)>>,
    path: PathBuf,
}

/// Audit failure.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {0}: {1}")]
    Io(String, std::io::Error),
    #[error("audit log line {0}: {1}")]
    Chain(u64, String),
    /// A record without a canonical JSON form (it cannot be hashed into the chain).
    #[error("audit log line {0}: canonical JSON: {1}")]
    Canonical(u64, #[source] serde_json::Error),
}

/// The chain hash of one record. A record that cannot be canonicalised is an error: hashing
/// empty bytes instead would chain a value that no verifier can recompute.
fn hash_record(rec: &Map<String, Value>) -> Result<String, serde_json::Error> {
    let bytes = serde_jcs::to_vec(rec)?;
    Ok(agentjail_manifest::sha256_digest(&bytes))
}

impl AuditLog {
    /// Opens the log for appending after verifying its chain (a broken chain refuses start-up:
    /// an operator must look at it).
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        let (seq, prev) = if path.exists() {
            verify_chain(path)?
        } else {
            (0, GENESIS.to_string())
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| AuditError::Io(path.display().to_string(), e))?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
        let sync_file = file
            .try_clone()
            .map_err(|e| AuditError::Io(path.display().to_string(), e))?;
        Ok(AuditLog {
            inner: Arc::new(Mutex::new(Inner { file, seq, prev })),
            synced: Arc::new(Mutex::new((sync_file, seq))),
            path: path.to_owned(),
        })
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record and returns once it is on disk (fdatasync; blocking). Concurrent
    /// appenders share fsyncs (group commit): the chain is built under one lock, the fsync
    /// under another, so records written while an fsync is under way are covered by the next
    /// one, which one of them issues for all.
    pub fn append_blocking(&self, ev: &Event) -> Result<(), AuditError> {
        let mine = self.write_record(ev)?;
        let mut s = self
            .synced
            .lock()
            .map_err(|_| AuditError::Chain(0, "lock poisoned".into()))?;
        if s.1 >= mine {
            return Ok(());
        }
        // Everything written so far (at least `mine`) is covered by this fsync.
        let written = self
            .inner
            .lock()
            .map_err(|_| AuditError::Chain(0, "lock poisoned".into()))?
            .seq;
        s.0.sync_data()
            .map_err(|e| AuditError::Io(self.path.display().to_string(), e))?;
        s.1 = written;
        Ok(())
    }

    /// Chains and writes one record (not yet fsync'd); returns its `seq`.
    fn write_record(&self, ev: &Event) -> Result<u64, AuditError> {
        let mut g = self
            .inner
            .lock()
            .map_err(|_| AuditError::Chain(0, "lock poisoned".into()))?;
        let (mut line, h) = chain_record(ev, g.seq + 1, &g.prev)?;
        line.push('\n');
        let p = self.path.display().to_string();
        g.file
            .write_all(line.as_bytes())
            .map_err(|e| AuditError::Io(p, e))?;
        g.seq += 1;
        g.prev = h;
        Ok(g.seq)
    }

    /// Appends from async code on a blocking thread; failures are logged (and counted).
    pub async fn append(&self, ev: Event) {
        let me = self.clone();
        let r = tokio::task::spawn_blocking(move || me.append_blocking(&ev)).await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                metrics::counter!("agentjail_audit_failures_total").increment(1);
                tracing::error!(error = %e, "audit append failed");
            }
            Err(e) => {
                metrics::counter!("agentjail_audit_failures_total").increment(1);
                tracing::error!(error = %e, "audit append task failed");
            }
        }
    }
}

/// One record of the chain: `ev` with `seq`, `ts` (now) and `prev`, hashed. Returns the
/// record as one line of JSON (no newline) and its `hash`. The file log and the PostgreSQL
/// store (`crate::storage::pg`) both build records here, so one verifier serves both.
pub fn chain_record(ev: &Event, seq: u64, prev: &str) -> Result<(String, String), AuditError> {
    // An event that does not serialise to an object is an error, never an empty record.
    let mut rec = match serde_json::to_value(ev) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(AuditError::Chain(seq, "event is not an object".into())),
        Err(e) => return Err(AuditError::Chain(seq, e.to_string())),
    };
    rec.insert("seq".into(), Value::from(seq));
    rec.insert("ts".into(), Value::from(jiff::Timestamp::now().to_string()));
    rec.insert("prev".into(), Value::from(prev.to_string()));
    let h = hash_record(&rec).map_err(|e| AuditError::Canonical(seq, e))?;
    rec.insert("hash".into(), Value::from(h.clone()));
    let line = serde_json::to_string(&rec).map_err(|e| AuditError::Chain(seq, e.to_string()))?;
    Ok((line, h))
}

/// Verifies a chain given as its lines, in order; returns (last seq, last hash).
pub fn verify_lines<I>(lines: I) -> Result<(u64, String), AuditError>
where
    I: IntoIterator<Item = Result<String, AuditError>>,
{
    let mut prev = GENESIS.to_string();
    let mut seq = 0u64;
    for (i, line) in lines.into_iter().enumerate() {
        let n = i as u64 + 1;
        let line = line?;
        let mut rec: Map<String, Value> = serde_json::from_str(&line)
            .map_err(|e| AuditError::Chain(n, format!("not a JSON object: {e}")))?;
        let Some(Value::String(h)) = rec.remove("hash") else {
            return Err(AuditError::Chain(n, "no hash".into()));
        };
        if rec.get("prev").and_then(Value::as_str) != Some(prev.as_str()) {
            return Err(AuditError::Chain(
                n,
                "prev does not match the previous record's hash".into(),
            ));
        }
        if rec.get("seq").and_then(Value::as_u64) != Some(seq + 1) {
            return Err(AuditError::Chain(n, "seq is not consecutive".into()));
        }
        if hash_record(&rec).map_err(|e| AuditError::Canonical(n, e))? != h {
            return Err(AuditError::Chain(
                n,
                "hash does not match the record".into(),
            ));
        }
        prev = h;
        seq += 1;
    }
    Ok((seq, prev))
}

/// What [`verify_chains`] found: every chain's (records, head), by chain (`""`: the records
/// with no `node`, the file log's and the database's before it had one chain per node), and
/// how many cross-anchors were checked.
#[derive(Debug, Clone, Default)]
pub struct Verified {
    pub chains: std::collections::BTreeMap<String, (u64, String)>,
    pub records: u64,
    pub anchors: u64,
}

/// Verifies one or more chains given as their lines, interleaved in any order of chains but
/// each chain in its own order: records are grouped by `node` (absent: chain `""`), and each
/// chain must verify as [`verify_lines`] does (seq from 1, consecutive; `prev`; `hash`). Then
/// every cross-anchor (an `audit_anchor` record naming another chain's `seq` and `hash`) must
/// match that chain's record: a chain truncated or rewritten below a head another node
/// recorded is broken even if it verifies on its own.
pub fn verify_chains<I>(lines: I) -> Result<Verified, AuditError>
where
    I: IntoIterator<Item = Result<String, AuditError>>,
{
    use std::collections::BTreeMap;
    // Per chain: (seq, prev hash, the hashes of its records in order).
    let mut chains: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut anchors: Vec<(u64, String, Anchor)> = Vec::new();
    let mut records = 0u64;
    for (i, line) in lines.into_iter().enumerate() {
        let n = i as u64 + 1;
        let line = line?;
        let mut rec: Map<String, Value> = serde_json::from_str(&line)
            .map_err(|e| AuditError::Chain(n, format!("not a JSON object: {e}")))?;
        let Some(Value::String(h)) = rec.remove("hash") else {
            return Err(AuditError::Chain(n, "no hash".into()));
        };
        let chain = match rec.get("node") {
            None => String::new(),
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => return Err(AuditError::Chain(n, "node is not a chain name".into())),
        };
        let hashes = chains.entry(chain.clone()).or_default();
        let prev = hashes.last().map_or(GENESIS, String::as_str);
        let name = if chain.is_empty() {
            String::new()
        } else {
            format!(" (chain {chain})")
        };
        if rec.get("prev").and_then(Value::as_str) != Some(prev) {
            return Err(AuditError::Chain(
                n,
                format!("prev does not match the previous record's hash{name}"),
            ));
        }
        if rec.get("seq").and_then(Value::as_u64) != Some(hashes.len() as u64 + 1) {
            return Err(AuditError::Chain(
                n,
                format!("seq is not consecutive{name}"),
            ));
        }
        if hash_record(&rec).map_err(|e| AuditError::Canonical(n, e))? != h {
            return Err(AuditError::Chain(
                n,
                format!("hash does not match the record{name}"),
            ));
        }
        if let Some(a) = rec.get("anchors") {
            let list: Vec<Anchor> = serde_json::from_value(a.clone())
                .map_err(|e| AuditError::Chain(n, format!("anchors: {e}")))?;
            anchors.extend(list.into_iter().map(|a| (n, chain.clone(), a)));
        }
        hashes.push(h);
        records += 1;
    }
    for (n, by, a) in &anchors {
        let found = chains
            .get(&a.node)
            .and_then(|hs| hs.get((a.seq as usize).wrapping_sub(1)));
        if found != Some(&a.hash) {
            return Err(AuditError::Chain(
                *n,
                format!(
                    "chain {} lacks its record {} that chain {by} anchored (hash {}): it was truncated, rewritten or deleted",
                    if a.node.is_empty() {
                        "(unnamed)"
                    } else {
                        &a.node
                    },
                    a.seq,
                    a.hash
                ),
            ));
        }
    }
    Ok(Verified {
        chains: chains
            .into_iter()
            .map(|(k, hs)| {
                let head = hs.last().cloned().unwrap_or_else(|| GENESIS.to_string());
                (k, (hs.len() as u64, head))
            })
            .collect(),
        records,
        anchors: anchors.len() as u64,
    })
}

/// [`verify_chains`] of the log (or export) at `path`.
pub fn verify_file_chains(path: &Path) -> Result<Verified, AuditError> {
    let f = File::open(path).map_err(|e| AuditError::Io(path.display().to_string(), e))?;
    let p = path.display().to_string();
    verify_chains(
        BufReader::new(f)
            .lines()
            .map(|l| l.map_err(|e| AuditError::Io(p.clone(), e))),
    )
}

/// Verifies the whole chain of the log at `path`; returns (last seq, last hash).
pub fn verify_chain(path: &Path) -> Result<(u64, String), AuditError> {
    let f = File::open(path).map_err(|e| AuditError::Io(path.display().to_string(), e))?;
    let p = path.display().to_string();
    verify_lines(
        BufReader::new(f)
            .lines()
            .map(|l| l.map_err(|e| AuditError::Io(p.clone(), e))),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn chain_verifies_and_detects_tampering() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&p).unwrap();
        for i in 0..3 {
            log.append_blocking(&Event {
                event: "test",
                reason: Some(format!("line\nbreak {i}")),
                ..Default::default()
            })
            .unwrap();
        }
        drop(log);
        assert_eq!(verify_chain(&p).unwrap().0, 3);
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 3, "newlines in values are escaped");
        // Reopen continues the chain.
        let log = AuditLog::open(&p).unwrap();
        log.append_blocking(&Event {
            event: "again",
            ..Default::default()
        })
        .unwrap();
        assert_eq!(verify_chain(&p).unwrap().0, 4);
        // Tamper with one record.
        let tampered = std::fs::read_to_string(&p)
            .unwrap()
            .replace("break 1", "break 9");
        std::fs::write(&p, tampered).unwrap();
        assert!(matches!(verify_chain(&p), Err(AuditError::Chain(2, _))));
    }

    fn on(node: &str, seq: u64, prev: &str, anchors: Option<Vec<Anchor>>) -> (String, String) {
        let ev = Event {
            event: if anchors.is_some() {
                "audit_anchor"
            } else {
                "test"
            },
            node: Some(node.into()),
            anchors,
            ..Default::default()
        };
        chain_record(&ev, seq, prev).unwrap()
    }

    #[test]
    fn chains_per_node_verify_with_their_anchors() {
        let (a1, ha1) = on("a", 1, GENESIS, None);
        let (b1, hb1) = on("b", 1, GENESIS, None);
        let (a2, ha2) = on("a", 2, &ha1, None);
        let anchor = vec![Anchor {
            node: "a".into(),
            seq: 2,
            hash: ha2.clone(),
        }];
        let (b2, _) = on("b", 2, &hb1, Some(anchor));
        let ok = |ls: &[&String]| verify_chains(ls.iter().map(|l| Ok((*l).clone())));
        let v = ok(&[&a1, &b1, &a2, &b2]).unwrap();
        assert_eq!((v.records, v.chains.len(), v.anchors), (4, 2, 1));
        assert_eq!(v.chains["a"], (2, ha2));
        // Grouped by chain, any order of chains.
        assert!(ok(&[&b1, &b2, &a1, &a2]).is_ok());
        // a's anchored record deleted: a verifies alone, the anchor does not.
        let e = ok(&[&a1, &b1, &b2]).unwrap_err().to_string();
        assert!(e.contains("chain a lacks its record 2"), "{e}");
        // A record repeated, or edited, breaks its chain.
        assert!(ok(&[&a1, &a2, &a2]).is_err());
        assert!(ok(&[&a1, &b1.replace("\"test\"", "\"tost\""), &a2]).is_err());
    }
}
