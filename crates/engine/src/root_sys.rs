//! The system calls that build the sandbox's root from the plan (`inside::root::apply` and
//! `inside::root::finish_root`, the interpreter of [`crate::plan::Op`]), behind a small trait, as
//! youki does with its `Syscall` trait: [`Host`] makes them; [`Recorder`] (tests) records them, so
//! that their order and arguments are unit-tested without root or namespaces.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags, openat2};
use rustix::mount::MountFlags;

use crate::sys;

/// A step of building the sandbox's root: what a set-up failure names (the report's `step`,
/// the same words as before these were typed) and the system call it makes, as nsjail and
/// firecracker's jailer name both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootStep {
    Mkdir(PathBuf),
    CreateMountPoint(String),
    Open(PathBuf),
    Stat(PathBuf),
    Bind {
        src: PathBuf,
        dest: String,
    },
    BindDevice(String),
    RestrictDevice(String),
    MountTmpfs {
        dest: String,
        data: String,
    },
    MountProc(String),
    Symlink {
        dest: String,
        target: String,
    },
    Write(String),
    MakeReadOnly(String),
    RemountReadOnly(String),
    RemountNewRoot,
    EnterNewRoot,
    PivotRoot,
    DetachOldRoot,
    ChdirRoot,
    /// A path or mount option that holds a NUL byte.
    Path,
}

impl std::fmt::Display for RootStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootStep::Mkdir(p) => write!(f, "mkdir {}", p.display()),
            RootStep::CreateMountPoint(d) => write!(f, "create mount point {d}"),
            RootStep::Open(p) => write!(f, "open {}", p.display()),
            RootStep::Stat(p) => write!(f, "stat {}", p.display()),
            RootStep::Bind { src, dest } => write!(f, "bind {} -> {dest}", src.display()),
            RootStep::BindDevice(d) => write!(f, "bind device {d}"),
            RootStep::RestrictDevice(d) => write!(f, "restrict device {d}"),
            RootStep::MountTmpfs { dest, data } => write!(f, "mount tmpfs {dest} ({data})"),
            RootStep::MountProc(d) => write!(f, "mount proc on {d}"),
            RootStep::Symlink { dest, target } => write!(f, "symlink {dest} -> {target}"),
            RootStep::Write(d) => write!(f, "write {d}"),
            RootStep::MakeReadOnly(d) => write!(f, "make {d} read-only"),
            RootStep::RemountReadOnly(d) => write!(f, "remount {d} read-only"),
            RootStep::RemountNewRoot => f.write_str("remount new root read-only"),
            RootStep::EnterNewRoot => f.write_str("chdir /newroot"),
            RootStep::PivotRoot => f.write_str("pivot_root(., .)"),
            RootStep::DetachOldRoot => f.write_str("detach the old root"),
            RootStep::ChdirRoot => f.write_str("chdir /"),
            RootStep::Path => f.write_str("path"),
        }
    }
}

impl RootStep {
    /// The system call the step makes.
    pub(crate) fn syscall(&self) -> &'static str {
        match self {
            RootStep::Mkdir(_) => "mkdir",
            RootStep::CreateMountPoint(_) => "open(O_CREAT)",
            RootStep::Open(_) => "openat2(O_PATH, RESOLVE_NO_SYMLINKS)",
            RootStep::Stat(_) => "fstat",
            RootStep::Bind { .. } => "mount(MS_BIND|MS_REC)",
            RootStep::BindDevice(_) => "mount(MS_BIND)",
            RootStep::RestrictDevice(_) | RootStep::MakeReadOnly(_) => {
                "mount_setattr(AT_RECURSIVE)"
            }
            RootStep::MountTmpfs { .. } => "mount(tmpfs)",
            RootStep::MountProc(_) => "mount(proc)",
            RootStep::Symlink { .. } => "symlink",
            RootStep::Write(_) => "open(O_CREAT|O_TRUNC), write",
            RootStep::RemountReadOnly(_) | RootStep::RemountNewRoot => {
                "mount(MS_REMOUNT|MS_BIND|MS_RDONLY)"
            }
            RootStep::EnterNewRoot | RootStep::ChdirRoot => "chdir",
            RootStep::PivotRoot => "pivot_root",
            RootStep::DetachOldRoot => "umount2(MNT_DETACH)",
            RootStep::Path => "CString::new",
        }
    }
}

