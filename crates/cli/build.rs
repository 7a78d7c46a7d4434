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
            Some((c, d)) => (Some(c), d),
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

/// Runs git in `dir`; its trimmed stdout when it succeeds, else what went wrong.
fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| format!("git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// HEAD's short id and, when git answers, its commit date (YYYY-MM-DD); `None` when this
/// workspace (crates/cli/../..) has no `.git` of its own: a tarball unpacked inside some other
/// repository must not borrow that repository's commit. Asks cargo to rerun this script when
/// HEAD moves, whether or not git answered this time (the files are read directly), so that a
/// failure of git is never stuck in the build.
fn git_commit(manifest_dir: &Path) -> Option<(String, Option<String>)> {
    let workspace = manifest_dir.parent()?.parent()?.canonicalize().ok()?;
    let gitdir = git_dir(&workspace)?;
    let head = std::fs::read_to_string(gitdir.join("HEAD")).ok()?;
    let head = head.trim();
    println!("cargo:rerun-if-changed={}", gitdir.join("HEAD").display());
    // A worktree keeps its branches in the common folder.
    let common = std::fs::read_to_string(gitdir.join("commondir"))
        .ok()
        .map(|c| gitdir.join(c.trim()))
        .unwrap_or_else(|| gitdir.clone());
    let branch = head.strip_prefix("ref: ").map(str::trim);
    for p in [
        branch.map(|b| common.join(b)),
        Some(common.join("packed-refs")),
    ]
    .into_iter()
    .flatten()
    {
        // A path that does not exist is not named: cargo would rerun the script every build.
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    match git(
        &workspace,
        &["log", "-1", "--format=%h %cs", "--abbrev=7", "HEAD"],
    ) {
        Ok(line) => {
            let (c, d) = line.split_once(' ')?;
            Some((short(c), Some(d.to_string())))
        }
        Err(e) => {
            // The id from the files; the date needs git.
            println!("cargo:warning=agentjail --version: {e}; reading HEAD from .git");
            let id = match branch {
                None => head.to_string(),
                Some(b) => std::fs::read_to_string(common.join(b))
                    .ok()
                    .map(|s| s.trim().to_string())
                    .or_else(|| {
                        let packed = std::fs::read_to_string(common.join("packed-refs")).ok()?;
                        packed.lines().find_map(|l| {
                            let (id, name) = l.split_once(' ')?;
                            (name == b).then(|| id.to_string())
                        })
                    })?,
            };
            id.bytes()
                .all(|c| c.is_ascii_hexdigit())
                .then(|| (short(&id), None))
        }
    }
}

/// The git folder of `workspace`: `.git` itself, or the folder a `.git` file names
/// (`gitdir: …`, a worktree or submodule).
fn git_dir(workspace: &Path) -> Option<PathBuf> {
    let dot = workspace.join(".git");
    if dot.is_dir() {
        return Some(dot);
    }
    let text = std::fs::read_to_string(&dot).ok()?;
    let d = PathBuf::from(text.trim().strip_prefix("gitdir:")?.trim());
    Some(if d.is_absolute() {
        d
    } else {
        workspace.join(d)
    })
}

/// `SOURCE_DATE_EPOCH` (seconds since 1970) as a UTC date, YYYY-MM-DD.
fn source_date_epoch() -> Option<String> {
    let secs: i64 = std::env::var("SOURCE_DATE_EPOCH")
        .ok()?
        .trim()
        .parse()
        .ok()?;
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
