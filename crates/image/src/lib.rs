//! # agentjail-image
//!
//! A content-addressed local store of root images that a manifest pins by digest
//! (`image: sha256:…`). See `docs/images.md` for the layout, the import safety rules (each
//! attack and its defence) and how verification works.
//!
//! - [`Store::import`] takes an OCI image layout (a directory or a tar of one) or a plain root
//!   file system (a directory or a tarball, gzip or not). Every OCI blob is copied into private
//!   staging while its sha256 and size are checked against its descriptor, before it is parsed
//!   or unpacked; layers are unpacked in order by an untrusting extractor ([`extract`]) into a
//!   staging directory that is renamed into place only when everything passed.
//! - The image digest is the OCI image manifest's digest, or for a plain root file system the
//!   sha256 of its canonical file list ([`tree`]).
//! - [`Store::resolve`] (every run) compares a cheap metadata fingerprint, keyed with the store key kept outside the store; [`Store::verify`]
//!   re-hashes every file against the recorded file list.

mod bounds;
pub mod extract;
mod fsops;
pub mod layout;
pub mod tree;

pub use bounds::{ImageError, Limits};

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, OFlags};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Schema tag of a store record.
pub const RECORD_SCHEMA: &str = "agentjail.image/v1";
/// Environment variable naming the store directory.
pub const STORE_ENV: &str = "AGENTJAIL_IMAGE_STORE";
/// Environment variable naming the store's fingerprint key file (default: `<store>.key`, next
/// to the store directory, outside it).
pub const KEY_ENV: &str = "AGENTJAIL_IMAGE_KEY";
/// Prefix of a keyed fingerprint in a record.
const KEYED: &str = "hmac-sha256:";

/// A stored image whose record cannot be read (`agentjail image ls` lists it as such).
#[derive(Debug, thiserror::Error)]
#[error("{digest}: incomplete or damaged: {error}")]
pub struct Incomplete {
    pub digest: String,
    #[source]
    pub error: ImageError,
}

/// What the store knows about one image (`images/<hex>/image.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageRecord {
    /// Always `agentjail.image/v1`.
    pub schema: String,
    /// `sha256:<hex>`: the OCI image manifest digest, or the content digest of a plain rootfs.
    pub digest: String,
    /// `oci`, `rootfs-dir` or `rootfs-tar`.
    pub kind: String,
    /// The path it was imported from (informational).
    pub source: String,
    /// RFC 3339 instant of the import.
    pub created: String,
    /// sha256 of the canonical file list (`files.txt`).
    pub content_digest: String,
    /// `hmac-sha256:<hex>`: HMAC-SHA256, keyed with the store's key (kept outside the store,
    /// 0600), over the image digest and the sha256 of every entry's (path, mode, size, mtime,
    /// ctime, inode) after import.
    pub fingerprint: String,
    pub entries: u64,
    pub bytes: u64,
    /// Layer digests, in order (OCI only).
    #[serde(default)]
    pub layers: Vec<String>,
    /// What the import did not reproduce (devices, FIFOs, setuid bits, xattrs), first 100.
    #[serde(default)]
    pub dropped: Vec<String>,
    #[serde(default)]
    pub dropped_count: u64,
}

/// Result of [`Store::import`].
#[derive(Debug, Clone)]
pub struct Imported {
    pub record: ImageRecord,
    /// The image was already in the store (the new copy was discarded).
    pub already_present: bool,
}

/// Result of [`Store::verify`].
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    pub digest: String,
    pub ok: bool,
    /// The recorded file list still hashes to the record's `content_digest`.
    pub record_intact: bool,
    /// The cheap per-run check (metadata fingerprint) still matches.
    pub fingerprint_ok: bool,
    /// `changed: PATH`, `added: PATH`, `removed: PATH` (first 200).
    pub changes: Vec<String>,
}

