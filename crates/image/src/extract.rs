//! The untrusting tar extractor. Every entry is checked before anything is written:
//!
//! - names: UTF-8, relative, no `..` component, bounded length and depth (absolute paths and
//!   `..` refuse the whole import rather than being rewritten);
//! - every parent is opened component by component with `RESOLVE_BENEATH | NO_SYMLINKS`, so a
//!   symlink (from this layer or an earlier one) is never written through;
//! - files are created with `O_CREAT | O_EXCL | O_NOFOLLOW` after removing what was there;
//! - hard links must name a regular file this import already extracted (never one outside the
//!   tree, never a path not yet written);
//! - device nodes and FIFOs are dropped, setuid/setgid/sticky bits on files are cleared, extended
//!   attributes (file capabilities included) and ownership are never applied;
//! - entry count, per-file size, total size and decompressed stream size are bounded, judged on
//!   the headers before data is read (a 10 GB sparse file is refused on its header; GNU sparse
//!   entries are refused outright).
//!
//! In OCI mode, whiteouts (`.wh.NAME`) delete NAME from earlier layers and an opaque marker
//! (`.wh..wh..opq`) empties its directory of what earlier layers put there.

use std::collections::HashSet;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::bounds::{ImageError, Limits};
use crate::fsops;

fn refused(s: impl Into<String>) -> ImageError {
    ImageError::Refused(s.into())
}

fn esc(s: &str) -> String {
    format!("{s:?}")
}

/// A reader that refuses to yield more than `max` bytes in total.
pub struct Bounded<R> {
    pub inner: R,
    pub read: u64,
    pub max: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.max {
            return Err(io::Error::other(format!(
                "the archive stream is larger than {} bytes (after decompression)",
                self.max
            )));
        }
        Ok(n)
    }
}

/// Wraps a reader in a decompressor chosen by its magic bytes (gzip or none; zstd refused).
pub fn decompress<'a, R: Read + 'a>(mut r: R) -> Result<Box<dyn Read + 'a>, ImageError> {
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < magic.len() {
        let n = r
            .read(&mut magic[got..])
            .map_err(|e| ImageError::Io(format!("read archive: {e}")))?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let head = io::Cursor::new(magic[..got].to_vec());
    let chained = head.chain(r);
    if got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(chained)))
    } else if got == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd] {
        Err(refused(
            "zstd-compressed archives are not supported (use gzip or plain tar)",
        ))
    } else {
        Ok(Box::new(chained))
    }
}

pub struct Extractor<'l> {
    root: OwnedFd,
    limits: &'l Limits,
    oci: bool,
    pub entries: u64,
    pub total_bytes: u64,
    /// Regular files extracted by this import and still present: the only hard-link targets.
    files: HashSet<String>,
    /// Paths created by the current layer (an opaque marker keeps these).
    layer_created: HashSet<String>,
    /// Directories and their final modes, applied at the end (extraction needs u+rwx).
    dir_modes: Vec<(String, u32)>,
    /// What was not reproduced, one line each (bounded).
    pub dropped: Vec<String>,
    pub dropped_count: u64,
    /// The layer may only add: an entry whose name exists already is refused, except a
    /// directory over a directory (which keeps the mode it has). `image build`'s layer.
    add_only: bool,
}

impl<'l> Extractor<'l> {
    pub fn new(root: OwnedFd, limits: &'l Limits, oci: bool) -> Self {
        Extractor {
            root,
            limits,
            oci,
            entries: 0,
            total_bytes: 0,
            files: HashSet::new(),
            layer_created: HashSet::new(),
            dir_modes: Vec::new(),
            dropped: Vec::new(),
            dropped_count: 0,
            add_only: false,
        }
    }

    /// From the next archive on, entries may only add ([`Extractor::add_only`]), and hard
    /// links may name only files of that archive: what was extracted so far is the base.
    pub fn start_added_layer(&mut self) {
        self.add_only = true;
        self.files.clear();
    }

    fn drop_note(&mut self, s: String) {
        self.dropped_count += 1;
        if self.dropped.len() < 100 {
            self.dropped.push(s);
        }
    }

    /// Extracts one archive (one layer) on top of what is there.
    pub fn extract<R: Read>(&mut self, reader: R) -> Result<(), ImageError> {
        self.layer_created.clear();
        let bounded = Bounded {
            inner: reader,
            read: 0,
            max: self.limits.max_archive_bytes,
        };
        let mut ar = tar::Archive::new(bounded);
        let entries = ar
            .entries()
            .map_err(|e| refused(format!("malformed archive: {e}")))?;
        for e in entries {
            let mut e = e.map_err(|e| refused(format!("malformed archive: {e}")))?;
            self.entries += 1;
            if self.entries > self.limits.max_entries {
                return Err(refused(format!(
                    "more than {} entries; refusing (bound: max_entries)",
                    self.limits.max_entries
                )));
            }
            self.entry(&mut e)?;
        }
        Ok(())
    }

