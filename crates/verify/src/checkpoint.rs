//! Workspace checkpoints: a sandbox's `/work` as a deterministic, bounded, hashed archive.
//!
//! [`build`] collects the tree with the same untrusting walk as `/output` ([`crate::collect`]:
//! no symlink followed, no FIFO, socket or device opened, hard links and unsafe names refused,
//! depth, entries and bytes bounded) and writes what passed as a tar archive (GNU headers, long
//! names as GNU long-name entries) in walk order (names sorted within each folder, a folder
//! before what it holds), every entry with uid and gid 0, no owner names, mtime 0, and mode
//! 0755 (folders, and files with the owner's exec bit) or 0644. Equal trees therefore give
//! equal bytes and an equal sha256. A tree over its bounds gives no archive at all, never a
//! partial one.
//!
//! [`check`] reads an archive that is to be restored, trusting nothing: only regular files and
//! folders, each name relative, made of printable UTF-8 components without `.` or `..`, at
//! most [`MAX_DEPTH`] deep, once, below a folder listed before it, within the entry and byte
//! bounds; anything else refuses the whole archive with a one-line reason. [`extract`] checks
//! again and creates the entries below a directory descriptor only, each relative to its
//! parent's descriptor, opened with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`
//! and created with `O_EXCL | O_NOFOLLOW`.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::fd::{BorrowedFd, OwnedFd};

use agentjail_manifest::report::{RejectedFile, WorkspaceReport};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use sha2::{Digest, Sha256};

use crate::collect::{CollectError, MAX_DEPTH, walk_tree};

/// A collected checkpoint: the report's `workspace` object (without `restored_sha256`) and
/// the archive, when the tree was within its bounds.
#[derive(Debug, Default)]
pub struct Checkpoint {
    pub report: WorkspaceReport,
    pub archive: Option<Vec<u8>>,
}