/// Checks the form `sha256:<64 lowercase hex>` and returns the hex part.
pub fn parse_digest(d: &str) -> Result<&str, ImageError> {
    let hex = d.strip_prefix("sha256:").ok_or_else(|| {
        ImageError::BadDigest(format!(
            "{d:?}: digests have the form sha256:<64 hex digits>"
        ))
    })?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(ImageError::BadDigest(format!(
            "{d:?}: digests have the form sha256:<64 lowercase hex digits>"
        )));
    }
    Ok(hex)
}

fn io_err(ctx: &str) -> impl Fn(std::io::Error) -> ImageError + '_ {
    move |e| ImageError::Io(format!("{ctx}: {e}"))
}

/// The content-addressed store.
///
/// Layout: `images/<hex>/{rootfs/, image.json, files.txt}`, staging in `tmp/` (same file
/// system, so that the final rename is atomic). The store directory is created 0700.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// `$AGENTJAIL_IMAGE_STORE`, else `$XDG_DATA_HOME/agentjail/images`, else
    /// `~/.local/share/agentjail/images`.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os(STORE_ENV).filter(|v| !v.is_empty()) {
            return PathBuf::from(d);
        }
        if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
            return PathBuf::from(d).join("agentjail/images");
        }
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
        PathBuf::from(home).join(".local/share/agentjail/images")
    }

    /// The store at `dir` (or the default), without creating anything.
    pub fn at(dir: Option<&Path>) -> Store {
        Store {
            root: dir
                .map(Path::to_path_buf)
                .unwrap_or_else(Store::default_dir),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The fingerprint key: `$AGENTJAIL_IMAGE_KEY`, else `<store>.key` beside the store
    /// directory (the store's real path, symlinks resolved), never inside it.
    pub fn key_path(&self) -> Result<PathBuf, ImageError> {
        if let Some(k) = std::env::var_os(KEY_ENV).filter(|v| !v.is_empty()) {
            return Ok(PathBuf::from(k));
        }
        let real = std::fs::canonicalize(&self.root)
            .map_err(io_err(&format!("image store {}", self.root.display())))?;
        let name = real.file_name().ok_or_else(|| {
            ImageError::Io(format!(
                "image store {}: the store cannot be the root directory",
                real.display()
            ))
        })?;
        let mut key = name.to_os_string();
        key.push(".key");
        Ok(real.with_file_name(key))
    }

    /// Reads the key, creating it (32 random bytes, 0600, exclusively) when `create` and absent.
    /// Refused unless it is a regular file owned by this user and closed to everyone else.
    fn key(&self, create: bool) -> Result<Vec<u8>, ImageError> {
        use std::io::Write;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let path = self.key_path()?;
        let shown = path.display().to_string();
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc_nofollow())
                .open(&path)
        };
        let mut f = match open() {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                let mut bytes = [0u8; 32];
                std::fs::File::open("/dev/urandom")
                    .and_then(|mut r| r.read_exact(&mut bytes))
                    .map_err(io_err("read /dev/urandom"))?;
                match std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc_nofollow())
                    .open(&path)
                {
                    Ok(mut w) => {
                        w.write_all(tree::hex(&bytes).as_bytes())
                            .and_then(|()| w.sync_all())
                            .map_err(io_err(&shown))?;
                    }
                    // Created meanwhile by another import: use that one.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(ImageError::Io(format!("create the image key {shown}: {e}")));
                    }
                }
                open().map_err(io_err(&shown))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::Io(format!(
                    "the image store's key {shown} is missing: the store's fingerprints cannot be checked (re-import the images, which creates a new key, or set {KEY_ENV})"
                )));
            }
            Err(e) => return Err(ImageError::Io(format!("image key {shown}: {e}"))),
        };
        let meta = f.metadata().map_err(io_err(&shown))?;
        let euid = rustix::process::geteuid().as_raw();
        if !meta.is_file() || meta.uid() != euid || meta.mode() & 0o077 != 0 {
            return Err(ImageError::Io(format!(
                "image key {shown}: must be a regular file owned by uid {euid} with mode 0600 (it is uid {}, mode {:o})",
                meta.uid(),
                meta.mode() & 0o7777
            )));
        }
        let mut text = String::new();
        f.read_to_string(&mut text).map_err(io_err(&shown))?;
        let text = text.trim();
        if text.len() < 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ImageError::Io(format!(
                "image key {shown}: not a key (64+ hex digits expected)"
            )));
        }
        Ok(text.as_bytes().to_vec())
    }

    fn entry_dir(&self, hex: &str) -> PathBuf {
        self.root.join("images").join(hex)
    }

    fn ensure(&self) -> Result<(), ImageError> {
        for d in [
            self.root.clone(),
            self.root.join("images"),
            self.root.join("tmp"),
        ] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&d)
                .map_err(io_err(&d.display().to_string()))?;
        }
        Ok(())
    }

    /// Imports an OCI layout (dir or tar) or a plain rootfs (dir or tarball).
    pub fn import(&self, src: &Path, limits: &Limits) -> Result<Imported, ImageError> {
        self.ensure()?;
        let key = self.key(true)?;
        let nanos = jiff::Timestamp::now().as_nanosecond();
        let work = self
            .root
            .join("tmp")
            .join(format!("import-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&work)
            .map_err(io_err("create the staging directory"))?;
        let r = self.import_into(&work, src, limits, &key);
        if work.exists() {
            let _ = fsops::remove_tree(&work);
        }
        r
    }

    fn import_into(
        &self,
        work: &Path,
        src: &Path,
        limits: &Limits,
        key: &[u8],
    ) -> Result<Imported, ImageError> {
        let meta = std::fs::metadata(src).map_err(io_err(&src.display().to_string()))?;
        let rootfs = work.join("rootfs");
        mkdir(&rootfs)?;
        let mut ex = extract::Extractor::new(open(&rootfs)?, limits, true);
        let (kind, oci_digest, layers);
        if meta.is_dir() && src.join("oci-layout").is_file() && src.join("index.json").is_file() {
            kind = "oci";
            (oci_digest, layers) =
                import_layout(src, work, &mut ex, limits).map(|(d, l)| (Some(d), l))?;
        } else if meta.is_dir() {
            // A directory is packed into a tar (symlinks kept as symlinks, never followed) and
            // goes through the same extractor as any archive.
            kind = "rootfs-dir";
            let tarpath = work.join("input.tar");
            pack_dir(src, &tarpath)?;
            let f = std::fs::File::open(&tarpath).map_err(io_err("read the packed directory"))?;
            let mut plain = extract::Extractor::new(open(&rootfs)?, limits, false);
            plain.extract(f)?;
            plain.finish()?;
            ex = plain;
            (oci_digest, layers) = (None, Vec::new());
        } else if meta.is_file() {
            if meta.len() > limits.max_blob_bytes {
                return Err(ImageError::Refused(format!(
                    "{} is {} bytes, more than the bound of {} (max_blob_bytes)",
                    src.display(),
                    meta.len(),
                    limits.max_blob_bytes
                )));
            }
            let input = work.join("in");
            mkdir(&input)?;
            let f = std::fs::File::open(src).map_err(io_err(&src.display().to_string()))?;
            let mut plain = extract::Extractor::new(open(&input)?, limits, false);
            plain.extract(extract::decompress(f)?)?;
            plain.finish()?;
            if input.join("oci-layout").is_file() && input.join("index.json").is_file() {
                kind = "oci";
                (oci_digest, layers) =
                    import_layout(&input, work, &mut ex, limits).map(|(d, l)| (Some(d), l))?;
            } else {
                kind = "rootfs-tar";
                std::fs::remove_dir(&rootfs).map_err(io_err("staging"))?;
                std::fs::rename(&input, &rootfs).map_err(io_err("staging"))?;
                ex = plain;
                (oci_digest, layers) = (None, Vec::new());
            }
        } else {
            return Err(ImageError::Refused(format!(
                "{} is neither a directory nor a regular file",
                src.display()
            )));
        }
        ex.finish()?;
        for leftover in ["in", "blobs", "input.tar"] {
            let p = work.join(leftover);
            if std::fs::symlink_metadata(&p).is_ok() {
                fsops::remove_tree(&p).map_err(io_err("clean the staging directory"))?;
            }
        }
        let sum = tree::walk(&rootfs, true).map_err(io_err("hash the unpacked tree"))?;
        let content_digest = tree::sha256_str(sum.list.as_bytes());
        let digest = oci_digest.unwrap_or_else(|| content_digest.clone());
        let hex = parse_digest(&digest)?.to_string();
        let record = ImageRecord {
            schema: RECORD_SCHEMA.into(),
            digest: digest.clone(),
            kind: kind.into(),
            source: src.display().to_string(),
            created: jiff::Timestamp::now().to_string(),
            content_digest,
            fingerprint: keyed_fingerprint(key, &digest, &sum.fingerprint),
            entries: sum.entries,
            bytes: sum.bytes,
            layers,
            dropped: ex.dropped.clone(),
            dropped_count: ex.dropped_count,
        };
        std::fs::write(work.join("files.txt"), sum.list.as_bytes())
            .map_err(io_err("write files.txt"))?;
        let json = serde_json::to_vec_pretty(&record).map_err(|e| ImageError::Io(e.to_string()))?;
        std::fs::write(work.join("image.json"), json).map_err(io_err("write image.json"))?;
        let dest = self.entry_dir(&hex);
        if dest.exists() {
            return Ok(Imported {
                record: self.record(&digest).unwrap_or(record),
                already_present: true,
            });
        }
        match std::fs::rename(work, &dest) {
            Ok(()) => Ok(Imported {
                record,
                already_present: false,
            }),
            Err(_) if dest.exists() => Ok(Imported {
                record: self.record(&digest).unwrap_or(record),
                already_present: true,
            }),
            Err(e) => Err(ImageError::Io(format!(
                "move the image into the store: {e}"
            ))),
        }
    }

    /// The record of a stored image.
    pub fn record(&self, digest: &str) -> Result<ImageRecord, ImageError> {
        let hex = parse_digest(digest)?;
        let p = self.entry_dir(hex).join("image.json");
        let text = match std::fs::read(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::NotFound {
                    digest: digest.into(),
                    store: self.root.display().to_string(),
                });
            }
            Err(e) => return Err(ImageError::Io(format!("{}: {e}", p.display()))),
        };
        let r: ImageRecord = serde_json::from_slice(&text).map_err(|e| ImageError::Changed {
            digest: digest.into(),
            store: self.root.display().to_string(),
            detail: format!("image.json unreadable: {e}"),
        })?;
        if r.digest != digest {
            return Err(ImageError::Changed {
                digest: digest.into(),
                store: self.root.display().to_string(),
                detail: format!("image.json names {}", r.digest),
            });
        }
        Ok(r)
    }

    /// The rootfs of a stored image (its real path, symlinks in the store's path resolved),
    /// after the cheap per-run check: the record is readable and names this digest, and the
    /// keyed fingerprint over the digest and the tree's metadata equals the recorded one. Only
    /// the holder of the store's key (outside the store) can produce a matching fingerprint.
    pub fn resolve(&self, digest: &str) -> Result<PathBuf, ImageError> {
        let r = self.record(digest)?;
        let changed = |detail: String| ImageError::Changed {
            digest: digest.into(),
            store: self.root.display().to_string(),
            detail,
        };
        let rootfs = std::fs::canonicalize(self.entry_dir(parse_digest(digest)?).join("rootfs"))
            .map_err(|e| changed(format!("rootfs: {e}")))?;
        if !r.fingerprint.starts_with(KEYED) {
            return Err(changed(
                "the recorded fingerprint is not keyed (imported by an older agentjail); re-import the image".into(),
            ));
        }
        let key = self.key(false)?;
        let now = tree::walk(&rootfs, false)
            .map_err(|e| changed(format!("cannot walk the tree: {e}")))?;
        if !constant_time_eq(
            keyed_fingerprint(&key, digest, &now.fingerprint).as_bytes(),
            r.fingerprint.as_bytes(),
        ) {
            return Err(changed(
                "file metadata (size, mode, mtime, ctime or inode) changed since import, or the fingerprint was not made with this store's key".into(),
            ));
        }
        Ok(rootfs)
    }

    /// Re-hashes every file and compares with the recorded file list.
    pub fn verify(&self, digest: &str) -> Result<Verification, ImageError> {
        let r = self.record(digest)?;
        let dir = self.entry_dir(parse_digest(digest)?);
        let recorded = std::fs::read_to_string(dir.join("files.txt")).unwrap_or_default();
        let record_intact = tree::sha256_str(recorded.as_bytes()) == r.content_digest
            && (r.kind == "oci" || r.content_digest == r.digest);
        let now = tree::walk(&dir.join("rootfs"), true).map_err(io_err("walk the stored tree"))?;
        let mut changes = diff(&recorded, &now.list);
        if !record_intact {
            changes.insert(
                0,
                "record: files.txt or image.json does not match the digest".into(),
            );
        }
        let fingerprint_ok = self
            .key(false)
            .map(|k| keyed_fingerprint(&k, digest, &now.fingerprint) == r.fingerprint)
            .unwrap_or(false);
        changes.truncate(200);
        Ok(Verification {
            digest: digest.into(),
            ok: changes.is_empty()
                && record_intact
                && tree::sha256_str(now.list.as_bytes()) == r.content_digest,
            record_intact,
            fingerprint_ok,
            changes,
        })
    }

    /// Every stored image's record (entries without a readable record are listed as
    /// `incomplete`).
    pub fn list(&self) -> Result<Vec<Result<ImageRecord, Incomplete>>, ImageError> {
        let dir = self.root.join("images");
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ImageError::Io(format!("{}: {e}", dir.display()))),
        };
        let mut out = Vec::new();
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for n in names {
            let d = format!("sha256:{n}");
            out.push(self.record(&d).map_err(|error| Incomplete {
                digest: d.clone(),
                error,
            }));
        }
        Ok(out)
    }

    /// Removes a stored image.
    pub fn remove(&self, digest: &str) -> Result<(), ImageError> {
        let hex = parse_digest(digest)?;
        let dir = self.entry_dir(hex);
        if std::fs::symlink_metadata(&dir).is_err() {
            return Err(ImageError::NotFound {
                digest: digest.into(),
                store: self.root.display().to_string(),
            });
        }
        // Move aside first so that a half-removed image is never taken for a stored one.
        self.ensure()?;
        let aside = self
            .root
            .join("tmp")
            .join(format!("rm-{hex}-{}", std::process::id()));
        std::fs::rename(&dir, &aside).map_err(io_err("remove"))?;
        fsops::remove_tree(&aside).map_err(io_err("remove"))
    }
}

