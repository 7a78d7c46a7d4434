//! The digests agentjail signs: of a stream, a file, and a folder (a *tree*). Every function
//! here either returns the digest of everything it was asked to describe or an error; nothing
//! that could not be read is ever hashed as if it were empty.
//!
//! Digests are written `sha256:<64 lower-case hex digits>` ([`agentjail_manifest::sha256_digest`]
//! and [`agentjail_manifest::hex`] are the one encoder).
//!
//! ## The tree digest (format `agentjail-tree-v2`)
//!
//! sha256 over the byte string
//!
//! ```text
//! "agentjail-tree-v2\0"  then, for every entry below the folder (the folder itself is not an
//!                        entry), depth first, the entries of each folder sorted by the raw bytes
//!                        of their names:
//!     tag (1 byte)  len(path) (8 bytes, big endian)  path (raw bytes)  body
//! ```
//!
//! `path` is the entry's path relative to the folder, its components joined by `/`, as the raw
//! bytes of the names (no UTF-8 conversion). `tag` and `body`:
//!
//! | tag   | entry          | body                                                        |
//! |-------|----------------|-------------------------------------------------------------|
//! | `D`   | folder         | none (its entries follow)                                   |
//! | `F`   | regular file   | the 32 raw bytes of sha256 of its content                   |
//! | `L`   | symbolic link  | len(target) (8 bytes, big endian) and the target's raw bytes (not followed) |
//! | `O`   | anything else (FIFO, socket, device) | none (never opened)                   |
//!
//! Every field has a fixed size or a length prefix, so the byte string decodes in exactly one
//! way, and two different trees (names, kinds, contents or link targets) give two different
//! byte strings. The format it replaces (`v1`, lines such as `F <lossy UTF-8 path> <digest>\n`)
//! was not injective: a name containing a newline or invalid UTF-8 could make two trees hash the
//! same.
//!
//! A folder deeper than [`MAX_TREE_DEPTH`] levels, or any entry that cannot be listed, examined,
//! opened or read, is an error.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// How many folder levels a tree digest descends; a deeper tree is an error.
pub const MAX_TREE_DEPTH: usize = 256;

const TREE_DOMAIN: &[u8] = b"agentjail-tree-v2\0";

/// Why a digest could not be made: what was being done, to which path, and the OS's answer.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} {}: {source}", crate::text::printable(&path.to_string_lossy(), 200))]
pub struct DigestError {
    /// What failed: "open", "read", "list", "examine", "read the link".
    pub what: &'static str,
    /// The path it failed on.
    pub path: PathBuf,
    /// The OS error (or a description of the refusal).
    #[source]
    pub source: std::io::Error,
}

fn fail<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DigestError + 'a {
    move |source| DigestError {
        what,
        path: path.to_owned(),
        source,
    }
}

/// Feeds everything `r` yields into `h`; an error other than EINTR is returned, never skipped.
pub fn hash_reader(r: &mut impl Read, h: &mut Sha256) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => {
                h.update(buf.get(..n).unwrap_or_default());
                total = total.saturating_add(n as u64);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The raw sha256 of a regular file's content. The file is opened without blocking (a FIFO
/// cannot stall it) and must be a regular file.
fn file_sha256(p: &Path) -> Result<[u8; 32], DigestError> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(o_nonblock())
        .open(p)
        .map_err(fail("open", p))?;
    let m = f.metadata().map_err(fail("examine", p))?;
    if !m.is_file() {
        return Err(fail("read", p)(std::io::Error::other(
            "not a regular file or folder",
        )));
    }
    let mut h = Sha256::new();
    hash_reader(&mut f, &mut h).map_err(fail("read", p))?;
    Ok(h.finalize().into())
}

/// O_NONBLOCK, from rustix (the crate already used here) rather than a new libc dependency.
fn o_nonblock() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits() as i32
}