/// A failed step of building the root: the step and the OS's answer.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {}: {source}", step.syscall())]
pub(crate) struct RootError {
    pub(crate) step: RootStep,
    #[source]
    pub(crate) source: io::Error,
}

/// Runs one step: its result, or a [`RootError`] naming it.
pub(crate) fn root_step<T>(step: RootStep, r: io::Result<T>) -> Result<T, RootError> {
    if crate::timing::every_step() {
        crate::timing::mark(&step.to_string());
    }
    r.map_err(|source| RootError { step, source })
}

/// The root-building system calls. Paths are as the init sees them (the new root is below
/// `/newroot`, the host's root below `/oldroot`).
pub(crate) trait RootSys {
    /// An opened host path (an `O_PATH` fd for [`Host`]).
    type Source;
    /// Opens `path` without following any symlink (`openat2`, `RESOLVE_NO_SYMLINKS`).
    fn open_source(&mut self, path: &str) -> io::Result<Self::Source>;
    /// Whether the opened source is a directory (`fstat`).
    fn source_is_dir(&mut self, src: &Self::Source) -> io::Result<bool>;
    /// The path through which the opened source is bound (`/oldroot/proc/self/fd/N`).
    fn source_path(&self, src: &Self::Source) -> String;
    /// `mkdir -p` with mode 0755.
    fn mkdir_all(&mut self, path: &Path) -> io::Result<()>;
    /// Creates an empty file of mode 0444 to mount on (kept if it exists).
    fn create_mount_file(&mut self, path: &Path) -> io::Result<()>;
    /// A bind mount (`MS_BIND`, with `MS_REC` when `recursive`).
    fn bind(&mut self, from: &str, to: &str, recursive: bool) -> io::Result<()>;
    /// `mount_setattr(AT_RECURSIVE)` setting `attrs`.
    fn set_attrs(&mut self, path: &CStr, attrs: u64) -> io::Result<()>;
    /// A remount of a bind mount with `flags`.
    fn remount(&mut self, path: &str, flags: MountFlags) -> io::Result<()>;
    /// A new mount of `fstype`.
    fn mount(
        &mut self,
        source: &str,
        target: &str,
        fstype: &str,
        flags: MountFlags,
        data: Option<&CStr>,
    ) -> io::Result<()>;
    fn symlink(&mut self, target: &str, path: &str) -> io::Result<()>;
    /// Writes a fresh file of mode 0644.
    fn write_file(&mut self, path: &str, content: &[u8]) -> io::Result<()>;
    /// Creates one directory of mode 0755 (an existing one is not an error to the caller).
    fn mkdir(&mut self, path: &str) -> io::Result<()>;
    fn chdir(&mut self, path: &str) -> io::Result<()>;
    fn pivot_root(&mut self, new_root: &str, put_old: &str) -> io::Result<()>;
    /// A lazy unmount (`MNT_DETACH`).
    fn unmount_detach(&mut self, path: &str) -> io::Result<()>;
}

/// The real system calls.
pub(crate) struct Host;

impl RootSys for Host {
    type Source = OwnedFd;

    fn open_source(&mut self, path: &str) -> io::Result<OwnedFd> {
        Ok(openat2(
            rustix::fs::CWD,
            path,
            OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )?)
    }
    fn source_is_dir(&mut self, src: &OwnedFd) -> io::Result<bool> {
        let st = rustix::fs::fstat(src)?;
        Ok(rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory)
    }
    fn source_path(&self, src: &OwnedFd) -> String {
        format!("/oldroot/proc/self/fd/{}", src.as_raw_fd())
    }
    fn mkdir_all(&mut self, path: &Path) -> io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path)
    }
    fn create_mount_file(&mut self, path: &Path) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o444)
            .open(path)
            .map(drop)
    }
    fn bind(&mut self, from: &str, to: &str, recursive: bool) -> io::Result<()> {
        if recursive {
            Ok(rustix::mount::mount_bind_recursive(from, to)?)
        } else {
            Ok(rustix::mount::mount_bind(from, to)?)
        }
    }
    fn set_attrs(&mut self, path: &CStr, attrs: u64) -> io::Result<()> {
        sys::mount_setattr_recursive(&path.to_owned(), attrs)
    }
    fn remount(&mut self, path: &str, flags: MountFlags) -> io::Result<()> {
        Ok(rustix::mount::mount_remount(path, flags, "")?)
    }
    fn mount(
        &mut self,
        source: &str,
        target: &str,
        fstype: &str,
        flags: MountFlags,
        data: Option<&CStr>,
    ) -> io::Result<()> {
        Ok(rustix::mount::mount(source, target, fstype, flags, data)?)
    }
    fn symlink(&mut self, target: &str, path: &str) -> io::Result<()> {
        std::os::unix::fs::symlink(target, path)
    }
    fn write_file(&mut self, path: &str, content: &[u8]) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, content))
    }
    fn mkdir(&mut self, path: &str) -> io::Result<()> {
        std::fs::DirBuilder::new().mode(0o755).create(path)
    }
    fn chdir(&mut self, path: &str) -> io::Result<()> {
        std::env::set_current_dir(path)
    }
    fn pivot_root(&mut self, new_root: &str, put_old: &str) -> io::Result<()> {
        Ok(rustix::process::pivot_root(new_root, put_old)?)
    }
    fn unmount_detach(&mut self, path: &str) -> io::Result<()> {
        Ok(rustix::mount::unmount(
            path,
            rustix::mount::UnmountFlags::DETACH,
        )?)
    }
}