/// `hmac-sha256:<hex>` of the digest and the tree's (unkeyed) metadata fingerprint.
fn keyed_fingerprint(key: &[u8], digest: &str, metadata: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = match hmac::Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        // HMAC takes keys of any length; unreachable, and an empty answer never matches.
        Err(_) => return String::new(),
    };
    mac.update(b"agentjail image fingerprint v1\n");
    mac.update(digest.as_bytes());
    mac.update(b"\n");
    mac.update(metadata.as_bytes());
    format!("{KEYED}{}", tree::hex(&mac.finalize().into_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn libc_nofollow() -> i32 {
    OFlags::NOFOLLOW.bits() as i32
}

fn line_path(line: &str) -> &str {
    line.rfind(" \"").map(|i| &line[i + 1..]).unwrap_or(line)
}

fn diff(old: &str, new: &str) -> Vec<String> {
    use std::collections::BTreeMap;
    let index = |s: &str| -> BTreeMap<String, String> {
        s.lines()
            .map(|l| (line_path(l).to_string(), l.to_string()))
            .collect()
    };
    let (a, b) = (index(old), index(new));
    let mut out = Vec::new();
    for (p, l) in &a {
        match b.get(p) {
            None => out.push(format!("removed: {p}")),
            Some(m) if m != l => out.push(format!("changed: {p}")),
            _ => {}
        }
    }
    for p in b.keys() {
        if !a.contains_key(p) {
            out.push(format!("added: {p}"));
        }
    }
    out
}

fn mkdir(p: &Path) -> Result<(), ImageError> {
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(p)
        .map_err(io_err(&p.display().to_string()))
}

fn open(p: &Path) -> Result<std::os::fd::OwnedFd, ImageError> {
    fsops::open_root(p).map_err(io_err(&p.display().to_string()))
}

fn pack_dir(src: &Path, dest: &Path) -> Result<(), ImageError> {
    let f = std::fs::File::create(dest).map_err(io_err("pack the directory"))?;
    let mut b = tar::Builder::new(f);
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    b.append_dir_all(".", src)
        .map_err(|e| ImageError::Refused(format!("cannot read {}: {e}", src.display())))?;
    b.finish().map_err(io_err("pack the directory"))
}

// --- OCI image layout -------------------------------------------------------------------

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Deserialize)]
struct Index {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct ImageManifest {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

const MT_MANIFEST: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
const MT_INDEX: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const MT_LAYER: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
];

fn refused(s: String) -> ImageError {
    ImageError::Refused(s)
}

/// Opens the blob a descriptor names, checks it is a regular file of the descriptor's size,
/// and streams it through sha256 into `sink`; refuses on any difference.
fn check_blob(
    layout: BorrowedFd<'_>,
    d: &Descriptor,
    max: u64,
    sink: &mut dyn std::io::Write,
) -> Result<(), ImageError> {
    let hex = parse_digest(&d.digest).map_err(|e| refused(format!("descriptor digest: {e}")))?;
    if d.size > max {
        return Err(refused(format!(
            "blob {} is {} bytes by its descriptor, more than the bound of {max}",
            d.digest, d.size
        )));
    }
    let rel = format!("blobs/sha256/{hex}");
    let fd = fsops::open_beneath(layout, &rel, OFlags::RDONLY).map_err(|e| {
        refused(format!(
            "blob {}: cannot open {rel} without following links: {e}",
            d.digest
        ))
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| ImageError::Io(format!("{rel}: {e}")))?;
    if fsops::file_type(&st) != FileType::RegularFile {
        return Err(refused(format!("blob {}: not a regular file", d.digest)));
    }
    if st.st_size as u64 != d.size {
        return Err(refused(format!(
            "blob {} is {} bytes but its descriptor says {} (truncated or altered)",
            d.digest, st.st_size, d.size
        )));
    }
    let mut f = std::fs::File::from(fd).take(d.size + 1);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(io_err(&rel))?;
        if k == 0 {
            break;
        }
        n += k as u64;
        h.update(&buf[..k]);
        sink.write_all(&buf[..k]).map_err(io_err("copy blob"))?;
    }
    if n != d.size {
        return Err(refused(format!(
            "blob {}: read {n} bytes but its descriptor says {} (truncated or altered)",
            d.digest, d.size
        )));
    }
    let got = format!("sha256:{}", tree::hex(&h.finalize()));
    if got != d.digest {
        return Err(refused(format!(
            "blob {}: content hashes to {got}; wrong digest",
            d.digest
        )));
    }
    Ok(())
}

fn small_blob(layout: BorrowedFd<'_>, d: &Descriptor) -> Result<Vec<u8>, ImageError> {
    let mut v = Vec::new();
    check_blob(layout, d, 4 << 20, &mut v)?;
    Ok(v)
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn pick_manifest(layout: BorrowedFd<'_>, idx: Index, depth: u32) -> Result<Descriptor, ImageError> {
    if idx.schema_version != 2 {
        return Err(refused(format!(
            "index schemaVersion {} is not 2",
            idx.schema_version
        )));
    }
    let mut manifests: Vec<Descriptor> = Vec::new();
    let mut indexes: Vec<Descriptor> = Vec::new();
    for d in idx.manifests {
        if MT_INDEX.contains(&d.media_type.as_str()) {
            indexes.push(d);
        } else if MT_MANIFEST.contains(&d.media_type.as_str()) || d.media_type.is_empty() {
            manifests.push(d);
        }
    }
    if manifests.len() > 1 {
        manifests.retain(|d| {
            d.platform
                .as_ref()
                .map(|p| p.os == "linux" && p.architecture == host_arch())
                .unwrap_or(false)
        });
    }
    match manifests.len() {
        1 => return manifests.pop().ok_or_else(|| refused("no image".into())),
        0 => {}
        n => {
            return Err(refused(format!(
                "the index lists {n} images for linux/{}; give a layout with one",
                host_arch()
            )));
        }
    }
    if depth < 2
        && indexes.len() == 1
        && let Some(d) = indexes.pop()
    {
        let bytes = small_blob(layout, &d)?;
        let nested: Index = serde_json::from_slice(&bytes)
            .map_err(|e| refused(format!("nested index {}: {e}", d.digest)))?;
        return pick_manifest(layout, nested, depth + 1);
    }
    Err(refused("the index names no image manifest".into()))
}

/// Verifies and unpacks an OCI layout; returns the image manifest digest and layer digests.
fn import_layout(
    dir: &Path,
    work: &Path,
    ex: &mut extract::Extractor<'_>,
    limits: &Limits,
) -> Result<(String, Vec<String>), ImageError> {
    let layout = open(dir)?;
    let lfd = layout.as_fd();
    let index_fd = fsops::open_beneath(lfd, "index.json", OFlags::RDONLY)
        .map_err(|e| refused(format!("index.json: {e}")))?;
    let mut text = Vec::new();
    std::fs::File::from(index_fd)
        .take(4 << 20)
        .read_to_end(&mut text)
        .map_err(io_err("index.json"))?;
    let idx: Index =
        serde_json::from_slice(&text).map_err(|e| refused(format!("index.json: {e}")))?;
    let mdesc = pick_manifest(lfd, idx, 0)?;
    let mbytes = small_blob(lfd, &mdesc)?;
    let m: ImageManifest = serde_json::from_slice(&mbytes)
        .map_err(|e| refused(format!("image manifest {}: {e}", mdesc.digest)))?;
    if m.schema_version != 2 {
        return Err(refused(format!(
            "image manifest schemaVersion {} is not 2",
            m.schema_version
        )));
    }
    let _config = {
        let mut v = Vec::new();
        check_blob(lfd, &m.config, 16 << 20, &mut v)?;
        v
    };
    // Every layer is copied into private staging and checked before any is unpacked.
    let blobs = work.join("blobs");
    mkdir(&blobs)?;
    let mut copies = Vec::new();
    for (i, l) in m.layers.iter().enumerate() {
        if l.media_type.contains("zstd") {
            return Err(refused(format!(
                "layer {}: zstd layers are not supported",
                l.digest
            )));
        }
        if !MT_LAYER.contains(&l.media_type.as_str()) {
            return Err(refused(format!(
                "layer {}: unsupported media type {:?}",
                l.digest, l.media_type
            )));
        }
        let p = blobs.join(format!("{i}"));
        let mut f = std::fs::File::create(&p).map_err(io_err("stage a layer"))?;
        check_blob(lfd, l, limits.max_blob_bytes, &mut f)?;
        copies.push(p);
    }
    for p in &copies {
        let f = std::fs::File::open(p).map_err(io_err("read a staged layer"))?;
        ex.extract(extract::decompress(f)?)?;
    }
    Ok((
        mdesc.digest,
        m.layers.iter().map(|l| l.digest.clone()).collect(),
    ))
}

#[cfg(test)]
mod tests;
