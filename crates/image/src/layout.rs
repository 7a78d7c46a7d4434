//! Writing an OCI image layout (used by tests and by tooling that builds images offline):
//! `oci-layout`, `index.json`, and the config, layer and manifest blobs under `blobs/sha256/`.

use std::io::Write;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::tree::hex;

/// gzip-compresses a tar stream (a layer).
pub fn gzip(tar: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(tar)?;
    e.finish()
}

fn put_blob(dir: &Path, bytes: &[u8]) -> std::io::Result<(String, u64)> {
    let h = hex(&Sha256::digest(bytes));
    std::fs::write(dir.join("blobs/sha256").join(&h), bytes)?;
    Ok((format!("sha256:{h}"), bytes.len() as u64))
}

/// Writes a layout with one linux image whose layers are the given gzip-compressed tars, in
/// order. Returns the image manifest digest (the image's digest).
pub fn write_oci_layout(dir: &Path, layers_gz: &[Vec<u8>]) -> std::io::Result<String> {
    std::fs::create_dir_all(dir.join("blobs/sha256"))?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    for l in layers_gz {
        let (d, size) = put_blob(dir, l)?;
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&l[..]), &mut raw)?;
        diff_ids.push(format!("sha256:{}", hex(&Sha256::digest(&raw))));
        layers.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": d, "size": size,
        }));
    }
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "config": {},
    });
    let (cd, cs) = put_blob(dir, config.to_string().as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
        "layers": layers,
    });
    let (md, ms) = put_blob(dir, manifest.to_string().as_bytes())?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": md, "size": ms,
            "platform": {"architecture": arch, "os": "linux"},
        }],
    });
    std::fs::write(dir.join("index.json"), index.to_string())?;
    Ok(md)
}

/// A tar stream of a directory's content (symlinks kept as symlinks), e.g. a layer.
pub fn tar_dir(src: &Path) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", src)?;
    b.into_inner()
}
