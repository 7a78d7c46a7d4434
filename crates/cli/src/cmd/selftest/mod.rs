//! `agentjail selftest`: the escape corpus as a product feature (docs/selftest.md).
//!
//! Every probe runs the way a real run does: this very binary (`/proc/self/exe`) is started as
//! `agentjail run` with the default limits and protections, and a small program inside the
//! sandbox attempts an escape and prints what happened. Each probe has a sentinel, so that
//! "refused by agentjail" cannot pass for "failed anyway": a control that must work in the same
//! run, an errno that only the refusing layer gives, a denial that only the seccomp listener
//! writes into the report, or an effect checked on the host afterwards.
//!
//! The probes run one after another (each in its own sandbox, a process of its own), so this
//! process never enters a namespace itself and may use threads for the host-side servers.
//!
//! Exit status: 0 when no probe failed (skipped probes are listed, with their reason, in every
//! output), 1 when one failed, 125 for bad arguments or when the self-test could not start.
//!
//! The result's `passed` is stronger than the exit status: it is what a signed result
//! (`--receipt`) attests, so it is true only when the whole corpus of every tier named ran
//! (no `--only` that left a probe out, no tier or gateway that could not be attacked: then
//! `complete` is false and `incomplete` says why), in strict mode, without a failure.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{Value, json};

mod egress;
mod kit;
mod probes;

pub use kit::*;

/// Schema tag of the JSON result.
pub const RESULT_SCHEMA: &str = "agentjail.selftest/v1";

/// `--tier`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierArg {
    Native,
    Gvisor,
    All,
}

/// `agentjail selftest` arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct SelftestArgs {
    /// Which isolation tier to attack: `native`, `gvisor` or `all` [default: native, plus
    /// gvisor where runsc is available].
    #[arg(long, value_name = "TIER", hide_possible_values = true)]
    pub tier: Option<TierArg>,
    /// Also attack the egress gateway from a private network namespace with loopback-only fake
    /// upstreams (needs root).
    #[arg(long)]
    pub egress: bool,
    /// Machine-readable result on stdout (progress on stderr when it is a terminal).
    #[arg(long)]
    pub json: bool,
    /// Sign the result: an in-toto statement in a DSSE envelope, written here
    /// (`agentjail receipt verify` checks it).
    #[arg(long, value_name = "FILE")]
    pub receipt: Option<PathBuf>,
    /// Receipt signing key (default: $XDG_DATA_HOME/agentjail/receipt-key.pem).
    #[arg(long, value_name = "FILE", requires = "receipt")]
    pub key: Option<PathBuf>,
    /// Only the probes whose id contains PATTERN (comma-separated: any of them).
    #[arg(long, value_name = "PATTERN")]
    pub only: Option<String>,
    /// List the probes (id, tier, what is attempted, what is expected) without running them.
    #[arg(long)]
    pub list: bool,
    /// Internal: this process runs in the private network namespace of `--egress`.
    #[arg(long, hide = true, requires = "egress")]
    pub egress_inner: bool,
}

/// Whether `id` is selected by `--only` (comma-separated substrings).
fn selected(only: Option<&str>, id: &str) -> bool {
    match only {
        None => true,
        Some(p) => p
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .any(|p| id.contains(p)),
    }
}

