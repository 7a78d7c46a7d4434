//! Reading an OCI image layout for an import: `index.json`, the image manifest for this
//! host's platform (through at most two nested indexes), its config and layer blobs, each
//! checked against its descriptor (regular file, size, sha256) while it is copied into
//! private staging, before the layers are unpacked in order by the untrusting extractor.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{FileType, OFlags};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::bounds::{ImageError, Limits, io_err, mkdir, open, parse_digest};
use crate::{extract, fsops, tree};

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
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

/// What an imported OCI layout is: its manifest digest, its layer digests, and the base image
/// its manifest names (`org.opencontainers.image.base.digest`, with `….base.name` if given).
pub(crate) struct LayoutImage {
    pub digest: String,
    pub layers: Vec<String>,
    pub base: Option<String>,
}

/// The base image named by the manifest's annotations: `NAME@DIGEST` or `DIGEST`; None unless
/// the digest is `sha256:<64 hex>` and the name printable and short.
pub(crate) fn base_of(a: &std::collections::BTreeMap<String, String>) -> Option<String> {
    let d = a.get("org.opencontainers.image.base.digest")?;
    crate::parse_digest(d).ok()?;
    match a.get("org.opencontainers.image.base.name") {
        Some(n) if n.len() <= 256 && n.chars().all(|c| c.is_ascii_graphic()) => {
            Some(format!("{n}@{d}"))
        }
        _ => Some(d.clone()),
    }
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

/// Verifies and unpacks an OCI layout.
pub(crate) fn import_layout(
    dir: &Path,
    work: &Path,
    ex: &mut extract::Extractor<'_>,
    limits: &Limits,
) -> Result<LayoutImage, ImageError> {
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
    Ok(LayoutImage {
        digest: mdesc.digest,
        layers: m.layers.iter().map(|l| l.digest.clone()).collect(),
        base: base_of(&m.annotations),
    })
}
