//! Collecting what a sandboxed command left in its output directory, trusting nothing.
//!
//! The source is an open directory (the sandbox's `/output`) whose content is hostile: it may
//! hold symlinks to host files, hard links, FIFOs that would block a reader, sockets, device
//! nodes, names with control characters, millions of entries or deep nesting. [`collect`]
//! walks it iteratively (at most [`MAX_DEPTH`] levels and [`MAX_ENTRIES`] entries, with at most
//! two open descriptors per level), opening every entry relative to its parent's descriptor
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)` and `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC`. Every entry is
//! classified with `fstatat(AT_SYMLINK_NOFOLLOW)` before it is opened (so FIFOs, sockets and
//! devices are never opened at all) and again with `fstat` after (a swap in between is refused).
//! Only regular files with one link and directories pass; files are copied into a private
//! staging folder, within a total byte budget, hashing while copying.

use std::ffi::CStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use agentjail_manifest::report::{OutputFile, RejectedFile};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use crate::text::{escape_name, is_unsafe_char};

/// Deepest path accepted, in components (`a/b/c` is 3). A directory at this level is refused,
/// since anything inside it would be deeper.
pub const MAX_DEPTH: usize = 16;
/// Most entries (files, directories and refused entries together) examined.
pub const MAX_ENTRIES: usize = 10_000;

/// What came out of the output directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectReport {
    /// Files copied into the staging folder, in path order.
    pub files: Vec<OutputFile>,
    /// Entries that were refused, with the reason: at most
    /// [`MAX_REJECTED_LISTED`](agentjail_manifest::report::MAX_REJECTED_LISTED), in the order met.
    pub rejected: Vec<RejectedFile>,
    /// Refused entries past that many: counted, not listed.
    pub rejected_dropped: u64,
}

/// A failure on the host side (the staging folder or the output descriptor itself), as opposed
/// to hostile content, which is reported in [`CollectReport::rejected`]. After one, the staging
/// folder's content is incomplete and should be discarded.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("output directory: {0}")]
    Source(#[source] std::io::Error),
    #[error("output directory descriptor is not a directory")]
    SourceNotDirectory,
    #[error("staging folder {}: {source}", .path.display())]
    Staging {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "staging folder {} must be an empty directory owned by the current user with mode 0700",
        .path.display()
    )]
    StagingNotPrivate { path: PathBuf },
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

fn open_flags() -> OFlags {
    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC
}

/// One directory being walked: its source and staging descriptors (no staging descriptor when
/// collecting into memory), its relative path and the names still to examine.
struct Frame {
    src: OwnedFd,
    dst: Option<OwnedFd>,
    /// Relative path components (all valid, printable UTF-8).
    rel: Vec<String>,
    names: std::vec::IntoIter<Vec<u8>>,
}

struct Walk<'a> {
    report: CollectReport,
    dest: &'a Path,
    /// Collecting into memory ([`collect_to_memory`]): the kept file's content, by path.
    memory: Option<Vec<(String, Vec<u8>)>>,
    /// In memory, the one path whose content is kept (the others are read, hashed, counted
    /// and checked like it, and dropped): the runner's memory holds at most one file.
    keep: Option<String>,
    budget: u64,
    used: u64,
    entries: usize,
    /// Most entries examined ([`MAX_ENTRIES`], or a workspace's own bound).
    max_entries: usize,
    /// What is collected, for the byte bound's refusal: `output` or `workspace`.
    what: &'static str,
    /// Collecting a whole tree ([`walk_tree`]): every accepted folder and file, in walk order.
    tree: Option<Vec<TreeEntry>>,
    /// A bound (bytes or entries) refused something: the tree is incomplete.
    over_bounds: bool,
}

/// One accepted entry of a tree collected whole ([`walk_tree`]): its relative path, whether
/// it is a folder, its owner-exec bit, and (a file's) content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TreeEntry {
    pub path: String,
    pub dir: bool,
    pub exec: bool,
    pub content: Vec<u8>,
}

/// Copies every acceptable file under `src` (an `O_DIRECTORY` descriptor of the sandbox's
/// `/output`) into `dest` (an existing, empty, 0700 folder owned by the current user), keeping
/// relative paths, within `max_total_bytes` of file content in total.
///
/// Created folders are 0700 and files 0600. Hostile entries are refused and listed with a
/// reason; they never cause an error. `Err` means the host side failed (see [`CollectError`]).
pub fn collect(
    src: BorrowedFd<'_>,
    dest: &Path,
    max_total_bytes: u64,
) -> Result<CollectReport, CollectError> {
    let staging = |source: std::io::Error| CollectError::Staging {
        path: dest.to_owned(),
        source,
    };
    let src_root = open_source(src)?;
    let dst_root = rustix::fs::open(
        dest,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| staging(e.into()))?;
    let st = rustix::fs::fstat(&dst_root).map_err(|e| staging(e.into()))?;
    let not_private = st.st_uid != rustix::process::geteuid().as_raw() || st.st_mode & 0o077 != 0;
    if not_private || !read_names(&dst_root, 1).map_err(staging)?.is_empty() {
        return Err(CollectError::StagingNotPrivate {
            path: dest.to_owned(),
        });
    }

    let mut walk = Walk {
        report: CollectReport::default(),
        dest,
        memory: None,
        keep: None,
        budget: max_total_bytes,
        used: 0,
        entries: 0,
        max_entries: MAX_ENTRIES,
        what: "output",
        tree: None,
        over_bounds: false,
    };
    walk.run(src_root, Some(dst_root))?;
    Ok(walk.report)
}

/// The source's root, checked to be a directory, opened anew for the walk.
fn open_source(src: BorrowedFd<'_>) -> Result<OwnedFd, CollectError> {
    let root_stat = rustix::fs::fstat(src).map_err(|e| CollectError::Source(e.into()))?;
    if !FileType::from_raw_mode(root_stat.st_mode).is_dir() {
        return Err(CollectError::SourceNotDirectory);
    }
    rustix::fs::openat(
        src,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| CollectError::Source(e.into()))
}

/// Files collected into memory by [`collect_to_memory`]: the report, and each accepted
/// file's content by its relative path (the report's `files` order).
#[derive(Debug, Default)]
pub struct InMemory {
    pub report: CollectReport,
    pub contents: Vec<(String, Vec<u8>)>,
}

/// [`collect`] into memory instead of a staging folder: the same walk, checks, refusals and
/// byte budget, and nothing written to any file system. Only the file at `keep` (a relative
/// path) has its content kept, so at most one file and `max_total_bytes` are held; every
/// other accepted file is listed (size, digest) as by [`collect`]. For a runner that hands
/// its results to `agentjail serve` over its lifeline.
pub fn collect_to_memory(
    src: BorrowedFd<'_>,
    max_total_bytes: u64,
    keep: Option<&str>,
) -> Result<InMemory, CollectError> {
    let src_root = open_source(src)?;
    let mut walk = Walk {
        report: CollectReport::default(),
        dest: Path::new("(memory)"),
        memory: Some(Vec::new()),
        keep: keep.map(str::to_owned),
        budget: max_total_bytes,
        used: 0,
        entries: 0,
        max_entries: MAX_ENTRIES,
        what: "output",
        tree: None,
        over_bounds: false,
    };
    walk.run(src_root, None)?;
    let mut contents = walk.memory.take().unwrap_or_default();
    contents.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(InMemory {
        report: walk.report,
        contents,
    })
}

/// A whole tree (a workspace) collected into memory by the same walk, checks and refusals as
/// [`collect`]: the report, every accepted folder and file in walk order (names sorted within
/// each folder, a folder before what it holds), and whether a bound (`max_total_bytes`,
/// `max_entries`, at most [`MAX_ENTRIES`]) refused something, i.e. the tree is incomplete.
pub(crate) fn walk_tree(
    src: BorrowedFd<'_>,
    max_total_bytes: u64,
    max_entries: usize,
) -> Result<(CollectReport, Vec<TreeEntry>, bool), CollectError> {
    let src_root = open_source(src)?;
    let mut walk = Walk {
        report: CollectReport::default(),
        dest: Path::new("(memory)"),
        memory: None,
        keep: None,
        budget: max_total_bytes,
        used: 0,
        entries: 0,
        max_entries: max_entries.min(MAX_ENTRIES),
        what: "workspace",
        tree: Some(Vec::new()),
        over_bounds: false,
    };
    walk.run(src_root, None)?;
    let tree = walk.tree.take().unwrap_or_default();
    Ok((walk.report, tree, walk.over_bounds))
}

impl Walk<'_> {
    /// The walk itself, from the source's root (and the staging folder's, unless in memory).
    fn run(&mut self, src_root: OwnedFd, dst_root: Option<OwnedFd>) -> Result<(), CollectError> {
        let names = match read_names(&src_root, self.max_entries + 1) {
            Ok(n) => n,
            Err(e) => return Err(CollectError::Source(e)),
        };
        let mut stack = vec![Frame {
            src: src_root,
            dst: dst_root,
            rel: Vec::new(),
            names: names.into_iter(),
        }];
        while let Some(frame) = stack.last_mut() {
            let Some(name) = frame.names.next() else {
                stack.pop();
                continue;
            };
            self.entries += 1;
            if self.entries > self.max_entries {
                let max = self.max_entries;
                self.over_bounds = true;
                self.reject(
                    &frame.rel,
                    &name,
                    format!("more than {max} entries; this and the rest were not collected"),
                );
                break;
            }
            if let Some(child) = self.entry(frame, &name)? {
                stack.push(child);
            }
        }
        self.report.files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(())
    }
}

/// Names in a directory except `.` and `..`, sorted, at most `limit` of them.
/// Whether the directory `dir` has any entry; true when that cannot be read (then
/// [`collect`] looks and reports why). Cheap: lets a caller skip making a staging folder.
pub fn has_entries(dir: BorrowedFd<'_>) -> bool {
    match dir.try_clone_to_owned() {
        Ok(d) => read_names(&d, 1).map(|n| !n.is_empty()).unwrap_or(true),
        Err(_) => true,
    }
}

fn read_names(dir: &OwnedFd, limit: usize) -> std::io::Result<Vec<Vec<u8>>> {
    let fd = rustix::fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = Dir::new(fd)?;
    let mut names = Vec::new();
    while let Some(entry) = d.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(name.to_vec());
        if names.len() >= limit {
            break;
        }
    }
    names.sort();
    Ok(names)
}

/// Why a name is unsafe, if it is: not UTF-8, a control or bidi character, `.`/`..`.
pub(crate) fn name_ok(name: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(name).ok()?;
    if s.is_empty() || s == "." || s == ".." || s.contains('/') || s.chars().any(is_unsafe_char) {
        return None;
    }
    Some(s)
}

fn kind_refused(t: FileType) -> &'static str {
    match t {
        FileType::Symlink => "symlink refused",
        FileType::Fifo => "FIFO refused",
        FileType::Socket => "socket refused",
        FileType::CharacterDevice | FileType::BlockDevice => "device node refused",
        _ => "unsupported file type refused",
    }
}

fn errno_reason(e: Errno, what: &str) -> String {
    match e {
        Errno::LOOP => "symlink refused".into(),
        Errno::XDEV => "mount point or path outside the output refused".into(),
        Errno::NOTDIR => "changed while being collected; refused".into(),
        other => format!("{what}: {}", std::io::Error::from(other)),
    }
}

impl Walk<'_> {
    fn reject(&mut self, rel: &[String], name: &[u8], reason: impl Into<String>) {
        if self.report.rejected.len() >= agentjail_manifest::report::MAX_REJECTED_LISTED {
            self.report.rejected_dropped += 1;
            return;
        }
        let mut path = rel.join("/");
        if !path.is_empty() {
            path.push('/');
        }
        path.push_str(&escape_name(name));
        self.report.rejected.push(RejectedFile {
            path,
            reason: reason.into(),
        });
    }

    fn staging_err(
        &self,
        rel: &[String],
        name: &str,
        e: impl Into<std::io::Error>,
    ) -> CollectError {
        let mut path = self.dest.to_owned();
        for c in rel {
            path.push(c);
        }
        path.push(name);
        CollectError::Staging {
            path,
            source: e.into(),
        }
    }

    /// Examines one entry of `frame`; returns a frame to descend into for an accepted directory.
    fn entry(&mut self, frame: &Frame, raw: &[u8]) -> Result<Option<Frame>, CollectError> {
        let Some(name) = name_ok(raw) else {
            self.reject(&frame.rel, raw, "unsafe name");
            return Ok(None);
        };
        let cname = match std::ffi::CString::new(raw) {
            Ok(c) => c,
            Err(_) => {
                self.reject(&frame.rel, raw, "unsafe name");
                return Ok(None);
            }
        };
        let before =
            match rustix::fs::statat(&frame.src, cname.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(s) => s,
                Err(e) => {
                    self.reject(&frame.rel, raw, errno_reason(e, "cannot examine"));
                    return Ok(None);
                }
            };
        let kind = FileType::from_raw_mode(before.st_mode);
        if !(kind.is_file() || kind.is_dir()) {
            self.reject(&frame.rel, raw, kind_refused(kind));
            return Ok(None);
        }
        if kind.is_dir() && frame.rel.len() + 1 >= MAX_DEPTH {
            self.reject(
                &frame.rel,
                raw,
                format!("directory nested deeper than {MAX_DEPTH} levels refused"),
            );
            return Ok(None);
        }
        let flags = if kind.is_dir() {
            open_flags() | OFlags::DIRECTORY
        } else {
            open_flags()
        };
        let fd = match rustix::fs::openat2(
            &frame.src,
            cname.as_c_str(),
            flags,
            Mode::empty(),
            RESOLVE,
        ) {
            Ok(fd) => fd,
            Err(e) => {
                self.reject(&frame.rel, raw, errno_reason(e, "cannot open"));
                return Ok(None);
            }
        };
        let after = match rustix::fs::fstat(&fd) {
            Ok(s) => s,
            Err(e) => {
                self.reject(&frame.rel, raw, errno_reason(e, "cannot examine"));
                return Ok(None);
            }
        };
        let kind_after = FileType::from_raw_mode(after.st_mode);
        if kind_after != kind || after.st_ino != before.st_ino || after.st_dev != before.st_dev {
            self.reject(&frame.rel, raw, "changed while being collected; refused");
            return Ok(None);
        }
        if kind.is_dir() {
            return self.enter_dir(frame, raw, name, &cname, fd);
        }
        if after.st_nlink > 1 {
            self.reject(&frame.rel, raw, "hard link refused");
            return Ok(None);
        }
        let exec = after.st_mode & 0o100 != 0;
        self.copy_file(frame, raw, name, &cname, fd, (after.st_size, exec))?;
        Ok(None)
    }

    fn enter_dir(
        &mut self,
        frame: &Frame,
        raw: &[u8],
        name: &str,
        cname: &CStr,
        src: OwnedFd,
    ) -> Result<Option<Frame>, CollectError> {
        let remaining = (self.max_entries + 1).saturating_sub(self.entries);
        let names = match read_names(&src, remaining.max(1)) {
            Ok(n) => n,
            Err(e) => {
                self.reject(&frame.rel, raw, format!("cannot read directory: {e}"));
                return Ok(None);
            }
        };
        let dst = match &frame.dst {
            None => None,
            Some(parent) => {
                rustix::fs::mkdirat(parent, cname, Mode::from_raw_mode(0o700))
                    .map_err(|e| self.staging_err(&frame.rel, name, e))?;
                Some(
                    rustix::fs::openat2(
                        parent,
                        cname,
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                        RESOLVE,
                    )
                    .map_err(|e| self.staging_err(&frame.rel, name, e))?,
                )
            }
        };
        if let Some(tree) = self.tree.as_mut() {
            tree.push(TreeEntry {
                path: join_rel(&frame.rel, name),
                dir: true,
                exec: true,
                content: Vec::new(),
            });
        }
        let mut rel = frame.rel.clone();
        rel.push(name.to_owned());
        Ok(Some(Frame {
            src,
            dst,
            rel,
            names: names.into_iter(),
        }))
    }

    fn copy_file(
        &mut self,
        frame: &Frame,
        raw: &[u8],
        name: &str,
        cname: &CStr,
        src: OwnedFd,
        (size, exec): (i64, bool),
    ) -> Result<(), CollectError> {
        let remaining = self.budget.saturating_sub(self.used);
        let too_big = format!("{} exceeds its limit of {} bytes", self.what, self.budget);
        if u64::try_from(size).map_or(true, |s| s > remaining) {
            self.over_bounds = true;
            self.reject(&frame.rel, raw, too_big);
            return Ok(());
        }
        // A staging file, or (in memory) a buffer that never holds more than the budget left.
        let mut out = match &frame.dst {
            Some(dst) => Staged::File(File::from(
                rustix::fs::openat(
                    dst,
                    cname,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| self.staging_err(&frame.rel, name, e))?,
            )),
            None if self.tree.is_some() => Staged::Memory(Some(Vec::new())),
            None => {
                let wanted = self.keep.as_deref() == Some(&*join_rel(&frame.rel, name));
                Staged::Memory(wanted.then(Vec::new))
            }
        };
        // Read at most one byte more than the budget allows, to notice a file that grew.
        let mut input = File::from(src).take(remaining.saturating_add(1));
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut copied: u64 = 0;
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    drop(out);
                    self.discard(frame, name, cname)?;
                    self.reject(&frame.rel, raw, format!("cannot read: {e}"));
                    return Ok(());
                }
            };
            copied += n as u64;
            if copied > remaining {
                drop(out);
                self.over_bounds = true;
                self.discard(frame, name, cname)?;
                self.reject(&frame.rel, raw, too_big);
                return Ok(());
            }
            let chunk = buf.get(..n).unwrap_or_default();
            hasher.update(chunk);
            out.write_all(chunk)
                .map_err(|e| self.staging_err(&frame.rel, name, e))?;
        }
        // No fsync: the staging folder is scratch space, rebuilt by a new run after a crash.
        self.used += copied;
        let path = join_rel(&frame.rel, name);
        match (self.memory.as_mut(), self.tree.as_mut(), out) {
            (Some(memory), _, Staged::Memory(Some(content))) => {
                memory.push((path.clone(), content))
            }
            (None, Some(tree), Staged::Memory(Some(content))) => tree.push(TreeEntry {
                path: path.clone(),
                dir: false,
                exec,
                content,
            }),
            _ => {}
        }
        self.report.files.push(OutputFile {
            path,
            bytes: copied,
            sha256: format!("sha256:{}", agentjail_manifest::hex(&hasher.finalize())),
        });
        Ok(())
    }

    /// Removes a partly copied staging file (a buffer in memory is simply dropped).
    fn discard(&self, frame: &Frame, name: &str, cname: &CStr) -> Result<(), CollectError> {
        match &frame.dst {
            Some(dst) => rustix::fs::unlinkat(dst, cname, AtFlags::empty())
                .map_err(|e| self.staging_err(&frame.rel, name, e)),
            None => Ok(()),
        }
    }
}

/// Where [`Walk::copy_file`] copies a file: a staging file, or in memory a buffer (`None`:
/// read and hashed, not kept).
enum Staged {
    File(File),
    Memory(Option<Vec<u8>>),
}

/// A relative path: `rel`'s components, then `name`.
fn join_rel(rel: &[String], name: &str) -> String {
    let mut path = rel.join("/");
    if !path.is_empty() {
        path.push('/');
    }
    path.push_str(name);
    path
}

impl Write for Staged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Staged::File(f) => f.write(buf),
            Staged::Memory(v) => {
                if let Some(v) = v {
                    v.extend_from_slice(buf);
                }
                Ok(buf.len())
            }
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Staged::File(f) => f.flush(),
            Staged::Memory(_) => Ok(()),
        }
    }
}

/// Opens `path` as an `O_DIRECTORY` descriptor suitable for [`collect`] (no symlink followed in
/// its last component). A convenience for callers and tests that start from a host path.
pub fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

#[cfg(test)]
mod tests;
