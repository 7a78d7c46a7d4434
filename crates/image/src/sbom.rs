//! The software bill of materials of a stored image (`agentjail image show`): a CycloneDX 1.5
//! JSON document listing what the image's own package records say is installed, read from
//! inside its root file system:
//! - Debian packages: `var/lib/dpkg/status` (paragraphs whose `Status` ends in `installed`);
//! - Python distributions: every `*.dist-info/METADATA` (`Name`, `Version`) in the
//!   `site-packages` and `dist-packages` folders of `usr/lib/python3*` and
//!   `usr/local/lib/python3*`, and in `usr/lib/python3/dist-packages` (Debian's).
//!
//! The image is untrusted input: every file is opened beneath its root one component at a
//! time without following a symlink or crossing a mount (`fsops`), so a symlinked folder that
//! points out of the image is skipped, never read; each file read is bounded. The document is
//! deterministic (the same image gives the same bytes: no time stamp, components sorted by
//! purl, a serial number derived from the image digest), so its digest names it.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::OFlags;
use serde_json::{Value, json};

use crate::fsops;

/// Largest `var/lib/dpkg/status` read (Debian's full desktop is ~5 MiB).
const DPKG_STATUS_MAX: u64 = 64 << 20;
/// Largest part of a `METADATA` file read (its headers come first).
const METADATA_MAX: u64 = 256 << 10;
/// Most bytes of `METADATA` read in all, per image (a few MiB for a data-science image).
const METADATA_TOTAL_MAX: u64 = 64 << 20;
/// Largest `etc/os-release` read.
const OS_RELEASE_MAX: u64 = 64 << 10;
/// Most Python distributions listed (a guard against an image made to be slow to describe).
const MAX_DISTRIBUTIONS: usize = 20_000;

/// One installed package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// `deb` or `pypi`.
    pub ecosystem: &'static str,
    pub name: String,
    pub version: String,
    /// Package URL (purl), e.g. `pkg:deb/debian/python3.11@3.11.2-6?arch=amd64`.
    pub purl: String,
}

/// The packages installed in the root file system at `rootfs`, sorted by purl, without
/// duplicates. An image whose records exceed the bounds (a dpkg status over 64 MiB, more than
/// 20,000 Python distributions or 64 MiB of their `METADATA`) is an error, never a partial list.
pub fn packages(rootfs: &Path) -> std::io::Result<Vec<Package>> {
    let root = fsops::open_root(rootfs)?;
    let mut by_purl = BTreeMap::new();
    for p in debian(root.as_fd())?
        .into_iter()
        .chain(python(root.as_fd())?)
    {
        by_purl.entry(p.purl.clone()).or_insert(p);
    }
    Ok(by_purl.into_values().collect())
}

/// The CycloneDX 1.5 document of the image `digest` whose root is `rootfs`.
pub fn cyclonedx(rootfs: &Path, digest: &str) -> std::io::Result<Value> {
    let components: Vec<Value> = packages(rootfs)?
        .into_iter()
        .map(|p| {
            json!({
                "type": "library",
                "bom-ref": p.purl,
                "name": p.name,
                "version": p.version,
                "purl": p.purl,
            })
        })
        .collect();
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    Ok(json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": serial_number(digest),
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "bom-ref": digest,
                "name": digest,
                "hashes": [{"alg": "SHA-256", "content": hex}],
            },
            "tools": {
                "components": [{"type": "application", "name": "agentjail"}],
            },
        },
        "components": components,
    }))
}

/// The document's bytes as `agentjail image show --sbom` prints them (pretty JSON and a
/// newline): what its digest (`image_sbom` in reports and receipts) is taken of.
pub fn text(doc: &Value) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(doc).unwrap_or_else(|_| "null".into())
    )
}

/// The SBOM of the image `digest` at `rootfs` and its digest (`sha256:<hex>` of [`text`]).
pub fn digest(rootfs: &Path, digest: &str) -> std::io::Result<(String, String)> {
    let t = text(&cyclonedx(rootfs, digest)?);
    let d = agentjail_manifest::sha256_digest(t.as_bytes());
    Ok((t, d))
}

/// `urn:uuid:` of a name-based UUID (version 5 layout) from the sha256 of the image digest.
fn serial_number(digest: &str) -> String {
    let h = agentjail_manifest::sha256_digest(format!("agentjail-sbom:{digest}").as_bytes());
    let hex = h.strip_prefix("sha256:").unwrap_or(&h);
    let mut b: Vec<u8> = (0..16)
        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    b.resize(16, 0);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    let x = crate::tree::hex(&b);
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

/// A path that is not there for the SBOM's purposes: missing, not a folder on the way, or
/// refused by the resolution (a symlink, `..`, a mount crossing). Any other failure (EACCES,
/// EIO, EMFILE …) is an error: a partial list is never made.
fn absent(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::NOENT, Errno::NOTDIR, Errno::LOOP, Errno::XDEV]
        .iter()
        .any(|x| e.raw_os_error() == Some(x.raw_os_error()))
}

