//! Inputs the sandbox user cannot read (issue #31 §4). As root, the sandbox runs as an
//! unprivileged host uid of its own (one per run), to which only the permissions for others
//! apply: a secret of mode 0600 bound into the sandbox would fail there with a bare
//! "Permission denied", and the old fix (`chmod o+r`) made the secret readable by every user
//! of the host. Instead, the supervisor (root) reads such a file and gives the sandbox a
//! read-only copy in memory: its bytes go into one sealed memfd sent with the plan, and the
//! init writes each into a tmpfs of its own, bound read-only at the input's path (as an
//! inline input is, [`crate::plan::Op::Copy`]). The host file is not changed. The report
//! names every copy (`inputs_copied`).
//!
//! Bounds: files of at most [`COPY_MAX`], [`COPIES_MAX`] in all (the memory is the runner's,
//! outside the run's cgroup). A larger file is refused before anything runs, naming the
//! bound and the fixes. A folder is never copied: the CLI refuses one holding what the
//! sandbox user cannot read (`pipeline::unreadable_input`).
//!
//! Why a copy and not an ID-mapped bind mount (`mount_setattr(MOUNT_ATTR_IDMAP)`): it works
//! on every kernel and file system agentjail supports (ID-mapped mounts need Linux 5.12 and a
//! file system that supports them, tmpfs only from 6.3), and an ID mapping would show the
//! sandbox every file of that owner under the mount as its own.

use std::os::fd::{AsFd, OwnedFd};

use crate::plan::{Op, Plan};

/// The largest file given as a copy.
pub const COPY_MAX: u64 = 8 << 20;
/// The most bytes copied for one run.
pub const COPIES_MAX: u64 = 32 << 20;

/// The copies made for a run: the sealed memfd the init reads, and the inputs copied.
pub(crate) struct Copies {
    pub fd: OwnedFd,
    pub mounts: Vec<String>,
}

/// Replaces, in `plan`, the bind of every file input the sandbox user cannot read (no read
/// bit for others) by an [`Op::Copy`] of its bytes. None when no input needs it; Err (a
/// one-line reason for the report) for a file over the bounds or one that cannot be read.
pub(crate) fn unreadable_inputs(
    vm: &agentjail_manifest::ValidatedManifest,
    plan: &mut Plan,
) -> Result<Option<Copies>, String> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let mut copies: Option<(std::fs::File, Vec<String>)> = None;
    let mut offset = 0u64;
    for input in vm.inputs.iter().filter(|i| !i.is_dir) {
        let path = &input.host_path;
        let fail = |what: String| format!("input {} ({}): {what}", input.mount, path.display());
        // Opened without following a link in any component (the path is canonical, so a link
        // found now means it changed since it was checked: a folder above the file swapped
        // for a link to /etc must not make root copy /etc/shadow), as the init opens a bind's
        // source; and without blocking on a FIFO. What is checked and copied is this open
        // file, not the path again.
        let fd = rustix::fs::openat2(
            rustix::fs::CWD,
            path,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::NONBLOCK,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| fail(format!("cannot open it without following a link: {e}")))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| fail(format!("fstat: {e}")))?;
        let mode = st.st_mode;
        if mode & libc::S_IFMT != libc::S_IFREG || mode & 0o004 != 0 {
            continue;
        }
        let size = st.st_size as u64;
        if size > COPY_MAX || offset + size > COPIES_MAX {
            let over = if size > COPY_MAX {
                format!("it is larger than {} MiB", COPY_MAX >> 20)
            } else {
                format!(
                    "with the run's other copies it comes to more than {} MiB",
                    COPIES_MAX >> 20
                )
            };
            return Err(fail(format!(
                "the sandbox user cannot read the file (mode {:04o}), and {over}, the most agentjail gives the sandbox as read-only copies in memory: as root, agentjail runs the sandbox as an unprivileged uid of its own, to which only the permissions for others apply; fix: give the run a smaller file, or chmod o+r {} if every user of this host may read it",
                mode & 0o7777,
                path.display()
            )));
        }
        let (memfd, mounts) = match &mut copies {
            Some(c) => c,
            None => {
                let m = rustix::fs::memfd_create(
                    c"agentjail-input-copies",
                    rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
                )
                .map_err(|e| fail(format!("memfd for its copy: {e}")))?;
                copies.insert((std::fs::File::from(m), Vec::new()))
            }
        };
        // At most the bound: a file that grew since the fstat is cut there and refused below.
        let mut src = std::io::Read::take(std::fs::File::from(fd), COPY_MAX + 1);
        let n = std::io::copy(&mut src, memfd).map_err(|e| fail(format!("copying it: {e}")))?;
        if n > COPY_MAX || offset + n > COPIES_MAX {
            return Err(fail(format!(
                "the file grew past {} MiB while it was copied",
                COPY_MAX >> 20
            )));
        }
        let Some(op) = plan
            .ops
            .iter_mut()
            .find(|op| matches!(op, Op::BindRo { dest, dir: false, .. } if *dest == input.mount))
        else {
            return Err(fail("no bind of it in the plan".into()));
        };
        *op = Op::Copy {
            dest: input.mount.clone(),
            offset,
            len: n,
        };
        offset += n;
        mounts.push(input.mount.clone());
    }
    let Some((memfd, mounts)) = copies else {
        return Ok(None);
    };
    // Sealed: nothing can change the copies between here and the init's read.
    use rustix::fs::SealFlags;
    rustix::fs::fcntl_add_seals(
        memfd.as_fd(),
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL,
    )
    .map_err(|e| format!("sealing the input copies: {e}"))?;
    Ok(Some(Copies {
        fd: memfd.into(),
        mounts,
    }))
}
