//! The run's workspace (`/work`) as state (issue #34; the manifest's `workspace`).
//!
//! Restore: the caller (the CLI) reads the checkpoint file once, checks its sha256 against the
//! manifest and its entries ([`agentjail_verify::checkpoint::check`]) before anything starts,
//! and hands the bytes over in [`crate::RunOptions::workspace_restore`]. The supervisor puts
//! them in a sealed memfd sent with the plan; the payload (the command's process before it
//! execs), already the sandbox user without capabilities and in the run's cgroup, but before
//! Landlock and seccomp, forks a copy of itself with memory of its own (so that the restored
//! pages are charged to the run, not to the init whose memory the payload shares), which maps
//! the memfd, checks the archive again and extracts it into the fresh `/work` tmpfs through
//! that directory's descriptor only ([`agentjail_verify::checkpoint::extract`]: beneath it, no
//! link followed, `O_EXCL`). A failure there ends the run as a setup error
//! before the command starts: a workspace is never half-restored under a running command.
//!
//! Collect: the init opens `/work` and hands the descriptor to the supervisor
//! ([`crate::inside::ToSupervisor::Work`]), which returns it in
//! [`crate::Outcome::work_dir`]; the caller collects it after every process of the sandbox is
//! gone ([`agentjail_verify::checkpoint::build`]), whatever the command's status.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use serde::{Deserialize, Serialize};

use crate::step::{SetupError, Step, StepResult};

/// What the plan says of the workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspacePlan {
    /// A checkpoint is restored: its archive is the sealed memfd sent after the copies'.
    pub restore: bool,
    /// The init hands `/work` to the supervisor, for collection after the run.
    pub collect: bool,
    pub max_bytes: u64,
    pub max_files: u64,
}

impl WorkspacePlan {
    pub(crate) fn of(vm: &agentjail_manifest::ValidatedManifest) -> Option<WorkspacePlan> {
        vm.workspace.as_ref().map(|w| WorkspacePlan {
            restore: w.restore.is_some(),
            collect: w.collect,
            max_bytes: w.max_bytes,
            max_files: w.max_files,
        })
    }
}

/// The sealed memfd of the checkpoint to restore, when the plan restores one; an error when
/// the plan restores one the caller did not give.
pub(crate) fn restore_memfd(
    w: Option<&WorkspacePlan>,
    opts: &crate::RunOptions,
) -> StepResult<Option<OwnedFd>> {
    if !w.is_some_and(|w| w.restore) {
        return Ok(None);
    }
    let fail = |e: std::io::Error| SetupError::new(Step::RestoreWorkspace, e);
    let bytes = opts.workspace_restore.as_deref().ok_or_else(|| {
        fail(std::io::Error::other(
            "the checkpoint was not read before the run",
        ))
    })?;
    let fd = rustix::fs::memfd_create(
        c"agentjail-workspace",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|e| fail(e.into()))?;
    let mut f = std::fs::File::from(fd);
    std::io::Write::write_all(&mut f, bytes).map_err(fail)?;
    use rustix::fs::SealFlags;
    rustix::fs::fcntl_add_seals(
        f.as_fd(),
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL,
    )
    .map_err(|e| fail(e.into()))?;
    Ok(Some(f.into()))
}

/// The descriptors present among `fds`, borrowed (the plan's, the copies', the checkpoint's).
pub(crate) fn present<'a>(fds: &[Option<&'a OwnedFd>]) -> Vec<BorrowedFd<'a>> {
    fds.iter().flatten().map(|&f| f.as_fd()).collect()
}

/// In the init, once the root is built: hands the `/work` descriptor to the supervisor when
/// the plan collects the workspace.
pub(crate) fn hand_over_work(w: Option<&WorkspacePlan>, ctl: BorrowedFd<'_>) -> StepResult<()> {
    if !w.is_some_and(|w| w.collect) {
        return Ok(());
    }
    use rustix::fs::{Mode, OFlags};
    let work = crate::step::step(
        Step::OpenWork,
        rustix::fs::open(
            "/work",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ),
    )?;
    crate::step::step(
        Step::ReportReady,
        crate::inside::send(ctl, &crate::inside::ToSupervisor::Work, Some(work.as_fd())),
    )
}

/// In the payload, as the sandbox user before Landlock and seccomp: extracts the checkpoint
/// (the sealed memfd `fd`) into the empty `/work`, checking it again on the way. The work is
/// done by a forked copy of the payload, in the run's cgroups with memory of its own, so that
/// the restored files' pages are charged to the run (the payload itself shares the init's
/// memory, and what it writes would be charged to the init's cgroup, the runner's).
pub(crate) fn restore_in_payload(
    w: Option<&WorkspacePlan>,
    fd: Option<&OwnedFd>,
) -> StepResult<()> {
    let Some(w) = w.filter(|w| w.restore) else {
        return Ok(());
    };
    let fail = |e: String| SetupError::new(Step::RestoreWorkspace, e);
    let fd = fd.ok_or_else(|| fail("no checkpoint was sent".into()))?;
    let (r, tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| fail(format!("pipe: {e}")))?;
    let status = crate::sys::fork_and_wait(&mut || match extract(w, fd) {
        Ok(()) => 0,
        Err(why) => {
            let mut bytes = why.into_bytes();
            bytes.truncate(4096);
            let _ = rustix::io::write(&tx, &bytes);
            1
        }
    });
    drop(tx);
    let mut why = Vec::new();
    let _ = std::io::Read::read_to_end(
        &mut std::io::Read::take(std::fs::File::from(r), 4096),
        &mut why,
    );
    match status {
        Ok(Ok(0)) => Ok(()),
        Ok(Ok(_)) => Err(fail(String::from_utf8_lossy(&why).into_owned())),
        Ok(Err(sig)) => Err(fail(format!(
            "the process restoring it was killed by signal {sig} (over the run's memory limit?)"
        ))),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Err(fail(format!(
            "fork: {e}: restoring the workspace takes a second process; limits.processes must be at least 2"
        ))),
        Err(e) => Err(fail(format!("fork: {e}"))),
    }
}

/// [`restore_in_payload`]'s work, in the forked copy: reads the checkpoint and extracts it.
fn extract(w: &WorkspacePlan, fd: &OwnedFd) -> Result<(), String> {
    // The memfd's own pages (charged where they were written, the supervisor's), not a copy.
    let bytes = crate::sys::map_sealed(fd).map_err(|e| format!("mapping the checkpoint: {e}"))?;
    use rustix::fs::{Mode, OFlags};
    let work = rustix::fs::open(
        "/work",
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| format!("open /work: {e}"))?;
    let max_files = usize::try_from(w.max_files).unwrap_or(usize::MAX);
    agentjail_verify::checkpoint::extract(&bytes, work.as_fd(), w.max_bytes, max_files)
        .map_err(|e| format!("workspace checkpoint refused: {e}"))
}
