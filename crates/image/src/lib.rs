//! # agentjail-image
//!
//! A content-addressed local store of root images that a manifest pins by digest
//! (`image: sha256:…`). See `docs/images.md` for the layout, the import safety rules (each
//! attack and its defence) and how verification works.
//!
//! - [`Store::import`] takes an OCI image layout (a directory or a tar of one) or a plain root
//!   file system (a directory or a tarball, gzip or not). Every OCI blob is copied into private
//!   staging while its sha256 and size are checked against its descriptor, before it is parsed
//!   or unpacked (`oci.rs`); layers are unpacked in order by an untrusting extractor
//!   ([`extract`]) into a staging directory that is renamed into place only when everything
//!   passed.
//! - The image digest is the OCI image manifest's digest, or for a plain root file system the
//!   sha256 of its canonical file list ([`tree`]).
//! - [`Store::resolve`] (every run) compares a cheap metadata fingerprint, keyed with the store key kept outside the store; [`Store::verify`]
//!   re-hashes every file against the recorded file list.

mod bounds;
pub mod extract;
mod fsops;
pub mod layout;
mod oci;
pub mod requirements;
pub mod sbom;
pub mod tree;

pub use bounds::{ImageError, Limits, parse_digest};
use bounds::{io_err, mkdir, open};
use oci::import_layout;

