//! Names the build in `agentjail --version`: `0.1.0 (commit abcdef0, 2026-12-03,
//! x86_64-unknown-linux-musl)`, set as `AGENTJAIL_VERSION_LINE`.
//!
//! The commit and its date come from, in order:
//! 1. `AGENTJAIL_BUILD_COMMIT` and `AGENTJAIL_BUILD_DATE` (the release script builds from a
//!    `git archive` of the commit, which has no `.git`, and passes them; see docs/release.md);
//! 2. git, when this crate is in a git checkout of the agentjail workspace itself;
//! 3. otherwise (a source tarball, git missing): `commit unknown`, and the date from
//!    `SOURCE_DATE_EPOCH` when it is set. The build never fails for want of git.
//!
//! The date is the commit's (not the clock's), so that the same commit builds the same binary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for v in [
        "AGENTJAIL_BUILD_COMMIT",
        "AGENTJAIL_BUILD_DATE",
        "SOURCE_DATE_EPOCH",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown-target".into());

    let from_env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let (commit, date) = match from_env("AGENTJAIL_BUILD_COMMIT") {
        Some(c) => (Some(short(&c)), from_env("AGENTJAIL_BUILD_DATE")),
        None => match git_commit(&manifest_dir) {
            Some((c, d)) => (Some(c), Some(d)),
            None => (None, source_date_epoch()),
        },
    };
    let mut parts = vec![format!(
        "commit {}",
        commit.unwrap_or_else(|| "unknown".into())
    )];
    if let Some(d) = date {
        parts.push(d);
    }
    parts.push(target);
    println!(
        "cargo:rustc-env=AGENTJAIL_VERSION_LINE={} ({})",
        std::env::var("CARGO_PKG_VERSION").unwrap_or_default(),
        parts.join(", ")
    );
}

/// The first 7 characters of a commit id given in full or abbreviated.
fn short(c: &str) -> String {
    c.trim().chars().take(7).collect()
}

/// Runs git in `dir`; its trimmed stdout when it succeeds.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    Some(s.trim().to_string())
}

/// HEAD's short id and commit date (YYYY-MM-DD), when `manifest_dir` is inside a git checkout
/// whose top level is this workspace (crates/cli/../..): a tarball unpacked inside some other
/// repository must not borrow that repository's commit. Asks cargo to rerun this script when
/// HEAD moves.
fn git_commit(manifest_dir: &Path) -> Option<(String, String)> {
    let workspace = manifest_dir.parent()?.parent()?.canonicalize().ok()?;
    let top = PathBuf::from(git(manifest_dir, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != workspace {
        return None;
    }
    let line = git(manifest_dir, &["log", "-1", "--format=%h %cs", "--abbrev=7", "HEAD"])?;
    let (c, d) = line.split_once(' ')?;
    // HEAD, the branch it names, and packed-refs: the files that change when HEAD moves. A path
    // that does not exist is not named (cargo would rerun the script on every build).
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(r) = git(manifest_dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(r);
    }
    for w in watch {
        if let Some(p) = git(manifest_dir, &["rev-parse", "--git-path", &w]) {
            let p = if Path::new(&p).is_absolute() {
                PathBuf::from(p)
            } else {
                manifest_dir.join(p)
            };
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    Some((short(c), d.to_string()))
}

/// `SOURCE_DATE_EPOCH` (seconds since 1970) as a UTC date, YYYY-MM-DD.
fn source_date_epoch() -> Option<String> {
    let secs: i64 = std::env::var("SOURCE_DATE_EPOCH").ok()?.trim().parse().ok()?;
    let days = secs.div_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    Some(format!("{y:04}-{m:02}-{d:02}"))
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day) (Howard Hinnant's
/// algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}
