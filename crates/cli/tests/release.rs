//! What a release binary says about itself and installs with it (docs/release.md): `--version`
//! names the version, the commit it was built from and the target; `completions SHELL` and the
//! hidden `man DIR` generate the shell completions and man pages the Debian package installs.
//! These run the binary under test (`AGENTJAIL_TEST_BIN`: .ci/run runs them against the musl
//! build too); the release artifacts themselves are tested by ci/release/check.sh.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{agentjail, skip};
use std::process::Command;

/// `agentjail 0.1.0 (commit abcdef0, 2026-12-03, x86_64-unknown-linux-gnu)`, with a commit
/// that is HEAD or one of its ancestors (the binary was built from this checkout; others may
/// have committed since).
#[test]
fn version_names_the_commit_its_date_and_the_target() {
    let o = agentjail(&["--version"]);
    assert_eq!(o.code, 0, "{}", o.dump());
    let line = o.stdout.trim_end();
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    if std::env::var_os("AGENTJAIL_TEST_BIN").is_none()
        && !std::path::Path::new(repo).join(".git").exists()
    {
        // Built from a tree without .git (a source tarball): the clean fallback.
        assert!(
            line.starts_with(&format!(
                "agentjail {} (commit unknown, ",
                env!("CARGO_PKG_VERSION")
            )) && line.ends_with(')'),
            "unexpected --version without .git: {line:?}"
        );
        return;
    }
    let rest = line
        .strip_prefix(&format!("agentjail {} (commit ", env!("CARGO_PKG_VERSION")))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unexpected --version: {line:?}"));
    let parts: Vec<&str> = rest.split(", ").collect();
    assert_eq!(parts.len(), 3, "commit, date, target: {line:?}");
    let (commit, date, target) = (parts[0], parts[1], parts[2]);
    assert!(
        commit.len() == 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "commit {commit:?} in {line:?}"
    );
    let d: Vec<&str> = date.split('-').collect();
    assert!(
        d.len() == 3 && d[0].len() == 4 && d.iter().all(|p| p.parse::<u32>().is_ok()),
        "date {date:?} in {line:?}"
    );
    assert!(
        target.starts_with(std::env::consts::ARCH) && target.contains("-linux-"),
        "target {target:?} in {line:?}"
    );
    // The same line from `-V`, and every subcommand names the same build.
    assert_eq!(agentjail(&["-V"]).stdout.trim_end(), line);
    let run = agentjail(&["run", "--version"]);
    assert!(run.stdout.contains(rest), "{}", run.dump());

    match Command::new("git")
        .args(["-C", repo, "merge-base", "--is-ancestor", commit, "HEAD"])
        .status()
    {
        Ok(s) => assert!(
            s.success(),
            "commit {commit} of {line:?} is not HEAD or an ancestor of it"
        ),
        Err(e) => skip(&format!("git: {e}")),
    }
}

#[test]
fn completions_for_every_shell_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = agentjail(&["completions", shell]);
        assert_eq!(o.code, 0, "{shell}: {}", o.dump());
        for sub in ["run", "selftest", "receipt", "completions"] {
            assert!(o.stdout.contains(sub), "{shell}: no {sub}");
        }
    }
    // The bash script is valid bash.
    let o = agentjail(&["completions", "bash"]);
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("agentjail.bash");
    std::fs::write(&f, &o.stdout).unwrap();
    let st = Command::new("bash").arg("-n").arg(&f).status().unwrap();
    assert!(st.success(), "bash -n refused the completion script");
    // An unknown shell is a usage error (125), naming the shells.
    let o = agentjail(&["completions", "tcsh"]);
    assert_eq!(o.code, 125, "{}", o.dump());
    assert!(o.stderr.contains("bash"), "{}", o.dump());
}

#[test]
fn man_pages_for_every_visible_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let o = agentjail(&[
        std::ffi::OsStr::new("man"),
        dir.path().join("man").as_os_str(),
    ]);
    assert_eq!(o.code, 0, "{}", o.dump());
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("man"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for want in [
        "agentjail.1",
        "agentjail-run.1",
        "agentjail-serve.1",
        "agentjail-selftest.1",
        "agentjail-image-import.1",
        "agentjail-receipt-verify.1",
        "agentjail-completions.1",
        "agentjail-session-start.1",
        "agentjail-session-exec.1",
        "agentjail-session-stop.1",
    ] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    assert!(
        !names.iter().any(|n| n == "agentjail-man.1"
            || n == "agentjail-help.1"
            || n == "agentjail-session-daemon.1"),
        "{names:?}"
    );
    let top = std::fs::read_to_string(dir.path().join("man/agentjail.1")).unwrap();
    assert!(
        top.starts_with(".ie") || top.contains(".TH agentjail 1"),
        "{top:.200}"
    );
    assert!(
        top.contains(env!("CARGO_PKG_VERSION")),
        "no version in agentjail.1"
    );
    let run = std::fs::read_to_string(dir.path().join("man/agentjail-run.1")).unwrap();
    assert!(
        run.contains("\\-\\-allow\\-degraded"),
        "agentjail-run.1 lacks its flags"
    );
    // man(1) renders it, where man-db is installed.
    if let Ok(o) = Command::new("man")
        .arg("-l")
        .arg(dir.path().join("man/agentjail-run.1"))
        .env("MANWIDTH", "80")
        .output()
        && o.status.success()
    {
        assert!(String::from_utf8_lossy(&o.stdout).contains("agentjail"));
    }
}