use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

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
    /// The image it was made from, where known: an OCI manifest's
    /// `org.opencontainers.image.base.digest` (as `NAME@DIGEST` with `….base.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
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
        self.staged("import", |work, key| {
            self.import_into(work, src, limits, key)
        })
    }

    /// Runs `f` in a fresh private staging folder below `tmp/` (named `PREFIX-PID-NANOS`)
    /// with the fingerprint key; the folder is removed afterwards whatever happened (a
    /// successful `f` has renamed it into `images/`).
    fn staged<T>(
        &self,
        prefix: &str,
        f: impl FnOnce(&Path, &[u8]) -> Result<T, ImageError>,
    ) -> Result<T, ImageError> {
        self.ensure()?;
        let key = self.key(true)?;
        let nanos = jiff::Timestamp::now().as_nanosecond();
        let work = self
            .root
            .join("tmp")
            .join(format!("{prefix}-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&work)
            .map_err(io_err("create the staging directory"))?;
        let r = f(&work, &key);
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
        let mut base = None;
        let mut oci = |dir: &Path, ex: &mut extract::Extractor<'_>| {
            import_layout(dir, work, ex, limits).map(|l| {
                base = l.base;
                (Some(l.digest), l.layers)
            })
        };
        if meta.is_dir() && src.join("oci-layout").is_file() && src.join("index.json").is_file() {
            kind = "oci";
            (oci_digest, layers) = oci(src, &mut ex)?;
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
                (oci_digest, layers) = oci(&input, &mut ex)?;
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
        self.seal(
            work,
            &rootfs,
            &mut ex,
            kind,
            &src.display().to_string(),
            oci_digest,
            layers,
            base,
            key,
        )
    }

    /// Ends a staged import: the tree is hashed, the record written, and the staging folder
    /// renamed into the store at once (or the stored copy kept when it is there already).
    #[allow(clippy::too_many_arguments)]
    fn seal(
        &self,
        work: &Path,
        rootfs: &Path,
        ex: &mut extract::Extractor<'_>,
        kind: &str,
        source: &str,
        oci_digest: Option<String>,
        layers: Vec<String>,
        base: Option<String>,
        key: &[u8],
    ) -> Result<Imported, ImageError> {
        ex.finish()?;
        for leftover in ["in", "blobs", "input.tar"] {
            let p = work.join(leftover);
            if std::fs::symlink_metadata(&p).is_ok() {
                fsops::remove_tree(&p).map_err(io_err("clean the staging directory"))?;
            }
        }
        let sum = tree::walk(rootfs, true).map_err(io_err("hash the unpacked tree"))?;
        let content_digest = tree::sha256_str(sum.list.as_bytes());
        let digest = oci_digest.unwrap_or_else(|| content_digest.clone());
        let hex = parse_digest(&digest)?.to_string();
        let record = ImageRecord {
            schema: RECORD_SCHEMA.into(),
            digest: digest.clone(),
            kind: kind.into(),
            source: source.to_owned(),
            created: jiff::Timestamp::now().to_string(),
            content_digest,
            fingerprint: keyed_fingerprint(key, &digest, &sum.fingerprint),
            entries: sum.entries,
            bytes: sum.bytes,
            layers,
            base,
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

    /// Makes a new image from the stored image `base` and one layer (a tar, from
    /// `agentjail image build`) that may only **add** to it: an entry whose name the base has
    /// (a directory over a directory aside) refuses the whole layer. The base is checked first
    /// as `verify` does; the layer goes through the same untrusting extractor and bounds as an
    /// import, and the result is stored the same way (kind `build`, `base` named, the digest
    /// that of its file list, so the same base and layer content give the same digest).
    pub fn build_on(
        &self,
        base: &str,
        layer: &Path,
        source: &str,
        limits: &Limits,
    ) -> Result<Imported, ImageError> {
        let v = self.verify(base)?;
        if !v.ok {
            return Err(ImageError::Refused(format!(
                "the base image {base} changed since it was stored ({}); see `agentjail image verify {base}`",
                v.changes
                    .first()
                    .map(String::as_str)
                    .unwrap_or("its record or fingerprint")
            )));
        }
        let base_root = self.resolve(base)?;
        self.staged("build", |work, key| {
            let rootfs = work.join("rootfs");
            mkdir(&rootfs)?;
            let packed = work.join("base.tar");
            pack_dir(&base_root, &packed)?;
            let mut ex = extract::Extractor::new(open(&rootfs)?, limits, false);
            let f = std::fs::File::open(&packed).map_err(io_err("read the packed base"))?;
            ex.extract(f)?;
            std::fs::remove_file(&packed).map_err(io_err("clean the staging directory"))?;
            ex.start_added_layer();
            let f = std::fs::File::open(layer).map_err(io_err(&layer.display().to_string()))?;
            let len = f.metadata().map_err(io_err("read the layer"))?.len();
            if len > limits.max_blob_bytes {
                return Err(ImageError::Refused(format!(
                    "the layer is {len} bytes, more than the bound of {} (max_blob_bytes)",
                    limits.max_blob_bytes
                )));
            }
            ex.extract(extract::decompress(f)?)?;
            self.seal(
                work,
                &rootfs,
                &mut ex,
                "build",
                source,
                None,
                Vec::new(),
                Some(base.to_owned()),
                key,
            )
        })
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

    /// Records that a run used the image now (`images/<hex>/used`, an RFC 3339 instant,
    /// replaced atomically; outside `rootfs`, so the fingerprint does not cover it). What
    /// `agentjail image gc` keeps recent images by. Best effort: a store this user cannot write
    /// keeps its older stamp.
    pub fn mark_used(&self, digest: &str) -> Result<(), ImageError> {
        let dir = self.entry_dir(parse_digest(digest)?);
        let tmp = dir.join(format!("used.tmp{}", std::process::id()));
        std::fs::write(&tmp, jiff::Timestamp::now().to_string())
            .and_then(|()| std::fs::rename(&tmp, dir.join("used")))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                ImageError::Io(format!("{}: {e}", dir.display()))
            })
    }

    /// When a run last used the image ([`Store::mark_used`]); None if never.
    pub fn last_used(&self, digest: &str) -> Option<jiff::Timestamp> {
        let dir = self.entry_dir(parse_digest(digest).ok()?);
        std::fs::read_to_string(dir.join("used"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The CycloneDX SBOM of a stored image ([`sbom`]), read from its root after the cheap
    /// per-run check ([`Store::resolve`]): a changed image is refused, not described.
    pub fn sbom(&self, digest: &str) -> Result<serde_json::Value, ImageError> {
        let rootfs = self.resolve(digest)?;
        sbom::cyclonedx(&rootfs, digest).map_err(io_err("read the image's package records"))
    }

    /// The packages installed in a stored image ([`sbom::packages`]), after the same check.
    pub fn packages(&self, digest: &str) -> Result<Vec<sbom::Package>, ImageError> {
        let rootfs = self.resolve(digest)?;
        sbom::packages(&rootfs).map_err(io_err("read the image's package records"))
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

fn pack_dir(src: &Path, dest: &Path) -> Result<(), ImageError> {
    let f = std::fs::File::create(dest).map_err(io_err("pack the directory"))?;
    let mut b = tar::Builder::new(f);
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    b.append_dir_all(".", src)
        .map_err(|e| ImageError::Refused(format!("cannot read {}: {e}", src.display())))?;
    b.finish().map_err(io_err("pack the directory"))
}

#[cfg(test)]
mod tests;