/// The patterns of `--only` (comma-separated, trimmed, empty ones dropped), as `selected`
/// reads them.
fn patterns(only: &str) -> Vec<String> {
    only.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// How many probes the whole corpus of `tiers` holds (the groups given: egress only with
/// `--egress`).
fn corpus_size(groups: &[&Group], tiers: &[Tier]) -> usize {
    tiers
        .iter()
        .map(|t| {
            groups
                .iter()
                .filter(|g| g.tiers.contains(t))
                .map(|g| g.probes.len())
                .sum::<usize>()
        })
        .sum()
}

/// Why a run of `ran` probes out of a corpus of `corpus` does not attest the whole corpus of
/// its tiers: a filter that left probes out, and what could not be attacked here. Empty when
/// it does.
fn incomplete_reasons(
    ran: usize,
    corpus: usize,
    filter: Option<&[String]>,
    not_attacked: Vec<String>,
) -> Vec<String> {
    let mut why = Vec::new();
    if ran < corpus {
        why.push(match filter {
            Some(f) => format!(
                "only the probes matching --only {} ran ({ran} of {corpus})",
                printable(&f.join(","), 200)
            ),
            None => format!("{ran} of the corpus's {corpus} probes ran"),
        });
    }
    for r in not_attacked {
        if !why.contains(&r) {
            why.push(r);
        }
    }
    why
}

/// The result's `passed`: the whole corpus of every tier named, in strict mode, no failure.
fn attests_a_pass(complete: bool, degraded: bool, failed: usize, ran: usize) -> bool {
    complete && !degraded && failed == 0 && ran > 0
}

/// The host's facts, as `agentjail check` sees them.
fn host_facts(check: &agentjail_engine::check::Report) -> Value {
    let item = |name: &str| check.items.iter().find(|i| i.name == name);
    let landlock_abi = item("landlock").and_then(|i| {
        i.detail
            .strip_prefix("ABI ")
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u32>().ok())
    });
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    json!({
        "kernel": read("/proc/sys/kernel/osrelease"),
        "arch": std::env::consts::ARCH,
        "user": if rustix_is_root() { "root" } else { "unprivileged" },
        "landlock_abi": landlock_abi,
        "cgroup": item("cgroups").map(|i| i.detail.clone()),
        "seccomp": item("seccomp").map(|i| i.detail.clone()),
        "seccomp_actions": read("/proc/sys/kernel/seccomp/actions_avail"),
        "gvisor": item("gvisor tier").map(|i| json!({"available": i.ok, "detail": i.detail})),
        "strict_run": check.strict_run_ok,
        "host_image": check.host_image,
        "agentjail_version": env!("CARGO_PKG_VERSION"),
        "agentjail_binary": binary_digest().ok(),
        "check": check.items,
    })
}

/// `sha256:<hex>` of this binary.
fn binary_digest() -> Result<String, String> {
    let a = agentjail_verify::receipt::Artifact::from_path(Path::new("/proc/self/exe"))
        .map_err(|e| e.to_string())?;
    Ok(format!("sha256:{}", a.sha256))
}

fn all_groups() -> Vec<&'static Group> {
    probes::GROUPS.iter().chain(egress::GROUPS.iter()).collect()
}

