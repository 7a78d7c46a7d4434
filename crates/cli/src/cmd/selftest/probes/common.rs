//! What the probe families share: the tier lists and the verdict helpers.

use super::super::kit::{Env, Probe, RunOut, Tier, Verdict};

pub(super) const BOTH: &[Tier] = &[Tier::Native, Tier::Gvisor];
pub(super) const NATIVE: &[Tier] = &[Tier::Native];

pub(super) type Verdicts = Vec<(&'static str, Verdict)>;

pub(super) fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Every probe of `probes` gets the same verdict (a run that could not be made or completed).
pub(super) fn all(probes: &[Probe], v: Verdict) -> Verdicts {
    probes.iter().map(|p| (p.id, v.clone())).collect()
}

pub(super) fn pass(d: impl Into<String>) -> Verdict {
    Verdict::Pass(d.into())
}
pub(super) fn fail(d: impl Into<String>) -> Verdict {
    Verdict::Fail(d.into())
}

pub(super) fn res(o: &RunOut, name: &str) -> String {
    o.result(name).unwrap_or_else(|| "no result".into())
}

/// Every named attempt was refused (`errno=…`); the detail lists what each got.
pub(super) fn refused(o: &RunOut, names: &[&str]) -> Verdict {
    let got: Vec<String> = names
        .iter()
        .map(|n| format!("{n}: {}", res(o, n)))
        .collect();
    if names.iter().all(|n| res(o, n).starts_with("errno=")) {
        pass(format!("refused ({})", got.join(", ")))
    } else {
        fail(format!("NOT refused: {}", got.join(", ")))
    }
}

/// Like [`refused`], with one exact errno each.
pub(super) fn refused_with(o: &RunOut, names: &[&str], errno: i32) -> Verdict {
    let want = format!("errno={errno}");
    let got: Vec<String> = names
        .iter()
        .map(|n| format!("{n}: {}", res(o, n)))
        .collect();
    if names.iter().all(|n| res(o, n) == want) {
        pass(format!("refused with errno {errno} ({})", got.join(", ")))
    } else {
        fail(format!("expected errno {errno}: {}", got.join(", ")))
    }
}

pub(super) fn sandbox_file(
    env: &Env,
    what: &str,
    content: &str,
) -> Result<std::path::PathBuf, Verdict> {
    env.file(what, content.as_bytes(), 0o644)
        .map_err(|e| fail(format!("setup: {e}")))
}
