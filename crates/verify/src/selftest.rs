//! What a self-test attestation claims, and what a verifier may conclude from it.
//!
//! The predicate of a self-test attestation (`agentjail.selftest/v1`, see docs/selftest.md) is
//! authentic once [`crate::receipt::verify_any`] accepted its signature, but authentic is not
//! the same as *passed*: a run of one probe, or a run in degraded mode, is signed as faithfully
//! as a run of the whole corpus. [`SelftestClaim`] reads the predicate's top-level facts (tiers,
//! filter, mode, completeness, counts) and sorts it into one [`SelftestVerdict`] so that
//! `agentjail receipt verify` (and any other caller) cannot take a partial or degraded run for
//! a pass.
//!
//! The reading is conservative. An attestation made before agentjail recorded `complete` is
//! partial; a mode other than `strict` is degraded; a failure counted in `summary` or listed in
//! `probes` is a failure; and a pass needs the signer's own `passed: true` as well.

use serde_json::Value;

use crate::text::printable;

/// Longest string taken from a predicate into a claim (tier names, patterns, reasons).
const MAX_TEXT: usize = 200;
/// Most list entries taken from a predicate into a claim.
const MAX_ITEMS: usize = 64;

/// The verdict on a self-test attestation, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelftestVerdict {
    /// A probe failed, or the signer did not claim a pass: never acceptable.
    Failed,
    /// No failure, but not every probe of the named tiers' corpus ran (`--only`, a tier or
    /// the egress gateway that could not be attacked), and it ran in degraded mode.
    PartialDegraded,
    /// No failure, but not every probe of the named tiers' corpus ran.
    Partial,
    /// No failure, the whole corpus, but in degraded mode (a strict run was refused).
    Degraded,
    /// The whole corpus of every named tier, strict mode, no failure.
    Passed,
}

impl SelftestVerdict {
    /// `FAILED`, `PARTIAL, DEGRADED`, `PARTIAL`, `DEGRADED` or `PASSED`.
    pub fn word(self) -> &'static str {
        match self {
            SelftestVerdict::Failed => "FAILED",
            SelftestVerdict::PartialDegraded => "PARTIAL, DEGRADED",
            SelftestVerdict::Partial => "PARTIAL",
            SelftestVerdict::Degraded => "DEGRADED",
            SelftestVerdict::Passed => "PASSED",
        }
    }
    pub fn is_partial(self) -> bool {
        matches!(
            self,
            SelftestVerdict::Partial | SelftestVerdict::PartialDegraded
        )
    }
    pub fn is_degraded(self) -> bool {
        matches!(
            self,
            SelftestVerdict::Degraded | SelftestVerdict::PartialDegraded
        )
    }
}

/// The top-level facts of a self-test predicate, every string made printable and bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelftestClaim {
    /// The tiers attacked (`native`, `gvisor`).
    pub tiers: Vec<String>,
    /// Whether the egress gateway was attacked too (`--egress`).
    pub egress: bool,
    /// The `--only` patterns, if the run was filtered.
    pub filter: Option<Vec<String>>,
    /// `strict` or `degraded` (or whatever the predicate says, printable).
    pub mode: String,
    /// Probes run, and the size of the whole corpus of the named tiers (absent in attestations
    /// made before agentjail counted it).
    pub total: u64,
    pub corpus: Option<u64>,
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    /// `id` (or `tier/id` when several tiers ran) of each failed probe.
    pub failed_probes: Vec<String>,
    /// Why the attestation does not cover the whole corpus; empty when it does.
    pub incomplete: Vec<String>,
    /// The signer's own `passed`.
    pub signer_passed: bool,
}

