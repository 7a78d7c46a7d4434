//! Identity of the default root file system: the host's system directories, bound read-only.
//!
//! The host image is not content-pinned (hashing all of /usr on every run would cost seconds),
//! so its identity is a digest over what describes it: the list of bound paths and symlinks,
//! the OS release, and the size and modification time of the files that are rewritten whenever
//! the installed software changes: the dynamic loader cache (`ldconfig` rewrites it when
//! libraries come or go) and the package database (any package install or removal rewrites
//! it). Hashing their contents instead cost ~0.1 ms (loader cache) and ~0.5 ms (dpkg's status
//! file) per run, a large share of a whole run. The report and the receipt record it as
//! `image`; a manifest's `image_digest` must equal it. Two identical hosts therefore get
//! different identities: the host image identifies one machine's state, it does not pin
//! content (that is what digest-pinned images are for).

use sha2::{Digest, Sha256};

use crate::plan::Plan;

/// Small files whose content identifies the host's installed software.
const IDENTITY_FILES: &[&str] = &["/usr/lib/os-release"];
/// The loader cache and the package databases, identified by size and modification time.
const PACKAGE_DBS: &[&str] = &[
    "/etc/ld.so.cache",
    "/var/lib/dpkg/status",
    "/var/lib/rpm/rpmdb.sqlite",
    "/lib/apk/db/installed",
];

/// `sha256:<hex>` identity of the host image.
pub fn host_image_identity() -> String {
    let mut h = Sha256::new();
    h.update(b"agentjail.host-image/v2\n");
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
    for f in PACKAGE_DBS {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(f) {
            Ok(m) => h.update(
                format!(
                    "{f} size={} mtime={}.{:09}\n",
                    m.len(),
                    m.mtime(),
                    m.mtime_nsec()
                )
                .as_bytes(),
            ),
            Err(_) => h.update(format!("{f} absent\n").as_bytes()),
        }
    }
    format!("sha256:{}", agentjail_manifest::hex(&h.finalize()))
}