/// Reads the regular file `path` (plain components) beneath `dir`: `Ok(None)` if it is
/// absent (see [`absent`]) or not a regular file; `Err` if it cannot be read, or if it is
/// larger than `max` bytes and `head` is false (with `head`, its first `max` bytes: the
/// headers of a `METADATA`). (Opened non-blocking: a FIFO never holds the reader, and is then
/// skipped as not a regular file.)
fn read_beneath(
    dir: BorrowedFd<'_>,
    path: &str,
    max: u64,
    head: bool,
) -> std::io::Result<Option<String>> {
    let fd: OwnedFd = match fsops::open_beneath(dir, path, OFlags::RDONLY | OFlags::NONBLOCK) {
        Ok(fd) => fd,
        Err(e) if absent(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = rustix::fs::fstat(&fd)?;
    if fsops::file_type(&st) != rustix::fs::FileType::RegularFile {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(max + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        if !head {
            return Err(too_big(path));
        }
        bytes.truncate(max as usize);
    }
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// The names in the directory `path` beneath `dir` (none if it is absent).
fn names(dir: BorrowedFd<'_>, path: &str) -> std::io::Result<Vec<String>> {
    let d = match fsops::open_dir_path(dir, path) {
        Ok(d) => d,
        Err(e) if absent(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(fsops::list(d.as_fd())?
        .into_iter()
        .filter_map(|n| String::from_utf8(n).ok())
        .collect())
}

/// The distribution's `ID` in `etc/os-release` (else `usr/lib/os-release`), for the purl's
/// namespace; `debian` when neither says.
fn os_id(root: BorrowedFd<'_>) -> std::io::Result<String> {
    let mut text = None;
    for p in ["etc/os-release", "usr/lib/os-release"] {
        text = read_beneath(root, p, OS_RELEASE_MAX, false)?;
        if text.is_some() {
            break;
        }
    }
    Ok(text
        .and_then(|t| {
            t.lines().find_map(|l| {
                let v = l.strip_prefix("ID=")?.trim().trim_matches('"');
                let ok = !v.is_empty()
                    && v.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                    });
                ok.then(|| v.to_owned())
            })
        })
        .unwrap_or_else(|| "debian".into()))
}

fn too_big(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("{what}: beyond the SBOM's bounds"),
    )
}

fn debian(root: BorrowedFd<'_>) -> std::io::Result<Vec<Package>> {
    let Some(status) = read_beneath(root, "var/lib/dpkg/status", DPKG_STATUS_MAX, false)? else {
        return Ok(Vec::new());
    };
    let ns = os_id(root)?;
    let mut out = Vec::new();
    for para in status.split("\n\n") {
        let field = |name: &str| {
            para.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k == name).then(|| v.trim().to_owned())
            })
        };
        let installed = field("Status").is_some_and(|s| s.ends_with(" installed"));
        let (Some(name), Some(version)) = (field("Package"), field("Version")) else {
            continue;
        };
        if !installed || name.is_empty() || version.is_empty() {
            continue;
        }
        let arch = field("Architecture").unwrap_or_default();
        let mut purl = format!("pkg:deb/{ns}/{}@{}", encode(&name), encode(&version));
        if !arch.is_empty() {
            purl.push_str(&format!("?arch={}", encode(&arch)));
        }
        out.push(Package {
            ecosystem: "deb",
            name,
            version,
            purl,
        });
    }
    Ok(out)
}

/// The folders that hold Python distributions, each once.
fn python_dirs(root: BorrowedFd<'_>) -> std::io::Result<std::collections::BTreeSet<String>> {
    let mut dirs = std::collections::BTreeSet::from(["usr/lib/python3/dist-packages".to_owned()]);
    for base in ["usr/lib", "usr/local/lib"] {
        for n in names(root, base)? {
            if n.starts_with("python3") {
                for sub in ["site-packages", "dist-packages"] {
                    dirs.insert(format!("{base}/{n}/{sub}"));
                }
            }
        }
    }
    Ok(dirs)
}

fn python(root: BorrowedFd<'_>) -> std::io::Result<Vec<Package>> {
    let mut out = Vec::new();
    let mut read = 0u64;
    for dir in python_dirs(root)? {
        for n in names(root, &dir)? {
            if !n.ends_with(".dist-info") {
                continue;
            }
            if out.len() >= MAX_DISTRIBUTIONS {
                return Err(too_big("the Python distributions"));
            }
            let Some(meta) =
                read_beneath(root, &format!("{dir}/{n}/METADATA"), METADATA_MAX, true)?
            else {
                continue;
            };
            read += meta.len() as u64;
            if read > METADATA_TOTAL_MAX {
                return Err(too_big("the Python distributions' METADATA"));
            }
            let header = |name: &str| {
                meta.lines().take_while(|l| !l.is_empty()).find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                })
            };
            let (Some(name), Some(version)) = (header("Name"), header("Version")) else {
                continue;
            };
            if name.is_empty() || version.is_empty() {
                continue;
            }
            let purl = format!("pkg:pypi/{}@{}", encode(&pep503(&name)), encode(&version));
            out.push(Package {
                ecosystem: "pypi",
                name,
                version,
                purl,
            });
        }
    }
    Ok(out)
}

/// PEP 503's normalized name (the purl spec's for PyPI): lower case, each run of `-`, `_`
/// and `.` one `-`.
pub fn pep503(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// Percent-encodes all but purl's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A `METADATA` that is a FIFO (no reader would ever get an end) is skipped, not waited on.
    #[test]
    fn a_fifo_named_metadata_does_not_hold_the_reader() {
        let d = tempfile::tempdir().unwrap();
        let dist = d.path().join("usr/lib/python3/dist-packages/x-1.dist-info");
        std::fs::create_dir_all(&dist).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dist.join("METADATA"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert_eq!(packages(d.path()).unwrap(), []);
    }

    #[test]
    fn names_and_versions_are_encoded_as_purl_wants() {
        assert_eq!(pep503("Bar_Baz.Qux--x"), "bar-baz-qux-x");
        assert_eq!(encode("1:2.3+dfsg~1"), "1%3A2.3%2Bdfsg~1");
        let s = serial_number("sha256:00");
        assert_eq!(s.len(), "urn:uuid:".len() + 36, "{s}");
        assert_eq!(&s[9 + 14..9 + 15], "5", "{s}");
    }
}
