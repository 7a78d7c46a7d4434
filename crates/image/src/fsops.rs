//! File-system primitives relative to a root directory fd that never follow a symlink: every
//! path is resolved one component at a time with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
//! | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`, so neither `..`, an absolute path, a symlink
//! nor a mount point can lead outside the root.

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

/// The resolution every lookup uses.
pub fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV
}

/// Opens `name` (one component, or a relative path of plain components) below `dir`.
pub fn open_beneath(dir: BorrowedFd<'_>, name: &str, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        name,
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        beneath(),
    )?)
}

/// Opens a directory (O_PATH) below `dir`.
pub fn open_dir_path(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    open_beneath(dir, name, OFlags::PATH | OFlags::DIRECTORY)
}

/// Opens a host directory by absolute path for use as a root (the path itself may contain
/// symlinks; everything below it is resolved without them).
pub fn open_root(path: &std::path::Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// `lstat` of one entry of `dir`.
pub fn lstat(dir: BorrowedFd<'_>, name: &str) -> io::Result<rustix::fs::Stat> {
    Ok(rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
}

pub fn file_type(st: &rustix::fs::Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// Names in a directory, sorted by bytes, without `.` and `..`.
pub fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let fd = open_beneath(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY)?;
    let mut names = Vec::new();
    let d = rustix::fs::Dir::read_from(&fd)?;
    for e in d {
        let e = e?;
        let n: &CStr = e.file_name();
        let b = n.to_bytes();
        if b != b"." && b != b".." {
            names.push(b.to_vec());
        }
    }
    names.sort();
    Ok(names)
}

pub fn name_str(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// Removes `name` below `dir` whatever it is (a directory with everything in it), never
/// following a symlink. A missing entry is not an error.
pub fn remove_any(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(s) => s,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if file_type(&st) == FileType::Directory {
        let sub = rustix::fs::openat2(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        )?;
        // Our own tree: make sure we may delete in it even if the image made it read-only.
        let _ = rustix::fs::fchmod(&sub, Mode::from_raw_mode(0o700));
        let names = {
            let mut v = Vec::new();
            for e in rustix::fs::Dir::read_from(&sub)? {
                let e = e?;
                let b = e.file_name().to_bytes();
                if b != b"." && b != b".." {
                    v.push(b.to_vec());
                }
            }
            v
        };
        for n in names {
            remove_any(sub.as_fd(), name_str(&n))?;
        }
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(())
}

/// Removes a whole host directory tree (our staging or a store entry) without following links.
pub fn remove_tree(path: &std::path::Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other("refusing to remove a root path"));
    };
    let p = open_root(parent)?;
    remove_any(p.as_fd(), name)
}
