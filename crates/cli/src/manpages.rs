//! `agentjail completions SHELL` and the hidden `agentjail man DIR`: shell completion scripts
//! (clap_complete) and man pages (clap_mangen), generated from the same clap definition that
//! parses the command line, so they cannot drift from it. The Debian package installs both
//! (docs/release.md).

use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;

/// Prints the completion script for `shell` on stdout. A closed stdout ends it quietly, as
/// for every subcommand (exit 141, `crate::out`).
pub fn completions(shell: clap_complete::Shell) -> Result<u8, String> {
    let mut cmd = Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "agentjail", &mut buf);
    crate::out::out_bytes(&buf);
    Ok(0)
}

/// Writes `agentjail.1` and `agentjail-SUB.1` (and `agentjail-SUB-SUBSUB.1`) for every visible
/// subcommand into `dir`, creating it; prints the files' names.
pub fn write_all(dir: &Path) -> Result<u8, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut cmd = Cli::command();
    cmd.build();
    let mut written = Vec::new();
    page(dir, &cmd, &mut written)?;
    for w in written {
        outln!("{w}");
    }
    Ok(0)
}

/// Renders the page of a built `cmd` as `NAME.1` in `dir`, then its visible subcommands' pages.
/// NAME is clap's display name: `agentjail`, `agentjail-run`, `agentjail-image-import`.
fn page(dir: &Path, cmd: &clap::Command, written: &mut Vec<String>) -> Result<(), String> {
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name());
    let file = format!("{name}.1");
    let path = dir.join(&file);
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut buf)
        .map_err(|e| format!("cannot render {file}: {e}"))?;
    std::fs::write(&path, buf).map_err(|e| format!("{}: {e}", path.display()))?;
    written.push(file);
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        page(dir, sub, written)?;
    }
    Ok(())
}