/// `agentjail selftest`.
pub fn run(a: SelftestArgs) -> Result<u8, String> {
    let tiers: Vec<Tier> = match a.tier {
        None => {
            if agentjail_engine::gvisor::available().is_ok() {
                vec![Tier::Native, Tier::Gvisor]
            } else {
                vec![Tier::Native]
            }
        }
        Some(TierArg::Native) => vec![Tier::Native],
        Some(TierArg::Gvisor) => vec![Tier::Gvisor],
        Some(TierArg::All) => vec![Tier::Native, Tier::Gvisor],
    };
    let only = a.only.as_deref();
    let groups: Vec<&Group> = all_groups()
        .into_iter()
        .filter(|g| a.egress || !g.name.starts_with("egress"))
        .collect();
    // The plan: (group, tier) pairs with at least one selected probe.
    let mut plan: Vec<(&Group, Tier)> = Vec::new();
    let mut total = 0;
    for t in &tiers {
        for g in &groups {
            let n = g.probes.iter().filter(|p| selected(only, p.id)).count();
            if n > 0 && g.tiers.contains(t) {
                plan.push((g, *t));
                total += n;
            }
        }
    }
    if a.list {
        for (g, t) in &plan {
            for p in g.probes.iter().filter(|p| selected(only, p.id)) {
                outln!(
                    "{:<7} {:<28} {} — expected: {}",
                    t.name(),
                    p.id,
                    p.attempt,
                    p.expect
                );
            }
        }
        return Ok(0);
    }
    if total == 0 {
        return Err(format!(
            "--only {}: no probe matches (`agentjail selftest --list` lists them)",
            only.unwrap_or("")
        ));
    }
    if let Some(r) = &a.receipt
        && r.exists()
        && r.is_dir()
    {
        return Err(format!("--receipt {}: is a directory", r.display()));
    }

    // The host check clones a sandbox itself: it runs before any thread of ours exists.
    let started = Instant::now();
    let started_at = jiff::Timestamp::now().to_string();
    let check = agentjail_engine::check::check();
    let host = host_facts(&check);
    let env = Env::new(!check.strict_run_ok, a.egress_inner)?;

    let progress_to_stderr = a.json && std::io::stderr().is_terminal();
    let say = |line: &str| {
        if !a.json {
            outln!("{line}");
            let _ = std::io::stdout().lock().flush();
        } else if progress_to_stderr {
            errln!("{line}");
        }
    };
    say(&format!(
        "agentjail selftest {}: {} probe(s) on {} ({}; kernel {}; landlock ABI {}; {}){}",
        env!("CARGO_PKG_VERSION"),
        total,
        tiers.iter().map(|t| t.name()).collect::<Vec<_>>().join("+"),
        host["user"].as_str().unwrap_or(""),
        host["kernel"].as_str().unwrap_or(""),
        host["landlock_abi"]
            .as_u64()
            .map_or_else(|| "none".to_string(), |n| n.to_string()),
        host["cgroup"].as_str().unwrap_or("no cgroups"),
        if env.degraded {
            "\n  a strict run is refused on this host: every probe runs with --allow-degraded, and what that mode does not enforce fails"
        } else {
            ""
        }
    ));
    if a.tier.is_none() && !tiers.contains(&Tier::Gvisor) {
        say(&format!(
            "  gvisor tier not attacked: {} (`--tier all` lists its probes as skipped)",
            agentjail_engine::gvisor::available()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        ));
    }

    let mut results: Vec<ProbeResult> = Vec::new();
    let gvisor_missing = agentjail_engine::gvisor::available().err();
    // What the named tiers' corpus holds that this run did not attack (docs/selftest.md,
    // "What an attestation claims").
    let corpus = corpus_size(&groups, &tiers);
    let mut not_attacked: Vec<String> = Vec::new();
    if let Some(why) = &gvisor_missing
        && tiers.contains(&Tier::Gvisor)
    {
        not_attacked.push(format!("the gvisor tier was not attacked: {why}"));
    }
    for (g, tier) in plan {
        let wanted: Vec<&Probe> = g.probes.iter().filter(|p| selected(only, p.id)).collect();
        let t = Instant::now();
        let verdicts = match (&gvisor_missing, tier) {
            (Some(why), Tier::Gvisor) => wanted
                .iter()
                .map(|p| {
                    (
                        p.id,
                        Verdict::Skip(format!("gvisor tier unavailable: {why}")),
                    )
                })
                .collect(),
            _ => (g.run)(&env, tier),
        };
        let ms = t.elapsed().as_millis() as u64;
        if g.name.starts_with("egress") {
            let skips: Vec<&str> = wanted
                .iter()
                .map(|p| verdicts.iter().find(|(id, _)| *id == p.id))
                .map(|v| match v {
                    Some((_, Verdict::Skip(d))) => Some(d.as_str()),
                    _ => None,
                })
                .collect::<Option<_>>()
                .unwrap_or_default();
            if let Some(why) = skips.first() {
                not_attacked.push(format!(
                    "the egress gateway was not attacked: {}",
                    printable(why, 200)
                ));
            }
        }
        for p in wanted {
            let v = verdicts
                .iter()
                .find(|(id, _)| *id == p.id)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| {
                    Verdict::Fail("the probe produced no verdict (fail closed)".into())
                });
            let r = ProbeResult {
                id: p.id.to_string(),
                tier,
                layer: p.layer.to_string(),
                attempt: p.attempt.to_string(),
                expect: p.expect.to_string(),
                outcome: v.word().to_string(),
                detail: v.detail().to_string(),
                ms,
            };
            say(&format!(
                "[{:>3}/{total}] {:<4} {:<7} {:<26} {} — expected: {} — {}",
                results.len() + 1,
                r.outcome.to_uppercase(),
                tier.name(),
                r.id,
                r.attempt,
                r.expect,
                r.detail
            ));
            results.push(r);
        }
    }

    let count = |w: &str| results.iter().filter(|r| r.outcome == w).count();
    let (passed, failed, skipped) = (count("pass"), count("fail"), count("skip"));
    let duration_ms = started.elapsed().as_millis() as u64;
    let filter = only.map(patterns);
    let incomplete = incomplete_reasons(results.len(), corpus, filter.as_deref(), not_attacked);
    let complete = incomplete.is_empty();
    let result = json!({
        "schema": RESULT_SCHEMA,
        "agentjail_version": env!("CARGO_PKG_VERSION"),
        "started_at": started_at,
        "duration_ms": duration_ms,
        "host": host,
        "mode": if env.degraded { "degraded" } else { "strict" },
        "tiers": tiers,
        "egress": a.egress,
        "only": a.only,
        "filter": filter,
        "complete": complete,
        "incomplete": incomplete,
        "summary": {
            "total": results.len(),
            "corpus": corpus,
            "passed": passed,
            "failed": failed,
            "skipped": skipped,
        },
        "passed": attests_a_pass(complete, env.degraded, failed, results.len()),
        "probes": results,
    });
    if let Some(path) = &a.receipt {
        let key_path = a
            .key
            .clone()
            .unwrap_or_else(agentjail_verify::receipt::default_key_path);
        let key = agentjail_verify::receipt::ReceiptKey::load_or_create(&key_path)
            .map_err(|e| e.to_string())?;
        let digest = binary_digest()?;
        let env = agentjail_verify::receipt::sign_selftest(
            &key,
            "agentjail",
            digest.trim_start_matches("sha256:"),
            result.clone(),
        )
        .map_err(|e| e.to_string())?;
        crate::pipeline::write_atomic(path, env.to_json().as_bytes())
            .map_err(|crate::pipeline::SetupFailure(m)| format!("--receipt: {m}"))?;
    }
    if a.json {
        let s = serde_json::to_string_pretty(&result).unwrap_or_default();
        outln!("{s}");
    } else {
        let skipped_why: Vec<String> = {
            let mut v: Vec<String> = results
                .iter()
                .filter(|r| r.outcome == "skip")
                .map(|r| r.detail.clone())
                .collect();
            v.sort();
            v.dedup();
            v
        };
        say(&format!(
            "agentjail selftest: {passed} passed, {failed} failed, {skipped} skipped of {} in {:.1} s{}",
            results.len(),
            duration_ms as f64 / 1000.0,
            if skipped_why.is_empty() {
                String::new()
            } else {
                format!(" (skipped: {})", skipped_why.join("; "))
            }
        ));
        if failed > 0 {
            say(
                "FAILED: a guarantee listed above does not hold on this host; see docs/selftest.md",
            );
        } else if !complete {
            say(&format!(
                "PARTIAL: {}; this result (and a --receipt of it) does not attest the whole corpus",
                incomplete.join("; ")
            ));
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_whole_corpus_of_the_named_tiers_in_strict_mode_attests_a_pass() {
        let groups: Vec<&Group> = all_groups()
            .into_iter()
            .filter(|g| !g.name.starts_with("egress"))
            .collect();
        let native = corpus_size(&groups, &[Tier::Native]);
        let both = corpus_size(&groups, &[Tier::Native, Tier::Gvisor]);
        assert!(native > 50 && both > native, "{native} {both}");
        let with_egress = corpus_size(&all_groups(), &[Tier::Native]);
        assert!(with_egress > native);

        // The whole corpus, nothing left out.
        assert!(incomplete_reasons(native, native, None, vec![]).is_empty());
        assert!(attests_a_pass(true, false, 0, native));
        // A filter that selects everything leaves nothing out.
        let all = vec![".".to_string()];
        assert!(incomplete_reasons(native, native, Some(&all), vec![]).is_empty());
        // A filter that left probes out.
        let f = patterns(" syscall.control,, ");
        assert_eq!(f, ["syscall.control"]);
        let why = incomplete_reasons(1, native, Some(&f), vec![]);
        assert_eq!(
            why,
            [format!(
                "only the probes matching --only syscall.control ran (1 of {native})"
            )]
        );
        // A tier that could not be attacked, named once.
        let gone = "the gvisor tier was not attacked: runsc not found".to_string();
        let why = incomplete_reasons(both, both, None, vec![gone.clone(), gone.clone()]);
        assert_eq!(why, [gone]);

        assert!(!attests_a_pass(false, false, 0, 1), "partial");
        assert!(!attests_a_pass(true, true, 0, native), "degraded");
        assert!(!attests_a_pass(true, false, 1, native), "a failure");
        assert!(!attests_a_pass(true, false, 0, 0), "nothing ran");
    }
}