/// `sha256:<hex>` of a regular file's content.
pub fn file_digest(p: &Path) -> Result<String, DigestError> {
    Ok(format!(
        "sha256:{}",
        agentjail_manifest::hex(&file_sha256(p)?)
    ))
}

/// `sha256:<hex>` of bytes held in memory: what [`file_digest`] gives for a file of them (an
/// inline input's digest).
pub fn bytes_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", agentjail_manifest::hex(&Sha256::digest(bytes)))
}

/// `sha256:<hex>` of the tree below the folder `dir`, in the `agentjail-tree-v2` format (see
/// the module documentation).
pub fn tree_digest(dir: &Path) -> Result<String, DigestError> {
    let mut h = Sha256::new();
    h.update(TREE_DOMAIN);
    walk(dir, &[], &mut h, 0)?;
    Ok(format!("sha256:{}", agentjail_manifest::hex(&h.finalize())))
}

/// The digest of an input: a regular file's content digest, or a folder's tree digest. The
/// input path itself is followed if it is a symlink (it was resolved when the manifest was
/// validated); nothing below it is.
pub fn input_digest(p: &Path) -> Result<String, DigestError> {
    let m = std::fs::metadata(p).map_err(fail("examine", p))?;
    if m.is_dir() {
        tree_digest(p)
    } else {
        file_digest(p)
    }
}

fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