/// Collects the tree below `src` (an `O_DIRECTORY` descriptor of the sandbox's `/work`, whose
/// processes are all dead) into a checkpoint of at most `max_bytes` of file content and
/// `max_entries` entries. Refused entries are listed; a bound exceeded leaves `archive` and
/// `sha256` empty, with the reason listed. `Err` only when `src` itself cannot be read.
pub fn build(
    src: BorrowedFd<'_>,
    max_bytes: u64,
    max_entries: usize,
) -> Result<Checkpoint, CollectError> {
    let (collected, tree, over) = walk_tree(src, max_bytes, max_entries)?;
    let mut report = WorkspaceReport {
        rejected: collected.rejected,
        rejected_dropped: collected.rejected_dropped,
        ..WorkspaceReport::default()
    };
    if over {
        // The whole-checkpoint refusal is always listed, within the 256 listed.
        if report.rejected.len() >= agentjail_manifest::report::MAX_REJECTED_LISTED
            && report.rejected.pop().is_some()
        {
            report.rejected_dropped += 1;
        }
        report.rejected.push(RejectedFile {
            path: String::new(),
            reason: format!(
                "the workspace is over its bounds ({max_bytes} bytes, {max_entries} entries): no checkpoint was made"
            ),
        });
        return Ok(Checkpoint {
            report,
            archive: None,
        });
    }
    let mut tar = tar::Builder::new(Vec::new());
    for e in &tree {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_mode(if e.exec { 0o755 } else { 0o644 });
        h.set_size(e.content.len() as u64);
        h.set_entry_type(if e.dir {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        if !e.dir {
            report.files += 1;
            report.bytes += e.content.len() as u64;
        }
        // Names come from the walk: relative, components checked; `append_data` writes a
        // long one as a GNU long-name entry.
        tar.append_data(&mut h, &e.path, &e.content[..])
            .map_err(CollectError::Source)?;
    }
    let archive = tar.into_inner().map_err(CollectError::Source)?;
    report.sha256 = Some(crate::digest::bytes_digest(&archive));
    Ok(Checkpoint {
        report,
        archive: Some(archive),
    })
}

/// One entry of a checked archive: its relative path components, whether it is a folder, its
/// exec bit, and where its content lies in the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: Vec<String>,
    pub dir: bool,
    pub exec: bool,
    pub offset: u64,
    pub len: u64,
}

/// Checks an archive to be restored (see the module) and lists its entries; `Err` is the one
/// reason it is refused.
pub fn check(archive: &[u8], max_bytes: u64, max_entries: usize) -> Result<Vec<Entry>, String> {
    let mut ar = tar::Archive::new(archive);
    let entries = ar
        .entries()
        .map_err(|e| format!("not a tar archive: {e}"))?;
    let mut seen: HashSet<Vec<String>> = HashSet::new();
    let mut dirs: HashSet<Vec<String>> = HashSet::new();
    let mut out = Vec::new();
    let mut bytes = 0u64;
    for entry in entries {
        let entry = entry.map_err(|e| format!("not a valid tar archive: {e}"))?;
        let raw = entry.path_bytes().into_owned();
        let shown = crate::text::escape_name(&raw);
        let refuse = |why: &str| Err(format!("entry `{shown}`: {why}"));
        if out.len() >= max_entries {
            return Err(format!("more than {max_entries} entries"));
        }
        let kind = entry.header().entry_type();
        let dir = match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => false,
            tar::EntryType::Directory => true,
            tar::EntryType::Symlink => return refuse("symlink refused"),
            tar::EntryType::Link => return refuse("hard link refused"),
            tar::EntryType::Fifo => return refuse("FIFO refused"),
            tar::EntryType::Char | tar::EntryType::Block => return refuse("device node refused"),
            _ => return refuse("unsupported entry type refused (only files and folders)"),
        };
        if raw.first() == Some(&b'/') {
            return refuse("absolute path refused");
        }
        let trimmed = if dir {
            raw.strip_suffix(b"/").unwrap_or(&raw)
        } else {
            &raw[..]
        };
        let mut path = Vec::new();
        for c in trimmed.split(|b| *b == b'/') {
            if c == b".." {
                return refuse("`..` refused");
            }
            match crate::collect::name_ok(c) {
                Some(s) => path.push(s.to_owned()),
                None => return refuse("unsafe or empty name component refused"),
            }
        }
        if path.len() > MAX_DEPTH || (dir && path.len() >= MAX_DEPTH) {
            return refuse(&format!("nested deeper than {MAX_DEPTH} levels refused"));
        }
        if !seen.insert(path.clone()) {
            return refuse("duplicate entry refused");
        }
        if path.len() > 1 && !dirs.contains(&path[..path.len() - 1]) {
            return refuse("its folder is not listed before it in the archive");
        }
        let len = entry
            .header()
            .size()
            .map_err(|e| format!("entry `{shown}`: {e}"))?;
        if dir && len != 0 {
            return refuse("a folder with content refused");
        }
        bytes = bytes.saturating_add(len);
        if bytes > max_bytes {
            return refuse(&format!(
                "over the workspace's limit of {max_bytes} bytes of content"
            ));
        }
        let mode = entry
            .header()
            .mode()
            .map_err(|e| format!("entry `{shown}`: {e}"))?;
        if dir {
            dirs.insert(path.clone());
        }
        out.push(Entry {
            path,
            dir,
            exec: dir || mode & 0o100 != 0,
            offset: entry.raw_file_position(),
            len,
        });
    }
    Ok(out)
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Checks `archive` ([`check`]) and creates its entries below `dir` (an `O_DIRECTORY`
/// descriptor of an empty `/work`): folders 0755, files 0644 or 0755, owned by the caller.
/// Every entry is created relative to its parent's descriptor, opened beneath `dir` without
/// following any link or crossing a mount, and with `O_EXCL | O_NOFOLLOW`.
pub fn extract(
    archive: &[u8],
    dir: BorrowedFd<'_>,
    max_bytes: u64,
    max_entries: usize,
) -> Result<(), String> {
    let entries = check(archive, max_bytes, max_entries)?;
    for e in &entries {
        let shown = e.path.join("/");
        let fail = |what: &str, err: rustix::io::Errno| {
            format!("entry `{shown}`: {what}: {}", std::io::Error::from(err))
        };
        let (name, parents) = match e.path.split_last() {
            Some(x) => x,
            None => return Err("an entry without a name".into()),
        };
        let parent: Option<OwnedFd> = if parents.is_empty() {
            None
        } else {
            Some(
                rustix::fs::openat2(
                    dir,
                    parents.join("/"),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    RESOLVE,
                )
                .map_err(|err| fail("opening its folder", err))?,
            )
        };
        let at = match &parent {
            Some(p) => std::os::fd::AsFd::as_fd(p),
            None => dir,
        };
        if e.dir {
            rustix::fs::mkdirat(at, name.as_str(), Mode::from_raw_mode(0o755))
                .map_err(|err| fail("mkdir", err))?;
            continue;
        }
        let mode = if e.exec { 0o755 } else { 0o644 };
        let fd = rustix::fs::openat(
            at,
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(|err| fail("create", err))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|err| fail("chmod", err))?;
        let start = usize::try_from(e.offset).map_err(|_| format!("entry `{shown}`: offset"))?;
        let end = start.saturating_add(usize::try_from(e.len).unwrap_or(usize::MAX));
        let data = archive
            .get(start..end)
            .ok_or_else(|| format!("entry `{shown}`: content cut short"))?;
        let mut f = std::fs::File::from(fd);
        f.write_all(data)
            .map_err(|err| format!("entry `{shown}`: write: {err}"))?;
    }
    Ok(())
}

/// The sha256 of a reader's bytes, `sha256:<hex>`, reading at most `max` bytes (more is an
/// error): the digest of a checkpoint file as it is read, once.
pub fn read_bounded(mut r: impl Read, max: u64) -> std::io::Result<(Vec<u8>, String)> {
    let mut bytes = Vec::new();
    r.by_ref()
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "larger than {max} bytes, more than a checkpoint within the workspace's bounds can be"
        )));
    }
    let sha = format!(
        "sha256:{}",
        agentjail_manifest::hex(&Sha256::digest(&bytes))
    );
    Ok((bytes, sha))
}

#[cfg(test)]
mod tests;