    fn entry<R: Read>(&mut self, e: &mut tar::Entry<'_, R>) -> Result<(), ImageError> {
        let raw = e.path_bytes().into_owned();
        let comps = self.components(&raw)?;
        let path = comps.join("/");
        let kind = e.header().entry_type();
        let mode = e.header().mode().unwrap_or(0o644);
        if let Ok(Some(exts)) = e.pax_extensions() {
            for x in exts.flatten() {
                if let Ok(k) = x.key()
                    && (k.starts_with("SCHILY.xattr.") || k.starts_with("LIBARCHIVE.xattr."))
                {
                    let k = k.to_string();
                    self.drop_note(format!(
                        "{}: extended attribute {} not applied",
                        esc(&path),
                        esc(&k)
                    ));
                }
            }
        }
        let Some(name) = comps.last().cloned() else {
            // The archive's root ("./"): nothing to create.
            return if kind.is_dir() {
                Ok(())
            } else {
                Err(refused(
                    "an entry names the root itself and is not a directory",
                ))
            };
        };
        let parent = &comps[..comps.len() - 1];
        if self.oci && name.starts_with(".wh.") {
            if name == ".wh..wh..opq" {
                return self.opaque(parent);
            }
            let target = &name[4..];
            if target.is_empty() || target == "." || target == ".." {
                return Err(refused(format!("{}: malformed whiteout", esc(&path))));
            }
            return self.whiteout(parent, target);
        }
        use tar::EntryType as T;
        if self.add_only
            && !matches!(
                kind,
                T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink
            )
            && let Some(dir) = self.dir(parent, false)?
            && let Ok(st) = fsops::lstat(dir.as_fd(), &name)
        {
            if kind.is_dir() && fsops::file_type(&st) == FileType::Directory {
                return Ok(());
            }
            return Err(refused(format!(
                "{} exists already: the layer may only add entries to its base",
                esc(&path)
            )));
        }
        match kind {
            T::Regular | T::Continuous => {
                let size = e
                    .header()
                    .entry_size()
                    .map_err(|err| refused(format!("{}: bad size field: {err}", esc(&path))))?;
                if size > self.limits.max_file_bytes {
                    return Err(refused(format!(
                        "{}: file of {size} bytes is larger than the bound of {} bytes (max_file_bytes)",
                        esc(&path),
                        self.limits.max_file_bytes
                    )));
                }
                if self.total_bytes.saturating_add(size) > self.limits.max_total_bytes {
                    return Err(refused(format!(
                        "{}: the image would exceed {} bytes in total (max_total_bytes)",
                        esc(&path),
                        self.limits.max_total_bytes
                    )));
                }
                self.total_bytes += size;
                if mode & 0o7000 != 0 {
                    self.drop_note(format!("{}: setuid/setgid/sticky bits cleared", esc(&path)));
                }
                self.write_file(parent, &name, &path, mode & 0o777, e, size)
            }
            T::Directory => self.make_dir(parent, &name, &path, mode),
            T::Symlink => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| refused(format!("{}: symlink without a target", esc(&path))))?
                    .into_owned();
                if target.is_empty() || target.len() > 4096 {
                    return Err(refused(format!(
                        "{}: symlink target empty or too long",
                        esc(&path)
                    )));
                }
                self.symlink(parent, &name, &path, &target)
            }
            T::Link => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| refused(format!("{}: hard link without a target", esc(&path))))?
                    .into_owned();
                let tcomps = self
                    .components(&target)
                    .map_err(|r| refused(format!("{}: hard link target: {r}", esc(&path))))?;
                self.hardlink(parent, &name, &path, &tcomps)
            }
            T::Char | T::Block | T::Fifo => {
                self.drop_note(format!("{}: device node or FIFO dropped", esc(&path)));
                Ok(())
            }
            T::GNUSparse => Err(refused(format!(
                "{}: GNU sparse entries are not supported",
                esc(&path)
            ))),
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink => Ok(()),
            other => Err(refused(format!(
                "{}: unsupported entry type {:?}",
                esc(&path),
                other.as_byte() as char
            ))),
        }
    }

    /// Splits an entry name into plain components; refuses absolute names, `..`, non-UTF-8 and
    /// over-long names.
    fn components(&self, raw: &[u8]) -> Result<Vec<String>, ImageError> {
        if raw.len() > self.limits.max_path_bytes {
            return Err(refused(format!(
                "an entry name is longer than {} bytes",
                self.limits.max_path_bytes
            )));
        }
        let s = std::str::from_utf8(raw).map_err(|_| {
            refused(format!(
                "entry name {} is not UTF-8",
                esc(&String::from_utf8_lossy(raw))
            ))
        })?;
        if s.contains('\0') {
            return Err(refused(format!("entry name {} contains NUL", esc(s))));
        }
        if s.starts_with('/') {
            return Err(refused(format!(
                "entry {}: absolute path; refusing (no entry may leave the image root)",
                esc(s)
            )));
        }
        let mut v = Vec::new();
        for c in s.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    return Err(refused(format!(
                        "entry {}: `..` component; refusing (no entry may leave the image root)",
                        esc(s)
                    )));
                }
                c if c.len() > 255 => {
                    return Err(refused(format!(
                        "entry {}: a component is longer than 255 bytes",
                        esc(s)
                    )));
                }
                c => v.push(c.to_string()),
            }
        }
        if v.len() > self.limits.max_depth {
            return Err(refused(format!(
                "entry {}: deeper than {} levels",
                esc(s),
                self.limits.max_depth
            )));
        }
        Ok(v)
    }

    /// Opens (O_PATH) the directory `comps` below the root, creating missing directories when
    /// `create`; never through a symlink. `Ok(None)` when it is missing and not created.
    fn dir(&mut self, comps: &[String], create: bool) -> Result<Option<OwnedFd>, ImageError> {
        let mut cur = fsops::open_dir_path(self.root.as_fd(), ".")
            .map_err(|e| ImageError::Io(format!("open the staging root: {e}")))?;
        for (i, c) in comps.iter().enumerate() {
            let so_far = comps[..=i].join("/");
            match fsops::open_dir_path(cur.as_fd(), c) {
                Ok(fd) => cur = fd,
                Err(e) if e.raw_os_error() == Some(libc_enoent()) => {
                    if !create {
                        return Ok(None);
                    }
                    rustix::fs::mkdirat(cur.as_fd(), c.as_str(), Mode::from_raw_mode(0o755))
                        .map_err(|e| ImageError::Io(format!("mkdir {}: {e}", esc(&so_far))))?;
                    self.layer_created.insert(so_far.clone());
                    cur = fsops::open_dir_path(cur.as_fd(), c)
                        .map_err(|e| ImageError::Io(format!("open {}: {e}", esc(&so_far))))?;
                }
                Err(e) => {
                    return Err(refused(format!(
                        "{} is a symlink or not a directory ({e}); refusing to write through it",
                        esc(&so_far)
                    )));
                }
            }
        }
        Ok(Some(cur))
    }

    fn forget_below(&mut self, path: &str) {
        let prefix = format!("{path}/");
        self.files.retain(|f| f != path && !f.starts_with(&prefix));
    }

    /// Removes whatever is at `name` in `parent` (so that the new entry is created, never
    /// opened through an existing symlink).
    fn clear(&mut self, parent: BorrowedFd<'_>, name: &str, path: &str) -> Result<(), ImageError> {
        fsops::remove_any(parent, std::ffi::OsStr::new(name))
            .map_err(|e| ImageError::Io(format!("replace {}: {e}", esc(path))))?;
        self.forget_below(path);
        Ok(())
    }

    fn write_file<R: Read>(
        &mut self,
        parent: &[String],
        name: &str,
        path: &str,
        mode: u32,
        data: &mut R,
        size: u64,
    ) -> Result<(), ImageError> {
        let Some(dir) = self.dir(parent, true)? else {
            return Err(ImageError::Io(format!("{}: parent missing", esc(path))));
        };
        self.clear(dir.as_fd(), name, path)?;
        let fd = rustix::fs::openat(
            dir.as_fd(),
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| ImageError::Io(format!("create {}: {e}", esc(path))))?;
        let mut f = std::fs::File::from(fd);
        let n = io::copy(&mut data.take(size), &mut f)
            .map_err(|e| refused(format!("{}: {e}", esc(path))))?;
        if n != size {
            return Err(refused(format!(
                "{}: archive ends inside the file ({n} of {size} bytes)",
                esc(path)
            )));
        }
        rustix::fs::fchmod(&f, Mode::from_raw_mode(mode))
            .map_err(|e| ImageError::Io(format!("chmod {}: {e}", esc(path))))?;
        self.files.insert(path.to_string());
        self.layer_created.insert(path.to_string());
        Ok(())
    }

    fn make_dir(
        &mut self,
        parent: &[String],
        name: &str,
        path: &str,
        mode: u32,
    ) -> Result<(), ImageError> {
        let Some(dir) = self.dir(parent, true)? else {
            return Err(ImageError::Io(format!("{}: parent missing", esc(path))));
        };
        match fsops::lstat(dir.as_fd(), name) {
            Ok(st) if fsops::file_type(&st) == FileType::Directory => {}
            Ok(_) => {
                self.clear(dir.as_fd(), name, path)?;
                self.mkdir(dir.as_fd(), name, path)?;
            }
            Err(_) => self.mkdir(dir.as_fd(), name, path)?,
        }
        if mode & 0o6000 != 0 {
            self.drop_note(format!("{}: setuid/setgid bits cleared", esc(path)));
        }
        self.dir_modes.push((path.to_string(), mode & 0o1777));
        self.layer_created.insert(path.to_string());
        Ok(())
    }

    fn mkdir(&mut self, dir: BorrowedFd<'_>, name: &str, path: &str) -> Result<(), ImageError> {
        rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755))
            .map_err(|e| ImageError::Io(format!("mkdir {}: {e}", esc(path))))
    }

    fn symlink(
        &mut self,
        parent: &[String],
        name: &str,
        path: &str,
        target: &[u8],
    ) -> Result<(), ImageError> {
        let Some(dir) = self.dir(parent, true)? else {
            return Err(ImageError::Io(format!("{}: parent missing", esc(path))));
        };
        self.clear(dir.as_fd(), name, path)?;
        // The target is stored as given and never followed here; inside the sandbox it
        // resolves against the sandbox's own root.
        rustix::fs::symlinkat(fsops::name_str(target), dir.as_fd(), name)
            .map_err(|e| ImageError::Io(format!("symlink {}: {e}", esc(path))))?;
        self.layer_created.insert(path.to_string());
        Ok(())
    }

    fn hardlink(
        &mut self,
        parent: &[String],
        name: &str,
        path: &str,
        target: &[String],
    ) -> Result<(), ImageError> {
        let tpath = target.join("/");
        let Some(tname) = target.last() else {
            return Err(refused(format!("{}: hard link to the root", esc(path))));
        };
        if !self.files.contains(&tpath) {
            return Err(refused(format!(
                "{}: hard link to {}, which is not a regular file this import already extracted; refusing",
                esc(path),
                esc(&tpath)
            )));
        }
        let Some(tdir) = self.dir(&target[..target.len() - 1], false)? else {
            return Err(refused(format!(
                "{}: hard link target {} is gone",
                esc(path),
                esc(&tpath)
            )));
        };
        match fsops::lstat(tdir.as_fd(), tname) {
            Ok(st) if fsops::file_type(&st) == FileType::RegularFile => {}
            _ => {
                return Err(refused(format!(
                    "{}: hard link target {} is not a regular file",
                    esc(path),
                    esc(&tpath)
                )));
            }
        }
        if tpath == path {
            return Ok(());
        }
        let Some(dir) = self.dir(parent, true)? else {
            return Err(ImageError::Io(format!("{}: parent missing", esc(path))));
        };
        self.clear(dir.as_fd(), name, path)?;
        rustix::fs::linkat(
            tdir.as_fd(),
            tname.as_str(),
            dir.as_fd(),
            name,
            AtFlags::empty(),
        )
        .map_err(|e| ImageError::Io(format!("link {}: {e}", esc(path))))?;
        self.files.insert(path.to_string());
        self.layer_created.insert(path.to_string());
        Ok(())
    }

    fn whiteout(&mut self, parent: &[String], target: &str) -> Result<(), ImageError> {
        let path = parent
            .iter()
            .map(String::as_str)
            .chain([target])
            .collect::<Vec<_>>()
            .join("/");
        if let Some(dir) = self.dir(parent, false)? {
            self.clear(dir.as_fd(), target, &path)?;
        }
        Ok(())
    }

    fn opaque(&mut self, dir_comps: &[String]) -> Result<(), ImageError> {
        let base = dir_comps.join("/");
        let Some(dir) = self.dir(dir_comps, true)? else {
            return Ok(());
        };
        let names = fsops::list(dir.as_fd())
            .map_err(|e| ImageError::Io(format!("list {}: {e}", esc(&base))))?;
        for n in names {
            let n = String::from_utf8_lossy(&n).into_owned();
            let child = if base.is_empty() {
                n.clone()
            } else {
                format!("{base}/{n}")
            };
            if !self.layer_created.contains(&child) {
                self.clear(dir.as_fd(), &n, &child)?;
            }
        }
        Ok(())
    }

    /// Applies the directories' final modes (deepest first).
    pub fn finish(&mut self) -> Result<(), ImageError> {
        let mut modes = std::mem::take(&mut self.dir_modes);
        modes.sort_by_key(|(p, _)| std::cmp::Reverse(p.matches('/').count()));
        for (p, mode) in modes {
            if let Ok(fd) =
                fsops::open_beneath(self.root.as_fd(), &p, OFlags::RDONLY | OFlags::DIRECTORY)
            {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
                    .map_err(|e| ImageError::Io(format!("chmod {}: {e}", esc(&p))))?;
            }
        }
        Ok(())
    }
}

fn libc_enoent() -> i32 {
    rustix::io::Errno::NOENT.raw_os_error()
}
