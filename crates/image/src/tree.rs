//! Walking an unpacked tree (never following a symlink) to describe it.
//!
//! - The *file list* is canonical and content-based: one line per entry, sorted by path, with
//!   type, permission bits, size and sha256 (files) or target (symlinks). Its sha256 is the
//!   record's `content_digest`; for a plain root filesystem it is also the image digest.
//! - The *fingerprint* is cheap and metadata-based: path, type, mode, size, mtime, ctime and
//!   inode of every entry. ctime cannot be set from user space, so any change to a file's
//!   content or metadata after import changes the fingerprint, without reading file content.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{FileType, OFlags};
use sha2::{Digest, Sha256};

use crate::fsops;

#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// Canonical file list (only when content was hashed).
    pub list: String,
    /// sha256 of the metadata lines, `sha256:<hex>`.
    pub fingerprint: String,
    pub entries: u64,
    pub bytes: u64,
}

/// Lower-case hex: the workspace's one encoder.
pub use agentjail_manifest::hex;

/// `sha256:<hex>` of bytes.
pub fn sha256_str(b: &[u8]) -> String {
    agentjail_manifest::sha256_digest(b)
}

/// Describes the tree below `root` (the root directory itself is not part of it).
pub fn walk(root: &Path, content: bool) -> std::io::Result<Summary> {
    let fd = fsops::open_root(root)?;
    let mut s = Summary::default();
    let mut fp = Sha256::new();
    walk_dir(fd.as_fd(), "", content, &mut s, &mut fp, 0)?;
    s.fingerprint = format!("sha256:{}", hex(&fp.finalize()));
    Ok(s)
}

fn walk_dir(
    dir: BorrowedFd<'_>,
    prefix: &str,
    content: bool,
    s: &mut Summary,
    fp: &mut Sha256,
    depth: usize,
) -> std::io::Result<()> {
    if depth > 512 {
        return Err(std::io::Error::other("tree deeper than 512 levels"));
    }
    for name in fsops::list(dir)? {
        let n = String::from_utf8_lossy(&name).into_owned();
        let path = if prefix.is_empty() {
            n.clone()
        } else {
            format!("{prefix}/{n}")
        };
        let os = fsops::name_str(&name);
        let st = rustix::fs::statat(dir, os, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
        let ft = fsops::file_type(&st);
        let perm = st.st_mode & 0o7777;
        s.entries += 1;
        fp.update(
            format!(
                "{path:?} {:o} {} {}.{} {}.{} {}\n",
                st.st_mode,
                st.st_size,
                st.st_mtime,
                st.st_mtime_nsec,
                st.st_ctime,
                st.st_ctime_nsec,
                st.st_ino
            )
            .as_bytes(),
        );
        match ft {
            FileType::Directory => {
                if content {
                    s.list.push_str(&format!("d {perm:04o} {path:?}\n"));
                }
                let sub = rustix::fs::openat2(
                    dir,
                    os,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                    fsops::beneath(),
                )?;
                walk_dir(sub.as_fd(), &path, content, s, fp, depth + 1)?;
            }
            FileType::RegularFile => {
                s.bytes += st.st_size as u64;
                if content {
                    let f = rustix::fs::openat2(
                        dir,
                        os,
                        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        rustix::fs::Mode::empty(),
                        fsops::beneath(),
                    )?;
                    let mut f = std::fs::File::from(f);
                    let mut h = Sha256::new();
                    let mut buf = vec![0u8; 256 * 1024];
                    let mut len = 0u64;
                    loop {
                        let k = f.read(&mut buf)?;
                        if k == 0 {
                            break;
                        }
                        len += k as u64;
                        h.update(&buf[..k]);
                    }
                    s.list.push_str(&format!(
                        "f {perm:04o} {len} sha256:{} {path:?}\n",
                        hex(&h.finalize())
                    ));
                }
            }
            FileType::Symlink => {
                if content {
                    let t = rustix::fs::readlinkat(dir, os, Vec::new())?;
                    let t = String::from_utf8_lossy(t.to_bytes()).into_owned();
                    s.list.push_str(&format!("l {t:?} {path:?}\n"));
                }
            }
            other => {
                if content {
                    s.list.push_str(&format!("o {other:?} {path:?}\n"));
                }
            }
        }
    }
    Ok(())
}