impl SelftestClaim {
    /// Reads the claim of an (authentic) self-test predicate. Never fails: what is missing or
    /// malformed counts against the attestation.
    pub fn from_predicate(p: &Value) -> SelftestClaim {
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .take(MAX_ITEMS)
                        .map(|s| match s.as_str() {
                            Some(s) => printable(s, MAX_TEXT),
                            None => printable(&s.to_string(), MAX_TEXT),
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let tiers = strings(&p["tiers"]);
        // `filter` (a list) since completeness is recorded; `only` (the raw argument) before.
        let filter = if p["filter"].is_array() {
            Some(strings(&p["filter"]))
        } else {
            match &p["only"] {
                Value::Null => None,
                Value::String(s) => Some(
                    s.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .take(MAX_ITEMS)
                        .map(|s| printable(s, MAX_TEXT))
                        .collect(),
                ),
                other => Some(vec![printable(&other.to_string(), MAX_TEXT)]),
            }
        };
        let n = |k: &str| p["summary"][k].as_u64();
        let probes = p["probes"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        let failed_listed: Vec<&Value> = probes.iter().filter(|r| r["outcome"] == "fail").collect();
        let several_tiers = tiers.len() > 1;
        let failed_probes: Vec<String> = failed_listed
            .iter()
            .take(MAX_ITEMS)
            .map(|r| {
                let id = r["id"].as_str().unwrap_or("?");
                let id = if several_tiers {
                    format!("{}/{id}", r["tier"].as_str().unwrap_or("?"))
                } else {
                    id.to_string()
                };
                printable(&id, MAX_TEXT)
            })
            .collect();
        let total = n("total").unwrap_or(probes.len() as u64);
        let corpus = n("corpus");
        let failed = n("failed").unwrap_or(0).max(failed_listed.len() as u64);

        let mut incomplete = Vec::new();
        match p["complete"].as_bool() {
            Some(true) => {}
            Some(false) => {
                incomplete = strings(&p["incomplete"]);
                if incomplete.is_empty() {
                    incomplete
                        .push("the attestation says it does not cover the whole corpus".into());
                }
            }
            None => {
                incomplete.push(
                    "the attestation does not say whether it covers the whole corpus (made by an agentjail that did not record it)"
                        .into(),
                );
                if let Some(f) = &filter {
                    incomplete.push(format!("only the probes matching --only {}", f.join(",")));
                }
            }
        }
        if tiers.is_empty() {
            incomplete.push("the attestation names no tier".into());
        }
        if total == 0 {
            incomplete.push("no probe ran".into());
        }
        if let Some(c) = corpus
            && total < c
            && incomplete.is_empty()
        {
            incomplete.push(format!("{total} of the corpus's {c} probes ran"));
        }
        SelftestClaim {
            tiers,
            egress: p["egress"] == true,
            filter,
            mode: printable(p["mode"].as_str().unwrap_or("unknown"), MAX_TEXT),
            total,
            corpus,
            passed: n("passed").unwrap_or(0),
            failed,
            skipped: n("skipped").unwrap_or(0),
            failed_probes,
            incomplete,
            signer_passed: p["passed"] == true,
        }
    }

    /// Whether the run was made in strict mode.
    pub fn strict(&self) -> bool {
        self.mode == "strict"
    }

    /// The verdict: a failure first, then partial and degraded, else a pass.
    pub fn verdict(&self) -> SelftestVerdict {
        let partial = !self.incomplete.is_empty();
        let degraded = !self.strict();
        if self.failed > 0 {
            return SelftestVerdict::Failed;
        }
        match (partial, degraded) {
            (true, true) => SelftestVerdict::PartialDegraded,
            (true, false) => SelftestVerdict::Partial,
            (false, true) => SelftestVerdict::Degraded,
            // Everything says pass, but the signer did not claim one: not a pass.
            (false, false) if !self.signer_passed => SelftestVerdict::Failed,
            (false, false) => SelftestVerdict::Passed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn complete_strict() -> Value {
        json!({
            "schema": "agentjail.selftest/v1",
            "mode": "strict",
            "tiers": ["native"],
            "egress": false,
            "only": null,
            "filter": null,
            "complete": true,
            "incomplete": [],
            "summary": {"total": 3, "corpus": 3, "passed": 3, "failed": 0, "skipped": 0},
            "passed": true,
            "probes": [
                {"id": "a", "tier": "native", "outcome": "pass"},
                {"id": "b", "tier": "native", "outcome": "pass"},
                {"id": "c", "tier": "native", "outcome": "pass"},
            ],
        })
    }

    #[test]
    fn the_whole_corpus_in_strict_mode_passes() {
        let c = SelftestClaim::from_predicate(&complete_strict());
        assert_eq!(c.verdict(), SelftestVerdict::Passed, "{c:?}");
        assert_eq!(c.tiers, ["native"]);
        assert_eq!(c.filter, None);
        assert_eq!((c.total, c.corpus), (3, Some(3)));
    }

    #[test]
    fn a_filtered_run_is_partial_whatever_its_signer_claimed() {
        let mut p = complete_strict();
        p["filter"] = json!(["syscall.control"]);
        p["only"] = json!("syscall.control");
        p["complete"] = json!(false);
        p["incomplete"] = json!(["only the probes matching --only syscall.control ran"]);
        let c = SelftestClaim::from_predicate(&p);
        assert_eq!(c.verdict(), SelftestVerdict::Partial);
        assert_eq!(c.filter, Some(vec!["syscall.control".to_string()]));
        assert!(c.incomplete[0].contains("--only"), "{c:?}");

        // An attestation from before completeness was recorded: `only` and `passed: true`,
        // exactly what issue #29 saw verify as PASSED.
        let old = json!({
            "mode": "strict", "tiers": ["native"], "egress": false,
            "only": "fs.,proc.,syscall.,net.",
            "summary": {"total": 50, "passed": 50, "failed": 0, "skipped": 0},
            "passed": true, "probes": [],
        });
        let c = SelftestClaim::from_predicate(&old);
        assert_eq!(c.verdict(), SelftestVerdict::Partial, "{c:?}");
        assert_eq!(
            c.filter,
            Some(
                vec!["fs.", "proc.", "syscall.", "net."]
                    .into_iter()
                    .map(String::from)
                    .collect()
            )
        );
        assert!(
            c.incomplete.iter().any(|r| r.contains("--only fs.,proc.")),
            "{c:?}"
        );
        // Old and unfiltered: still not known to be complete.
        let mut old = old;
        old["only"] = Value::Null;
        assert_eq!(
            SelftestClaim::from_predicate(&old).verdict(),
            SelftestVerdict::Partial
        );

        // `complete: true` with fewer probes than the corpus is not believed.
        let mut p = complete_strict();
        p["summary"]["total"] = json!(2);
        let c = SelftestClaim::from_predicate(&p);
        assert_eq!(c.verdict(), SelftestVerdict::Partial);
        assert_eq!(c.incomplete, ["2 of the corpus's 3 probes ran"]);
    }

    #[test]
    fn degraded_failed_and_malformed_predicates() {
        let mut p = complete_strict();
        p["mode"] = json!("degraded");
        p["passed"] = json!(false);
        assert_eq!(
            SelftestClaim::from_predicate(&p).verdict(),
            SelftestVerdict::Degraded
        );
        p["complete"] = json!(false);
        let c = SelftestClaim::from_predicate(&p);
        assert_eq!(c.verdict(), SelftestVerdict::PartialDegraded);
        assert!(c.verdict().is_partial() && c.verdict().is_degraded());
        assert_eq!(c.verdict().word(), "PARTIAL, DEGRADED");

        // A failure listed in `probes` counts even when `summary` says none.
        let mut p = complete_strict();
        p["probes"][1]["outcome"] = json!("fail");
        let c = SelftestClaim::from_predicate(&p);
        assert_eq!(c.verdict(), SelftestVerdict::Failed);
        assert_eq!(c.failed_probes, ["b"]);
        assert_eq!(c.failed, 1);

        // No pass claimed by the signer: not a pass.
        let mut p = complete_strict();
        p["passed"] = json!(false);
        assert_eq!(
            SelftestClaim::from_predicate(&p).verdict(),
            SelftestVerdict::Failed
        );

        // Missing everything: partial and degraded, never a pass; no panic.
        for p in [
            json!({}),
            json!({"tiers": "native", "summary": 3, "probes": {}}),
        ] {
            let c = SelftestClaim::from_predicate(&p);
            assert_eq!(c.verdict(), SelftestVerdict::PartialDegraded, "{c:?}");
        }

        // Hostile strings come out printable and bounded.
        let mut p = complete_strict();
        p["tiers"] = json!(["native\u{1b}[31m"]);
        p["filter"] = json!(["x".repeat(1000)]);
        let c = SelftestClaim::from_predicate(&p);
        assert!(!c.tiers[0].contains('\u{1b}'), "{c:?}");
        assert!(c.filter.unwrap()[0].chars().count() <= MAX_TEXT + 1);
    }
}