/// A test double: records each call as one line (name and arguments) and fails the call
/// whose line starts with `fail_on`, with EPERM.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) calls: Vec<String>,
    pub(crate) fail_on: Option<String>,
    /// Paths [`RootSys::open_source`] reports as directories.
    pub(crate) dirs: std::collections::HashSet<String>,
}

#[cfg(test)]
impl Recorder {
    fn call(&mut self, line: String) -> io::Result<()> {
        let fail = self.fail_on.as_deref().is_some_and(|f| line.starts_with(f));
        self.calls.push(line);
        if fail {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
impl RootSys for Recorder {
    /// The opened path.
    type Source = String;

    fn open_source(&mut self, path: &str) -> io::Result<String> {
        self.call(format!("open_source {path}"))?;
        Ok(path.to_owned())
    }
    fn source_is_dir(&mut self, src: &String) -> io::Result<bool> {
        self.call(format!("fstat {src}"))?;
        Ok(self.dirs.contains(src))
    }
    fn source_path(&self, src: &String) -> String {
        format!("fd:{src}")
    }
    fn mkdir_all(&mut self, path: &Path) -> io::Result<()> {
        self.call(format!("mkdir_all {}", path.display()))
    }
    fn create_mount_file(&mut self, path: &Path) -> io::Result<()> {
        self.call(format!("create_mount_file {}", path.display()))
    }
    fn bind(&mut self, from: &str, to: &str, recursive: bool) -> io::Result<()> {
        self.call(format!("bind {from} {to} recursive={recursive}"))
    }
    fn set_attrs(&mut self, path: &CStr, attrs: u64) -> io::Result<()> {
        self.call(format!("set_attrs {} {attrs:#x}", path.to_string_lossy()))
    }
    fn remount(&mut self, path: &str, flags: MountFlags) -> io::Result<()> {
        self.call(format!("remount {path} {:#x}", flags.bits()))
    }
    fn mount(
        &mut self,
        source: &str,
        target: &str,
        fstype: &str,
        flags: MountFlags,
        data: Option<&CStr>,
    ) -> io::Result<()> {
        let data = data.map(|d| d.to_string_lossy().into_owned());
        self.call(format!(
            "mount {source} {target} {fstype} {:#x} {}",
            flags.bits(),
            data.unwrap_or_default()
        ))
    }
    fn symlink(&mut self, target: &str, path: &str) -> io::Result<()> {
        self.call(format!("symlink {target} {path}"))
    }
    fn write_file(&mut self, path: &str, content: &[u8]) -> io::Result<()> {
        self.call(format!("write_file {path} {}", content.len()))
    }
    fn mkdir(&mut self, path: &str) -> io::Result<()> {
        self.call(format!("mkdir {path}"))
    }
    fn chdir(&mut self, path: &str) -> io::Result<()> {
        self.call(format!("chdir {path}"))
    }
    fn pivot_root(&mut self, new_root: &str, put_old: &str) -> io::Result<()> {
        self.call(format!("pivot_root {new_root} {put_old}"))
    }
    fn unmount_detach(&mut self, path: &str) -> io::Result<()> {
        self.call(format!("unmount_detach {path}"))
    }
}
