//! Building the sandbox's root from the plan: the interpreter of [`Op`], applied below
//! `/newroot` through [`RootSys`] (the real system calls, or the tests' recording double), then
//! the new root made read-only and pivoted into. The init calls it twice: for the part of the
//! root every host-image run has, while the supervisor plans, and for the rest of the plan.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::mount::MountFlags;

use crate::plan::{Op, SANDBOX_ID};
use crate::root_sys::{RootError, RootStep, RootSys, root_step};

/// Result of a step of building the root.
type RootResult<T> = Result<T, RootError>;

/// Applies the rest of the plan to the new root, makes it read-only and pivots into it.
pub(super) fn finish_root<S: RootSys>(sys: &mut S, ops: &[Op], made: &mut Made) -> RootResult<()> {
    for op in ops {
        apply(sys, op, made)?;
    }
    for d in ["/newroot/input", "/newroot/work", "/newroot/output"] {
        let _ = sys.mkdir(d);
    }
    root_step(
        RootStep::RemountNewRoot,
        sys.remount(
            "/newroot",
            MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        ),
    )?;
    root_step(RootStep::EnterNewRoot, sys.chdir("/newroot"))?;
    root_step(RootStep::PivotRoot, sys.pivot_root(".", "."))?;
    root_step(RootStep::DetachOldRoot, sys.unmount_detach("."))?;
    root_step(RootStep::ChdirRoot, sys.chdir("/"))?;
    Ok(())
}

fn new(dest: &str) -> String {
    format!("/newroot{dest}")
}

/// Directories of the new root made so far (each parent is made once, not once per entry),
/// and how many inline inputs were written (each has its own tmpfs, `/inline<n>`).
#[derive(Default)]
pub(super) struct Made {
    dirs: std::collections::HashSet<std::path::PathBuf>,
    inline: usize,
    /// The supervisor's sealed memfd of input copies ([`Op::Copy`]), when it sent one.
    pub(super) copies: Option<OwnedFd>,
}

fn mkdirs<S: RootSys>(sys: &mut S, path: &Path, made: &mut Made) -> RootResult<()> {
    if made.dirs.contains(path) {
        return Ok(());
    }
    root_step(RootStep::Mkdir(path.to_path_buf()), sys.mkdir_all(path))?;
    made.dirs.insert(path.to_path_buf());
    Ok(())
}

fn mountpoint<S: RootSys>(
    sys: &mut S,
    dest: &str,
    dir: bool,
    made: &mut Made,
) -> RootResult<String> {
    let d = new(dest);
    let p = Path::new(&d);
    if dir {
        mkdirs(sys, p, made)?;
    } else {
        if let Some(parent) = p.parent() {
            mkdirs(sys, parent, made)?;
        }
        root_step(
            RootStep::CreateMountPoint(dest.to_owned()),
            sys.create_mount_file(p),
        )?;
    }
    Ok(d)
}

/// Opens a host path (below /oldroot) without following any symlink, so that a path swapped
/// for a symlink after validation cannot redirect the bind.
fn open_source<S: RootSys>(sys: &mut S, src: &Path, dir: bool) -> RootResult<S::Source> {
    let path = format!("/oldroot{}", src.display());
    let fd = root_step(RootStep::Open(src.to_owned()), sys.open_source(&path))?;
    let is_dir = root_step(RootStep::Stat(src.to_owned()), sys.source_is_dir(&fd))?;
    if dir && !is_dir {
        return Err(RootError {
            step: RootStep::Open(src.to_owned()),
            source: std::io::Error::other("is no longer a directory"),
        });
    }
    Ok(fd)
}

