//! Identity of the default root file system: the host's system directories, bound read-only.
//!
//! The host image is not content-pinned (hashing all of /usr on every run would cost seconds),
//! so its identity is a digest over what describes it: the list of bound paths and symlinks,
//! and the content of the files that change whenever its software changes (the dynamic loader
//! cache, the OS release, the package database when there is one). The report and the receipt
//! record it as `image`; a manifest's `image_digest` must equal it.

use sha2::{Digest, Sha256};

use crate::plan::Plan;

/// Files whose content identifies the host's installed software.
const IDENTITY_FILES: &[&str] = &[
    "/etc/ld.so.cache",
    "/usr/lib/os-release",
    "/var/lib/dpkg/status",
    "/var/lib/rpm/rpmdb.sqlite",
    "/lib/apk/db/installed",
];

/// `sha256:<hex>` identity of the host image.
pub fn host_image_identity() -> String {
    let mut h = Sha256::new();
    h.update(b"agentjail.host-image/v1\n");
    for p in Plan::image_description() {
        h.update(p.as_bytes());
        h.update(b"\n");
    }
    for f in IDENTITY_FILES {
        match std::fs::read(f) {
            Ok(bytes) => {
                h.update(format!("{f} {}\n", agentjail_manifest::sha256_digest(&bytes)).as_bytes())
            }
            Err(_) => h.update(format!("{f} absent\n").as_bytes()),
        }
    }
    format!("sha256:{}", agentjail_manifest::hex(&h.finalize()))
}
