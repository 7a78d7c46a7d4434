//! Input roots (stdio only, `--input-root`): the host folders from which `upload_input` may
//! read a file by `path`, and that read, which never leaves them.

/// A host directory an stdio caller may name inputs in (`agentjail mcp --input-root DIR`).
pub struct InputRoot {
    /// The directory, canonical (symlinks resolved at start-up).
    pub path: std::path::PathBuf,
    /// The directory, opened (`O_PATH`): every read resolves beneath this descriptor.
    dir: rustix::fd::OwnedFd,
}

impl InputRoot {
    /// Opens `dir` as an input root; it must be a directory.
    pub fn open(dir: &std::path::Path) -> Result<InputRoot, String> {
        use rustix::fs::{Mode, OFlags};
        let path = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let fd = rustix::fs::open(
            &path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("{}: {e} (not a directory?)", path.display()))?;
        Ok(InputRoot { path, dir: fd })
    }
}

/// Reads the file a tool call names by `path` below one of `roots`: an absolute path must lie
/// below a root; a relative one is taken below the first root. Resolution never leaves the
/// root (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`: no `..` out, no absolute
/// symlink, no symlink pointing out, no `/proc` magic link), as the process's own user. Only a
/// regular file of at most `max` bytes is read: the file is first opened `O_PATH` (which never
/// blocks or has side effects on a FIFO or device) and checked, then opened for reading
/// (`O_NONBLOCK`) and checked to be the same file. Returns the content and the file's name.
pub fn read_beneath(roots: &[InputRoot], p: &str, max: u64) -> Result<(Vec<u8>, String), String> {
    use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
    use std::io::Read;
    if p.is_empty() || p.len() > 4096 || p.contains('\0') {
        return Err("not a usable path".into());
    }
    let path = std::path::Path::new(p);
    let (root, rel) = if path.is_absolute() {
        roots
            .iter()
            .find_map(|r| path.strip_prefix(&r.path).ok().map(|rel| (r, rel)))
            .ok_or("outside the input roots")?
    } else {
        (roots.first().ok_or("no input roots")?, path)
    };
    if rel.as_os_str().is_empty() {
        return Err("not a regular file".into());
    }
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    let open = |flags: OFlags| {
        rustix::fs::openat2(&root.dir, rel, flags | OFlags::CLOEXEC, Mode::empty(), how).map_err(
            |e| match e {
                rustix::io::Errno::XDEV => "it resolves outside the input roots".to_string(),
                rustix::io::Errno::LOOP => "too many symlinks, or a magic link".to_string(),
                rustix::io::Errno::NOENT => "no such file".to_string(),
                rustix::io::Errno::NOSYS => {
                    "this kernel has no openat2 (Linux 5.6+); reading by path is refused"
                        .to_string()
                }
                e => format!("cannot open: {e}"),
            },
        )
    };
    let regular =
        |st: &rustix::fs::Stat| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
    let first = open(OFlags::PATH)?;
    let st = rustix::fs::fstat(&first).map_err(|e| format!("cannot stat: {e}"))?;
    if !regular(&st) {
        return Err("not a regular file".into());
    }
    if st.st_size as u64 > max {
        return Err(format!("larger than the limit of {max} bytes"));
    }
    let fd = open(OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)?;
    let st2 = rustix::fs::fstat(&fd).map_err(|e| format!("cannot stat: {e}"))?;
    if !regular(&st2) || (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) {
        return Err("the file changed while it was opened".into());
    }
    let mut buf = Vec::new();
    std::fs::File::from(fd)
        .take(max.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read: {e}"))?;
    if buf.len() as u64 > max {
        return Err(format!("larger than the limit of {max} bytes"));
    }
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok((buf, upload_name(&name)))
}

/// A file name as an upload name (`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$`).
pub(super) fn upload_name(n: &str) -> String {
    let mut s: String = n
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '_');
        s.truncate(128);
    }
    s
}