fn walk(dir: &Path, rel: &[u8], h: &mut Sha256, depth: usize) -> Result<(), DigestError> {
    if depth >= MAX_TREE_DEPTH {
        return Err(fail("list", dir)(std::io::Error::other(format!(
            "deeper than {MAX_TREE_DEPTH} levels"
        ))));
    }
    let mut entries = Vec::new();
    for e in std::fs::read_dir(dir).map_err(fail("list", dir))? {
        entries.push(e.map_err(fail("list", dir))?.file_name());
    }
    entries.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in entries {
        let path = dir.join(&name);
        let mut r = rel.to_vec();
        if !r.is_empty() {
            r.push(b'/');
        }
        r.extend_from_slice(name.as_bytes());
        let ft = std::fs::symlink_metadata(&path)
            .map_err(fail("examine", &path))?
            .file_type();
        if ft.is_symlink() {
            let t = std::fs::read_link(&path).map_err(fail("read the link", &path))?;
            h.update(b"L");
            field(h, &r);
            field(h, t.as_os_str().as_bytes());
        } else if ft.is_dir() {
            h.update(b"D");
            field(h, &r);
            walk(&path, &r, h, depth + 1)?;
        } else if ft.is_file() {
            let d = file_sha256(&path)?;
            h.update(b"F");
            field(h, &r);
            h.update(d);
        } else {
            debug_assert!(
                ft.is_fifo() || ft.is_socket() || ft.is_block_device() || ft.is_char_device()
            );
            h.update(b"O");
            field(h, &r);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    fn tree(build: impl FnOnce(&Path)) -> (tempfile::TempDir, String) {
        let d = tempfile::tempdir().unwrap();
        build(d.path());
        let digest = tree_digest(d.path()).unwrap();
        (d, digest)
    }

    #[test]
    fn a_missing_file_is_an_error_not_the_empty_digest() {
        let d = tempfile::tempdir().unwrap();
        let e = file_digest(&d.path().join("gone")).unwrap_err();
        assert_eq!(e.what, "open");
        assert!(e.to_string().contains("gone"), "{e}");
        let e = input_digest(&d.path().join("gone")).unwrap_err();
        assert!(e.to_string().starts_with("cannot examine"), "{e}");
    }

    #[test]
    fn a_read_error_is_an_error_not_a_partial_digest() {
        // /proc/self/mem is a regular file whose read at offset 0 fails (EIO: page 0 is not
        // mapped), after a successful open.
        let e = file_digest(Path::new("/proc/self/mem")).unwrap_err();
        assert_eq!(e.what, "read", "{e}");
    }

    #[test]
    fn a_fifo_input_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &p, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        let e = input_digest(&p).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // Inside a tree it is recorded by kind, never opened.
        tree_digest(d.path()).unwrap();
    }

    #[test]
    fn an_unlistable_subfolder_fails_the_tree() {
        // A folder entry that vanishes between listing and examining is an error: simulate
        // with a symlink-free path that is not there.
        let d = tempfile::tempdir().unwrap();
        let e = tree_digest(&d.path().join("nope")).unwrap_err();
        assert_eq!(e.what, "list");
    }

    #[test]
    fn names_with_newlines_or_invalid_utf8_do_not_collide() {
        let (_a, a) = tree(|p| std::fs::create_dir(p.join("a\nD b")).unwrap());
        let (_b, b) = tree(|p| {
            std::fs::create_dir(p.join("a")).unwrap();
            std::fs::create_dir(p.join("b")).unwrap();
        });
        assert_ne!(a, b);
        let (_c, c) = tree(|p| {
            std::fs::write(p.join(OsStr::from_bytes(b"\xff")), b"x").unwrap();
        });
        let (_d, d) = tree(|p| {
            std::fs::write(p.join(OsStr::from_bytes(b"\xfe")), b"x").unwrap();
        });
        assert_ne!(c, d);
        // A file in a folder and a file whose name holds the slash-joined path cannot exist
        // (names have no '/'), but a folder "a" with file "b" differs from a folder "a/b"-less
        // tree with file "a" holding the same bytes.
        let (_e, e) = tree(|p| {
            std::fs::create_dir(p.join("a")).unwrap();
            std::fs::write(p.join("a/b"), b"x").unwrap();
        });
        let (_f, f) = tree(|p| std::fs::write(p.join("a"), b"x").unwrap());
        assert_ne!(e, f);
    }

    #[test]
    fn kinds_contents_and_targets_are_all_part_of_the_digest() {
        let (_a, file) = tree(|p| std::fs::write(p.join("n"), b"t").unwrap());
        let (_b, other) = tree(|p| std::fs::write(p.join("n"), b"u").unwrap());
        let (_c, link) = tree(|p| std::os::unix::fs::symlink("t", p.join("n")).unwrap());
        let (_d, link2) = tree(|p| std::os::unix::fs::symlink("u", p.join("n")).unwrap());
        let (_e, dir) = tree(|p| std::fs::create_dir(p.join("n")).unwrap());
        let all = [&file, &other, &link, &link2, &dir];
        for (i, x) in all.iter().enumerate() {
            for y in all.iter().skip(i + 1) {
                assert_ne!(x, y);
            }
        }
        // Stable: the same tree twice gives the same digest.
        let (_g, again) = tree(|p| std::fs::write(p.join("n"), b"t").unwrap());
        assert_eq!(file, again);
    }

    #[test]
    fn the_format_is_the_documented_byte_string() {
        // One folder "d" holding file "f" with content "x", and a symlink "l" -> "t".
        let (_t, got) = tree(|p| {
            std::fs::create_dir(p.join("d")).unwrap();
            std::fs::write(p.join("d/f"), b"x").unwrap();
            std::os::unix::fs::symlink("t", p.join("l")).unwrap();
        });
        let mut want = b"agentjail-tree-v2\0".to_vec();
        want.extend(b"D");
        want.extend(1u64.to_be_bytes());
        want.extend(b"d");
        want.extend(b"F");
        want.extend(3u64.to_be_bytes());
        want.extend(b"d/f");
        want.extend(Sha256::digest(b"x"));
        want.extend(b"L");
        want.extend(1u64.to_be_bytes());
        want.extend(b"l");
        want.extend(1u64.to_be_bytes());
        want.extend(b"t");
        assert_eq!(got, agentjail_manifest::sha256_digest(&want));
    }

    #[test]
    fn too_deep_a_tree_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let mut p = d.path().to_owned();
        for _ in 0..MAX_TREE_DEPTH + 1 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        let e = tree_digest(d.path()).unwrap_err();
        assert!(e.to_string().contains("deeper than"), "{e}");
    }
}