/// Applies one op of the plan to the new root (the interpreter of [`Op`]).
pub(super) fn apply<S: RootSys>(sys: &mut S, op: &Op, made: &mut Made) -> RootResult<()> {
    match op {
        Op::BindRo { src, dest, dir } => {
            let fd = open_source(sys, src, *dir)?;
            let d = mountpoint(sys, dest, *dir, made)?;
            let via = sys.source_path(&fd);
            root_step(
                RootStep::Bind {
                    src: src.clone(),
                    dest: dest.clone(),
                },
                sys.bind(&via, &d, true),
            )?;
            make_readonly(sys, &d, dest)?;
        }
        Op::Device { src, dest } => {
            let fd = open_source(sys, src, false)?;
            let d = mountpoint(sys, dest, false, made)?;
            let via = sys.source_path(&fd);
            root_step(
                RootStep::BindDevice(dest.clone()),
                sys.bind(&via, &d, false),
            )?;
            let c = cstr(&d)?;
            root_step(
                RootStep::RestrictDevice(dest.clone()),
                sys.set_attrs(&c, libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC),
            )?;
        }
        Op::Tmpfs {
            dest,
            size_bytes,
            inodes,
            mode,
            exec,
        } => {
            let d = mountpoint(sys, dest, true, made)?;
            let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
            if !exec {
                flags |= MountFlags::NOEXEC;
            }
            let owner = if *mode == 0o700 {
                format!(",uid={SANDBOX_ID},gid={SANDBOX_ID}")
            } else {
                String::new()
            };
            let data = format!("size={size_bytes},nr_inodes={inodes},mode={mode:o}{owner}");
            let cdata = cstr(&data)?;
            root_step(
                RootStep::MountTmpfs {
                    dest: dest.clone(),
                    data: data.clone(),
                },
                sys.mount("tmpfs", &d, "tmpfs", flags, Some(cdata.as_c_str())),
            )?;
        }
        Op::Proc { dest } => {
            let d = mountpoint(sys, dest, true, made)?;
            root_step(
                RootStep::MountProc(dest.clone()),
                sys.mount(
                    "proc",
                    &d,
                    "proc",
                    MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                    Some(crate::plan::PROC_OPTIONS),
                ),
            )?;
        }
        Op::Symlink { target, dest } => {
            let d = new(dest);
            if let Some(parent) = Path::new(&d).parent() {
                mkdirs(sys, parent, made)?;
            }
            root_step(
                RootStep::Symlink {
                    dest: dest.clone(),
                    target: target.clone(),
                },
                sys.symlink(target, &d),
            )?;
        }
        Op::File { dest, content } => {
            let d = new(dest);
            if let Some(parent) = Path::new(&d).parent() {
                mkdirs(sys, parent, made)?;
            }
            // A fresh file (the umask is 0 here): mode 0644 from the start.
            root_step(
                RootStep::Write(dest.clone()),
                sys.write_file(&d, content.as_bytes()),
            )?;
        }
        Op::Inline { dest, content } => inline_file(sys, dest, content.as_bytes(), made)?,
        Op::Copy { dest, offset, len } => {
            // The bytes the supervisor copied (as root) from a file the sandbox user cannot
            // read: the same read-only tmpfs file as an inline input.
            let bytes =
                copied_bytes(made.copies.as_ref(), *offset, *len).map_err(|e| RootError {
                    step: RootStep::Write(format!("the copy of the input {dest}")),
                    source: e,
                })?;
            inline_file(sys, dest, &bytes, made)?;
        }
    }
    Ok(())
}

/// `len` bytes at `offset` of the supervisor's sealed memfd of input copies.
fn copied_bytes(fd: Option<&OwnedFd>, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let fd = fd.ok_or_else(|| std::io::Error::other("no memfd of input copies was sent"))?;
    let mut bytes = vec![0u8; len as usize];
    let mut at = 0usize;
    while at < bytes.len() {
        match rustix::io::pread(fd, &mut bytes[at..], offset + at as u64) {
            Ok(0) => return Err(std::io::Error::other("the memfd of input copies is short")),
            Ok(n) => at += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(bytes)
}

/// A read-only file given by value (an inline input, or a copied one): its own tmpfs in the
/// staging root, which is detached with the host's root after the pivot: the bind at `dest`
/// is then the only way to the file, and it is read-only (so below the writable /work too:
/// the tmpfs's root directory, not /work, holds the file, and a bind mount cannot be unlinked
/// or renamed over). Sized for the content. Its pages are charged to the init's memory cgroup
/// (the runner's: the init stays outside the run's cgroup), like the root tmpfs's; the
/// manifest bounds inline inputs (8 of 1 MiB), [`crate::copies`] the copies (32 MiB).
fn inline_file<S: RootSys>(
    sys: &mut S,
    dest: &String,
    content: &[u8],
    made: &mut Made,
) -> RootResult<()> {
    let dir = format!("/inline{}", made.inline);
    made.inline += 1;
    match sys.mkdir(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(RootError {
                step: RootStep::Mkdir(dir.into()),
                source: e,
            });
        }
        _ => {}
    }
    let page = rustix::param::page_size();
    let size = content.len().div_ceil(page) * page + page;
    let data = format!("size={size},nr_inodes=2,mode=0755");
    let cdata = cstr(&data)?;
    root_step(
        RootStep::MountTmpfs {
            dest: format!("{dir} (for the inline input {dest})"),
            data: data.clone(),
        },
        sys.mount(
            "agentjail",
            &dir,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(cdata.as_c_str()),
        ),
    )?;
    let file = format!("{dir}/content");
    root_step(
        RootStep::Write(format!("{file} (for the inline input {dest})")),
        sys.write_file(&file, content),
    )?;
    let d = mountpoint(sys, dest, false, made)?;
    root_step(
        RootStep::Bind {
            src: "inline".into(),
            dest: dest.clone(),
        },
        sys.bind(&file, &d, false),
    )?;
    make_readonly(sys, &d, dest)?;
    Ok(())
}

fn cstr(s: &str) -> RootResult<CString> {
    CString::new(s).map_err(|e| RootError {
        step: RootStep::Path,
        source: std::io::Error::other(e),
    })
}

fn make_readonly<S: RootSys>(sys: &mut S, d: &str, dest: &str) -> RootResult<()> {
    let c = cstr(d)?;
    let attrs = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    match sys.set_attrs(&c, attrs) {
        Ok(()) => Ok(()),
        // Kernels before 5.12: remount the top mount only.
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => root_step(
            RootStep::RemountReadOnly(dest.to_owned()),
            sys.remount(
                d,
                MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
            ),
        ),
        Err(source) => Err(RootError {
            step: RootStep::MakeReadOnly(dest.to_owned()),
            source,
        }),
    }
}

#[cfg(test)]
mod tests;
